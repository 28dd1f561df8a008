"""What the documentation says is what the code does: docstring examples run, help() lists
the API, the claims about backends hold, and benchmarks/README.md reads as a user's guide."""

import inspect
import pathlib
import pydoc
import re

import pytest

import tridiax

ROOT = pathlib.Path(__file__).parent.parent


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
    from tridiax._backend import default_backend
    from tridiax._kernels import _native

    assert default_backend("cpu", "float32") == ("native" if _native.available() else "xla")


def test_benchmarks_readme_is_a_guide_for_users():
    text = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("bench_*.py"))
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    for script in scripts:  # each benchmark: a section with its command, machine and table
        section = next((s for s in sections if f"python benchmarks/{script}" in s), None)
        assert section is not None, f"{script} has no section with its command"
        assert re.search(r"\| ?-{3}", section), f"{script}: no table"
        assert "Machine:" in section and "jax " in section, f"{script}: no machine line"
        assert "**Conclusion" in section, f"{script}: no conclusion"
    for phrase in ("issue", "lent to", "/tmp", "this session"):  # no development log
        assert phrase not in text.lower(), phrase
