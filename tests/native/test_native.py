"""The native CPU kernel's build on first use: one notice with where it is cached and what it costs,
progress, a fallback without libmvec, failures recorded (not cached as a library) and retried
once the record is deleted; and the choice of an installed x86-64 level."""

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from tridiax._native import build as _native
from tridiax._native import compiler

CODE = ("import jax.numpy as jnp, tridiax; "
        "print(tridiax.solve_tridiagonal(jnp.ones(4), 4 * jnp.ones(4), jnp.ones(4), jnp.ones(4)))")


def run(cache, code=CODE, check=True, **extra):
    # TRIDIAX_NATIVE=build: built on first use also where the package carries compiled kernels.
    env = dict(os.environ, TRIDIAX_CACHE_DIR=str(cache), TRIDIAX_NATIVE="build",
               JAX_PLATFORMS="cpu", **extra)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=600)
    if check:
        assert result.returncode == 0, result.stderr
    return result.stderr


def stand_in(tmp_path, prelude=""):
    """A compiler that stands in for the real one (objects: empty files; the library: the one
    this process runs), so that no case here pays a compile; `prelude` runs first, with the
    arguments in "$@". The real build runs wherever a test process builds on first use."""
    assert _native.available(), "the native kernel could not be built: python -m tridiax --info"
    path = tmp_path / "compiler"
    path.write_text(
        "#!/bin/sh\n" + prelude +
        'out=""; while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done\n'
        f'case "$out" in *.so) cp "{_native.library_path()}" "$out";; *) : > "$out";; esac\n')
    path.chmod(0o755)
    return path


@pytest.mark.skipif(sys.platform != "linux", reason="the cache path printed is a Linux path")
def test_first_build_logs_one_line_with_the_cache_path(tmp_path):
    cxx = stand_in(tmp_path)
    cache = tmp_path / "cache"
    err = run(cache, CXX=str(cxx))
    notices = [line for line in err.splitlines() if "building the native CPU kernel" in line]
    assert len(notices) == 1, err
    built = list(cache.glob("cpu_kernels-*.so"))
    assert len(built) == 1 and str(built[0]) in notices[0], err
    assert "setLevel(logging.ERROR)" in notices[0]
    # Why it builds, what the build costs on this machine's cores, and, once done, how long it took.
    assert "TRIDIAX_NATIVE=build" in notices[0] and f"; {compiler.estimate()})" in notices[0], err
    lines = err.splitlines()
    done = [line for line in lines if "built the native CPU kernel in" in line]
    assert len(done) == 1 and lines.index(done[0]) > lines.index(notices[0]), err
    assert re.search(r"built the native CPU kernel in \d+ s$", done[0]), err
    assert "building" not in run(cache, CXX=str(cxx))  # cached: silent
    # Silenced the way the notice says (a fresh cache, so it builds again).
    fresh = tmp_path / "fresh"
    quiet = "import logging; logging.getLogger('tridiax').setLevel(logging.ERROR); " + CODE
    assert "building" not in run(fresh, quiet, CXX=str(cxx))
    assert list(fresh.glob("cpu_kernels-*.so"))
    assert "building the native CPU kernel" in run(tmp_path / "loud", CXX=str(cxx))


def test_a_slow_build_reports_its_progress(tmp_path):
    # Each compilation of the stand-in takes a little over a second; with progress lines due every
    # second, the sources finished so far are counted between the notice and the end.
    cxx = stand_in(tmp_path, prelude="sleep 1.2\n")
    code = f"from tridiax._native import build; build._PROGRESS_EVERY = 1.0; {CODE}"
    err = run(tmp_path / "cache", code, CXX=str(cxx))
    counts = [int(m.group(1)) for m in re.finditer(r"compiling the native CPU kernel: (\d+) of "
                                                   rf"{len(compiler.SOURCES)} sources, \d+ s", err)]
    assert counts and counts == sorted(counts) and counts[-1] < len(compiler.SOURCES), err


