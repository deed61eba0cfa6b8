"""Real-size shapes: load memory, the decode step against the stream bound, the sampled round.

Random SmolLM-135M and Qwen3-0.6B shapes are saved as BF16 Hugging Face folders; each storage
dtype is loaded in a fresh process (:func:`fastspec.tools.bench_real.measure_folder`), which
times the decode step and a read-only BLAS ``sdot`` stream of the step's bytes interleaved in
one run. ``extra_info`` holds the row: ``peak_rss_over_file`` (goal <= 1.3 for 16-bit
weights), ``fraction_of_stream_bound`` and ``fraction_paired_median`` (goal >= 0.9 for 16-bit weights,
one thread: at 2 threads the BLAS ``sdot`` reference reads no faster here while a 2-thread C
reader does, so a 2-thread fraction overstates),
``sampled_round_over_step`` (Qwen3-0.6B, goal < 0.05) and the load average.

``test_real_peers`` runs greedy decoding of the SmolLM-135M folder in fastspec (bf16, float32)
and transformers (bf16, float32), interleaved, at 1 and 2 threads, with the identical-output
check (goal: fastspec bf16 / transformers bf16 >= 1.9).

Run: ``pytest bench/test_bench_real.py --benchmark-only -s`` (about 10 minutes; writes about
1.5 GB under the temporary folder). FASTSPEC_BENCH_THREADS=1,2 sets the thread counts.
"""
import os

import pytest

from fastspec.tools.bench_real import REAL_SHAPES, measure_folder, write_random_folder

THREADS = tuple(int(t) for t in os.environ.get("FASTSPEC_BENCH_THREADS", "1,2").split(","))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    return {name: (root / name, write_random_folder(cfg, root / name))
            for name, cfg in REAL_SHAPES.items()}


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("weight_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", list(REAL_SHAPES))
def test_real_decode(benchmark, folders, shape, weight_dtype, threads):
    folder, file_bytes = folders[shape]
    benchmark.group = f"real {shape} {weight_dtype}"
    row = measure_folder(folder, weight_dtype, new_tokens=16, repeats=3,
                         sampled=shape == "Qwen3-0.6B", threads=threads)
    row.update(load_average=os.getloadavg()[0], peak_rss_over_file=row["peak_rss_load_bytes"]
               / file_bytes)
    benchmark.extra_info.update(row)
    print(f"\n{shape} {weight_dtype} threads {threads}: "
          + ", ".join(f"{k}={v:.3g}" for k, v in row.items() if isinstance(v, float)))
    benchmark.pedantic(lambda: row["decode_step_s"], rounds=1)


def test_real_peers(benchmark, folders):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fastspec.tools.real_peers import real_peers, real_peers_text

    folder, _ = folders["SmolLM-135M"]
    rep = real_peers(folder, new_tokens=32, threads=THREADS, repeats=2)
    benchmark.extra_info.update(rep)
    print("\n" + "\n".join(real_peers_text(rep)))
    benchmark.pedantic(lambda: rep, rounds=1)
