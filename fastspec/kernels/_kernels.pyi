"""Type stub of the compiled kernels (same signatures as fastspec.kernels._reference)."""
from fastspec.kernels._kernels_attention import attention as attention
from fastspec.kernels._kernels_attention import cache_write as cache_write
from fastspec.kernels._kernels_attention import compact_kv as compact_kv
from fastspec.kernels._kernels_attention import tree_attention as tree_attention
from fastspec.kernels._kernels_sampling import probs as probs
from fastspec.kernels._kernels_sampling import sample as sample
from fastspec.kernels._kernels_verify import verify_greedy as verify_greedy
from fastspec.kernels._kernels_verify import verify_rejection as verify_rejection

__all__ = ["attention", "cache_write", "compact_kv", "probs", "sample", "tree_attention",
           "verify_greedy", "verify_rejection"]
