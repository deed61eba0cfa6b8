import os

import pytest

import fastspec as fs


@pytest.mark.skipif(not os.environ.get("FASTSPEC_BACKEND"), reason="FASTSPEC_BACKEND not set")
def test_env_selects_backend():
    assert fs.backend() == os.environ["FASTSPEC_BACKEND"]


@pytest.mark.skipif(not os.environ.get("CI"), reason="only CI installs the wheel")
def test_cython_backend_is_built_when_installed():
    # CI installs the wheel, which must carry the compiled module.
    assert "cython" in fs.available_backends()


def test_set_backend_rejects_unknown_name():
    with pytest.raises(ValueError, match="backend"):
        fs.set_backend("fortran")


def test_set_backend_round_trip():
    previous = fs.backend()
    try:
        for name in fs.available_backends():
            fs.set_backend(name)
            assert fs.backend() == name
            assert fs.kernels.attention is getattr(fs.kernels.module(name), "attention")
    finally:
        fs.set_backend(previous)


def test_using_backend_restores_the_previous_one():
    previous = fs.backend()
    for name in fs.available_backends():
        with fs.using_backend(name):
            assert fs.backend() == name
            assert fs.kernels.probs is fs.kernels.module(name).probs
        assert fs.backend() == previous
        with pytest.raises(KeyError), fs.using_backend(name):
            raise KeyError("an error inside the block")
        assert fs.backend() == previous
    with pytest.raises(ValueError, match="backend"), fs.using_backend("fortran"):
        pass  # pragma: no cover - the bad name raises before the block
    assert fs.backend() == previous


def test_cli_backend_option_does_not_outlive_main(capsys):
    from fastspec.cli import main
    previous = fs.backend()
    others = [b for b in fs.available_backends() if b != previous]
    if not others:
        pytest.skip("needs a second backend")
    other = others[0]
    assert main(["--backend", other]) == 0  # no command: the info page
    assert other in capsys.readouterr().out
    assert fs.backend() == previous
