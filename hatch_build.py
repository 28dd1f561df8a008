"""The wheel's build step: compile the C++ CPU kernels once per x86-64 level into
tridiax/_native/lib/, with a manifest of what was built, so that an installed tridiax needs no
compiler and imports at once. `pip install .` and `pip wheel .` run it; editable installs do
not (a source tree builds the kernels on first use).

A level whose build fails is left out and the manifest says why; where none builds, the wheel
still installs and tridiax runs the XLA formulation, saying why (`python -m tridiax --info`).
On other architectures than x86-64 no level applies: the wheel carries the sources only and the
kernels are built on first use.

TRIDIAX_BUILD_LEVELS (comma-separated, e.g. "x86-64-v4") builds fewer levels; TRIDIAX_BUILD_JOBS
sets the compiler processes run at once (default: one per core).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import sys
import sysconfig
import tempfile
import time

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

_ROOT = pathlib.Path(__file__).parent


def _load_compiler():
    """tridiax/_native/compiler.py on its own: importing the package would import jax, which
    the build environment does not have."""
    path = _ROOT / "tridiax" / "_native" / "compiler.py"
    spec = importlib.util.spec_from_file_location("_tridiax_compiler", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up while defining a class
    spec.loader.exec_module(module)
    return module


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class KernelsBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        compiler = _load_compiler()
        # One wheel serves every Python: the libraries are loaded with ctypes, not imported.
        platform_tag = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{platform_tag}"
        if not compiler.is_x86_64():
            _say("tridiax: no x86-64 levels to build on this architecture; the kernels are built "
                 "on first use")
            return
        levels = os.environ.get("TRIDIAX_BUILD_LEVELS", ",".join(compiler.LEVELS)).split(",")
        unknown = [level for level in levels if level not in compiler.LEVELS]
        if unknown:
            raise ValueError(f"TRIDIAX_BUILD_LEVELS: unknown {unknown}; levels: {compiler.LEVELS}")
        self._out = pathlib.Path(tempfile.mkdtemp(prefix="tridiax-wheel-"))
        paths = {level: self._out / f"cpu_kernels-{level}.so" for level in levels}
        jobs = int(os.environ.get("TRIDIAX_BUILD_JOBS", "0")) or None
        cxx = compiler.find_compiler()
        start = time.perf_counter()
        if cxx is None:
            errors = {level: "no C++ compiler found (set CXX or install g++)" for level in levels}
        else:
            _say(f"tridiax: compiling the CPU kernels for {', '.join(levels)} with {cxx} "
                 f"({compiler.estimate(len(levels), jobs)})")
            errors = compiler.build(paths, compiler=cxx, include_dir=compiler.VENDORED_INCLUDE,
                                    jobs=jobs, warn=_say)
        seconds = time.perf_counter() - start
        built = {level: paths[level].name for level in levels if errors[level] is None}
        failed = {level: error for level, error in errors.items() if error is not None}
        manifest = {
            "built": built,
            "failed": failed,
            "compiler": cxx,
            "seconds": round(seconds, 1),
            "cores": jobs or compiler.cores(),
            "ffi_api_version": compiler.ffi_api_version(compiler.VENDORED_INCLUDE),
            "vector_math": compiler.vector_math_library(),
        }
        (self._out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        for name in (*built.values(), "manifest.json"):
            build_data["force_include"][str(self._out / name)] = f"tridiax/_native/lib/{name}"
        if built:
            _say(f"tridiax: compiled the CPU kernels for {', '.join(built)} in {seconds:.0f} s")
        for level, error in failed.items():
            _say(f"tridiax: WARNING: the {level} kernels were not built; {error.splitlines()[0]}")
        if not built:
            _say("tridiax: WARNING: no native kernels in this install: tridiax will run the XLA "
                 "formulation on CPU (correct, slower); `python -m tridiax --info` says why")

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        out = getattr(self, "_out", None)
        if out is not None:
            shutil.rmtree(out, ignore_errors=True)
