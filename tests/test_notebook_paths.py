"""The chapters run from any working directory: JupyterLab starts kernels in the notebook's folder,
nbval and `make execute` too, but a learner may open a notebook from the repository root (or run it
with `jupyter execute chapters/...`). Every file a chapter reads must be found through an installed
package (`Path(minillm.__file__)`), never through a path relative to the working directory."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((REPO / "chapters").glob("*.ipynb"))
PATH_CALLS = {"open", "Path", "Image", "read_csv", "load", "loadtxt"}  # calls whose first argument is a file


def code_cells(notebook: Path) -> list[tuple[int, str]]:
    cells = json.loads(notebook.read_text())["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"]


def relative_paths(source: str) -> list[str]:
    """String literals used as file paths relative to the working directory in one cell's code."""
    tree = compile(source, "<cell>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(("../", "./")):
            found.append(node.value)
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            args = list(node.args[:1]) + [k.value for k in node.keywords if k.arg in ("filename", "file", "path")]
            if name in PATH_CALLS and not (name == "load" and isinstance(node.func, ast.Name)):  # torch.load, np.load
                found += [a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return found


def test_the_path_finder_finds_relative_paths():
    """The scan below would catch what it is meant to catch."""
    assert relative_paths('open("benchmarks/results/x.json")') == ["benchmarks/results/x.json"]
    assert relative_paths('Image(filename="plot.png")') == ["plot.png"]
    assert relative_paths('p = Path("../benchmarks")') == ["../benchmarks", "../benchmarks"]
    assert relative_paths('Path(minillm.__file__).parent / "benchmarks"\nawait x()') == []
    assert relative_paths('torch.load("weights.pt")') == ["weights.pt"]
    assert relative_paths('load("ch07.best_k")') == []  # exercises.grading.load takes an exercise's name


@pytest.mark.parametrize("notebook", CHAPTERS, ids=lambda p: p.stem)
def test_no_chapter_reads_a_path_relative_to_the_working_directory(notebook: Path):
    offenders = [(i, path) for i, source in code_cells(notebook) for path in relative_paths(source)]
    assert not offenders, f"{notebook.name}: cells read paths relative to the working directory: {offenders}"


def test_chapter_00_runs_from_the_repository_root():
    """Executed with the repository root as the working directory (nbval runs it from chapters/)."""
    notebook = nbformat.read(REPO / "chapters" / "00_setup.ipynb", as_version=4)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO)}})
    client.execute()  # raises CellExecutionError on the first error output
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("installed" in o.get("text", "") for o in outputs), "chapter 00's import check did not print"
