"""The documentation's code runs: every fenced ``python`` block of README.md
and docs/, and every code cell of its notebooks, compiles and its imports
resolve (CI's cover for the tutorial notebook, which runs whole only in the
``release`` tier); the blocks marked ``<!-- test:
run -->`` (the line before the fence), which start no Ray, run, each page's
marked blocks in order in one namespace, as a reader would paste them. The
job specs shown there pass the spec schema, and the README's test command is
the one CI runs. (The site itself is built, warnings as errors, by the
README's test command: ``mkdocs build --strict``.)
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
RUN_MARK = "<!-- test: run -->"
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    source: str
    runnable: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        indent = len(match["indent"])
        body = "".join(line[indent:] + "\n" for line in match["body"].splitlines())
        found.append(Block(page, text.count("\n", 0, match.start()) + 1, match["lang"], body, before == RUN_MARK))
    return found


def notebook_cells(notebook: Path) -> list[Block]:
    """The code cells of ``notebook``, as python blocks numbered by cell."""
    cells = json.loads(notebook.read_text())["cells"]
    return [
        Block(notebook, number, "python", "".join(cell["source"]), False)
        for number, cell in enumerate(cells, 1)
        if cell["cell_type"] == "code"
    ]


ALL = [block for page in PAGES for block in blocks(page)]
PYTHON = [block for block in ALL if block.lang == "python"]
NOTEBOOK_CELLS = [cell for notebook in sorted((ROOT / "docs").rglob("*.ipynb")) for cell in notebook_cells(notebook)]
RUNNABLE_PAGES = sorted({block.page for block in PYTHON if block.runnable})


def test_the_pages_have_code_and_some_of_it_runs():
    assert len(PYTHON) >= 15
    assert {page.name for page in RUNNABLE_PAGES} >= {"sequences.md", "planning.md"}
    # a marker must sit right before a python fence, or it checks nothing
    for page in PAGES:
        text = page.read_text()
        marked = text.count(RUN_MARK) - text.count(f"`{RUN_MARK}`")
        assert marked == sum(1 for b in PYTHON if b.page == page and b.runnable), page


@pytest.mark.parametrize("block", PYTHON + NOTEBOOK_CELLS, ids=lambda block: block.where)
def test_python_compiles_and_its_imports_resolve(block):
    tree = ast.parse(block.source, block.where)
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
    code = compile(ast.Module(body=imports, type_ignores=[]), block.where, "exec")
    exec(code, {})  # an API renamed or moved fails here


@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_marked_blocks_run(page, tmp_path, monkeypatch):
    import ray
    from ray import tune

    import ray_stagetree

    def refuse(what):
        def refused(*args, **kwargs):
            raise AssertionError(f"a block marked to run started Ray ({what})")

        return refused

    # Refused rather than looked for afterwards: this process's Ray may be the session's, started by another test.
    monkeypatch.setattr(ray, "init", refuse("ray.init"))
    monkeypatch.setattr(ray_stagetree.Tuner, "fit", refuse("ray_stagetree.Tuner.fit"))
    monkeypatch.setattr(tune.Tuner, "fit", refuse("ray.tune.Tuner.fit"))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for block in (b for b in PYTHON if b.page == page and b.runnable):
        exec(compile(block.source, block.where, "exec"), namespace)


def test_job_specs_shown_pass_the_schema():
    from ray_stagetree.jobs.schema import problems

    specs = [b for b in ALL if b.lang == "yaml" and "trainable:" in b.source]
    assert specs, "the CLI guide shows a job spec"
    for block in specs:
        assert problems(yaml.safe_load(block.source)) == [], block.where


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    (command,) = [line for line in readme.splitlines() if line.startswith("apt-get update")]
    ci = (ROOT / ".ci" / "run").read_text().rstrip("\n").splitlines()
    assert ci[-1] == command
    assert "mkdocs build --strict" in command


def test_links_between_readme_and_docs_resolve():
    # mkdocs checks links inside docs/; the README's relative links are checked here
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((?!https?://)([^)#]+)(?:#[^)]*)?\)", readme)
    assert targets
    missing = [target for target in targets if not (ROOT / target).exists()]
    assert missing == []


def test_no_links_outside_the_repository():
    included = [
        ROOT / "ARCHITECTURE.md",
        ROOT / "CONTRIBUTING.md",
        ROOT / "release" / "RESULTS.md",
    ]  # the site shows them too
    for page in [*PAGES, *included]:
        text = page.read_text()
        assert "../shared/" not in text, page
        assert not re.search(r"\bissue \d+\b", text, re.I), f"{page}: say what the issue is about, not its number"


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.release
def test_the_tutorial_notebook_runs_quietly(tmp_path):
    """docs/tutorial.ipynb, executed from its first cell to its last in a fresh
    kernel as a reader runs it (its own local Ray; the page shows the outputs
    it was saved with): a study, its results, the monitor, an interrupted
    study restored; and nothing of Ray's INFO lines, widget hints or stack
    traces on the way."""
    for module in ("nbformat", "nbconvert", "ipykernel", "ipywidgets", "mnist1d", "torch", "flask"):
        pytest.importorskip(module)
    from notebooks import displays, execute, noise, stream

    notebook = tmp_path / "tutorial.ipynb"
    shutil.copy(ROOT / "docs" / "tutorial.ipynb", notebook)
    cells, kernel_stderr = execute(notebook, {"RAY_ADDRESS": "local"}, timeout=600)
    code = [cell for cell in cells if cell["cell_type"] == "code"]

    assert noise(cells, kernel_stderr) == []
    printed = "\n".join(stream(cell, "stdout") for cell in code)
    assert re.search(r"epochs executed: \d+; trial by trial: 96 \(\d\.\d\dx fewer executed\)", printed)
    assert "monitor at http://127.0.0.1:" in printed
    assert any("image/svg+xml" in output["data"] for cell in code for output in displays(cell))
    interrupted = re.search(r"(\d+) of 8 trials finished", printed)
    assert interrupted and int(interrupted.group(1)) < 8
    assert "8 of 8 trials finished, 0 errors" in printed


def test_rendered_examples_show_no_doctest_directives():
    sys.path.insert(0, str(ROOT))
    try:
        from mkdocs_hooks import on_page_content
    finally:
        sys.path.remove(str(ROOT))
    page = "<p>grid = tuner.fit()                 # doctest: +SKIP\\nbest = grid[0]  # doctest: +ELLIPSIS, +SKIP</p>"
    assert on_page_content(page) == "<p>grid = tuner.fit()\\nbest = grid[0]</p>"
