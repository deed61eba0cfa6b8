"""ForwardOutput: what a forward pass returns (logits and the requested hidden states)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["ForwardOutput"]


@dataclass
class ForwardOutput:
    """Result of :meth:`Transformer.forward`.

    Attributes
    ----------
    logits : ndarray of shape (n, vocab_size)
    hidden : dict[int, ndarray of shape (n, dim)]
        Output of each requested layer.
    """

    logits: np.ndarray
    hidden: dict[int, np.ndarray] = field(default_factory=dict)
