"""Compile and run tests/c/attention.c: the tiled float attention block (fs_attention_f32.inc) in
every variant this CPU runs gives a query row the same bits alone as in any block of rows
(causal counts, tree nodes, head sizes 16 to 256, key counts across the tiles), and stays
within 2e-6 of softmax attention in double. The Python tests reach only the variant the CPU
selects; this reaches the others (AVX2 on an AVX-512 machine). Needs the source tree (csrc/)
and a C compiler; skipped otherwise.
"""
from _helpers import needs_c_harness, run_c_harness


@needs_c_harness
def test_attention_block_variants(tmp_path):
    run_c_harness("attention", [], tmp_path)
