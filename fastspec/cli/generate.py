"""``fastspec generate``: text in, streamed text out, with any drafter, on any model file.

Without ``--model`` it runs the embedded byte-level bundle. With ``--model`` it reads a GGUF
file (or a catalog name such as ``smollm2``, or a model Ollama pulled such as ``llama3.2:1b``:
:func:`fastspec.models.resolve`) with the
tokenizer and chat template of its metadata (``[gguf]`` extra), or a Llama/Qwen2/Qwen3 Hugging
Face folder and its ``tokenizer.json`` (``[hf]`` extra for the tokenizer; ``--prompt-ids``
needs neither). ``--chat MESSAGE`` renders one user turn with the model's chat template and
stops at its end of turn. Every check that can fail (tokenizer, prompt length, drafter spec)
runs before the weights are read, except a GGUF file's prompt length (its config is read with
the weights).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from fastspec.cli.args import (MODEL_SOURCES, WEIGHT_DTYPES, add_kv_dtype_option,
                               add_sampling_options, add_threads_option, positive_int)
from fastspec.decoding import speculative_generate
from fastspec.drafters import DraftModelDrafter, NgramDrafter
from fastspec.drafters.base import Proposal
from fastspec.drafters.dflash import DFlashDrafter
from fastspec.drafters.dflash_model import DFlashModel
from fastspec.formats import json_io
from fastspec.model import Transformer
from fastspec.text.tokenizer import ByteTokenizer, StreamDecoder

__all__ = ["add_parser", "run", "run_generate", "stream_reply", "parse_drafter", "DrafterSpec",
           "NoDrafter", "GenerateError", "load_drafter", "drafter_gamma"]


class GenerateError(ValueError):
    """A bad argument of ``fastspec generate`` (printed without a traceback, exit status 2)."""


class NoDrafter:
    """A drafter that never proposes: plain decoding through the speculative loop (which
    streams through its per-round callback; one target call per token, as ``generate``)."""

    hidden_layers: tuple[int, ...] = ()
    max_gamma: int | None = None

    def __init__(self) -> None:
        self._empty = Proposal(np.zeros(0, dtype=np.int64))

    def reset(self, prompt, hidden) -> None:
        pass

    def propose(self, seq, gamma, sampling, rng) -> Proposal:
        return self._empty

    def commit(self, seq, n_accepted, hidden) -> None:
        pass


@dataclass(frozen=True)
class DrafterSpec:
    """``--drafter``: ``kind`` in {none, ngram, draft, dflash}; ``path`` None = embedded."""

    kind: str
    path: Path | None = None


def parse_drafter(text: str, embedded: bool) -> DrafterSpec:
    """Parse ``none | ngram | draft[:DIR] | dflash[:DIR]`` (bare draft/dflash: embedded only)."""
    kind, _, path = text.partition(":")
    if kind not in ("none", "ngram", "draft", "dflash"):
        raise GenerateError(f"--drafter must be none, ngram, draft:DIR or dflash:DIR, got {text!r}")
    if kind in ("none", "ngram"):
        if path:
            raise GenerateError(f"--drafter {kind} takes no path, got {text!r}")
        return DrafterSpec(kind)
    if not path:
        if not embedded:
            raise GenerateError(f"--drafter {kind} needs a path with --model: {kind}:DIR")
        return DrafterSpec(kind)
    p = Path(path)
    if not p.exists():
        raise GenerateError(f"--drafter {text!r}: {p} does not exist")
    return DrafterSpec(kind, p)


def _prompt_ids(args, tokenizer) -> list[int]:
    if getattr(args, "chat", None) is not None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise GenerateError("--chat needs a model with a chat template (a GGUF file or a "
                                "folder that has one); use --prompt for plain text")
        return tokenizer.apply_chat_template([{"role": "user", "content": args.chat}],
                                             add_generation_prompt=True, tokenize=True)
    if args.prompt_ids is not None:
        try:
            return [int(t) for t in args.prompt_ids.replace(",", " ").split()]
        except ValueError:
            raise GenerateError("--prompt-ids must be integers separated by commas or spaces, "
                                f"got {args.prompt_ids!r}") from None
    text = args.prompt if args.prompt is not None else sys.stdin.read()
    if not text:
        raise GenerateError("the prompt is empty: give --prompt TEXT, --prompt-ids or stdin")
    return tokenizer.encode_prompt(text)


def _check_length(n_prompt: int, max_new: int, max_seq_len: int, where: str) -> None:
    if n_prompt < 1:
        raise GenerateError("the prompt has no tokens")
    if n_prompt >= max_seq_len:
        raise GenerateError(f"the prompt has {n_prompt} tokens, longer than the model's "
                            f"max_seq_len {max_seq_len} ({where}) minus one new token")
    if n_prompt + max_new > max_seq_len:
        raise GenerateError(f"the prompt ({n_prompt} tokens) + --max-new-tokens ({max_new}) "
                            f"exceeds max_seq_len {max_seq_len} ({where}); use "
                            f"--max-new-tokens {max_seq_len - n_prompt} or less")


def _load(args):
    """Return ``(target, tokenizer or None, prompt ids, bundle or None)``; checks come first."""
    if args.model is None and args.weight_dtype != "auto":
        raise GenerateError("--weight-dtype applies to --model folders (the embedded models "
                            "keep their own)")
    if args.model is None and args.mmap:
        raise GenerateError("--mmap applies to --model folders (the embedded models are "
                            "package .npz files)")
    if args.model is None:
        from fastspec.models import pretrained

        tok = ByteTokenizer()
        ids = _prompt_ids(args, tok)
        with np.load(pretrained.data_dir() / "target.npz") as z:  # the package's own file
            max_seq_len = int(json.loads(str(z["config"]))["max_seq_len"])
        _check_length(len(ids), args.max_new_tokens, max_seq_len, "embedded target")
        bundle = pretrained.load()
        return bundle.target, tok, ids, bundle
    from fastspec.formats.gguf_header import is_gguf
    from fastspec.formats.hf_folder import hf_config
    from fastspec.models.catalog import resolve

    folder = resolve(args.model)
    if is_gguf(folder):
        return _load_gguf(args, folder)
    raw = json_io.read_json_object(folder / "config.json")
    if raw is None:
        raise GenerateError(f"--model {folder}: no config.json (not a Hugging Face folder)")
    tok = None
    if args.prompt_ids is None:
        from fastspec.text.hf_tokenizer import HFTokenizer

        tok = HFTokenizer.from_folder(folder)
    ids = _prompt_ids(args, tok)
    config = hf_config(raw)
    _check_length(len(ids), args.max_new_tokens, config.max_seq_len, str(folder / "config.json"))
    return (Transformer.load(folder, weight_dtype=args.weight_dtype, mmap=args.mmap), tok, ids,
            None)


def _load_gguf(args, path: Path):
    """``_load`` for a GGUF file: the model with the tokenizer of its metadata."""
    from fastspec.models.pretrained import load_pretrained

    if args.mmap:
        raise GenerateError("--mmap applies to Hugging Face folders")
    model, tok = load_pretrained(path, weight_dtype=args.weight_dtype,
                                 tokenizer=args.prompt_ids is None)
    ids = _prompt_ids(args, tok)
    _check_length(len(ids), args.max_new_tokens, model.config.max_seq_len, str(path))
    return model, tok, ids, None


def load_drafter(spec: DrafterSpec, target, bundle, sampling: bool, weight_dtype: str):
    """The drafter ``spec`` names, for ``target`` (``bundle``: the embedded models, or None);
    ``sampling`` makes a DFlash drafter sample its blocks."""
    if spec.kind == "none":
        return NoDrafter()
    if spec.kind == "ngram":
        return NgramDrafter.tuned()
    if spec.kind == "draft":
        draft = (bundle.draft if spec.path is None
                 else Transformer.load(spec.path, weight_dtype=weight_dtype))
        if draft.config.vocab_size != target.config.vocab_size:
            raise GenerateError(f"--drafter draft:{spec.path}: the draft model's vocabulary "
                                f"({draft.config.vocab_size} ids) differs from the target's "
                                f"({target.config.vocab_size} ids); a draft model must share "
                                "the target's tokenizer")
        return DraftModelDrafter(draft)
    model = bundle.dflash if spec.path is None else DFlashModel.load(spec.path, target)
    return DFlashDrafter(model, sample_block=sampling)


def drafter_gamma(args, kind: str):
    """``--gamma``, else the tuned default of drafter ``kind`` at ``args.temperature``."""
    if args.gamma is not None:
        return args.gamma
    if kind in ("draft", "ngram", "dflash"):
        from fastspec.tools.demo import default_gamma

        return default_gamma(kind, args.temperature)
    return 4


def run_generate(args, write: Callable[[str], None]) -> dict:
    """Run one generation as ``args`` say, streaming text to ``write``; return the report."""
    spec = parse_drafter(args.drafter or ("dflash" if args.model is None else "ngram"),
                         args.model is None)
    target, tok, ids, bundle = _load(args)
    if args.kv_dtype:
        target.kv_dtype = args.kv_dtype
    drafter = load_drafter(spec, target, bundle, args.temperature > 0, args.weight_dtype)
    gamma = drafter_gamma(args, spec.kind) if spec.kind != "none" else None
    report = stream_reply(target, tok, drafter, ids, args, gamma, write)
    return {"model": str(args.model) if args.model else "embedded",
            "drafter": spec.kind if spec.path is None else f"{spec.kind}:{spec.path}",
            "gamma": gamma, "weight_dtype": target.config.weight_dtype or target.config.dtype,
            "kv_dtype": target.kv_dtype or target.config.dtype, **report}


def stream_reply(target, tok, drafter, ids: list[int], args, gamma,
                 write: Callable[[str], None]) -> dict:
    """Decode after ``ids`` with ``drafter``, streaming the text to ``write`` as rounds are
    accepted and stopping at the tokenizer's stop ids; return the figures.

    ``args`` supplies ``max_new_tokens``, ``temperature``, ``top_k``, ``top_p`` and ``seed``.
    The report's ``tokens`` end with the stop token when one was emitted; its ``text`` does not.
    """
    stops = set(tok.stop_ids) if tok is not None else set()
    eos = tok.eos_id if tok is not None else None
    decoder = StreamDecoder(tok) if tok is not None else None
    n_prompt = len(ids)
    state = {"shown": n_prompt, "stopped": False}

    def stream(seq: np.ndarray, n: int) -> None:
        if state["stopped"] or decoder is None:
            return
        new = seq[state["shown"]:n].tolist()
        state["shown"] = n
        for i, t in enumerate(new):  # stop ids other than eos: stop showing, truncate later
            if t in stops:
                new, state["stopped"] = new[:i], True
                break
        text = decoder.push(new)
        if text:
            write(text)

    result = speculative_generate(
        target, drafter, ids, args.max_new_tokens, gamma=gamma or 1,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
        eos_token_id=eos, callback=stream)
    tokens = result.tokens
    cut = next((i for i, t in enumerate(tokens) if t in stops), None)
    if cut is not None:
        tokens = tokens[:cut + 1]
    stream(np.asarray(ids + tokens, dtype=np.int64), n_prompt + len(tokens))  # the last round
    if decoder is not None and not state["stopped"]:
        rest = decoder.flush()
        if rest:
            write(rest)
    st = result.stats
    elapsed = st.elapsed_s  # the whole call, prefill included
    return {
        "prompt_tokens": n_prompt, "tokens": tokens,
        "text": None if tok is None else tok.decode(  # the stop token has no text
            tokens[:-1] if tokens and tokens[-1] in stops else tokens),
        "new_tokens": len(tokens), "elapsed_s": elapsed,
        "tokens_per_s": len(tokens) / elapsed if elapsed > 0 else None,
        "tau": st.mean_accepted_length, "target_calls": st.target_calls,
        "acceptance_rate": st.acceptance_rate, "stats": st.to_dict(),
    }


def add_parser(sub) -> None:
    """Register ``generate`` on the subparsers ``sub``."""
    p = sub.add_parser(
        "generate", help="generate text from a prompt, streamed as it is accepted",
        description="Speculative decoding of a prompt with the embedded models, a GGUF file "
                    "(--model x.gguf or smollm2; the [gguf] extra) or a Llama/Qwen2/Qwen3 "
                    "Hugging Face folder (--model DIR, its tokenizer.json needs the [hf] "
                    "extra). Streams the text to stdout, then prints tokens/s, tau and target "
                    "calls to stderr.")
    p.add_argument("--model", metavar="PATH",
                   help=f"{MODEL_SOURCES} (default: the embedded models)")
    p.add_argument("--drafter", metavar="SPEC",
                   help="none | ngram | draft:DIR | dflash:DIR (embedded: draft, dflash); "
                        "default dflash (embedded) or ngram (--model)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="prompt text (default: read stdin)")
    src.add_argument("--prompt-ids", metavar="IDS", help="prompt token ids, comma separated "
                     "(no tokenizer needed; the output is printed as ids)")
    src.add_argument("--chat", metavar="MESSAGE",
                     help="one user message, rendered with the model's chat template; the "
                          "reply stops at its end of turn")
    p.add_argument("--max-new-tokens", type=positive_int, default=128, metavar="N",
                   help="tokens to generate (default 128)")
    add_sampling_options(p)
    p.add_argument("--json", action="store_true", help="print the text and figures as JSON")
    p.add_argument("--weight-dtype", choices=("auto",) + WEIGHT_DTYPES,
                   default="auto",
                   help="storage of a --model's matrices (default auto: the file's own: a "
                        "GGUF file's Q8_0/Q4_0/Q4_1 blocks as they are (Q4_K as q4_1 with its "
                        "4-bit values, another quantized type converted to q8_0), its "
                        "F16/BF16 as 16-bit; a folder's "
                        "bfloat16 or float16; else float32; 16-bit matrices halve the bytes "
                        "each decode step reads, q8_0 and q4_* (GGUF's blocks) quarter or "
                        "eighth them)")
    p.add_argument("--mmap", action="store_true",
                   help="map a --model folder's safetensors instead of reading them: tensors "
                        "already in their storage dtype are not read at load (the first "
                        "forward packs them) and their pages stay reclaimable page cache")
    add_kv_dtype_option(p)
    add_threads_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``fastspec generate``: text on stdout, the figures on stderr.

    Returns 0, or 2 on bad input (the message on stderr, no traceback).
    """
    def write(text: str) -> None:
        if not args.json:
            sys.stdout.write(text)
            sys.stdout.flush()

    try:
        report = run_generate(args, write)
    except (GenerateError, FileNotFoundError, ValueError) as exc:
        print(f"fastspec generate: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json_io.dumps(report))
        return 0
    if report["text"] is None:
        print(" ".join(map(str, report["tokens"])), end="")
    print()
    print(f"{report['new_tokens']} tokens in {report['elapsed_s']:.2f} s: "
          f"{report['tokens_per_s']:.1f} tokens/s, tau {report['tau']:.2f}, "
          f"{report['target_calls']} target calls (drafter {report['drafter']}"
          + (f", gamma {report['gamma']})" if report["gamma"] is not None else ")"),
          file=sys.stderr)
    return 0
