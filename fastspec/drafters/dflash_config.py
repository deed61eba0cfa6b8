"""DFlashConfig: the shape of a DFlash drafter, resolved against its target's ModelConfig."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from fastspec.kernels.checks import check_index, check_known_fields
from fastspec.model.config import ModelConfig, freq_factors
from fastspec.text.tokenizer import ByteTokenizer

__all__ = ["CONTEXT_WINDOW_KEY", "DFlashConfig", "MAX_BLOCK_SIZE", "default_tap_layers"]

#: Largest supported block (the paper uses 8 to 16).
MAX_BLOCK_SIZE = 16
#: Config key of a drafter's trained context length in fastspec's ``.npz`` (beside the
#: :class:`DFlashConfig` fields; read into :attr:`fastspec.DFlashModel.context_window`).
CONTEXT_WINDOW_KEY = "context_window"
#: DFlashConfig fields of z-lab's format, at the values that mean "off".
_ZLAB_DEFAULTS = {"last_tap_normed": False, "input_embedding_scale": 1.0,
                  "output_multiplier": 1.0, "final_logit_softcapping": 0.0,
                  "rope_freq_factors": None}

def default_tap_layers(n_target_layers: int, n_draft_layers: int = 1) -> tuple[int, ...]:
    """Return ``k = min(L, max(2, n_draft_layers))`` target layers spread evenly, ending at L-1.

    This is the rule of ``fastspec.training.dflash_config`` (the torch trainer), so a config
    written without explicit taps resolves the same way on both sides.
    """
    L = check_index(n_target_layers, "n_target_layers", 1, 2**31 - 1)
    k = min(L, max(2, n_draft_layers))
    return tuple(sorted({round((i + 1) * L / k) - 1 for i in range(k)}))


@dataclass(frozen=True)
class DFlashConfig:
    """Shape of a DFlash drafter; fields left as None are taken from the target.

    Every field has a default, so ``DFlashConfig(block_size=8)`` is a valid config;
    :meth:`resolve` fills the None fields from a target's :class:`ModelConfig`.

    Parameters
    ----------
    block_size : int, default 8
        Block length B (bonus token + B-1 masks), ``2 <= B <= 16``; one round drafts up to B-1.
    n_layers : int, default 1
        Number of draft layers.
    tap_layers : tuple of int, optional
        Target layers whose outputs feed the context features, in concatenation order.
        Default: :func:`default_tap_layers` (spread over the target, always the last layer).
        Negative indices count from the end and are normalised by :meth:`resolve`.
    n_heads, n_kv_heads, head_dim, ffn_dim : int, optional
        Attention/MLP shape of the draft layers (default: the target's, as the torch trainer
        does; ``n_kv_heads`` falls back to ``n_heads`` when the target's does not divide it).
    qk_norm : bool, optional
        Per-head RMSNorm on queries and keys (Qwen3 style); default: as the target.
    rope_theta, norm_eps : float, optional
        Default: the target's.
    rope_freq_factors : tuple of float, optional
        The drafter's own per-frequency RoPE divisors (head_dim // 2 positive values; a z-lab
        drafter for a Llama 3.1+ target reads them from its config.json's llama3
        ``rope_scaling``, as :attr:`ModelConfig.rope_freq_factors`). Default None: plain RoPE,
        whatever the target's (fastspec's trainer drafts with plain RoPE).
    mask_token_id : int, optional
        Id of the MASK token (an embedding row of the target). Default: 258 (the byte
        tokenizer's MASK) when the target vocabulary has 260 entries, else ``vocab_size - 1``.
        The latter is a convention for toy targets without a dedicated MASK token: the id is
        then also an ordinary token, which is harmless (drafts are verified) but wastes the
        drafter's capacity; give an explicit id for real vocabularies.
    last_tap_normed : bool, default False
        Take the tap of the target's last layer after the target's final norm. This is the
        z-lab convention (their drafters read ``transformers``' ``hidden_states[L]``, which
        is taken after the final norm); fastspec's own drafters tap every layer before it.
    input_embedding_scale, output_multiplier : float, default 1.0
        z-lab's scale of the block's token embeddings and of the drafter's logits.
    final_logit_softcapping : float, default 0.0
        z-lab's ``tanh`` cap of the drafter's logits (0: none).

    Notes
    -----
    Only :meth:`DFlashModel.block_logits` implements ``input_embedding_scale``,
    ``output_multiplier`` and ``final_logit_softcapping``; a :class:`DFlashModel` refuses
    other values than the defaults (its fast block forward does not apply them yet).
    """

    block_size: int = 8
    n_layers: int = 1
    tap_layers: tuple[int, ...] | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    head_dim: int | None = None
    ffn_dim: int | None = None
    qk_norm: bool | None = None
    rope_theta: float | None = None
    norm_eps: float | None = None
    mask_token_id: int | None = None
    last_tap_normed: bool = False
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float = 0.0
    rope_freq_factors: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        check_index(self.block_size, "block_size", 2, MAX_BLOCK_SIZE)
        check_index(self.n_layers, "n_layers", 1, 1024)
        if self.tap_layers is not None:
            taps = tuple(check_index(t, "tap_layers", -2**31, 2**31 - 1) for t in self.tap_layers)
            if not taps:
                raise ValueError("tap_layers must not be empty")
            object.__setattr__(self, "tap_layers", taps)
        for name in ("n_heads", "n_kv_heads", "head_dim", "ffn_dim"):
            if getattr(self, name) is not None:
                check_index(getattr(self, name), name, 1, 2**31 - 1)
        if self.mask_token_id is not None:
            check_index(self.mask_token_id, "mask_token_id", 0, 2**31 - 1)
        if self.qk_norm is not None and not isinstance(self.qk_norm, (bool, np.bool_)):
            raise TypeError(f"qk_norm must be a bool or None, got {self.qk_norm!r}")
        for name in ("rope_theta", "norm_eps", "input_embedding_scale", "output_multiplier"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(float(v)) and float(v) > 0):
                raise ValueError(f"{name} must be positive, got {v}")
        if not (math.isfinite(float(self.final_logit_softcapping))
                and float(self.final_logit_softcapping) >= 0):
            raise ValueError("final_logit_softcapping must be >= 0 (0: off), got "
                             f"{self.final_logit_softcapping}")
        if not isinstance(self.last_tap_normed, (bool, np.bool_)):
            raise TypeError(f"last_tap_normed must be a bool, got {self.last_tap_normed!r}")
        if self.rope_freq_factors is not None:
            object.__setattr__(self, "rope_freq_factors", freq_factors(self.rope_freq_factors))

    @property
    def resolved(self) -> bool:
        """True when no field is None (the config of a built :class:`DFlashModel`), but
        ``rope_freq_factors``, whose None means plain RoPE."""
        return all(getattr(self, f.name) is not None for f in dataclasses.fields(self)
                   if f.name != "rope_freq_factors")

    def resolve(self, target: ModelConfig) -> "DFlashConfig":
        """Return a copy with every None field taken from ``target`` and checked against it.

        Raises
        ------
        ValueError
            If a tap layer, the MASK id or the head geometry does not fit the target.
        """
        if not isinstance(target, ModelConfig):
            raise TypeError(f"target must be a ModelConfig, got {type(target).__name__}")
        L = target.n_layers
        taps = self.tap_layers if self.tap_layers is not None else default_tap_layers(L, self.n_layers)
        taps = tuple(check_index(t, "tap_layers", -L, L - 1) % L for t in taps)
        if len(set(taps)) != len(taps):
            raise ValueError(f"tap_layers must not repeat a layer, got {list(taps)}")
        n_heads = self.n_heads if self.n_heads is not None else target.n_heads
        if self.n_kv_heads is not None:
            n_kv = self.n_kv_heads
        elif n_heads % target.n_kv_heads == 0:
            n_kv = target.n_kv_heads
        else:
            n_kv = n_heads
        head_dim = self.head_dim if self.head_dim is not None else target.head_dim
        if n_heads % n_kv:
            raise ValueError(f"n_heads {n_heads} must be a multiple of n_kv_heads {n_kv}")
        if head_dim % 2:
            raise ValueError(f"rotary positions need an even head_dim, got {head_dim}")
        if self.rope_freq_factors is not None:
            freq_factors(self.rope_freq_factors, (head_dim or 0) // 2, f"head_dim {head_dim}")
        if self.mask_token_id is not None:
            mask = self.mask_token_id
        elif target.vocab_size == ByteTokenizer.vocab_size:  # the embedded models' vocabulary
            mask = ByteTokenizer.mask_id
        else:
            mask = target.vocab_size - 1
        if mask >= target.vocab_size:
            raise ValueError(f"mask_token_id {mask} is outside the target vocabulary "
                             f"(vocab_size {target.vocab_size})")
        return dataclasses.replace(
            self, tap_layers=taps, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
            ffn_dim=self.ffn_dim if self.ffn_dim is not None else target.ffn_dim,
            qk_norm=bool(target.qk_norm if self.qk_norm is None else self.qk_norm),
            rope_theta=float(target.rope_theta if self.rope_theta is None else self.rope_theta),
            norm_eps=float(target.norm_eps if self.norm_eps is None else self.norm_eps),
            mask_token_id=mask)

    def to_dict(self) -> dict:
        """Return the config as a JSON-serialisable dict (``tap_layers`` as a list).

        The z-lab fields (``last_tap_normed``, the scales, ``rope_freq_factors``) are left
        out at their defaults, so that fastspec's own drafters keep the keys older versions
        read.
        """
        d = dataclasses.asdict(self)
        for name, default in _ZLAB_DEFAULTS.items():
            if d[name] == default:
                del d[name]
        for name in ("tap_layers", "rope_freq_factors"):
            if d.get(name) is not None:
                d[name] = list(d[name])
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "DFlashConfig":
        """Build a config from :meth:`to_dict` output; unknown keys raise ValueError."""
        check_known_fields(cls, d, "DFlashConfig")
        d = dict(d)
        if d.get("tap_layers") is not None:
            d["tap_layers"] = tuple(d["tap_layers"])
        return cls(**d)  # rope_freq_factors: checked and made a tuple by __post_init__

    def replace(self, **changes) -> "DFlashConfig":
        """Return a copy with some fields changed."""
        return dataclasses.replace(self, **changes)
