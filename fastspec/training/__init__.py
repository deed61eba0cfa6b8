"""Training of the embedded default models (the ``[train]`` extra: importing this needs PyTorch).

- :mod:`~fastspec.training.modules`: PyTorch twins of the NumPy forward passes of
  docs/FORMATS.md (the Llama-style target/draft and the DFlash drafter), parameters named
  after the Hugging Face keys;
- :mod:`~fastspec.training.weights`: configs and the ``.npz`` weight files (checked
  against fastspec's weight schema);
- :mod:`~fastspec.training.data`: corpus windows, greedy episodes, DFlash anchors;
- :mod:`~fastspec.training.objectives`: losses and evaluations;
- :mod:`~fastspec.training.loops`: ``train_target``, ``train_draft``, ``train_dflash``;
- :mod:`~fastspec.training.command`: the command line (``fastspec train``)::

    python -m fastspec.training target --minutes 65 --out fastspec/data/target.npz

The corpus is the interpreter's standard library (:mod:`fastspec.text.corpus`), tokenised by
:class:`fastspec.text.tokenizer.ByteTokenizer`. Weight files are ``.npz`` with a ``"config"`` key
(JSON) and float16 weights; fastspec computes in float32. ``import fastspec`` never imports
this package (nor torch).
"""
from fastspec.training.modules import build_dflash, build_transformer, n_params
from fastspec.training.weights import (check_schema, dflash_config, export_npz, load_dflash_npz,
                                       load_transformer_npz, model_config)
from fastspec.training.data import greedy_generate, make_greedy_episodes
from fastspec.training.objectives import (dflash_loss, dflash_packed_logits, evaluate_bpb,
                                          evaluate_dflash)
from fastspec.training.loops import Budget, train_dflash, train_draft, train_target
from fastspec.training.command import build_parser, main

__all__ = ["Budget", "model_config", "dflash_config", "build_transformer", "build_dflash",
           "n_params", "export_npz", "load_transformer_npz", "load_dflash_npz", "check_schema",
           "evaluate_bpb", "evaluate_dflash", "greedy_generate", "make_greedy_episodes",
           "dflash_packed_logits", "dflash_loss", "train_target", "train_draft",
           "train_dflash", "build_parser", "main"]
