"""Bad input, cross-cutting: one table of calls that must be refused.

Each case is ``(name, call, error type, regex)``: ``call(env)`` must raise the error with a
message matching the regex (the argument's name). Every case runs on both backends, against
caches that already hold positions; afterwards the target and draft caches (including the
DFlash drafter's context cache) must be exactly as before: same length, same buffer contents.

Per-kernel argument checks are also in tests/test_kernel_args.py; here the kernels are called
on the live cache buffers so that a refused call that wrote anything would be caught.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import fastspec as fs
from fastspec import Proposal

F32, F64 = np.float32, np.float64
NAN, INF = math.nan, math.inf


def _target_config(**kw) -> fs.ModelConfig:
    fields = dict(vocab_size=40, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                  max_seq_len=48)
    fields.update(kw)
    return fs.ModelConfig(**fields)


class Env:
    """Models and pre-filled caches shared by the cases (rebuilt per test)."""

    def __init__(self):
        self.target = fs.Transformer.random(_target_config(), seed=0)
        self.draft = fs.Transformer.random(_target_config(n_layers=1), seed=1)
        self.wide = fs.Transformer.random(_target_config(dim=48, n_heads=4), seed=2)
        self.dflash = fs.DFlashModel.random(fs.DFlashConfig(block_size=4), self.target, seed=3)
        self.dflash_drafter = fs.DFlashDrafter(self.dflash)
        self.drafter = fs.DraftModelDrafter(self.draft)
        self.tc = self.target.new_cache()
        self.dc = self.draft.new_cache()
        prompt = np.array([1, 5, 7, 2, 9, 3], dtype=np.int64)
        out = self.target.forward(prompt, self.tc, hidden_layers=self.dflash.config.tap_layers)
        self.draft.forward(prompt, self.dc)
        self.dflash_drafter.reset(np.append(prompt, 4), out.hidden)
        self.caches = {"target": self.tc, "draft": self.dc, "dflash": self.dflash_drafter.cache}

    def snapshot(self):
        return {name: (c.length, c.k.copy(), c.v.copy()) for name, c in self.caches.items()}

    def assert_unchanged(self, snap):
        for name, c in self.caches.items():
            length, k, v = snap[name]
            assert c.length == length, f"{name} cache length {c.length} != {length}"
            np.testing.assert_array_equal(c.k, k, err_msg=f"{name} cache keys changed")
            np.testing.assert_array_equal(c.v, v, err_msg=f"{name} cache values changed")


class BadDrafter:
    """A drafter whose proposals break the protocol in a chosen way."""

    hidden_layers: tuple[int, ...] = ()
    max_gamma = None

    def __init__(self, tokens, q=None):
        self.tokens, self.q = tokens, q

    def reset(self, prompt, hidden):
        pass

    def propose(self, seq, gamma, sampling, rng):
        return Proposal(np.asarray(self.tokens), self.q)

    def commit(self, seq, n_accepted, hidden):
        pass


def gen(e, **kw):
    args = dict(prompt_ids=[1, 2, 3], max_new_tokens=4, cache=e.tc)
    args.update(kw)
    return fs.generate(e.target, **args)


def spec(e, drafter=None, **kw):
    args = dict(prompt_ids=[1, 2, 3], max_new_tokens=4, cache=e.tc)
    args.update(kw)
    return fs.speculative_generate(e.target, e.drafter if drafter is None else drafter, **args)


def k(e, name, **args):
    """Call the active backend's kernel ``name``."""
    return getattr(fs.kernels, name)(**args)


def attn(e, **change):
    """Attention over the target cache's layer-0 buffers (q: 2 new positions, 4 heads)."""
    q = np.ones((2, 4, 8), F32)
    args = dict(q=q, k_cache=e.tc.k[0], v_cache=e.tc.v[0], length=e.tc.length, causal=True,
                out=None)
    args.update(change)
    return fs.kernels.attention(**args)


def cw(e, **change):
    """cache_write into the target cache's layer-0 key buffer at its length."""
    args = dict(cache=e.tc.k[0], new=np.ones((2, 2, 8), F32), start=e.tc.length)
    args.update(change)
    return fs.kernels.cache_write(**args)


