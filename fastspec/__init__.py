"""fastspec: lossless speculative decoding on the CPU, with a typed Cython core.

See ``docs/`` and the README for the API tour. Everything public is importable from here.
"""
from fastspec.kernels import backend, set_backend, using_backend, available_backends
from fastspec import kernels
from fastspec.kernels.cache import KVCache
from fastspec.model import ModelConfig, Transformer, ForwardOutput
from fastspec import formats  # registers the model file reader behind Transformer.load
from fastspec.drafters import Drafter, Proposal, Target, DraftModelDrafter, NgramDrafter
from fastspec.drafters.base import SamplingParams
from fastspec.decoding import DecodeStats, GenerationResult, generate, speculative_generate
from fastspec.drafters.dflash_model import DFlashConfig, DFlashModel
from fastspec.drafters.dflash import DFlashDrafter
from fastspec.text.tokenizer import ByteTokenizer, StreamDecoder, Tokenizer
from fastspec.models.pretrained import load_pretrained
from fastspec.text.hf_tokenizer import HFTokenizer
from fastspec.models import pretrained

from fastspec.version import __version__

__all__ = [
    "__version__", "backend", "set_backend", "using_backend", "available_backends", "kernels",
    "KVCache", "ModelConfig", "Transformer", "ForwardOutput",
    "Drafter", "Proposal", "Target", "SamplingParams", "DraftModelDrafter", "NgramDrafter",
    "DecodeStats", "GenerationResult", "generate", "speculative_generate",
    "DFlashConfig", "DFlashModel", "DFlashDrafter", "ByteTokenizer", "StreamDecoder", "Tokenizer",
    "HFTokenizer", "load_pretrained", "pretrained",
]
