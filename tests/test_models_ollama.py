"""Models Ollama pulled: a name finds its manifest and the GGUF blob behind it, which loads like a
``.gguf`` file although its name is ``sha256-<hex>``; broken stores give clear errors."""
import hashlib
import json

import numpy as np
import pytest

import fastspec as fs
from fastspec.cli import main
from fastspec.formats.gguf_header import is_gguf
from fastspec.models import catalog, ollama

HOST = "registry.ollama.ai"


def _layer(media_type, data=b"", digest=None):
    digest = digest or "sha256:" + hashlib.sha256(data).hexdigest()
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _pull(root, name, blob=b"GGUF" + bytes(60), layers=None, manifest=None):
    """Write ``name`` (host/namespace/model/tag parts) into the store ``root`` as Ollama does:
    the blob under its sha256, the manifest under manifests/; return the blob's path."""
    digest = hashlib.sha256(blob).hexdigest()
    path = root / "blobs" / f"sha256-{digest}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(blob)
    if layers is None:
        layers = [_layer(ollama.MODEL_MEDIA_TYPE, blob),
                  _layer("application/vnd.ollama.image.template", b"{{ .Prompt }}")]
    m = root / "manifests" / "/".join(name)
    m.parent.mkdir(parents=True, exist_ok=True)
    m.write_text(json.dumps({"schemaVersion": 2, "layers": layers}) if manifest is None
                 else manifest)
    return path


@pytest.fixture
def store(tmp_path, monkeypatch):
    root = tmp_path / "models"
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    return root


@pytest.mark.parametrize("name, parts", [
    ("llama3.2", (HOST, "library", "llama3.2", "latest")),
    ("qwen2.5:0.5b", (HOST, "library", "qwen2.5", "0.5b")),
    ("ollama:qwen2.5:0.5b", (HOST, "library", "qwen2.5", "0.5b")),
    ("user/my-model:q4_K_M", (HOST, "user", "my-model", "q4_K_M")),
    ("hf.co/org/Repo-GGUF:Q8_0", ("hf.co", "org", "Repo-GGUF", "Q8_0")),
    ("localhost:5000/ns/m", ("localhost:5000", "ns", "m", "latest")),
    ("localhost:5000/ns/m:v1", ("localhost:5000", "ns", "m", "v1")),
])
def test_names_take_ollamas_defaults(name, parts):
    assert ollama.parse_name(name) == parts


@pytest.mark.parametrize("name", ["", ":tag", "m:", "../x", "a/../b", "..", "a/b/c/d", "a//b",
                                  "m:t/x", "m x", "m:../t", "/abs", "m:t:u", "ollama:"])
def test_bad_names_are_refused(name):
    with pytest.raises(ValueError, match="Ollama model name"):
        ollama.parse_name(name)
    assert not ollama.pulled(name)


def test_names_match_without_regard_to_case_as_ollama(store):
    """Ollama keeps a name's case as pulled (hf.co repositories) and looks names up without
    regard to it; a hidden file is no model."""
    blob = _pull(store, ("hf.co", "Org", "Llama-3.2-1B-GGUF", "Q4_K_M"))
    for name in ("hf.co/org/llama-3.2-1b-gguf:q4_k_m", "hf.co/Org/Llama-3.2-1B-GGUF:Q4_K_M",
                 "HF.CO/ORG/LLAMA-3.2-1B-GGUF:q4_k_m"):
        assert ollama.find(name) == blob, name
    (store / "manifests" / "hf.co" / "Org" / "Llama-3.2-1B-GGUF" / ".DS_Store").write_text("")
    assert ollama.names() == ["hf.co/Org/Llama-3.2-1B-GGUF:Q4_K_M"]


def test_a_closed_service_folder_is_no_store(tmp_path, monkeypatch):
    """The Linux service's home is often closed to other users; Path.is_dir then raises
    PermissionError on Python 3.11 (simulated: the tests may run as root)."""
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    closed = tmp_path / "service"
    monkeypatch.setattr(ollama, "_SERVICE_DIR", closed)
    is_dir = type(closed).is_dir

    def refuse(self):
        if str(self).startswith(str(closed)):
            raise PermissionError(13, "Permission denied", str(self))
        return is_dir(self)

    monkeypatch.setattr(type(closed), "is_dir", refuse)
    assert ollama.models_dir() == tmp_path / ".ollama" / "models"
    with pytest.raises(FileNotFoundError, match="not a model Ollama pulled"):
        catalog.resolve("typo.gguf")