def read_only(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


def rows(*r, dtype=F32):
    return np.array(r, dtype=dtype)


P3 = rows([0.5, 0.5, 0.0], [0.25, 0.25, 0.5], [0.0, 0.0, 1.0])
Q2 = rows([0.5, 0.5, 0.0], [0.25, 0.25, 0.5])


def rej(e, **change):
    args = dict(draft_tokens=np.array([0, 1]), p=P3.copy(), q=Q2.copy(),
                uniforms=np.array([0.1, 0.2, 0.3]))
    args.update(change)
    return fs.kernels.verify_rejection(**args)


def dflash_load_other_width(e, tmp):
    path = tmp / "dflash.npz"
    e.dflash.save(path)
    return fs.DFlashModel.load(path, e.wide)


V = 40  # target vocabulary

CASES = [
    # --- token ids and prompts ----------------------------------------------------------
    ("generate: negative prompt id", lambda e: gen(e, prompt_ids=[1, -1]), ValueError, "prompt_ids"),
    ("generate: prompt id == vocab", lambda e: gen(e, prompt_ids=[V]), ValueError, "prompt_ids"),
    ("generate: float prompt ids", lambda e: gen(e, prompt_ids=[1.0, 2.0]), TypeError, "prompt_ids"),
    ("generate: 2-D prompt", lambda e: gen(e, prompt_ids=[[1, 2]]), ValueError, "prompt_ids"),
    ("generate: empty prompt", lambda e: gen(e, prompt_ids=[]), ValueError, "prompt_ids"),
    ("speculative: negative prompt id", lambda e: spec(e, prompt_ids=[-3]), ValueError, "prompt_ids"),
    ("speculative: prompt id > vocab", lambda e: spec(e, prompt_ids=[2, 10**6]), ValueError, "prompt_ids"),
    ("speculative: empty prompt", lambda e: spec(e, prompt_ids=np.zeros(0, np.int64)), ValueError, "prompt_ids"),
    ("forward: id == vocab on a cache", lambda e: e.target.forward([1, V], e.tc), ValueError, "ids"),
    ("forward: negative id on a cache", lambda e: e.target.forward([-1], e.tc), ValueError, "ids"),
    ("forward: empty ids", lambda e: e.target.forward([], e.tc), ValueError, "ids"),
    ("draft forward: id out of range", lambda e: e.draft.forward([V + 5], e.dc), ValueError, "ids"),
    ("dflash forward_block: id out of range",
     lambda e: e.dflash.forward_block(e.dflash_drafter.cache, [1, V]), ValueError, "block_tokens"),
    ("dflash mask_block: bonus out of range", lambda e: e.dflash.mask_block(V), ValueError, "bonus_token"),
    # --- lengths ----------------------------------------------------------------------------
    ("generate: prompt + max_new_tokens > max_seq_len",
     lambda e: gen(e, prompt_ids=[1] * 40, max_new_tokens=9, cache=None), ValueError, "max_new_tokens"),
    ("speculative: prompt + max_new_tokens > max_seq_len",
     lambda e: spec(e, max_new_tokens=46, cache=None), ValueError, "max_seq_len"),
    ("generate: max_new_tokens 0", lambda e: gen(e, max_new_tokens=0), ValueError, "max_new_tokens"),
    ("speculative: max_new_tokens -1", lambda e: spec(e, max_new_tokens=-1), ValueError, "max_new_tokens"),
    ("speculative: max_new_tokens 2.0", lambda e: spec(e, max_new_tokens=2.0), TypeError, "max_new_tokens"),
    ("generate: cache too small", lambda e: gen(e, cache=e.target.new_cache(5)), ValueError, "cache capacity"),
    ("speculative: cache of another model", lambda e: spec(e, cache=e.dc), ValueError, "cache"),
    ("forward: past the cache capacity",
     lambda e: e.target.forward([1] * 43, e.tc), ValueError, "capacity"),
    ("forward: cache of another model", lambda e: e.target.forward([1], e.dc), ValueError, "cache"),
    ("forward: not a cache", lambda e: e.target.forward([1], "cache"), TypeError, "cache"),
    ("forward: hidden layer out of range",
     lambda e: e.target.forward([1], e.tc, hidden_layers=[2]), ValueError, "hidden_layers"),
    ("forward: out of the wrong shape",
     lambda e: e.target.forward([1], e.tc, out=np.zeros((2, V), F32)), ValueError, "out"),
    ("forward: read-only out",
     lambda e: e.target.forward([1], e.tc, out=read_only(np.zeros((1, V), F32))), ValueError, "out"),
    # --- gamma and sampling settings ------------------------------------------------------------
    ("speculative: gamma 0", lambda e: spec(e, gamma=0), ValueError, "gamma"),
    ("speculative: gamma -2", lambda e: spec(e, gamma=-2), ValueError, "gamma"),
    ("speculative: gamma 2.5", lambda e: spec(e, gamma=2.5), TypeError, "gamma"),
    ("speculative: gamma True", lambda e: spec(e, gamma=True), (TypeError, ValueError), "gamma"),
    ("speculative: gamma 'fast'", lambda e: spec(e, gamma="fast"), ValueError, "gamma"),
    ("generate: temperature -0.5", lambda e: gen(e, temperature=-0.5), ValueError, "temperature"),
    ("speculative: temperature NaN", lambda e: spec(e, temperature=NAN), ValueError, "temperature"),
    ("speculative: temperature inf", lambda e: spec(e, temperature=INF), ValueError, "temperature"),
    ("generate: temperature 'hot'", lambda e: gen(e, temperature="hot"), TypeError, "temperature"),
    ("generate: top_k -1", lambda e: gen(e, temperature=1.0, top_k=-1), ValueError, "top_k"),
    ("speculative: top_k 1.5", lambda e: spec(e, top_k=1.5), TypeError, "top_k"),
    ("generate: top_p 0", lambda e: gen(e, top_p=0.0), ValueError, "top_p"),
    ("speculative: top_p -0.1", lambda e: spec(e, top_p=-0.1), ValueError, "top_p"),
    ("speculative: top_p 1.5", lambda e: spec(e, top_p=1.5), ValueError, "top_p"),
    ("generate: top_p NaN", lambda e: gen(e, top_p=NAN), ValueError, "top_p"),
    ("speculative: seed -1", lambda e: spec(e, seed=-1), ValueError, "seed"),
    ("speculative: eos id == vocab", lambda e: spec(e, eos_token_id=V), ValueError, "eos_token_id"),
    ("speculative: not a drafter", lambda e: spec(e, drafter=object()), TypeError, "drafter"),
    # --- logits / probability rows / uniforms (kernels) ------------------------------------------
    ("probs: NaN logits", lambda e: k(e, "probs", logits=rows([0.0, NAN])), ValueError, "logits"),
    ("probs: inf logits", lambda e: k(e, "probs", logits=rows([[0.0, INF]])), ValueError, "logits"),
    ("probs: -inf logits", lambda e: k(e, "probs", logits=rows([-INF, 0.0], dtype=F64)), ValueError, "logits"),
    ("probs: temperature NaN", lambda e: k(e, "probs", logits=rows([0.0, 1.0]), temperature=NAN), ValueError, "temperature"),
    ("probs: top_p 2", lambda e: k(e, "probs", logits=rows([0.0, 1.0]), top_p=2.0), ValueError, "top_p"),
    ("verify_greedy: NaN target logits",
     lambda e: k(e, "verify_greedy", draft_tokens=np.array([0]), target_logits=rows([0, 1], [NAN, 0])),
     ValueError, "target_logits"),
    ("verify_greedy: token == vocab",
     lambda e: k(e, "verify_greedy", draft_tokens=np.array([2]), target_logits=rows([0, 1], [1, 0])),
     ValueError, "draft_tokens"),
    ("sample: negative probability", lambda e: k(e, "sample", p=rows(-0.1, 1.1, dtype=F64), u=0.5), ValueError, r"\bp\b"),
    ("sample: u == 1", lambda e: k(e, "sample", p=rows(0.5, 0.5, dtype=F64), u=1.0), ValueError, r"\bu\b"),
    ("sample: u NaN", lambda e: k(e, "sample", p=rows(0.5, 0.5, dtype=F64), u=NAN), ValueError, r"\bu\b"),
    ("verify_rejection: p row sums to 0.9",
     lambda e: rej(e, p=rows([0.5, 0.4, 0.0], [0.25, 0.25, 0.5], [0, 0, 1])), ValueError, r"\bp rows"),
    ("verify_rejection: q negative entry",
     lambda e: rej(e, q=rows([0.5, 0.6, -0.1], [0.25, 0.25, 0.5])), ValueError, r"\bq\b"),
    ("verify_rejection: q NaN", lambda e: rej(e, q=rows([NAN, 0.5, 0.5], [0.25, 0.25, 0.5])), ValueError, r"\bq\b"),
    ("verify_rejection: p inf", lambda e: rej(e, p=rows([INF, 0, 0], [0.25, 0.25, 0.5], [0, 0, 1])), ValueError, r"\bp\b"),
    ("verify_rejection: uniform 1.0", lambda e: rej(e, uniforms=np.array([0.1, 1.0, 0.3])), ValueError, "uniforms"),
    ("verify_rejection: uniform -0.1", lambda e: rej(e, uniforms=np.array([-0.1, 0.5, 0.3])), ValueError, "uniforms"),
    ("verify_rejection: uniform NaN", lambda e: rej(e, uniforms=np.array([0.1, NAN, 0.3])), ValueError, "uniforms"),
    ("verify_rejection: float32 uniforms",
     lambda e: rej(e, uniforms=np.array([0.1, 0.2, 0.3], F32)), TypeError, "uniforms"),
    ("verify_rejection: token out of range", lambda e: rej(e, draft_tokens=np.array([0, 3])), ValueError, "draft_tokens"),
    ("verify_rejection: p and q of other dtypes", lambda e: rej(e, q=Q2.astype(F64)), TypeError, r"\bq\b"),
    # --- kernel arrays on the live cache buffers --------------------------------------------------
    ("attention: float64 q on a float32 cache", lambda e: attn(e, q=np.ones((2, 4, 8), F64)), TypeError, "k_cache"),
    ("attention: int q", lambda e: attn(e, q=np.ones((2, 4, 8), np.int32)), TypeError, r"\bq\b"),
    ("attention: q of rank 2", lambda e: attn(e, q=np.ones((2, 32), F32)), ValueError, r"\bq\b"),
    ("attention: k_cache of rank 4", lambda e: attn(e, k_cache=e.tc.k), ValueError, "k_cache"),
    ("attention: non-contiguous q", lambda e: attn(e, q=np.ones((2, 8, 8), F32)[:, ::2]), ValueError, r"\bq\b"),
    ("attention: non-contiguous k_cache",
     lambda e: attn(e, k_cache=e.tc.k[0, :, ::2], v_cache=e.tc.v[0, :, ::2], length=2), ValueError, "k_cache"),
    ("attention: read-only out", lambda e: attn(e, out=read_only(np.zeros((2, 4, 8), F32))), ValueError, "out"),
    ("attention: out of another shape", lambda e: attn(e, out=np.zeros((2, 4, 4), F32)), ValueError, "out"),
    ("attention: v_cache of another shape", lambda e: attn(e, v_cache=e.tc.v[0, :, :40]), ValueError, "v_cache"),
    ("attention: head_dim mismatch", lambda e: attn(e, q=np.ones((2, 4, 4), F32)), ValueError, "head_dim"),
    ("attention: heads not a multiple of kv heads", lambda e: attn(e, q=np.ones((2, 3, 8), F32)), ValueError, "n_heads"),
    ("attention: length > capacity", lambda e: attn(e, length=49), ValueError, "length"),
    ("attention: length < n", lambda e: attn(e, length=1), ValueError, "length"),
    ("attention: length 2.0", lambda e: attn(e, length=2.0), TypeError, "length"),
    ("attention: a list for q", lambda e: attn(e, q=[[[1.0] * 8] * 4] * 2), TypeError, r"\bq\b"),
    ("cache_write: past the capacity", lambda e: cw(e, start=47), ValueError, "capacity"),
    ("cache_write: negative start", lambda e: cw(e, start=-1), ValueError, "start"),
    ("cache_write: new of another shape", lambda e: cw(e, new=np.ones((2, 4, 8), F32)), ValueError, "new"),
    ("cache_write: new float64", lambda e: cw(e, new=np.ones((2, 2, 8), F64)), TypeError, "new"),
    ("cache_write: non-contiguous new", lambda e: cw(e, new=np.ones((2, 2, 16), F32)[:, :, ::2]), ValueError, "new"),
    ("cache_write: read-only cache", lambda e: cw(e, cache=read_only(e.tc.k[0])), ValueError, "cache"),
    ("cache_write: rank-4 cache", lambda e: cw(e, cache=e.tc.k), ValueError, "cache"),
    # --- KVCache crop / advance -----------------------------------------------------------------------
    ("crop: beyond length", lambda e: e.tc.crop(e.tc.length + 1), ValueError, "length"),
    ("crop: negative", lambda e: e.tc.crop(-1), ValueError, "length"),
    ("crop: float", lambda e: e.dc.crop(1.5), TypeError, "length"),
    ("crop: None", lambda e: e.dc.crop(None), TypeError, "length"),
    ("advance: past capacity", lambda e: e.tc.advance(e.tc.capacity), ValueError, r"\bn\b"),
    ("advance: negative", lambda e: e.tc.advance(-1), ValueError, r"\bn\b"),
    ("KVCache: capacity 0", lambda e: fs.KVCache(1, 1, 0, 4), ValueError, "capacity"),
    ("new_cache: capacity > max_seq_len", lambda e: e.target.new_cache(49), ValueError, "capacity"),
    # --- drafters that break the protocol ---------------------------------------------------------------
    ("drafter proposes id == vocab", lambda e: spec(e, BadDrafter([1, V]), cache=None), ValueError, "drafter proposed token ids"),
    ("drafter proposes a negative id", lambda e: spec(e, BadDrafter([-1]), cache=None), ValueError, "drafter proposed token ids"),
    ("drafter proposes more than gamma", lambda e: spec(e, BadDrafter([1] * 9), gamma=2, cache=None), ValueError, "gamma"),
    ("drafter proposes floats", lambda e: spec(e, BadDrafter([1.0]), cache=None), ValueError, "drafter proposal tokens"),
    ("drafter q of the wrong shape",
     lambda e: spec(e, BadDrafter([1], np.full((1, 5), 0.2, F32)), temperature=1.0, cache=None), ValueError, "drafter proposal q"),
    ("drafter q with NaN",
     lambda e: spec(e, BadDrafter([1], np.full((1, V), NAN, F32)), temperature=1.0, cache=None), ValueError, r"\bq\b"),
    ("drafter hidden layer out of range",
     lambda e: spec(e, type("D", (BadDrafter,), {"hidden_layers": (7,)})([1])), ValueError, "hidden_layers"),
    ("drafter max_gamma 0", lambda e: spec(e, type("D", (BadDrafter,), {"max_gamma": 0})([1])), ValueError, "max_gamma"),
    # --- DFlash paired with a target of another width ------------------------------------------------
    ("dflash drafter on a wider target",
     lambda e: fs.speculative_generate(e.wide, e.dflash_drafter, [1, 2, 3], 4, cache=None), ValueError, "target"),
    ("dflash weights on a wider target",
     lambda e: fs.DFlashModel(e.dflash.config, e.wide, e.dflash.fc, e.dflash.hidden_norm,
                              e.dflash.layers, e.dflash.norm), ValueError, "fc"),
    ("dflash context of the wrong width",
     lambda e: e.dflash.append_context(e.dflash_drafter.cache, np.zeros((1, 48), F32)), ValueError, "features"),
    ("dflash block on the target's cache",
     lambda e: e.dflash.forward_block(e.tc, [1, 2]), ValueError, "cache"),
]

IDS = [c[0] for c in CASES]
assert len(set(IDS)) == len(IDS), "case names must be unique"


@pytest.fixture
def env(backend):
    return Env()


@pytest.mark.parametrize("name, call, error, pattern", CASES, ids=IDS)
def test_bad_input_is_refused_and_caches_are_unchanged(env, name, call, error, pattern):
    snap = env.snapshot()
    with pytest.raises(error, match=pattern):
        call(env)
    env.assert_unchanged(snap)


def test_dflash_file_for_another_width_is_refused(backend, tmp_path):
    e = Env()
    snap = e.snapshot()
    with pytest.raises(ValueError, match="fc"):
        dflash_load_other_width(e, tmp_path)
    e.assert_unchanged(snap)


def test_models_still_agree_after_every_refusal(backend):
    """A refused call leaves no hidden state behind: the next valid call gives the same tokens
    as a fresh environment (fused runner scratch, drafter state, caches)."""
    fresh = Env()
    want = fs.speculative_generate(fresh.target, fresh.drafter, [1, 2, 3], 6, gamma=3).tokens
    e = Env()
    for _, call, error, _ in CASES:
        with pytest.raises(error):
            call(e)
    got = fs.speculative_generate(e.target, e.drafter, [1, 2, 3], 6, gamma=3).tokens
    assert got == want
