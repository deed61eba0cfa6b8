"""Peers: the same weights and prompts through Hugging Face transformers (``fastspec bench
--peers``)."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from fastspec.decoding import generate, speculative_generate
from fastspec.drafters import DraftModelDrafter, NgramDrafter
from fastspec.tools.rounds import prompt_tokens

__all__ = ["HFPair", "peers"]


class HFPair:
    """A fastspec target and draft exported to Hugging Face and loaded by ``transformers``.

    Generation is greedy, with no EOS, an explicit all-ones attention mask (the prompt may
    contain any id) and assisted generation fixed at 4 draft tokens per round, to match
    ``speculative_generate(gamma=4)``. ``target_calls`` counts the target's forward calls.
    """

    def __init__(self, target, draft, threads: int = 2) -> None:
        import tempfile

        import torch
        import transformers

        torch.set_num_threads(threads)
        self.torch = torch
        with tempfile.TemporaryDirectory() as tmp:
            target.save(Path(tmp) / "target")
            draft.save(Path(tmp) / "draft")
            load = lambda d: transformers.AutoModelForCausalLM.from_pretrained(  # noqa: E731
                Path(tmp) / d, dtype=torch.float32).eval()
            self.target, self.draft = load("target"), load("draft")
        for m in (self.target, self.draft):
            m.generation_config.eos_token_id = None
            m.generation_config.pad_token_id = m.config.vocab_size - 1
        self.draft.generation_config.num_assistant_tokens = 4
        self.draft.generation_config.num_assistant_tokens_schedule = "constant"
        self.target_calls = 0
        self.target.register_forward_pre_hook(lambda *a: self._count())

    def _count(self) -> None:
        self.target_calls += 1

    def kwargs(self, pair: str) -> dict:
        """Extra ``generate`` arguments of ``pair``: greedy, assisted or lookup."""
        return {"greedy": {}, "assisted": {"assistant_model": self.draft},
                "lookup": {"prompt_lookup_num_tokens": 4}}[pair]

    def generate(self, ids, new_tokens: int, pair: str = "greedy") -> tuple[list[int], float, int]:
        """Return ``(new tokens, seconds, target forward calls)``."""
        torch = self.torch
        inp = torch.tensor(np.asarray(ids)[None, :], dtype=torch.long)
        self.target_calls = 0
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.target.generate(inp, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                       do_sample=False, attention_mask=torch.ones_like(inp),
                                       **self.kwargs(pair))
            dt = time.perf_counter() - t0
        return out[0, inp.shape[1]:].tolist(), dt, self.target_calls


def peers(target, draft, new_tokens: int = 256, prompt_len: int = 64, threads: int = 2) -> dict:
    """fastspec vs Hugging Face transformers on the same weights (needs the ``[hf]`` extra).

    Greedy ``generate``, assisted generation with the same draft, and prompt lookup, each
    compared on tokens/s, output equality and target forward calls.
    """
    import torch
    import transformers

    hf = HFPair(target, draft, threads)
    ids = prompt_tokens(prompt_len, target.config.vocab_size)

    def fs_run(fn):
        fn()  # warm-up
        t0 = time.perf_counter()
        res = fn()
        dt = time.perf_counter() - t0
        calls_ = res.stats.target_calls if hasattr(res, "stats") and res.stats.target_calls else len(res.tokens)
        return list(res.tokens), dt, calls_

    pairs = {
        "greedy": (lambda: hf.generate(ids, new_tokens, "greedy"),
                   lambda: generate(target, ids, new_tokens)),
        "assisted / draft model": (lambda: hf.generate(ids, new_tokens, "assisted"),
                                   lambda: speculative_generate(target, DraftModelDrafter(draft),
                                                                ids, new_tokens, gamma=4)),
        "prompt lookup / n-gram": (lambda: hf.generate(ids, new_tokens, "lookup"),
                                   lambda: speculative_generate(target, NgramDrafter(max_ngram=3),
                                                                ids, new_tokens, gamma=4)),
    }
    rows = []
    for name, (hf_fn, fs_fn) in pairs.items():
        hf_fn()  # warm-up
        hf_tokens, hf_dt, hf_calls = hf_fn()
        fs_tokens, fs_dt, fs_calls = fs_run(fs_fn)
        same = hf_tokens == fs_tokens
        first_diff = next((i for i, (a, b) in enumerate(zip(hf_tokens, fs_tokens)) if a != b), None)
        rows.append({"pair": name, "hf_tokens_per_s": new_tokens / hf_dt,
                     "fs_tokens_per_s": len(fs_tokens) / fs_dt, "ratio": (len(fs_tokens) / fs_dt) / (new_tokens / hf_dt),
                     "hf_target_calls": hf_calls, "fs_target_calls": fs_calls,
                     "identical": same, "first_difference": first_diff})
    return {"transformers": transformers.__version__, "torch": torch.__version__,
            "threads": threads, "new_tokens": new_tokens, "rows": rows}
