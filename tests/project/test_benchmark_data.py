"""The benchmarks write their tables as data (--json) and benchmarks/plot.py draws them.

Each script runs at its smallest sizes in a subprocess; its JSON must have the documented
structure (benchmarks/_timing.py) and hold the numbers the script printed, and plot.py must turn
bench_shapes.py's JSON into a PNG.

The tables of benchmarks/README.md (the docs site's Performance page) are data too: each is a
`benchmarks/data/*.json` file of schema "tridiax-benchmark-table/1" (machine, CPU or GPU, jax
version, date, columns and rows, as printed), or comes straight from its runs' own files (the
shape table from sweep_order/, the accuracy table from accuracy_cpu.json, the GPU model's from
gpu_model_h100.json). The README must print what the data holds, number for number.
"""

import datetime
import importlib.util
import json
import math
import pathlib
import re
import subprocess
import sys

import jax
import pytest

from tridiax._core.backend import device_platform

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROW_KEYS = ["table", "case", "shape", "axis", "dtype", "method", "grad", "ms", "compile_s",
            "error", "ratio", "ratio_to"]
META_KEYS = {"schema", "script", "command", "date", "machine", "jax", "jaxlib", "platform",
             "device", "device_count", "cpu_count", "glibc_tunables", "args"}


def run(script, *args):
    """stdout of `python benchmarks/<script> *args`, which must succeed."""
    result = subprocess.run([sys.executable, f"benchmarks/{script}", *map(str, args)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def load(path, script):
    """The data file at `path`, checked against the schema of benchmarks/_timing.py."""
    data = json.loads(pathlib.Path(path).read_text())
    assert set(data) == {"meta", "rows"}
    meta, rows = data["meta"], data["rows"]
    assert META_KEYS <= set(meta), META_KEYS - set(meta)
    assert meta["schema"] == "tridiax-benchmark/1"
    assert meta["script"] == script and script in meta["command"] and "--json" in meta["command"]
    assert meta["jax"] == jax.__version__ and f"jax {jax.__version__}" in meta["machine"]
    assert meta["platform"] == device_platform(jax.devices()[0])
    when = datetime.datetime.fromisoformat(meta["date"])
    assert abs(datetime.datetime.now(datetime.UTC) - when) < datetime.timedelta(hours=1)
    assert rows
    for r in rows:
        assert list(r)[:len(ROW_KEYS)] == ROW_KEYS, r
        assert isinstance(r["table"], str) and isinstance(r["case"], str) and r["case"]
        assert isinstance(r["method"], str) and isinstance(r["grad"], bool)
        assert r["shape"] is None or all(isinstance(v, int) and v > 0 for v in r["shape"])
        assert r["dtype"] in (None, "float32", "float64")
        for key in ("ms", "compile_s", "error", "ratio"):
            assert r[key] is None or (isinstance(r[key], float | int) and r[key] >= 0), (key, r)
        assert (r["ratio"] is None) == (r["ratio_to"] is None), r
        if r["ratio"] is not None:  # ms / ms of the forward row of `ratio_to`, same table, case
            base = [b for b in rows if (b["table"], b["case"], b["dtype"], b["method"], b["grad"])
                    == (r["table"], r["case"], r["dtype"], r["ratio_to"], False)]
            assert len(base) == 1, r
            assert math.isclose(r["ratio"], r["ms"] / base[0]["ms"], rel_tol=1e-9), (r, base)
    return meta, rows


def test_shapes_data_holds_the_printed_table_and_plots(tmp_path):
    path = tmp_path / "data" / "shapes.json"  # a folder that does not exist yet
    out = run("bench_shapes.py", "--quick", "--dtype", "float32", "--only",
              "(N, B) = (100, 100 000)", "recurrence (T, F) = (1 000, 100 000)", "--json", path)
    meta, rows = load(path, "bench_shapes.py")
    assert f"machine: {meta['machine']}" in out.splitlines()
    assert meta["args"]["quick"] is True and meta["args"]["dtype"] == ["float32"]
    printed = [line.strip("|").split(" | ") for line in out.splitlines()
               if line.startswith("| ") and not line.startswith("| data |")]
    assert len(printed) == 2
    # Five rows per shape, in the printed order: tridiax, floor, tridiax fwd+grad, and the
    # baseline (lax for a solve, associative_scan for a recurrence) forward and fwd+grad.
    assert len(rows) == 10
    for cells, group in zip(printed, (rows[:5], rows[5:])):
        label, dtype, ours, floor, vs_floor, lax, lax_vs, grad, grad_vs, lax_grad, comp, err = (
            c.strip() for c in cells)
        baseline = "lax" if "recurrence" not in label else "associative_scan"
        by = {(r["method"], r["grad"]): r for r in group}
        assert set(by) == {("tridiax", False), ("floor", False), ("tridiax", True),
                           (baseline, False), (baseline, True)}
        assert {r["case"] for r in group} == {label} and {r["dtype"] for r in group} == {dtype}
        assert all(r["ratio_to"] == "floor" and r["table"] == "shapes" for r in group)
        assert all(r["op"] == ("solve" if baseline == "lax" else "recurrence") for r in group)
        assert group[0]["shape"] == [100, 1000] and group[0]["axis"] == 0
        fwd = by["tridiax", False]
        assert f"{fwd['ms']:.2f}" == ours
        assert f"{by['floor', False]['ms']:.2f}" == floor
        assert f"{fwd['ratio']:.2f}x" == vs_floor
        assert f"{by[baseline, False]['ms']:.1f}" == lax
        assert f"{by[baseline, False]['ms'] / fwd['ms']:.1f}x" == lax_vs
        assert f"{by['tridiax', True]['ms']:.1f}" == grad
        assert f"{by['tridiax', True]['ms'] / fwd['ms']:.2f}x" == grad_vs
        assert f"{by[baseline, True]['ms']:.1f}" == lax_grad
        assert f"{fwd['compile_s']:.2f}" == comp
        assert f"{fwd['error']:.0e}" == err and fwd["error"] < 1e-4
        assert all(r["compile_s"] > 0 for r in group)

    png = tmp_path / "shapes.png"
    assert f"wrote {png}" in run("plot.py", path, "-o", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000
    import matplotlib.image

    image = matplotlib.image.imread(png)
    assert image.shape[0] > 300 and image.shape[1] > 600
    assert image[..., :3].std() > 0.05  # drawn on, not blank


def test_plot_refuses_other_files(tmp_path):
    spec = importlib.util.spec_from_file_location("benchmarks_plot", ROOT / "benchmarks" / "plot.py")
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    wrong = tmp_path / "old.json"
    wrong.write_text(json.dumps({"machine": "x", "rows": []}))
    with pytest.raises(ValueError, match="schema"):
        plot.load(wrong)
    other = tmp_path / "banded.json"
    other.write_text(json.dumps({"meta": {"schema": "tridiax-benchmark/1"},
                                 "rows": [{"table": "banded"}]}))
    with pytest.raises(ValueError, match="no rows of table 'shapes'"):
        plot.load(other)


def test_banded_data_holds_the_printed_table(tmp_path):
    path = tmp_path / "banded.json"
    out = run("bench_banded.py", "--n", 8, "--batch", 24, "--repeats", 2, "--scipy-systems", 4,
              "--dense-systems", 4, "--json", path)
    _, rows = load(path, "bench_banded.py")
    printed = [line for line in out.splitlines() if line.startswith(("(N, B)", "(B, N)"))]
    assert len(printed) == len(rows) == 14
    methods = ["floor"] + [f"tridiax pivoting={p}" for p in (True, True, False, False)] + [
        "scipy loop", "dense LU"]
    grads = [False, False, True, False, True, False, False]
    for line, r, method, grad in zip(printed, rows, methods * 2, grads * 2):
        layout, cells = line[:16].strip(), line[38:].split()
        assert (r["case"], r["method"], r["grad"], r["ratio_to"]) == (layout, method, grad, "floor")
        assert r["shape"] == ([8, 24] if r["axis"] == 0 else [24, 8]) and r["bands"] == [2, 2]
        assert f"{r['ms']:.2f}" == cells[0] and f"{r['ratio']:.2f}" == cells[1]
        if r["compile_s"] is not None:
            assert f"{r['compile_s']:.2f}" == cells[2]
        if method.startswith("tridiax") and not grad:
            assert f"{r['error']:.1e}" == cells[3] and r["error"] < 1e-5
        else:
            assert r["error"] is None and cells[3] == "-"


def test_recurrence_data_holds_the_printed_table(tmp_path):
    path = tmp_path / "recurrence.json"
    out = run("bench_recurrence.py", "--T", 16, "--F", 8, "--repeats", 2, "--loop-T", 4,
              "--json", path)
    _, rows = load(path, "bench_recurrence.py")
    printed = [line for line in out.splitlines() if line.startswith("      8 ")]
    table = [r for r in rows if r["table"] == "recurrence"]
    forward = [r for r in table if not r["grad"]]
    assert len(printed) == len(forward) == 5
    names = {"floor": "fused 2-read 1-write", "pallas (T, 1)": "pallas (T, 1) block"}
    for line, r in zip(printed, forward):
        fwd_ms, bwd_ms, compile_s, err, vs_floor, bwd_vs = line[38:].split()
        assert line[8:38].strip() == names.get(r["method"], r["method"])
        assert (r["case"], r["shape"], r["ratio_to"]) == ("F=8", [16, 8], "floor")
        assert f"{r['ms']:.2f}" == fwd_ms and f"{r['ratio']:.2f}x" == vs_floor
        assert f"{r['compile_s']:.2f}" == compile_s
        assert err == ("-" if r["error"] is None else f"{r['error']:.1e}")
        grad = [g for g in table if g["grad"] and g["method"] == r["method"]]
        if bwd_ms == "-":
            assert not grad
        else:
            assert len(grad) == 1 and grad[0]["ratio_to"] == r["method"]
            assert f"{grad[0]['ms']:.2f}" == bwd_ms and f"{grad[0]['ratio']:.2f}" == bwd_vs
    compiles = [r for r in rows if r["table"] == "compile time"]
    assert [(r["case"], r["method"], r["grad"]) for r in compiles] == [
        ("T=4", "python loop", False), ("T=4", "tridiax.indrnn", False),
        ("T=10", "tridiax.indrnn", True), ("T=1000", "tridiax.indrnn", True),
        ("T=100000", "tridiax.indrnn", True)]
    assert all(r["ms"] is None and r["compile_s"] > 0 for r in compiles)


# --- benchmarks/README.md and the data behind its tables -------------------------------------

README = ROOT / "benchmarks" / "README.md"
DATA = ROOT / "benchmarks" / "data"
TABLE_SCHEMA = "tridiax-benchmark-table/1"
TABLE_KEYS = {"schema", "script", "command", "section", "machine", "cpu", "gpu", "jax", "date",
              "notes", "columns", "units", "rows"}
TABLE_FILES = sorted(p.name for p in DATA.glob("*.json")
                     if json.loads(p.read_text()).get("schema") == TABLE_SCHEMA)
# A table the README no longer prints (its section null) stays as data that others read:
# the H100 run, which benchmarks/gpu_model.py is fitted to.
RECORDS = [name for name in TABLE_FILES if json.loads((DATA / name).read_text())["section"] is None]
TABLE_FILES = [name for name in TABLE_FILES if name not in RECORDS]
# A number as the README prints it: digits grouped by spaces, then the unit "units" names.
NUMBER = re.compile(r"(\d+(?: \d{3})*(?:\.\d+)?) ?(ms|x|%)?")
SHAPES = "Every shape: few long systems, one long system, batch-first"
ACCURACY = "Accuracy against the sequential sweep"
MODEL = "A GPU model without a GPU"


def readme_sections() -> dict[str, list[str]]:
    """The lines under each `## ` or `### ` heading of benchmarks/README.md, by heading."""
    sections, lines = {}, None
    for line in README.read_text().splitlines():
        heading = re.match(r"#{2,3} (.+?)\s*$", line)
        if heading:
            lines = sections.setdefault(heading[1], [])
        elif lines is not None:
            lines.append(line)
    return sections


def readme_tables(lines: list[str]) -> list[tuple[list[str], list[list[str]]]]:
    """Each markdown table in `lines`: its header cells and the cells of each row."""
    tables, block = [], []
    for line in [*lines, ""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif block:
            assert set("".join(block[1])) <= set("-: "), block[1]  # the delimiter row
            tables.append((block[0], block[2:]))
            block = []
    return tables


def measured_on(lines: list[str]) -> str:
    """The section's text from its "Machine:" line on, with the lines joined."""
    text = " ".join(" ".join(lines).split())
    assert "Machine:" in text
    return text[text.index("Machine:"):]


def test_readme_helpers_read_a_table():
    lines = ["text", "| a | b |", "|---|---:|", "| x | 1 000 ms |", "", "more"]
    assert readme_tables(lines) == [(["a", "b"], [["x", "1 000 ms"]])]
    assert NUMBER.fullmatch("1 000 ms").groups() == ("1 000", "ms")
    assert NUMBER.fullmatch("(4096, 1024)") is None and NUMBER.fullmatch("10 x 10") is None


def test_every_readme_table_has_its_data():
    assert TABLE_FILES, "no benchmarks/data/*.json of the README's tables"
    sections = readme_sections()
    backed = {json.loads((DATA / name).read_text())["section"] for name in TABLE_FILES}
    for heading, lines in sections.items():
        if readme_tables(lines):
            assert heading in backed | {SHAPES, ACCURACY, MODEL}, f"{heading!r}: a table without data"
    text = README.read_text()
    for name in TABLE_FILES + RECORDS:  # the guide names each file, so a reader finds the data
        assert f"`{name}`" in text, name


@pytest.mark.parametrize("name", TABLE_FILES)
def test_readme_table_agrees_with_its_data(name):
    data = json.loads((DATA / name).read_text())
    assert set(data) == TABLE_KEYS, set(data) ^ TABLE_KEYS
    assert (ROOT / "benchmarks" / data["script"]).is_file()
    assert f"python benchmarks/{data['script']}" in data["command"]
    assert (data["cpu"] is None) != (data["gpu"] is None), "a CPU or a GPU"
    assert (data["cpu"] or data["gpu"]) in data["machine"] and f"jax {data['jax']}" in data["machine"]
    datetime.date.fromisoformat(data["date"])
    lines = readme_sections()[data["section"]]
    assert f"python benchmarks/{data['script']}" in " ".join(lines)
    machine = measured_on(lines)
    assert f"jax {data['jax']}" in machine and f"measured {data['date']}" in machine, machine[:300]

    tables = [rows for header, rows in readme_tables(lines) if header == data["columns"]]
    assert len(tables) == 1, f"{data['section']!r}: no table with the columns {data['columns']}"
    (rows,) = tables
    assert len(data["units"]) == len(data["columns"])
    assert len(rows) == len(data["rows"]), (len(rows), len(data["rows"]))
    for cells, values in zip(rows, data["rows"]):
        assert len(cells) == len(values) == len(data["columns"]), cells
        for column, cell, value, unit in zip(data["columns"], cells, values, data["units"]):
            if isinstance(value, str):
                assert cell == value, (column, cells)
                continue
            number = NUMBER.fullmatch(cell)
            assert number, (column, cell)
            assert float(number[1].replace(" ", "")) == value, (column, cells, values)
            assert number[2] == (None if cell == "0" else unit), (column, cell, unit)  # a bare 0: no unit


def _runs(pattern):
    return [json.loads(p.read_text()) for p in sorted((DATA / "sweep_order").glob(pattern))]


def test_readme_shape_table_is_its_runs():
    # ms: the minimum over the two runs of this code; / floor: that over the smallest floor
    # timed in the hour (the floor is an XLA op: the runs of the code before count too).
    lines = readme_sections()[SHAPES]
    ((header, rows),) = readme_tables(lines)
    assert header == ["data"] + [f"{dtype} {column}" for dtype in ("float32", "float64")
                                 for column in ("ms", "/ floor", "fwd+grad ms")]
    for dtype, cols in (("float32", slice(1, 4)), ("float64", slice(4, 7))):
        after, before = _runs(f"shapes_cpu_after_{dtype}_*.json"), _runs(f"shapes_cpu_before_{dtype}_*.json")
        assert len(after) == len(before) == 2
        for run in after:
            assert f"measured {run['meta']['date'][:10]}" in measured_on(lines)

        def best(runs, case, method, grad):
            return min(r["ms"] for run in runs for r in run["rows"]
                       if (r["case"], r["method"], r["grad"], r["dtype"]) == (case, method, grad, dtype))

        assert [c[0] for c in rows] == list(dict.fromkeys(r["case"] for r in after[0]["rows"]))
        for cells in rows:
            ms, ratio, grad = cells[cols]
            forward = best(after, cells[0], "tridiax", False)
            floor = best(after + before, cells[0], "floor", False)
            assert ms == f"{forward:.1f}", (dtype, cells)
            assert ratio == f"{forward / floor:.2f}x", (dtype, cells)
            assert grad == f"{best(after, cells[0], 'tridiax', True):.0f}", (dtype, cells)


def _accuracy_plan(row):
    """The README's name of the plan a row of accuracy_cpu.json measured."""
    kind, layout = row["kind"], row["case"].rsplit(" ", 1)[1]
    how = "whole" if row["plan"].startswith("whole") else "chunked"
    if kind == "thomas":
        return f"{how}, " + {"rows": "batch-first", "columns": "along axis 0", "one": "one system"}[layout]
    if kind in ("factored", "sharded"):
        return kind
    if kind == "periodic_pivoted":
        return "periodic pivoted"
    return f"{kind}, {how}"


def test_readme_accuracy_table_is_accuracy_cpu_json():
    data = json.loads((DATA / "accuracy_cpu.json").read_text())
    worst = {}
    for r in data["rows"]:
        key = (_accuracy_plan(r), r["dtype"], r["method"])
        worst[key] = max(worst.get(key, 0.0), r["error_ratio"])
    lines = readme_sections()[ACCURACY]
    assert f"measured {data['meta']['date'][:10]}" in measured_on(lines)
    ((header, rows),) = readme_tables(lines)
    columns = [tuple(column.split()) for column in header[1:]]  # (dtype, backend)
    plans = [cells[0].split(" (")[0] for cells in rows]
    assert sorted(plans) == sorted({plan for plan, _, _ in worst})
    for plan, cells in zip(plans, rows):
        for (dtype, backend), cell in zip(columns, cells[1:]):
            if cell == "-":  # not measured; the sharded solve runs alike whatever the backend
                assert (plan, dtype, backend) not in worst or (plan == "sharded" and backend != "native")
            else:
                assert cell == f"{worst[plan, dtype, backend]:.2f}", (plan, dtype, backend)


def test_readme_model_table_is_gpu_model_h100_json():
    data = json.loads((DATA / "gpu_model_h100.json").read_text())
    current = data["current"]
    lines = readme_sections()[MODEL]
    assert data["meta"]["date"][:10] in measured_on(lines)
    ((header, rows),) = readme_tables(lines)
    assert [cells[0] for cells in rows] == list(current["ratio"])
    for cells in rows:
        row = dict(zip(header, cells))
        ratio = current["ratio"][cells[0]]
        assert row["modelled / floor"] == f"{ratio:.2f}x", cells
        assert row["fwd+grad / fwd"] == f"{current['grad_ratio'][cells[0]]:.2f}x", cells
        assert row["meets"] == ("yes" if ratio <= float(row["goal"].rstrip("x")) else "no"), cells


def test_h100_table_is_the_run_the_model_is_fitted_to():
    measured = json.loads((DATA / "gpu_model_h100.json").read_text())["measured_commit"]["measured"]
    h100 = json.loads((DATA / "gpu_h100.json").read_text())
    column = h100["columns"].index
    assert [row[0] for row in h100["rows"]] == list(measured)
    for row in h100["rows"]:
        assert [row[column("tridiax ms")], row[column("floor ms")]] == measured[row[0]][:2], row


def test_planner_measurements_are_the_data_its_comments_name():
    # Every entry of the planner's measurements is named by a comment of the planner, and
    # every name such a comment gives is an entry: the numbers live in the data, the reasons
    # in the code.
    data = json.loads((ROOT / "benchmarks" / "data" / "planner.json").read_text())["decisions"]
    source = (ROOT / "tridiax" / "_core" / "planner.py").read_text()
    named = set(re.findall(r'(?:\(|planner\.json,\s+)"([a-z]+_[a-z_]+)"\)', source))
    assert named == set(data), (named ^ set(data))
    for name, entry in data.items():
        assert entry["decision"] and entry["measurements"], name
        assert all("machine" in m for m in entry["measurements"]), name
