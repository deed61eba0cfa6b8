import numpy as np
import pytest

import fastspec as fs


@pytest.mark.parametrize("backend", fs.available_backends())
def test_attention_smoke(benchmark, backend):
    mod = fs.kernels.module(backend)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, 64)).astype(np.float32)
    k = rng.standard_normal((8, 128, 64)).astype(np.float32)
    benchmark(mod.attention, q, k, k, 128)