def test_find_returns_the_model_layers_blob(store):
    blob = _pull(store, (HOST, "library", "tiny", "latest"))
    other = _pull(store, (HOST, "user", "other", "q8"), blob=b"GGUF" + bytes(8))
    hf = _pull(store, ("hf.co", "org", "Repo", "Q4_K_M"), blob=b"GGUF" + bytes(9))
    for name in ("tiny", "tiny:latest", "library/tiny", f"{HOST}/library/tiny:latest",
                 "ollama:tiny", "TINY", "Library/Tiny:LATEST"):
        assert ollama.find(name) == blob, name
    assert ollama.find("user/other:q8") == other
    assert ollama.find("hf.co/org/Repo:Q4_K_M") == hf
    assert ollama.names() == ["hf.co/org/Repo:Q4_K_M", "tiny:latest", "user/other:q8"]
    assert ollama.pulled("tiny") and not ollama.pulled("tiny:1b")
    assert "and 1 more" in ollama.listing(limit=2)


def test_the_models_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(ollama, "_SERVICE_DIR", tmp_path / "service")
    assert ollama.models_dir() == tmp_path / ".ollama" / "models"
    assert ollama.names() == [] and "none pulled into" in ollama.listing()
    (tmp_path / "service").mkdir()
    assert ollama.models_dir() == tmp_path / "service"  # the Linux service's, when home has none
    (tmp_path / ".ollama" / "models").mkdir(parents=True)
    assert ollama.models_dir() == tmp_path / ".ollama" / "models"
    monkeypatch.setenv("OLLAMA_MODELS", "~/elsewhere")
    assert ollama.models_dir() == tmp_path / "elsewhere"


def test_broken_stores_are_clear_errors(store):
    tiny = (HOST, "library", "tiny", "latest")
    with pytest.raises(FileNotFoundError, match=r"not found \(none pulled into .*ollama pull "
                                                r"tiny:1b"):
        ollama.find("tiny:1b")
    blob = _pull(store, tiny)
    with pytest.raises(FileNotFoundError, match=r"pulled into .*: tiny:latest\)"):
        ollama.find("ollama:tiny:1b")
    cases = [
        (dict(manifest="{not json"), ValueError, "not JSON"),
        (dict(manifest="[1, 2]"), ValueError, "no list of layers"),
        (dict(manifest=" " * (ollama._MAX_MANIFEST + 1)), ValueError, "too large"),
        (dict(layers=[]), ValueError, "0 layers of type"),
        (dict(layers=[_layer(ollama.MODEL_MEDIA_TYPE, b"a"), _layer(ollama.MODEL_MEDIA_TYPE)]),
         ValueError, "2 layers of type"),
        (dict(layers=[_layer(ollama.MODEL_MEDIA_TYPE, digest="sha256:../../../etc/passwd")]),
         ValueError, "digest"),
        (dict(layers=[_layer(ollama.MODEL_MEDIA_TYPE, digest="sha256:" + "A" * 64)]),
         ValueError, "digest"),
        (dict(layers=[_layer(ollama.MODEL_MEDIA_TYPE, digest="sha512:" + "a" * 128)]),
         ValueError, "digest"),
        (dict(layers=[_layer(ollama.MODEL_MEDIA_TYPE, b"never written")]),
         FileNotFoundError, "blob of Ollama model .* is missing"),
        (dict(blob=b"GGML" + bytes(60)), ValueError, "not a GGUF file"),
        (dict(manifest="[" * 100000), ValueError, "not JSON"),  # nested past the recursion
        (dict(layers=[_layer(ollama.MODEL_MEDIA_TYPE, b"GGUF"),
                      _layer("application/vnd.ollama.image.adapter", b"lora")]),
         ValueError, "LoRA adapter"),
    ]
    for kw, exc, message in cases:
        _pull(store, tiny, **kw)
        with pytest.raises(exc, match=message):
            ollama.find("tiny")
        with pytest.raises(exc, match=message):  # resolve says the same of a pulled name
            catalog.resolve("tiny")
    _pull(store, tiny)
    assert catalog.resolve("tiny") == blob
    blob.unlink()
    blob.mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        ollama.find("tiny")


