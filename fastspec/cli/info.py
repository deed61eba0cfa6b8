"""``fastspec info``: the version, the kernel backends, the compiled runner's ISA path and
threads."""
from __future__ import annotations

import argparse

from fastspec.cli.args import add_threads_option

from fastspec import kernels
from fastspec.kernels import available_backends, backend
from fastspec.tools.environment import cpu_name
from fastspec.version import __version__

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    """Register ``info`` on the subparsers ``sub``."""
    p = sub.add_parser("info", help="print the version, backend and build information",
                       description="Print the version, the active backend and the available ones.")
    add_threads_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Print the build information; return the exit status (0)."""
    print(f"fastspec {__version__}; backend {backend()}; "
          f"available {', '.join(available_backends())}")
    print(f"CPU: {cpu_name()}")
    isa = kernels.isa_info()
    threads = kernels.threads_info()
    source = (f"set by --threads or set_threads; default {threads['default']}: "
              if threads["set"] else "default: ") + threads["default_from"]
    if isa["selected"] is None:
        print("matrix products: NumPy only (compiled extension not built)")
        print(f"threads: {threads['threads']} ({source}; the NumPy backend ignores them)")
        return 0
    print(f"threads: {threads['threads']} ({source})")
    feats = " ".join(k for k, v in isa["features"].items() if v) or "none"
    how = f"forced by FASTSPEC_ISA/set_isa ({isa['forced']})" if isa["forced"] else "automatic"
    path = isa["selected"]
    print(f"CPU features: {feats}")
    print(f"matrix products: {path} kernels ({how}); paths on this CPU: "
          f"{', '.join(isa['available'])}; with kernels: {', '.join(isa['kernels'])}")
    peak = isa["peak"]
    rates = "; ".join(f"{p} {m // peak['fma_units'][p]} lanes x {peak['fma_units'][p]} = {m} "
                      f"multiply-adds/cycle = {peak['gmacs'][p]:.1f} G/s"
                      for p, m in peak["macs_per_cycle"].items())
    print(f"float FMA peak (lanes x FMA units x {peak['clock_ghz']:.2f} GHz, clock from "
          f"{peak['clock_source']}): {rates or 'no vector path'}")
    for p, d in peak["dot_bf16"].items():
        rate = "a cycle" if d["macs_per_cycle"] >= 32 else "every 2 cycles"
        print(f"bf16 dot-product peak ({p}: one VDPBF16PS {rate}, 16 lanes x 2 inputs): "
              f"{d['macs_per_cycle']} multiply-adds/cycle = {d['gmacs']:.1f} G/s")
    print(f"weight storage -> compute path (compiled backend, {path}):")
    print("  float32   packed float32 panels, float32 multiply-adds")
    print("  float16   binary16 panels widened to float32 in registers (F16C), float32 "
          "multiply-adds; bit-identical to float32 on the widened weights")
    if path in ("amx", "avx512bf16"):
        how = "AMX tiles (TDPBF16PS)" if path == "amx" else "AVX512-BF16 dot products (VDPBF16PS)"
        print(f"  bfloat16  bf16 bit patterns in the tile layout (pairs of inputs); every "
              f"product's input rounded to bf16 (nearest even), {how} summing in float32; "
              f"equal to the FMA paths within float32 rounding, not bit for bit")
    else:
        print("  bfloat16  bf16 bit patterns widened by a 16-bit shift in registers; every "
              "product's input rounded to bf16 (nearest even), float32 multiply-adds")
    quant = isa.get("quant_kernels", {})
    if path in quant:
        print(f"  q8_0/q4_0/q4_1  GGUF blocks x rows quantized to int8, exact integer block "
              f"sums, float32 over blocks; kernel: {quant[path]}")
    missing = [n for n in ("avx512bf16", "amx") if n not in isa["kernels"]]
    if missing:
        have = [n for n in missing if n in isa["available"]]
        print(f"  (no {'/'.join(missing)} kernels in this build"
              + (f"; this CPU has {', '.join(have)})" if have else
                 f"; this CPU lacks {', '.join(missing)} anyway)"))
    return 0
