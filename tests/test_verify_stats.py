"""Statistical test of verify_rejection: the emitted tokens have exactly the target distribution.

Over 100k independent rounds (draft tokens sampled from q, or fixed for one-hot proposals), the
first emitted token must be distributed as p[0] and, given that the first draft token was
accepted, the second as p[1]. A chi-square test at the 1e-6 level decides; a negative control
(a verifier whose correction is drawn from p instead of the residual max(p - q, 0), or from p
with the proposal left in) must be rejected by the very same test.
"""
import numpy as np
import pytest

import fastspec as fs

DRAWS = 100_000
#: chi-square critical values at the 1e-6 level, by degrees of freedom
CHI2_CRITICAL = {3: 30.66, 4: 33.38}

P = np.array([[0.35, 0.25, 0.20, 0.15, 0.05],
              [0.05, 0.10, 0.40, 0.25, 0.20],
              [0.20, 0.20, 0.20, 0.20, 0.20]])
Q = np.array([[0.10, 0.40, 0.10, 0.30, 0.10],
              [0.30, 0.30, 0.10, 0.10, 0.20]])


def chi_square(tokens, expected):
    counts = np.bincount(tokens, minlength=len(expected))
    n = counts.sum()
    return float(((counts - n * expected) ** 2 / (n * expected)).sum())


def consistent_with(tokens, expected):
    """True when the observed tokens are consistent with `expected` at the 1e-6 level."""
    return chi_square(tokens, expected) < CHI2_CRITICAL[len(expected) - 1]


def emitted(verify, p, q, seed, one_hot):
    """Run `verify` DRAWS times; return (first tokens, second tokens given a first accept)."""
    rng = np.random.default_rng(seed)
    g, vocab = q.shape
    if one_hot:  # deterministic proposals (any rule independent of the uniforms): the first
        # is always the argmax, as a greedy drafter would propose; a uniform rule would hide
        # the negative control's bias, which is proportional to p(x) - mean p(x).
        drafts = np.stack([np.zeros(DRAWS, np.int64), np.arange(DRAWS) % 3], axis=1)
    else:
        drafts = np.stack([rng.choice(vocab, DRAWS, p=q[i]) for i in range(g)], axis=1)
    uniforms = rng.random((DRAWS, g + 1))
    first, second = np.empty(DRAWS, np.int64), []
    q_arg = None if one_hot else q
    for t in range(DRAWS):
        n_accepted, token = verify(drafts[t], p, q_arg, uniforms[t])
        first[t] = drafts[t, 0] if n_accepted >= 1 else token
        if n_accepted >= 1:
            second.append(drafts[t, 1] if n_accepted >= 2 else token)
    return first, np.array(second, np.int64)


def broken_verify(draft_tokens, p, q, uniforms):
    """Negative control: like the real verifier but the correction comes from p itself."""
    g = len(draft_tokens)
    for i in range(g):
        x = draft_tokens[i]
        qx = 1.0 if q is None else q[i, x]
        if uniforms[i] * qx < p[i, x]:
            continue
        cum = np.cumsum(p[i])
        return i, int(np.searchsorted(cum, uniforms[g] * cum[-1], side="right"))
    cum = np.cumsum(p[g])
    return g, int(np.searchsorted(cum, uniforms[g] * cum[-1], side="right"))


@pytest.mark.parametrize("one_hot", [False, True], ids=["q", "onehot"])
def test_verify_rejection_emits_the_target_distribution(backend, one_hot):
    verify = fs.kernels.module(backend).verify_rejection
    first, second = emitted(verify, P, Q, seed=1 if one_hot else 0, one_hot=one_hot)
    assert consistent_with(first, P[0]), chi_square(first, P[0])
    assert len(second) > 20_000
    assert consistent_with(second, P[1]), chi_square(second, P[1])


@pytest.mark.parametrize("one_hot", [False, True], ids=["q", "onehot"])
def test_negative_control_is_detected(one_hot):
    first, _ = emitted(broken_verify, P, Q, seed=2, one_hot=one_hot)
    assert not consistent_with(first, P[0]), chi_square(first, P[0])


def test_statistic_has_power_against_a_small_bias():
    # Sanity check of the test itself: a 1% shift of mass between two tokens is detected.
    rng = np.random.default_rng(3)
    biased = P[0] + np.array([0.01, -0.01, 0, 0, 0])
    assert consistent_with(rng.choice(5, DRAWS, p=P[0]), P[0])
    assert not consistent_with(rng.choice(5, DRAWS, p=biased), P[0])
