"""What the documentation says is what the code does: docstring examples run, help() lists
the API, the claims about backends hold, and benchmarks/README.md reads as a user's guide."""

import inspect
import pathlib
import pydoc
import re

import pytest

import tridiax

ROOT = pathlib.Path(__file__).parents[2]


def _documented_objects():
    """Every public object whose docstring a user reads: tridiax's names, their public
    methods and properties, tridiax.lineax and tridiax.verify."""
    objects = [("tridiax", tridiax), ("tridiax.lineax", tridiax.lineax),
               ("tridiax.lineax.TDMA", tridiax.lineax.TDMA)]
    for module, names in ((tridiax, tridiax.__all__), (tridiax.verify, tridiax.verify.__all__)):
        for name in names:
            obj = getattr(module, name)
            objects.append((f"{module.__name__}.{name}", obj))
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if not attr.startswith("_") and getattr(member, "__doc__", None):
                        objects.append((f"{module.__name__}.{name}.{attr}", member))
    return objects


def _examples(doc: str) -> list[str]:
    return [inspect.cleandoc(block) for block in re.findall(r"```python\n(.*?)```", doc, re.S)]


EXAMPLES = [(name, code) for name, obj in _documented_objects()
            for code in _examples(inspect.getdoc(obj) or "")]


def test_docstring_examples_were_found():
    names = {name for name, _ in EXAMPLES}
    assert {"tridiax.solve_tridiagonal", "tridiax.solve_periodic_tridiagonal",
            "tridiax.Tridiagonal"} <= names


