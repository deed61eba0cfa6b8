#!/usr/bin/env python3
"""Print the Cython/NumPy speed ratio of every kernel benchmark case.

Usage::

    pytest bench/test_bench_kernels.py --benchmark-only --benchmark-json bench.json
    python scripts/kernel_ratios.py bench.json [--stat median|min|mean]

For each pytest-benchmark group it prints the time of each backend and the speed-up of the
compiled kernel over the NumPy twin (and, for the KV-cache groups, over the
concatenate-and-copy reference). Attention groups also get the effective rate: bytes of K
and V read per second. Ratios are only meaningful within one run.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict


def _sort_key(group: str):
    # natural order: "n=1 L=128" before "n=1 L=1024"
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", group)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file", help="output of pytest --benchmark-json")
    parser.add_argument("--stat", default="median", choices=("median", "min", "mean"))
    args = parser.parse_args(argv)
    with open(args.json_file) as fh:
        data = json.load(fh)

    groups: dict[str, dict[str, dict]] = defaultdict(dict)
    for bench in data["benchmarks"]:
        info = bench.get("extra_info", {})
        backend = info.get("backend") or bench.get("params", {}).get("backend", "?")
        groups[bench.get("group") or bench["name"]][backend] = bench
    if not groups:
        print("no benchmarks in", args.json_file, file=sys.stderr)
        return 1

    stat = args.stat
    header = (f"{'case':<36} {'cython':>11} {'numpy':>11} {'ratio':>8} "
              f"{'vs concat':>10} {'GB/s':>7}")
    print(f"({stat} time per call; ratio = numpy / cython)")
    print(header)
    print("-" * len(header))
    for group in sorted(groups, key=_sort_key):
        cases = groups[group]
        times = {b: cases[b]["stats"][stat] for b in cases}

        def fmt(seconds):
            return f"{seconds * 1e6:9.1f}us" if seconds is not None else f"{'-':>11}"

        cy, np_ = times.get("cython"), times.get("numpy")
        ratio = f"{np_ / cy:7.1f}x" if cy and np_ else f"{'-':>8}"
        concat = times.get("concat")
        vs_concat = f"{concat / cy:9.0f}x" if cy and concat else f"{'-':>10}"
        kv_bytes = cases.get("cython", {}).get("extra_info", {}).get("kv_bytes")
        rate = f"{kv_bytes / cy / 1e9:7.1f}" if cy and kv_bytes else f"{'-':>7}"
        print(f"{group:<36} {fmt(cy)} {fmt(np_)} {ratio} {vs_concat} {rate}")

    # flatness of the KV append in L: the same append at L = 256 and L = 4096
    kv = defaultdict(dict)
    for group, cases in groups.items():
        m = re.match(r"kv append (\d+) \+ crop L=(\d+)", group)
        if m and "cython" in cases:
            kv[int(m.group(1))][int(m.group(2))] = cases["cython"]["stats"][stat]
    for n, by_length in sorted(kv.items()):
        if len(by_length) > 1:
            lo, hi = min(by_length), max(by_length)
            print(f"kv append {n} (cython): L={hi} / L={lo} time ratio "
                  f"{by_length[hi] / by_length[lo]:.2f} (1.0 = flat in L)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
