"""benchmarks/gpu_report.py, the one command for a GPU machine, runs end to end (--quick, on
whatever device is here) and reports every kind in both layouts on every backend."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_gpu_report_quick_run_reports_every_kind(tmp_path):
    out = tmp_path / "report.md"
    data = tmp_path / "shapes.json"
    result = subprocess.run([sys.executable, "benchmarks/gpu_report.py", "--quick", "--skip-tests",
                             "--out", str(out), "--json", str(data), "--dtypes", "float32"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = out.read_text()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_report
    finally:
        sys.path.pop(0)
    import jax

    from tridiax._core.backend import device_platform

    platform = device_platform(jax.devices()[0])
    backends = gpu_report.device_backends(platform)
    assert backends, platform
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for kind in gpu_report.KINDS:
        for layout in ("axis 0", "axis -1"):
            for backend in backends:
                assert any(line.startswith(f"| {kind} | ") and layout in line
                           and f"| {backend} |" in line for line in rows), (kind, layout, backend)
    assert "failed" not in text
    assert "## Shapes, float32" in text and "## Machine and backend choice" in text
    # The shape table as data, which the cost model reads beside its own rows.
    import json

    table = json.loads(data.read_text())
    assert table["meta"]["platform"] == platform
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_model
    finally:
        sys.path.pop(0)
    measured = gpu_model.measured_rows(data)
    labels = [label for label, *_ in gpu_model.shapes()]
    assert sorted(measured) == sorted(labels)
    assert all({"tridiax", "floor"} <= set(methods) for methods in measured.values())