@pytest.mark.parametrize("name,code", EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_docstring_example_runs(name, code):
    exec(compile(code, name, "exec"), {})


def test_help_lists_the_public_api():
    text = pydoc.render_doc(tridiax, renderer=pydoc.plaintext)
    for name in tridiax.__all__:
        assert name in text, name
    assert "solve_tridiagonal(lower" in text and "class Tridiagonal(" in text


def test_all_is_the_public_surface():
    public = {name for name in vars(tridiax) if not name.startswith("_")}
    public -= {"importlib"}  # the module's own import
    assert set(tridiax.__all__) == public - {"lineax"}
    assert len(tridiax.__all__) == len(set(tridiax.__all__))


def test_docstrings_name_the_kernels_that_run():
    # The CPU solve is the C++ kernel (an XLA loop only where no compiler is found).
    doc = inspect.getdoc(tridiax.solve_tridiagonal)
    assert "on CPU an XLA loop" not in doc
    assert "C++ kernel" in doc
    from tridiax._core.backend import default_backend
    from tridiax._native import build as _native

    assert default_backend("cpu", "float32") == ("native" if _native.available() else "xla")


def test_benchmarks_readme_is_a_guide_for_users():
    # The docs site's Performance page: how fast tridiax is now, on which machine, and how to
    # measure it. How it got there is in git, not in the guide.
    text = (ROOT / "benchmarks" / "README.md").read_text()
    assert len(text.splitlines()) < 300, "a guide, not a log: under 300 lines"
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("bench_*.py"))
    scripts += ["gpu_report.py", "gpu_model.py"]
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    for script in scripts:  # each benchmark: a section with its command, machine and table
        section = next((s for s in sections if f"python benchmarks/{script}" in s), None)
        assert section is not None, f"{script} has no section with its command"
        assert re.search(r"\| ?-{3}", section), f"{script}: no table"
        assert "Machine:" in section and "jax " in section, f"{script}: no machine line"
        assert "**Conclusion" in section, f"{script}: no conclusion"
    headings = re.findall(r"^#+ .*$", text, flags=re.M)
    assert not [h for h in headings if "(20" in h], "dated headings: a date belongs to a measurement"
    for phrase in ("issue", "lent to", "/tmp", "session", "later", "→", "->"):  # no development log
        assert phrase not in text.lower(), phrase
    hashes = re.findall(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", text)
    assert not hashes, f"commit hashes: {hashes}"


def test_scipy_banded_layout_conversion_in_the_docstring():
    # A user passed scipy's rows straight in (ab[2], ab[1], ab[0]) and got a 22% error: the
    # docstring says how scipy's `ab` maps to the bands, and its conversion gives scipy's x.
    import numpy as np
    import scipy.linalg

    doc = inspect.getdoc(tridiax.solve_tridiagonal)
    conversion = next(line for line in doc.splitlines()
                      if line.startswith("lower, diag, upper = ") and "ab[" in line).split("#")[0]
    mapping = re.findall(r"`(ab\[[^`]+\])` is `(\w+(?:\[[^`]+\])?)`", " ".join(doc.split()))
    assert {name.split("[")[0] for _, name in mapping} == {"lower", "diag", "upper"}, mapping
    rng = np.random.default_rng(0)
    for n in (2, 5, 33):
        ab = rng.standard_normal((3, n))
        ab[1] += 4.0
        b = rng.standard_normal(n)
        bands = {"np": np, "ab": ab}
        exec(conversion, bands)
        expected = scipy.linalg.solve_banded((1, 1), ab, b)
        x = tridiax.solve_tridiagonal(bands["lower"], bands["diag"], bands["upper"], b)
        np.testing.assert_allclose(x, expected, rtol=1e-10, atol=1e-12)
        for scipy_part, band in mapping:  # the prose says the same as the code
            np.testing.assert_array_equal(eval(scipy_part, bands), eval(band, bands))


def _benchmark_section(heading: str) -> str:
    text = (ROOT / "benchmarks" / "README.md").read_text()
    return next(s for s in re.split(r"^## ", text, flags=re.M) if s.startswith(heading))


def test_periodic_pivoting_cost_agrees_with_the_benchmark():
    # The docstring said 2.5-3.5x where the guide and the benchmark said 1.9-3.7x: every
    # statement gives the range of the benchmark table's "/ pivoted" column.
    section = _benchmark_section("Factor once, solve many; periodic solves")
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| (")]
    header = next(line for line in section.splitlines() if line.startswith("| layout"))
    column = [c.strip() for c in header.split("|")[1:-1]].index("/ pivoted")
    ratios = [float(row[column].strip().rstrip("x")) for row in rows]
    assert len(ratios) == 4, ratios
    low, high = f"{min(ratios):.1f}", f"{max(ratios):.1f}"
    doc = " ".join(inspect.getdoc(tridiax.solve_periodic_tridiagonal).split())
    assert f"Costs {low}-{high}x a pivoted solve" in doc, doc
    guide = " ".join((ROOT / "docs" / "guides" / "periodic.md").read_text().split())
    assert f"it costs {low}–{high}x a pivoted plain solve" in guide
    assert f"costs {low}–{high}x a pivoted solve" in " ".join(section.split())


def test_cxx_default_is_the_code_s_and_the_same_everywhere():
    # The README and the getting-started page name the compilers in the order
    # compiler.find_compiler tries them after $CXX.
    from tridiax._native import compiler

    tried = re.findall(r'shutil\.which\("([^"]+)"\)', inspect.getsource(compiler.find_compiler))
    assert tried == ["c++", "g++"], tried
    default = ", else ".join(f"`{name}`" for name in tried)
    for page in ("README.md", "docs/getting-started.md"):
        line = next(line for line in (ROOT / page).read_text().splitlines()
                    if line.startswith("- `CXX`"))
        assert f"(default: {default}, the first found on `PATH`)" in line, (page, line)


def _readme_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_quick_example_says_what_dropping_axis_0_does():
    # Without axis=0 the call is valid and solves another problem: a user dropped it. The line
    # above the call says so, and what it says holds (checked against scipy, row by row).
    import numpy as np
    import scipy.linalg

    quick = next(code for code in _readme_examples() if "u_new = tridiax" in code)
    lines = quick.splitlines()
    call = next(i for i, line in enumerate(lines) if line.startswith("u_new = "))
    comment = lines[call - 1]
    assert "axis=0" in lines[call] and comment.startswith("# axis=0"), comment
    assert "each row of u" in comment and "constant-coefficient" in comment, comment
    names = {}
    exec(compile(quick, "README.md", "exec"), names)
    lower, diag, upper, u = (np.asarray(names[k], np.float64) for k in ("lower", "diag", "upper", "u"))
    dropped = np.asarray(tridiax.solve_tridiagonal(lower, diag, upper, u))  # axis=-1
    assert dropped.shape == u.shape
    rods = u.shape[1]
    for i in (0, u.shape[0] // 2, u.shape[0] - 1):  # row i: one system, constant coefficients
        ab = np.stack([np.full(rods, upper[i, 0]), np.full(rods, diag[i, 0]),
                       np.full(rods, lower[i, 0])])
        np.testing.assert_allclose(dropped[i], scipy.linalg.solve_banded((1, 1), ab, u[i]),
                                   rtol=1e-5, atol=1e-6)
    assert not np.allclose(dropped, np.asarray(names["u_new"]), rtol=1e-3)
