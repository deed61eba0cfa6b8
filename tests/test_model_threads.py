"""One model shared by several threads, each with its own cache, gives the serial outputs."""
import threading

import numpy as np

import fastspec as fs


def test_same_model_separate_caches_in_threads(backend):
    # Big enough that the threads' forward calls overlap (a shared scratch buffer made 6 of 6
    # runs differ at this size).
    model = fs.Transformer.random(fs.ModelConfig.tiny_llama(max_seq_len=256), seed=3)
    prompts = [np.random.default_rng(i).integers(0, 256, 16) for i in range(2)]
    serial = [fs.generate(model, p, 32).tokens for p in prompts]
    results = [[] for _ in prompts]
    start = threading.Barrier(len(prompts))

    def work(i):
        start.wait()
        for _ in range(3):  # several rounds so the threads really interleave
            results[i].append(fs.generate(model, prompts[i], 32).tokens)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [[s] * 3 for s in serial]