@pytest.mark.skipif(sys.platform != "linux", reason="libmvec is glibc's")
def test_a_build_that_cannot_link_libmvec_builds_without_it(tmp_path):
    # A stand-in compiler that fails whatever asks for libmvec: the kernel is built again
    # without it, with one warning saying so, and solves.
    if compiler.vector_math_library() is None:
        pytest.skip("no libmvec on this machine: nothing to fall back from")
    cxx = stand_in(tmp_path, prelude=(
        'for a in "$@"; do case "$a" in -DTRIDIAX_LIBMVEC|-l:libmvec*) '
        'echo "no libmvec here" >&2; exit 1;; esac; done\n'))
    err = run(tmp_path / "cache", CXX=str(cxx))
    fallbacks = [line for line in err.splitlines() if "building them without it" in line]
    assert len(fallbacks) == 1 and "no libmvec here" in fallbacks[0], err
    assert list((tmp_path / "cache").glob("cpu_kernels-*.so"))


def test_a_failed_build_is_recorded_not_cached_and_retried_once_the_record_is_gone(tmp_path):
    # A compiler that always fails and counts its calls: the first process compiles, fails and
    # solves with the XLA formulation; the next one reads the record instead of compiling; with
    # the record deleted, the build runs again.
    calls = tmp_path / "calls"
    cxx = tmp_path / "broken"
    cxx.write_text(f'#!/bin/sh\necho x >> "{calls}"\necho "error: this compiler is broken" >&2\nexit 1\n')
    cxx.chmod(0o755)
    cache = tmp_path / "cache"
    code = ("import json, warnings, numpy as np, tridiax; from tridiax._native import build; "
            "warnings.simplefilter('ignore'); "
            "x = tridiax.solve_tridiagonal(np.ones(5), np.arange(3.0, 8.0), np.ones(5), np.arange(5.0)); "
            "print(json.dumps([build.unavailable_reason(), np.asarray(x).tolist()]))")

    def attempt():
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                                env=dict(os.environ, TRIDIAX_CACHE_DIR=str(cache), TRIDIAX_NATIVE="build",
                                         JAX_PLATFORMS="cpu", CXX=str(cxx)))
        assert result.returncode == 0, result.stderr
        reason, x = json.loads(result.stdout.splitlines()[-1])
        dense = np.diag(np.arange(3.0, 8.0)) + np.diag(np.ones(4), 1) + np.diag(np.ones(4), -1)
        np.testing.assert_allclose(x, np.linalg.solve(dense, np.arange(5.0)), rtol=1e-6)  # float32
        return reason, len(calls.read_text().splitlines()) if calls.exists() else 0

    reason, compiled = attempt()
    assert "this compiler is broken" in reason and compiled >= 1, reason
    assert not list(cache.glob("*.so")) and len(list(cache.glob("*.failed"))) == 1
    reason, again = attempt()
    assert "failed before" in reason and "delete it to try again" in reason, reason
    assert again == compiled  # not compiled again
    next(cache.glob("*.failed")).unlink()
    assert attempt()[1] > compiled


