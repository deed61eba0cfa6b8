"""``fastspec quantize IN OUT --type q8_0|q4_0|q4_1``: end to end, and its errors."""
import numpy as np
import pytest

import fastspec as fs
from fastspec.cli import main
from fastspec.formats.gguf import GGUFFile
from fastspec.model import ModelConfig, Transformer

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402

from _gguf_writer import write_model  # noqa: E402


def test_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["quantize", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "usage: fastspec quantize" in text and "--type" in text and "q4_1" in text


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1"])
def test_gguf_in_gguf_out(tmp_path, kind, capsys):
    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    write_model(src, arch="qwen2", types=(Q.F16, Q.Q8_0, Q.Q4_1, Q.Q6_K), dim=256, n_heads=4,
                n_kv=2, ffn=512)
    assert main(["quantize", str(src), str(out), "--type", kind]) == 0
    assert "wrote" in capsys.readouterr().err
    model = Transformer.load(out, weight_dtype=kind)
    kinds = {getattr(lw, m).kind for lw in model.layers for m in ("wq", "wk", "w_down")}
    assert kinds == {kind} and model.embed.kind == kind
    meta, src_meta = GGUFFile(out).metadata, GGUFFile(src).metadata
    assert meta["tokenizer.ggml.merges"] == src_meta["tokenizer.ggml.merges"]
    assert meta["general.file_type"] == int(getattr(gguf.LlamaFileType, f"MOSTLY_{kind.upper()}"))
    # a file's blocks of the requested type are kept byte for byte
    reader = {t.name: t for t in gguf.GGUFReader(src).tensors}
    for name, t in reader.items():
        if t.tensor_type.name.lower() == kind and name.startswith("blk.1.ffn"):
            out_t = {t.name: t for t in gguf.GGUFReader(out).tensors}[name]
            np.testing.assert_array_equal(np.array(out_t.data), np.array(t.data))


def test_keep_native_keeps_other_native_blocks(tmp_path):
    src, out = tmp_path / "src.gguf", tmp_path / "out.gguf"
    write_model(src, types=(Q.Q8_0, Q.Q4_1), dim=128, n_heads=4, n_kv=2, ffn=256)
    assert main(["quantize", str(src), str(out), "--type", "q4_1", "--keep-native",
                 "--quiet"]) == 0
    model = Transformer.load(out, weight_dtype="q4_1")
    kinds = {getattr(lw, m).kind for lw in model.layers for m in ("wq", "wk", "wv", "wo")}
    assert kinds == {"q8_0", "q4_1"}


def test_npz_and_folder_inputs(tmp_path):
    base = Transformer.random(ModelConfig(vocab_size=64, dim=64, n_layers=1, n_heads=2,
                                          ffn_dim=64, max_seq_len=64), seed=2)
    base.save(tmp_path / "m.npz")
    base.save(tmp_path / "folder")
    for src in ("m.npz", "folder"):
        out = tmp_path / f"{src}.gguf"
        assert main(["quantize", str(tmp_path / src), str(out), "--type", "q8_0",
                     "--quiet"]) == 0
        back = Transformer.load(out, weight_dtype="q8_0")
        want = base.quantize("q8_0")
        np.testing.assert_array_equal(back.layers[0].w_up.to_blocks(),
                                      want.layers[0].w_up.to_blocks())


def test_embedded_target(tmp_path):
    if not fs.pretrained.available():
        pytest.skip("embedded model files not installed")
    out = tmp_path / "t.gguf"
    assert main(["quantize", "embedded:target", str(out), "--type", "q8_0", "--quiet"]) == 0
    model = Transformer.load(out, weight_dtype="q8_0")
    want = fs.pretrained.load(weight_dtype="q8_0").target
    ids = [1, 60, 70, 80]
    np.testing.assert_array_equal(model.forward(ids).logits, want.forward(ids).logits)


def test_errors_are_clear(tmp_path, capsys):
    out = tmp_path / "o.gguf"
    assert main(["quantize", str(tmp_path / "missing"), str(out), "--type", "q8_0"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["quantize", "x", str(tmp_path / "o.bin"), "--type", "q8_0"]) == 2
    assert "must end in .gguf" in capsys.readouterr().err
    out.write_bytes(b"")
    assert main(["quantize", "x", str(out), "--type", "q8_0"]) == 2
    assert "--force" in capsys.readouterr().err
    toy = tmp_path / "toy.npz"
    Transformer.random(ModelConfig.toy(dim=32)).save(toy)
    assert main(["quantize", str(toy), str(tmp_path / "t.gguf"), "--type", "q8_0"]) == 2
    assert "Llama-family" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["quantize", "a", "b.gguf", "--type", "q5_0"])
