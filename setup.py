"""Build script for fastspec's Cython extensions.

Environment switches (read at build time):

FASTSPEC_NATIVE=1   add ``-march=native`` (never the default: wheels must run elsewhere).
FASTSPEC_DEBUG=1    Cython bounds/wraparound/initialized checks on, the extensions ``-O0 -g``
                    (the C core keeps its optimised build, with FS_DEBUG's checks: a nested
                    thread-pool job aborts).

Threads: the core's own pool (csrc/fs_pool.c, POSIX threads; no OpenMP), linked with
``-pthread``.

The C core (``csrc/*.c``, csrc/README.md) is compiled ONCE, its files in parallel, into a
static library that every extension links; then the extensions compile in parallel, one job
per CPU (``build_ext -j N`` overrides).
"""
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from glob import glob
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


DEBUG = _flag("FASTSPEC_DEBUG")
IS_MSVC = sys.platform == "win32"

core_args: list[str] = []  # the C core
compile_args: list[str] = []  # the extensions' Cython-generated C
link_args: list[str] = []
macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
if not IS_MSVC:
    core_args += ["-O3", "-fno-math-errno", "-fno-trapping-math"]
    compile_args += ["-O0", "-g"] if DEBUG else ["-O3"]
    compile_args += ["-fno-math-errno", "-fno-trapping-math"]
    if _flag("FASTSPEC_NATIVE"):
        core_args.append("-march=native")
        compile_args.append("-march=native")
    core_args.append("-pthread")
    compile_args.append("-pthread")
    link_args.append("-pthread")
if DEBUG:
    macros.append(("FS_DEBUG", "1"))

CORE_SOURCES = sorted(glob("csrc/*.c"))
CORE_DEPENDS = sorted(glob("csrc/*.h") + glob("csrc/*.inc"))
# The products' files are fully unrolled register tiles written with explicit vectors: RTL
# GCSE finds nothing to remove there, and cost 55-70% of their compile time (measured with
# -ftime-report, GCC 12). The arithmetic is the same either way.
CORE_FILE_ARGS = {src: ["-fno-gcse", "-fno-gcse-after-reload"]
                  for src in CORE_SOURCES if Path(src).name.startswith("fs_linear") and not IS_MSVC}

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
        depends=CORE_DEPENDS,
    )
    for pyx in sorted(glob("fastspec/**/*.pyx", recursive=True))
]



class ParallelBuildExt(build_ext):
    """``build_ext`` that compiles the C core once into a static library, then the extensions;
    each in parallel unless ``-j`` says otherwise."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def build_extensions(self) -> None:
        out = Path(self.build_temp) / "core"
        objects = self._compile_core(out)
        lib_dir = str(out)
        # create_static_lib skips an archive newer than its objects
        self.compiler.create_static_lib(objects, "fastspec_core", output_dir=lib_dir)
        archive = self.compiler.library_filename("fastspec_core", output_dir=lib_dir)
        for ext in self.extensions:
            ext.library_dirs.append(lib_dir)
            ext.libraries.append("fastspec_core")
            ext.depends.append(archive)
        super().build_extensions()

    def _compile_core(self, out: Path) -> list[str]:
        """Compile csrc/*.c into ``out``, one job per CPU; return the objects.

        Up-to-date objects (newer than their source and every header) are kept."""
        include = [str(HERE / "csrc")]
        core_macros = [m for m in macros if m[0] != "NPY_NO_DEPRECATED_API"]

        def one(src: str) -> str:
            (obj,) = self.compiler.object_filenames([src], output_dir=str(out))
            if not self.force and Path(obj).exists() and all(
                    Path(obj).stat().st_mtime >= Path(d).stat().st_mtime
                    for d in [src, *CORE_DEPENDS]):
                return obj
            (obj,) = self.compiler.compile(
                [src], output_dir=str(out), macros=core_macros, include_dirs=include,
                extra_postargs=core_args + CORE_FILE_ARGS.get(src, []), depends=CORE_DEPENDS)
            return obj

        # the products' variants take longest (fs_linear_f32.inc three times each): first
        order = sorted(CORE_SOURCES, key=lambda s: (not Path(s).name.startswith("fs_linear_"), s))
        with ThreadPoolExecutor(max_workers=self.parallel) as pool:
            done = dict(zip(order, pool.map(one, order)))
        return [done[s] for s in CORE_SOURCES]


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
