"""The native CPU kernel's first build says so, once, with where it is cached."""

import os
import re
import subprocess
import sys

import pytest

CODE = ("import jax.numpy as jnp, tridiax; "
        "print(tridiax.solve_tridiagonal(jnp.ones(4), 4 * jnp.ones(4), jnp.ones(4), jnp.ones(4)))")


def run(cache, code=CODE, **extra):
    env = dict(os.environ, TRIDIAX_CACHE_DIR=str(cache), TRIDIAX_NATIVE="1", JAX_PLATFORMS="cpu",
               **extra)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    return result.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="the cache path printed is a Linux path")
def test_first_build_logs_one_line_with_the_cache_path(tmp_path):
    # The compiler here stands in for the real one (objects: empty files; the library: the one
    # this process built or found in its cache), so that no case here pays a compile; the real
    # build runs on first use in a fresh cache (a fresh CI machine: every native test).
    from tridiax._native import build as _native

    assert _native.available(), "the native kernel could not be built: python -m tridiax --info"
    compiler = tmp_path / "compiler"
    compiler.write_text(
        "#!/bin/sh\n"
        'out=""; while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done\n'
        f'case "$out" in *.so) cp "{_native.library_path()}" "$out";; *) : > "$out";; esac\n')
    compiler.chmod(0o755)
    cache = tmp_path / "cache"
    err = run(cache, CXX=str(compiler))
    notices = [line for line in err.splitlines() if "building the native CPU kernel" in line]
    assert len(notices) == 1, err
    built = list(cache.glob("cpu_kernels-*.so"))
    assert len(built) == 1 and str(built[0]) in notices[0], err
    assert "setLevel(logging.ERROR)" in notices[0]
    # What the build costs on this machine's cores, and, once done, how long it took.
    assert f"({_native._build_estimate()})" in notices[0], err
    lines = err.splitlines()
    done = [line for line in lines if "built the native CPU kernel in" in line]
    assert len(done) == 1 and lines.index(done[0]) > lines.index(notices[0]), err
    assert re.search(r"built the native CPU kernel in \d+ s$", done[0]), err
    assert "building" not in run(cache, CXX=str(compiler))  # cached: silent
    # Silenced the way the notice says (a fresh cache, so it builds again).
    fresh = tmp_path / "fresh"
    quiet = "import logging; logging.getLogger('tridiax').setLevel(logging.ERROR); " + CODE
    assert "building" not in run(fresh, quiet, CXX=str(compiler))
    assert list(fresh.glob("cpu_kernels-*.so"))
    assert "building the native CPU kernel" in run(tmp_path / "loud", CXX=str(compiler))


@pytest.mark.skipif(sys.platform != "linux", reason="libmvec is glibc's")
def test_a_build_that_cannot_link_libmvec_builds_without_it(tmp_path):
    # A stand-in compiler that fails whatever asks for libmvec: the kernel is built again
    # without it, with one warning saying so, and solves.
    from tridiax._native import build as _native

    if _native._vector_math_library() is None:
        pytest.skip("no libmvec on this machine: nothing to fall back from")
    assert _native.available(), "the native kernel could not be built: python -m tridiax --info"
    compiler = tmp_path / "compiler"
    compiler.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in -DTRIDIAX_LIBMVEC|-l:libmvec*) '
        'echo "no libmvec here" >&2; exit 1;; esac; done\n'
        'out=""; while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done\n'
        f'case "$out" in *.so) cp "{_native.library_path()}" "$out";; *) : > "$out";; esac\n')
    compiler.chmod(0o755)
    err = run(tmp_path / "cache", CXX=str(compiler))
    fallbacks = [line for line in err.splitlines() if "building without it" in line]
    assert len(fallbacks) == 1 and "no libmvec here" in fallbacks[0], err
    assert list((tmp_path / "cache").glob("cpu_kernels-*.so"))


def test_build_notice_estimates_from_the_sources_and_the_cores(monkeypatch):
    # The sources compile side by side, one per core, longest first: one core compiles them
    # all in turn, enough cores take as long as the longest, and sources that cost the same
    # take ceil(sources / cores) times one. No build runs here.
    import math

    from tridiax._native import build as _native

    def seconds(cores):
        return tuple(map(int, re.search(r"about (\d+)-(\d+) s$", _native._build_estimate(cores))
                         .groups()))

    costs = [_native._seconds(source) for source in _native._SOURCES]
    assert seconds(1) == tuple(sum(c[k] for c in costs) for k in (0, 1))
    assert seconds(len(costs)) == tuple(max(c[k] for c in costs) for k in (0, 1))
    assert seconds(1) > seconds(2) > seconds(len(costs))
    low, high = _native._seconds(_native._SOURCES[0])
    for sources in (1, 3, 5):
        monkeypatch.setattr(_native, "_SOURCES", _native._SOURCES[:1] * sources)
        for cores in (1, 2, 3, 8):
            rounds = math.ceil(sources / cores)
            text = _native._build_estimate(cores)
            assert text.startswith(f"{sources} C++ source"), text
            assert f" on {cores} core" in text, text
            assert text.endswith(f"about {rounds * low}-{rounds * high} s"), text
    monkeypatch.setattr(_native.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert " on 2 cores: " in _native._build_estimate()
