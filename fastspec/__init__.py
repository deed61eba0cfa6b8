"""fastspec: lossless speculative decoding on the CPU, with a typed Cython core.

See ``docs/`` and the README for the API tour. Everything public is importable from here.
"""
from fastspec.kernels import backend, set_backend, using_backend, available_backends
from fastspec.kernels import get_threads, set_threads
from fastspec import kernels
from fastspec.kernels.cache import KVCache
from fastspec.model.config import ModelConfig
from fastspec.model.output import ForwardOutput
from fastspec.model.transformer import Transformer
from fastspec.formats import transformer_io  # noqa: F401 (registers Transformer.load/save)
from fastspec.drafters.base import Drafter, Proposal, SamplingParams, Target
from fastspec.drafters.draft_model import DraftModelDrafter
from fastspec.drafters.ngram import NgramDrafter
from fastspec.decoding.stats import DecodeStats, GenerationResult
from fastspec.decoding.vanilla import generate
from fastspec.decoding.speculative import speculative_generate
from fastspec.drafters.dflash_model import DFlashConfig, DFlashModel
from fastspec.drafters.dflash import DFlashDrafter
from fastspec.text.tokenizer import ByteTokenizer, StreamDecoder, Tokenizer
from fastspec.models.pretrained import load_pretrained
from fastspec.text.hf_tokenizer import HFTokenizer
from fastspec.models import pretrained
from fastspec import models

from fastspec.version import __version__

__all__ = [
    "__version__", "backend", "set_backend", "using_backend", "available_backends", "kernels",
    "set_threads", "get_threads",
    "KVCache", "ModelConfig", "Transformer", "ForwardOutput",
    "Drafter", "Proposal", "Target", "SamplingParams", "DraftModelDrafter", "NgramDrafter",
    "DecodeStats", "GenerationResult", "generate", "speculative_generate",
    "DFlashConfig", "DFlashModel", "DFlashDrafter", "ByteTokenizer", "StreamDecoder", "Tokenizer",
    "HFTokenizer", "load_pretrained", "pretrained", "models",
]
