"""The README's multi-host recipe, on one machine: two processes, two host devices each.

Each process (multihost_worker.py) calls `jax.distributed.initialize` with a coordinator on
localhost and CPU collectives through gloo, builds the 4-device global mesh over
`jax.devices()`, places its part of every array with `jax.make_array_from_process_local_data`
and runs the jitted solves; it writes the output shards it holds. Here the shards of both
processes are put together and checked against NumPy (dense solves, a Python loop for the
recurrence, the adjoint formulas for the gradient), none of which goes through tridiax.

Bounded: both processes are killed after DEADLINE seconds, or as soon as one of them fails.
"""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import dense_numpy, random_bands

HERE = pathlib.Path(__file__).parent
DEADLINE = 50  # seconds for both processes together, start-up included


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(devices_per_process):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices_per_process}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), str(HERE.parent / "support"),
                                                     env.get("PYTHONPATH")]))
    return env


def run_processes(commands, env, tmp_path, deadline=DEADLINE):
    """Start every command, wait until all end; kill them all when one fails or on timeout.
    Returns their stdout; fails the test with every process's stdout and stderr otherwise."""
    logs = [(open(tmp_path / f"out{i}.txt", "w+"), open(tmp_path / f"err{i}.txt", "w+"))
            for i in range(len(commands))]
    procs = [subprocess.Popen(c, stdout=o, stderr=e, env=env, cwd=HERE)
             for c, (o, e) in zip(commands, logs, strict=True)]
    start, problem = time.monotonic(), None
    try:
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                problem = f"process {failed[0]} exited with {procs[failed[0]].returncode}"
                break
            if time.monotonic() - start > deadline:
                problem = f"timed out after {deadline} s"
                break
            time.sleep(0.1)
        if problem is None and any(p.returncode != 0 for p in procs):
            problem = f"exit codes {[p.returncode for p in procs]}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    texts = []
    for o, e in logs:
        o.seek(0)
        e.seek(0)
        texts.append((o.read(), e.read()))
        o.close()
        e.close()
    if problem:
        pytest.fail(problem + "".join(f"\n--- process {i} stdout:\n{out[-3000:]}\n--- process "
                                      f"{i} stderr:\n{err[-6000:]}"
                                      for i, (out, err) in enumerate(texts)))
    return [out for out, _ in texts], time.monotonic() - start


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """{case: [output arrays put together from both processes' shards]}, and the reports."""
    tmp_path = tmp_path_factory.mktemp("multihost")
    coordinator = f"127.0.0.1:{free_port()}"
    commands = [[sys.executable, str(HERE / "multihost_worker.py"), str(i), "2", coordinator,
                 str(tmp_path / f"shards{i}.npz")] for i in range(2)]
    run_processes(commands, child_env(2), tmp_path)
    files = [np.load(tmp_path / f"shards{i}.npz") for i in range(2)]
    reports = [json.loads(str(f["report"])) for f in files]
    cases = {}
    for process, f in enumerate(files):
        for key in f.files:
            if key.endswith("/data"):
                name, k, j, _ = key.split("/")
                index = tuple(slice(a, b) for a, b in f[key[:-4] + "index"])
                cases.setdefault(name, {}).setdefault(int(k), []).append(
                    (process, index, f[key]))
    assembled = {}
    for name, outputs in cases.items():
        assembled[name] = []
        for k in sorted(outputs):
            pieces = outputs[k]
            shape = tuple(max(i[d].stop for _, i, _ in pieces) for d in range(pieces[0][2].ndim))
            full, seen = np.full(shape, np.nan), np.zeros(shape, int)
            owners = np.full(shape, -1)
            for process, index, data in pieces:
                full[index] = data
                seen[index] += 1
                owners[index] = process
            assert seen.min() >= 1, f"{name}[{k}]: part of the output is on no process"
            assembled[name].append((full, owners))
    return assembled, reports


def test_two_processes_form_one_four_device_mesh(shards):
    _, reports = shards
    for process, report in enumerate(reports):
        assert report["process"] == process
        assert len(report["devices"]) == 4 and len(report["local_devices"]) == 2
        assert report["devices"] == reports[0]["devices"]  # the same global mesh
    assert not set(reports[0]["local_devices"]) & set(reports[1]["local_devices"])


