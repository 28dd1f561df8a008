"""`python -m tridiax --info` and `import tridiax` from a source tree that is not installed."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import tridiax
from tridiax._native import build as _native

ROOT = pathlib.Path(__file__).parents[2]


def _run(code_or_args, *, env=None, cwd=None, module=False):
    cmd = [sys.executable, *(["-m", "tridiax", *code_or_args] if module else ["-c", code_or_args])]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr
    return out.stdout


def _table(text, platform="cpu"):
    """The backend table of `platform` as {operation: [backend per dtype]}."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"backends on {platform}"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("  ") or line.startswith("  why not"):
            break
        *name, f32, f64, c64, c128 = line.split()
        rows[" ".join(name)] = [f32, f64, c64, c128]
    return rows


def test_info_reports_the_native_kernel_and_each_operations_backend():
    text = _run(["--info"], module=True)
    assert text.splitlines()[0] == f"tridiax {tridiax.__version__} ({pathlib.Path(tridiax.__file__).parent})"
    import jax

    assert f"jax {jax.__version__}" in text
    rows = _table(text)
    if _native.available():
        # The level, where it came from and why, and the library's path.
        line = next(line for line in text.splitlines() if line.startswith("native CPU kernel"))
        choice = _native.choice()
        assert line.startswith(f"native CPU kernel: {choice.level if choice.level != 'native' else 'this CPU'}")
        assert f", {choice.origin} ({choice.why}), " in line
        path = pathlib.Path(line.rsplit(", ", 1)[1])
        assert path.is_file() and path == _native.library_path()
    # Every row is what the lowering chooses; IndRNN with an activation the C++ kernel does not
    # know, and complex tanh, run XLA's loop.
    native = "native" if _native.available() else "xla"
    assert rows["solve_tridiagonal (every kind)"] == [native] * 4
    assert rows["solve_block_tridiagonal k=8"] == [native] * 4
    assert rows["indrnn (tanh)"] == [native, native, "xla", "xla"]
    assert rows["indrnn (your activation)"] == ["xla"] * 4
    assert len(rows) == 7
    assert "pallas_triton  cannot: Triton runs on CUDA and ROCm GPUs" in text


# TRIDIAX_NATIVE=build: the compiler is asked also where the package carries compiled kernels.
@pytest.mark.parametrize("env, reason, fix", [
    ({"TRIDIAX_NATIVE": "0"}, "TRIDIAX_NATIVE=0 turns it off", "unset TRIDIAX_NATIVE"),
    ({"TRIDIAX_NATIVE": "build", "CXX": "/nonexistent/c++"}, "No such file or directory",
     "CXX=/nonexistent/c++ is not a program"),
    ({"TRIDIAX_NATIVE": "build", "CXX": "false"}, "building the kernels with false failed",
     "the compiler's error is above"),
    ({"TRIDIAX_CPU_LEVEL": "x86-64-v9"}, "x86-64-v9", "unset TRIDIAX_CPU_LEVEL"),
])
def test_info_says_why_the_native_kernel_is_missing_and_the_fix(env, reason, fix, tmp_path):
    text = _run(["--info"], module=True, env={**env, "TRIDIAX_CACHE_DIR": str(tmp_path)})
    line = next(i for i, s in enumerate(text.splitlines()) if s.startswith("native CPU kernel"))
    status, why, *rest = text.splitlines()[line:]
    hint = next(s for s in rest if s.startswith("  fix: "))
    assert status.startswith("native CPU kernel: NOT AVAILABLE") and why.startswith("  why: ")
    assert reason in why
    assert fix in hint
    assert _table(text)["solve_tridiagonal (every kind)"] == ["xla"] * 4


_NO_METADATA = """
import importlib.metadata as m, sys
real = m.version
def version(name):
    if name == "tridiax":
        raise m.PackageNotFoundError(name)
    return real(name)
m.version = version
sys.path.insert(0, {tree!r})
import tridiax
assert tridiax.__file__.startswith({tree!r}), tridiax.__file__
print(tridiax.__version__)
"""


@pytest.mark.parametrize("with_pyproject", [True, False])
def test_import_from_a_source_tree_without_installed_metadata(tmp_path, with_pyproject):
    # A vendored copy or a PYTHONPATH checkout: no dist-info for tridiax (simulated by
    # importlib.metadata not knowing it). The version comes from pyproject.toml beside it.
    shutil.copytree(ROOT / "tridiax", tmp_path / "tridiax",
                    ignore=shutil.ignore_patterns("__pycache__"))
    if with_pyproject:
        shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    version = _run(_NO_METADATA.format(tree=str(tmp_path)), cwd=tmp_path).strip()
    import tomllib

    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version == (f"{expected}+source" if with_pyproject else "0+unknown")


class _Client:
    def __init__(self, platform, platform_version=""):
        self.platform, self.platform_version = platform, platform_version


class _Device:
    def __init__(self, platform, client=None):
        self.platform, self.client = platform, client


@pytest.mark.parametrize("device, want", [
    (_Device("cpu"), "cpu"),
    (_Device("tpu"), "tpu"),
    # jax 0.11's CUDA and ROCm plugins name their devices' platform "gpu"; the client says which.
    (_Device("gpu", _Client("cuda")), "cuda"),
    (_Device("gpu", _Client("rocm")), "rocm"),
    (_Device("gpu", _Client("gpu", "rocm 6.2.4")), "rocm"),
    (_Device("gpu", _Client("gpu", "cuda 13.0")), "cuda"),
])
def test_device_platform_names_the_lowering_platform(device, want):
    from tridiax._core.backend import device_platform

    assert device_platform(device) == want


def test_device_platform_of_this_machines_devices_has_backends():
    import jax

    from tridiax._core import backend as _backend

    for device in jax.devices():
        platform = _backend.device_platform(device)
        assert platform != "gpu"
        assert platform in _backend.PREFERENCE, platform


def test_info_on_a_cuda_device_names_it_and_its_backends(monkeypatch):
    # jax 0.11's CUDA devices say platform "gpu": --info must still list CUDA's backends (it
    # said "no GPU visible" on an H100), and the cuSPARSE route for few long systems.
    import jax

    from tridiax import _info

    device = _Device("gpu", _Client("cuda", "cuda 13.0"))
    device.device_kind, device.id = "NVIDIA H100 80GB HBM3", 0
    monkeypatch.setattr(jax, "devices", lambda *args: [device])
    text = _info._report()
    assert "0: NVIDIA H100 80GB HBM3 (cuda)" in text
    assert "backends on cuda" in text and "no GPU visible" not in text
    assert "cuSPARSE gtsv2" in text
