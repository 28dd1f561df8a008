"""The documentation site (mkdocs.yml, docs/): `mkdocs build --strict` passes with no warning,
and every public name has an API reference entry.

Needs the `docs` extra (`pip install ".[docs]"`; CI installs it). Without it these tests fail
rather than skip, so a missing extra cannot hide a broken site.
"""

from __future__ import annotations

import html
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"

# The import names of what the `docs` extra installs.
_DOCS_MODULES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "lineax")


def _require_docs_extra():
    missing = []
    for name in _DOCS_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    if missing:
        pytest.fail(
            f"the documentation tools are not installed (missing: {', '.join(missing)}): "
            'install the docs extra, pip install -e ".[docs]" (CI installs it with .ci/run).',
            pytrace=False)


def _public_names() -> list[str]:
    """Every public name the API reference must document, fully qualified."""
    import tridiax
    import tridiax.lineax
    import tridiax.verify

    names = [f"tridiax.{name}" for name in tridiax.__all__]
    names += [f"tridiax.lineax.{name}" for name in tridiax.lineax.__all__]
    names += [f"tridiax.verify.{name}" for name in tridiax.verify.__all__]
    return names


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Build the site once, strictly, into a temporary directory; return (site dir, log)."""
    _require_docs_extra()
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(CONFIG), "-d", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    log = proc.stdout + proc.stderr
    return out, proc.returncode, log


def test_build_is_strict_and_clean(site):
    out, returncode, log = site
    warnings = [line for line in log.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert returncode == 0 and not warnings, (
        f"mkdocs build --strict failed (exit {returncode}):\n" + "\n".join(warnings or [log]))
    assert (out / "index.html").is_file()


def test_every_public_name_has_a_reference_entry(site):
    out, returncode, log = site
    assert returncode == 0, log
    directives = set()
    for page in (DOCS / "api").glob("*.md"):
        directives |= set(re.findall(r"^:::\s+([\w.]+)\s*$", page.read_text(), flags=re.M))
    anchors = set()
    for page in (out / "api").rglob("*.html"):
        anchors |= {html.unescape(a) for a in re.findall(r'id="(tridiax[\w.]*)"', page.read_text())}
    names = _public_names()
    missing_directive = [name for name in names if name not in directives]
    missing_anchor = [name for name in names if name not in anchors]
    assert not missing_directive, (
        f"no `::: name` entry under docs/api/ for {missing_directive}: add one to the page of "
        "its group")
    assert not missing_anchor, f"no rendered reference (HTML anchor) in the built site for {missing_anchor}"


def test_example_figures_are_in_the_site(site):
    """The Examples page is examples/README.md (docs/_hooks/readmes.py) and shows every figure of
    examples/figures/ (served by docs/_hooks/figures.py, with no copy under docs/)."""
    out, returncode, log = site
    assert returncode == 0, log
    figures = sorted(p.name for p in (ROOT / "examples" / "figures").glob("*.png"))
    assert figures
    page = (out / "examples" / "index.html").read_text()
    for name in figures:
        assert (out / "examples" / "figures" / name).is_file(), name
        assert f'src="figures/{name}"' in page, f"the Examples page does not show {name}"
    assert not list(DOCS.rglob("*.png"))


def test_examples_and_performance_pages_are_the_readmes(site):
    # Each section of the READMEs is a section of its page: they cannot drift apart.
    out, returncode, log = site
    assert returncode == 0, log
    for page, readme in (("examples", "examples/README.md"), ("performance", "benchmarks/README.md")):
        built = html.unescape(re.sub(r"<[^>]+>", "", (out / page / "index.html").read_text()))
        headings = re.findall(r"^##+ (.+?)\s*$", (ROOT / readme).read_text(), flags=re.M)
        assert headings
        for heading in headings:
            assert heading.replace("`", "") in built, f"{readme}: {heading!r} is not on the page"
    assert not (DOCS / "examples.md").exists() and not (DOCS / "performance.md").exists()


def test_math_is_rendered_by_arithmatex(site):
    """`$...$` in pages and docstrings becomes MathJax input, not literal dollars."""
    out, returncode, log = site
    assert returncode == 0, log
    solves = (out / "api" / "solves" / "index.html").read_text()
    assert 'class="arithmatex"' in solves
    assert "$Ax = b$" not in solves


def _pages_with_code():
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")
                  if "```python\n" in p.read_text())


@pytest.mark.parametrize("page", _pages_with_code())
def test_code_on_each_page_runs(page):
    # A page's ```python blocks, in order, as one program (later blocks may use earlier
    # names). Blocks fenced ```py are shown only: signatures, and code that needs several hosts.
    text = (DOCS / page).read_text()
    program = "\n".join(b.split("```", 1)[0] for b in text.split("```python\n")[1:])
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, f"docs/{page}:\n{proc.stderr[-3000:]}"


def test_readme_links_to_pages_that_exist():
    # The README is short and points to the pages: every relative link must resolve.
    text = (ROOT / "README.md").read_text()
    links = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) if "://" not in t]
    assert len(links) >= 10
    missing = [t for t in links if not (ROOT / t).exists()]
    assert not missing, missing


def _array_like_parameters() -> set[str]:
    """`name: annotation` of every parameter of the public API annotated with ArrayLike, as the
    source writes it (the functions, and the classes' __init__ and public methods)."""
    import inspect

    found = set()
    for qualified in _public_names():
        module, _, name = qualified.rpartition(".")
        obj = getattr(importlib.import_module(module), name)
        members = [obj]
        if inspect.isclass(obj):
            members = [obj.__init__] + [m for k, m in vars(obj).items()
                                        if not k.startswith("_") and inspect.isfunction(m)]
        for member in members:
            if not callable(member):
                continue
            try:
                signature = inspect.signature(member)
            except (TypeError, ValueError):
                continue
            for parameter in signature.parameters.values():
                annotation = parameter.annotation
                if isinstance(annotation, str) and "ArrayLike" in annotation:
                    found.add(f"{parameter.name}: {annotation}")
    assert "lower: ArrayLike" in found, found  # the scan found them
    return found


def test_array_like_parameters_render_as_array_like(site):
    # griffe resolved jax.typing.ArrayLike to the typing.Union it aliases, and the reference
    # showed "lower: Union" (46 times): it shows the alias, as the source writes it.
    out, returncode, log = site
    assert returncode == 0, log
    text = ""
    for page in sorted((out / "api").rglob("*.html")):
        text += html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
    text = re.sub(r"\s+", " ", text)
    unions = re.findall(r"\w+: Union\b", text)
    assert not unions, f"{len(unions)} parameters render as Union, e.g. {unions[:5]}"
    missing = sorted(p for p in _array_like_parameters() if p not in text)
    assert not missing, f"not shown in the API reference: {missing}"