def test_resolve_order(store, tmp_path, monkeypatch):
    blob = _pull(store, (HOST, "library", "tiny", "latest"))
    _pull(store, (HOST, "library", "smollm2", "latest"), blob=b"GGUF" + bytes(5))
    absent = catalog.CatalogEntry("numpy", "0", "no-such-file.gguf", "numpy holds no model")
    monkeypatch.setitem(catalog.CATALOG, "smollm2", absent)
    monkeypatch.setitem(catalog.CATALOG, "ghost", absent)
    # a catalog name not installed falls through to Ollama's model of that name
    assert catalog.resolve("smollm2") == ollama.find("smollm2")
    with pytest.raises(FileNotFoundError, match="is not installed"):
        catalog.resolve("ghost")  # nor pulled: the catalog's message
    installed = tmp_path / "installed.gguf"
    installed.write_bytes(b"GGUF")
    monkeypatch.setattr(catalog, "find", lambda name: installed)
    assert catalog.resolve("smollm2") == installed  # both there: the catalog's first
    assert catalog.resolve("ollama:smollm2") == ollama.find("smollm2")
    assert catalog.resolve("tiny") == catalog.resolve("ollama:tiny") == blob
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").write_bytes(b"a file")
    assert catalog.resolve("tiny").resolve() == tmp_path / "tiny"  # a path first
    with pytest.raises(FileNotFoundError, match=r"not a model Ollama pulled \(pulled into "):
        catalog.resolve("nothing")
    with pytest.raises(FileNotFoundError, match="ollama pull nothing"):
        catalog.resolve("ollama:nothing")
    with pytest.raises(ValueError, match="Ollama model name"):
        catalog.resolve("ollama:../x")


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("name", ["fifo", "x.gguf"])
def test_a_fifo_is_not_opened(tmp_path, name):
    """Opening a FIFO blocks until a writer comes: is_gguf looks at regular files only, and
    the GGUF reader refuses one named ``.gguf``."""
    import os
    import threading

    from fastspec.model import Transformer

    fifo = tmp_path / name
    os.mkfifo(fifo)
    result: list = []

    def run() -> None:
        try:
            result.append(Transformer.load(fifo) if name.endswith(".gguf") else is_gguf(fifo))
        except ValueError as exc:
            result.append(str(exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(5)
    blocked = worker.is_alive()
    if blocked:  # release it (a writer that closes at once), then fail
        os.close(os.open(fifo, os.O_WRONLY))
        worker.join(5)
    assert not blocked
    assert result == [False] if name == "fifo" else "not a regular file" in result[0]


def test_gguf_is_known_by_its_bytes(tmp_path):
    assert is_gguf(tmp_path / "empty.gguf")  # a .gguf name: its reader says what is wrong
    (tmp_path / "d.gguf").mkdir()
    assert not is_gguf(tmp_path / "d.gguf") and not is_gguf(tmp_path)
    (tmp_path / "sha256-ab").write_bytes(b"GGUF\x03")
    (tmp_path / "m.npz").write_bytes(b"PK\x03\x04")
    assert is_gguf(tmp_path / "sha256-ab") and not is_gguf(tmp_path / "m.npz")
    assert not is_gguf(tmp_path / "missing")


@pytest.fixture
def tiny_gguf(store, tmp_path):
    """A random qwen2 GGUF file with a tokenizer, pulled as ``tiny`` (and kept as x.gguf)."""
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    pytest.importorskip("jinja2")
    from gguf import GGMLQuantizationType as Q
    from _gguf_writer import write_model

    path = tmp_path / "x.gguf"
    write_model(path, types=(Q.Q8_0, Q.Q4_1), dim=64, n_layers=2, n_heads=4, n_kv=2, ffn=128)
    return path, _pull(store, (HOST, "library", "tiny", "latest"), blob=path.read_bytes())


def test_a_pulled_model_loads_and_runs_as_its_file(tiny_gguf, capsys, tmp_path):
    path, blob = tiny_gguf
    ids = [1, 5, 7, 9]
    a = fs.Transformer.load(path, weight_dtype="auto")
    b = fs.Transformer.load(blob, weight_dtype="auto")  # no .gguf name: known by its bytes
    assert b.config.weight_dtype == a.config.weight_dtype == "q8_0"
    assert np.array_equal(a.step(ids, a.new_cache(16)).logits,
                          b.step(ids, b.new_cache(16)).logits)
    model, tok = fs.load_pretrained("ollama:tiny", weight_dtype="auto")
    assert tok.encode("hello") == fs.load_pretrained(path, tokenizer=True)[1].encode("hello")
    assert fs.generate(model, ids, 8).tokens == fs.generate(a, ids, 8).tokens
    runs = []
    for name in (str(path), "tiny", "ollama:tiny"):
        rc = main(["generate", "--model", name, "--prompt-ids", "1,5,7,9", "--max-new-tokens",
                   "8", "--drafter", "ngram", "--json"])
        out = capsys.readouterr()
        assert rc == 0, out.err
        runs.append(json.loads(out.out)["tokens"])
    assert runs[0] == runs[1] == runs[2] == fs.generate(a, ids, 8).tokens
    out = tmp_path / "q.gguf"
    assert main(["quantize", "tiny", str(out), "--type", "q4_0", "--quiet"]) == 0
    assert fs.Transformer.load(out, weight_dtype="auto").config.weight_dtype == "q4_0"