def test_build_estimate_from_the_sources_and_the_cores(monkeypatch):
    # The sources compile side by side, one per core, longest first: one core compiles them
    # all in turn, enough cores take as long as the longest, and sources that cost the same
    # take ceil(sources / cores) times one. No build runs here.
    import math

    def seconds(libraries, cores):
        return tuple(map(int, re.search(r"about (\d+)-(\d+) s$", compiler.estimate(libraries, cores))
                         .groups()))

    costs = [compiler.seconds(source) for source in compiler.SOURCES]
    assert seconds(1, 1) == tuple(sum(c[k] for c in costs) for k in (0, 1))
    assert seconds(1, len(costs)) == tuple(max(c[k] for c in costs) for k in (0, 1))
    assert seconds(1, 1) > seconds(1, 2) > seconds(1, len(costs))
    assert seconds(3, 1) == tuple(3 * s for s in seconds(1, 1))
    low, high = compiler.seconds(compiler.SOURCES[0])
    for sources in (1, 3, 5):
        monkeypatch.setattr(compiler, "SOURCES", compiler.SOURCES[:1] * sources)
        for cores in (1, 2, 3, 8):
            rounds = math.ceil(sources / cores)
            text = compiler.estimate(1, cores)
            assert text.startswith(f"{sources} C++ compilation"), text
            assert f" on {cores} core" in text, text
            assert text.endswith(f"about {rounds * low}-{rounds * high} s"), text
    monkeypatch.setattr(compiler.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert " on 2 cores: " in compiler.estimate()


# ---------------------------------------------------------------------------------------------
# The choice of an installed level (no library is loaded: the CPU's level is given).

BUILT = {level: f"cpu_kernels-{level}.so" for level in compiler.LEVELS}


@pytest.fixture
def cpu_runs(monkeypatch):
    monkeypatch.delenv("TRIDIAX_CPU_LEVEL", raising=False)

    def set_level(level):
        monkeypatch.setattr(_native, "cpu_level", lambda probe=None: level)
    return set_level


@pytest.mark.parametrize("runs, want", [(4, "x86-64-v4"), (3, "x86-64-v3"), (2, "x86-64-v2")])
def test_the_best_installed_level_this_cpu_runs(cpu_runs, runs, want):
    cpu_runs(runs)
    choice = _native._installed_choice(BUILT)
    assert (choice.level, choice.origin, choice.path) == (want, "installed", _native.INSTALLED / BUILT[want])
    assert f"x86-64-v{runs})" in choice.why
    # A level that failed to build is not there to choose: the next one down is.
    partial = {k: v for k, v in BUILT.items() if k != want}
    if want != "x86-64-v2":
        assert _native._installed_choice(partial).level == f"x86-64-v{runs - 1}"


def test_a_cpu_below_every_installed_level_gets_none(cpu_runs):
    cpu_runs(2)
    with pytest.raises(_native.Unavailable, match="this CPU runs x86-64-v2; the installed kernels need x86-64-v3"):
        _native._installed_choice({k: v for k, v in BUILT.items() if k != "x86-64-v2"})


def test_a_pinned_level(cpu_runs, monkeypatch):
    cpu_runs(3)
    monkeypatch.setenv("TRIDIAX_CPU_LEVEL", "x86-64-v2")
    choice = _native._installed_choice(BUILT)
    assert (choice.level, choice.why) == ("x86-64-v2", "pinned by TRIDIAX_CPU_LEVEL")
    monkeypatch.setenv("TRIDIAX_CPU_LEVEL", "x86-64-v4")  # this CPU would not run it
    with pytest.raises(_native.Unavailable, match="this CPU runs x86-64-v3 at most"):
        _native._installed_choice(BUILT)
    monkeypatch.setenv("TRIDIAX_CPU_LEVEL", "avx2")
    with pytest.raises(_native.Unavailable, match="names no installed level"):
        _native._installed_choice(BUILT)


def test_cpu_level_is_what_this_cpu_reports():
    # The loaded library's answer against the kernel's own /proc/cpuinfo flags.
    if not compiler.is_x86_64() or not pathlib.Path("/proc/cpuinfo").exists():
        pytest.skip("x86-64 Linux: the levels and /proc/cpuinfo")
    assert _native.available()
    flags = set(next(line for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split(":", 1)[1].split())
    v3 = {"avx", "avx2", "fma", "bmi1", "bmi2"} <= flags
    v4 = v3 and {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= flags
    _native.cpu_level.cache_clear()
    assert _native.cpu_level(_native.library_path()) == (4 if v4 else 3 if v3 else 2)


def test_unknown_native_mode_says_what_it_takes(monkeypatch):
    monkeypatch.setenv("TRIDIAX_NATIVE", "yes")
    with pytest.raises(_native.Unavailable, match="not one of 0 .off., 1 .default. or build"):
        _native._mode()
