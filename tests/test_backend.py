import os

import pytest

import fastspec as fs


def test_env_selects_backend():
    wanted = os.environ.get("FASTSPEC_BACKEND")
    if wanted:
        assert fs.backend() == wanted


def test_cython_backend_is_built_when_installed():
    # CI installs the wheel, which must carry the compiled module.
    if os.environ.get("CI"):
        assert "cython" in fs.available_backends()


def test_set_backend_rejects_unknown_name():
    with pytest.raises(ValueError, match="backend"):
        fs.set_backend("fortran")


def test_set_backend_round_trip():
    previous = fs.backend()
    for name in fs.available_backends():
        fs.set_backend(name)
        assert fs.backend() == name
        assert fs.kernels.attention is getattr(fs.kernels.module(name), "attention")
    fs.set_backend(previous)
