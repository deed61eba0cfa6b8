"""Build script for fastspec's Cython extensions.

Environment switches (read at build time):

FASTSPEC_NATIVE=1   add ``-march=native`` (never the default: wheels must run elsewhere).
FASTSPEC_OPENMP=0   do not even probe for OpenMP (default: probe, use it when it links).
FASTSPEC_DEBUG=1    Cython bounds/wraparound/initialized checks on, ``-O0 -g``.

The extensions compile in parallel, one job per CPU (``build_ext -j N`` overrides).
"""
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from glob import glob
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _compiler_accepts(flags: list[str], link_flags: list[str]) -> bool:
    """Return True when the C compiler builds and links a tiny OpenMP program."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    cc = cc.split()[0]
    if shutil.which(cc) is None:
        return False
    src = "#include <omp.h>\nint main(void){return omp_get_max_threads() > 0 ? 0 : 1;}\n"
    with tempfile.TemporaryDirectory() as tmp:
        c_file = Path(tmp) / "probe.c"
        c_file.write_text(src)
        cmd = [cc, *flags, str(c_file), "-o", str(Path(tmp) / "probe"), *link_flags]
        try:
            return subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False


DEBUG = _flag("FASTSPEC_DEBUG")
IS_MSVC = sys.platform == "win32"

compile_args: list[str] = []
link_args: list[str] = []
macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
if not IS_MSVC:
    compile_args += ["-O0", "-g"] if DEBUG else ["-O3"]
    compile_args += ["-fno-math-errno", "-fno-trapping-math"]
    if _flag("FASTSPEC_NATIVE"):
        compile_args.append("-march=native")
    if os.environ.get("FASTSPEC_OPENMP", "1") != "0" and _compiler_accepts(["-fopenmp"], ["-fopenmp"]):
        compile_args.append("-fopenmp")
        link_args.append("-fopenmp")
        macros.append(("FASTSPEC_HAVE_OPENMP", "1"))

directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "nonecheck": DEBUG,
    "cdivision": True,
    "cpow": True,
    "embedsignature": True,
}

extensions = [
    Extension(
        str(Path(pyx).with_suffix("")).replace("/", "."),
        [pyx],
        include_dirs=[np.get_include(), str(HERE / "csrc")],
        define_macros=macros,
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        depends=sorted(glob("csrc/*.h")),
    )
    for pyx in sorted(glob("fastspec/**/*.pyx", recursive=True))
]



class ParallelBuildExt(build_ext):
    """``build_ext`` that compiles the extensions in parallel unless ``-j`` says otherwise."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1


setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        compile_time_env={"FASTSPEC_DEBUG": DEBUG},
        build_dir="build/cython" if not DEBUG else "build/cython-debug",
        nthreads=os.cpu_count() or 1,
    ),
    cmdclass={"build_ext": ParallelBuildExt},
)
