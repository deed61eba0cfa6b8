# Placeholder: the typed kernels land here; until then the twin's code is re-exported.
from fastspec._reference import attention, cache_write, probs, sample, verify_greedy, verify_rejection
