"""``fastspec chat``: a conversation in the terminal, replies streamed as they are verified.

Each turn renders the whole conversation with the model's chat template, decodes the reply
speculatively (n-gram prompt lookup by default: a chat keeps quoting itself), streams it, and
prints tokens/s and tau after it, like llama-cli's conversation mode. ``/reset`` starts over,
``/exit`` or end of input leaves.
"""
from __future__ import annotations

import argparse
import sys
from typing import TextIO

from fastspec.cli.args import (MODEL_SOURCES, WEIGHT_DTYPES, add_kv_dtype_option,
                               add_sampling_options, add_threads_option, positive_int)

__all__ = ["add_parser", "run", "converse"]


def converse(model, tok, drafter, args, lines: TextIO, out: TextIO, err: TextIO,
             gamma) -> int:
    """Run the conversation loop over the user ``lines``; return the number of replies.

    Parameters
    ----------
    model : Transformer
    tok : HFTokenizer
        With a chat template.
    drafter : Drafter
        Reset by the loop at the start of each reply.
    args : argparse.Namespace
        ``system``, ``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``, ``seed``.
    lines, out, err : text files
        The user's input, the replies, the prompts and figures.
    gamma : int, "adaptive" or None
    """
    from fastspec.cli.generate import stream_reply  # the engine, when a conversation starts

    messages = [{"role": "system", "content": args.system}] if args.system else []
    replies = 0
    while True:
        err.write("> ")
        err.flush()
        line = lines.readline()
        if not line or line.strip() == "/exit":
            return replies
        text = line.rstrip("\n")
        if text.strip() == "/reset":
            messages = messages[:1] if args.system else []
            continue
        if not text.strip():
            continue
        messages.append({"role": "user", "content": text})
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        room = model.config.max_seq_len - len(ids)
        if room < 2:
            err.write("the conversation fills the model's context; /reset to start over\n")
            messages.pop()
            continue
        args.max_new_tokens = min(args.max_new_tokens, room - 1)

        def write(chunk: str) -> None:
            out.write(chunk)
            out.flush()

        report = stream_reply(model, tok, drafter, ids, args, gamma, write)
        out.write("\n")
        err.write(f"[{report['new_tokens']} tokens, {report['tokens_per_s']:.1f} tokens/s, "
                  f"tau {report['tau']:.2f}, prompt {report['prompt_tokens']} tokens]\n")
        messages.append({"role": "assistant", "content": report["text"]})
        replies += 1


def add_parser(sub) -> None:
    """Register ``chat`` on the subparsers ``sub``."""
    p = sub.add_parser(
        "chat", help="a conversation with a chat model, replies streamed with tokens/s and tau",
        description=f"Chat with a model that has a chat template: {MODEL_SOURCES}. Replies "
                    "stream as the target verifies them; tokens/s and tau follow each one. "
                    "/reset starts over, /exit or end of input leaves.")
    p.add_argument("--model", required=True, metavar="PATH",
                   help=MODEL_SOURCES)
    p.add_argument("--drafter", default="ngram", metavar="SPEC",
                   help="none | ngram | draft:DIR | dflash:DIR (default ngram)")
    p.add_argument("--system", default=None, help="a system message for the conversation")
    p.add_argument("--max-new-tokens", type=positive_int, default=512, metavar="N",
                   help="longest reply (default 512)")
    add_sampling_options(p)
    p.add_argument("--weight-dtype", choices=("auto",) + WEIGHT_DTYPES, default="auto",
                   help="storage of the matrices (default auto: the file's own, as in "
                        "fastspec generate: a GGUF file's Q8_0/Q4_0/Q4_1 blocks as they are)")
    add_kv_dtype_option(p)
    add_threads_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``fastspec chat``; 0, or 2 on bad input (message on stderr)."""
    from fastspec.cli.generate import GenerateError, drafter_gamma, load_drafter, parse_drafter
    from fastspec.models.catalog import resolve
    from fastspec.models.pretrained import load_pretrained

    try:
        spec = parse_drafter(args.drafter, embedded=False)
        model, tok = load_pretrained(resolve(args.model), weight_dtype=args.weight_dtype,
                                     kv_dtype=args.kv_dtype)
        if tok.chat_template is None:
            raise GenerateError(f"{args.model}: the model has no chat template")
        drafter = load_drafter(spec, model, None, args.temperature > 0, args.weight_dtype)
        gamma = drafter_gamma(args, spec.kind) if spec.kind != "none" else None
    except (GenerateError, FileNotFoundError, ValueError) as exc:
        print(f"fastspec chat: {exc}", file=sys.stderr)
        return 2
    converse(model, tok, drafter, args, sys.stdin, sys.stdout, sys.stderr, gamma)
    return 0
