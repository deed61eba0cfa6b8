"""GGUF architectures that are a Llama under another name: ``exaone`` (EXAONE 3.x: NeoX RoPE,
so its q/k rows are not permuted; Llama 3.1's ``rope_freqs``), ``ernie4_5`` (ERNIE 4.5
dense: interleaved RoPE, its rows as the ones llama.cpp's converter permutes a llama file's
into) and ``internlm2`` (its fused ``wqkv`` split and permuted by the converter). Checked
against llama.cpp and transformers, with the other row order as the negative control."""
import numpy as np
import pytest

from fastspec import Transformer
from fastspec.formats.gguf import GGUFFile, load_gguf
from fastspec.formats.gguf_write import save_gguf

pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402

from _helpers import hf_reference, llama_cpp_logits  # noqa: E402
from _gguf_writer import write_model  # noqa: E402

IDS = np.random.default_rng(3).integers(0, 300, 100)
FACTORS = np.linspace(5, 2, 8, dtype=np.float32)
#: The architecture whose q/k row order is the other one (the negative control).
OTHER = {"exaone": "llama", "ernie4_5": "exaone", "internlm2": "exaone"}


def _file(path, arch, types=(Q.F32,), **kw):
    """A random ``arch`` file; internlm2's has its own ``output.weight`` (llama.cpp needs it)."""
    return write_model(path, arch=arch, dim=64, n_layers=2, n_heads=4, n_kv=2, ffn=96,
                       types=types, tied=arch != "internlm2", **kw)


def _as(path, arch) -> Transformer:
    """The file's model read as if ``general.architecture`` were ``arch``."""
    f = GGUFFile(path)
    own = f.architecture + "."
    f.metadata = {(arch + "." + k[len(own):] if k.startswith(own) else k): v
                  for k, v in f.metadata.items()}
    f.architecture = arch
    return load_gguf(Transformer, f)


def _far(model: Transformer, ref: np.ndarray) -> bool:
    return np.abs(model.forward(IDS).logits - ref).max() > 1e-2 * np.abs(ref).max()


@pytest.mark.parametrize("arch, extra", [("exaone", {"rope_freqs.weight": FACTORS}),
                                         ("exaone", None), ("ernie4_5", None),
                                         ("internlm2", None)])
def test_matches_llama_cpp(tmp_path, arch, extra):
    pytest.importorskip("llama_cpp")
    path = tmp_path / "m.gguf"
    _file(path, arch, extra=extra)
    ours = Transformer.load(path)
    assert (ours.config.rope_freq_factors is not None) == (extra is not None)
    ref = llama_cpp_logits(path, IDS)
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=1e-4 * np.abs(ref).max())
    assert _far(_as(path, OTHER[arch]), ref)
    if extra is not None:
        plain = Transformer(ours.config.replace(rope_freq_factors=None), ours.embed,
                            ours.layers, ours.head, ours.final_norm)
        assert _far(plain, ref)


@pytest.mark.hf
def test_ernie_matches_transformers(tmp_path):
    """transformers' ERNIE 4.5 rotates interleaved pairs: the file's rows are its own."""
    path = tmp_path / "e.gguf"
    weights = _file(path, "ernie4_5", types=(Q.Q8_0, Q.F16, Q.Q4_1, Q.F32))
    ours = Transformer.load(path)
    cfg = dict(vocab_size=ours.config.vocab_size, hidden_size=64, intermediate_size=96,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True, use_bias=False,
               max_position_embeddings=512)
    ref = hf_reference("Ernie4_5ForCausalLM", cfg, IDS, weights=weights)  # lm_head: tied
    np.testing.assert_allclose(ours.forward(IDS).logits, ref, atol=1e-4 * np.abs(ref).max())
    assert _far(_as(path, "exaone"), ref)


@pytest.mark.parametrize("arch", ["exaone", "ernie4_5", "internlm2"])
def test_written_back_as_llama(tmp_path, arch):
    """Saved, such a model is the ``llama`` it computes (q/k permuted, factors kept)."""
    _file(tmp_path / "m.gguf", arch, extra={"rope_freqs.weight": FACTORS}
          if arch == "exaone" else None)
    ours = Transformer.load(tmp_path / "m.gguf")
    save_gguf(ours, tmp_path / "out.gguf", source=tmp_path / "m.gguf")
    f = GGUFFile(tmp_path / "out.gguf")
    assert f.architecture == "llama" and not any(k.startswith(arch + ".") for k in f.metadata)
    back = Transformer.load(tmp_path / "out.gguf")
    assert back.config == ours.config
    np.testing.assert_array_equal(back.forward(IDS).logits, ours.forward(IDS).logits)
    pytest.importorskip("llama_cpp")
    want = ours.forward(IDS).logits
    np.testing.assert_allclose(llama_cpp_logits(tmp_path / "out.gguf", IDS), want,
                               atol=1e-4 * np.abs(want).max())