def check_split(owners, axis):
    """Sharded outputs really are split between the processes: each holds half the axis."""
    n = owners.shape[axis]
    first, second = np.take(owners, range(n // 2), axis), np.take(owners, range(n // 2, n), axis)
    assert (first == 0).all() and (second == 1).all(), "output not split between the processes"


@pytest.mark.parametrize("case,pivoting", [("batch", False), ("batch_pivoted", True)])
def test_batch_sharded_solve(shards, case, pivoting):
    assembled, reports = shards
    lower, diag, upper, rhs = random_bands((40, 64), seed=1, dominant=not pivoting)
    expected = np.linalg.solve(dense_numpy(lower, diag, upper, axis=0), rhs.T[..., None])[..., 0].T
    (x, owners), = assembled[case]
    np.testing.assert_allclose(x, expected, rtol=0, atol=1e-12 * np.abs(expected).max())
    check_split(owners, 1)
    for report in reports:  # every process solves its own columns: no collective at all
        assert report["cases"][case]["collectives"] == []
        assert report["cases"][case]["kept"] == [True]  # the output keeps the input's sharding


def test_split_axis_solve(shards):
    assembled, reports = shards
    lower, diag, upper, rhs = random_bands((256, 6), seed=5)
    expected = np.linalg.solve(dense_numpy(lower, diag, upper, axis=0), rhs.T[..., None])[..., 0].T
    (x, owners), = assembled["split"]
    np.testing.assert_allclose(x, expected, rtol=0, atol=1e-12 * np.abs(expected).max())
    check_split(owners, 0)
    for report in reports:  # the partition method: a small all-gather, never the whole array
        moved = report["cases"]["split"]["collectives"]
        assert moved and all(op == "all-gather" for op, _ in moved), moved
        assert sum(size for _, size in moved) <= 7 * 4 * 6 * 8, moved
        assert report["cases"]["split"]["kept"] == [True]


def test_gradient_through_the_split_solve(shards):
    assembled, reports = shards
    assert all(r["cases"]["grad"]["kept"] == [True] * 4 for r in reports)
    lower, diag, upper, rhs = random_bands((256, 6), seed=6)
    a = dense_numpy(lower, diag, upper, axis=0)  # (6, 256, 256), one matrix per column
    x = np.linalg.solve(a, rhs.T[..., None])[..., 0]  # (6, 256)
    lam = np.linalg.solve(np.swapaxes(a, -1, -2), np.cos(x)[..., None])[..., 0]  # A^T lam = cos x
    # d sum(sin x) / dA = -lam x^T, restricted to the three bands; d / db = lam.
    zero = np.zeros((6, 1))
    expected = [-lam * np.concatenate([zero, x[:, :-1]], 1), -lam * x,
                -lam * np.concatenate([x[:, 1:], zero], 1), lam]
    grads = assembled["grad"]
    assert len(grads) == 4
    for name, (g, owners), e in zip("ldub", grads, expected, strict=True):
        np.testing.assert_allclose(g, e.T, rtol=0, atol=1e-12 * np.abs(e).max(), err_msg=name)
        check_split(owners, 0)


def test_split_time_recurrence(shards):
    assembled, reports = shards
    rng = np.random.default_rng(9)
    a, x, h0 = rng.uniform(0.9, 1, (256, 6)), rng.standard_normal((256, 6)), rng.standard_normal(6)
    expected, h = np.empty_like(x), h0
    for t in range(256):
        h = a[t] * h + x[t]
        expected[t] = h
    (out, owners), = assembled["recurrence"]
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12 * np.abs(expected).max())
    check_split(owners, 0)
    for report in reports:
        assert report["cases"]["recurrence"]["kept"] == [True]
        moved = report["cases"]["recurrence"]["collectives"]
        assert moved and sum(size for _, size in moved) <= 2 * 4 * 6 * 8, moved


def test_sharded_solve_example_with_two_processes():
    # The example's --processes 2 launches itself twice the same way; its launcher and both
    # children share a new process group, killed as a whole if they outlive the deadline.
    script = HERE.parents[1] / "examples" / "sharded_solve.py"
    launcher = subprocess.Popen([sys.executable, str(script), "--quick", "--processes", "2"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    try:
        out, _ = launcher.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        out, _ = launcher.communicate()
        pytest.fail(f"sharded_solve.py --processes 2 timed out after {DEADLINE} s:\n{out}")
    assert launcher.returncode == 0, out
    for process in range(2):
        lines = [line for line in out.splitlines() if line.startswith(f"[process {process}] ")]
        text = "\n".join(lines)
        assert f"process {process} of 2: a mesh of 8 cpu devices, 4 of them here" in text, out
        assert "1. batch axis x sharded" in text and "collectives: none" in text, out
        for pattern in (r"2\. solve axis z sharded.*= (\S+)", r"3\. d loss .* one device (\S+)",
                        r"4\. linear recurrence.*= (\S+);"):
            match = re.search(pattern, text)
            assert match and float(match.group(1)) < 1e-12, (pattern, out)
    assert "all 2 processes agree" in out
