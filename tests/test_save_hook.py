"""widgets/save_hook.py: saving a chapter keeps its widgets (found by a learner walk: after an autosave a
reopened chapter showed "Error displaying widget: model not found"), and `make lab` installs the hook
and the widget manager's saveState."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from widgets.save_hook import NOT_SAVED, STATE, VIEW, coalesce_streams, keep_widget_pictures, mend

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((REPO / "chapters").glob("*.ipynb"))


def model(name: str, **state) -> dict:
    return {"model_name": name, "model_module": "@jupyter-widgets/controls", "state": state}


def widget_output(model_id: str, still: bool = True) -> dict:
    data = {VIEW: {"model_id": model_id, "version_major": 2, "version_minor": 0}, "text/plain": "VBox(...)"}
    if still:
        data["text/html"] = "<div class='widget-still'>a still</div>"
    return {"output_type": "display_data", "data": data, "metadata": {}}


def notebook(outputs: list[dict], state: dict[str, dict]) -> dict:
    return {"cells": [{"cell_type": "code", "outputs": outputs, "source": ""}],
            "metadata": {"widgets": {STATE: {"version_major": 2, "version_minor": 0, "state": state}}}}


# model ids are hex strings: b0 a box holding a1 (play) and c2 (slider) with layout d3; e4 links a1 and c2
SAVED = {"b0": model("VBoxModel", children=["IPY_MODEL_a1", "IPY_MODEL_c2"], layout="IPY_MODEL_d3"),
         "a1": model("PlayModel"), "c2": model("IntSliderModel"), "d3": model("LayoutModel"),
         "e4": model("LinkModel", source=["IPY_MODEL_a1", "value"], target=["IPY_MODEL_c2", "value"])}


def state_of(nb: dict) -> dict:
    return nb["metadata"]["widgets"][STATE]["state"]


def test_a_save_before_running_keeps_the_models_on_disk():
    """The kernel holds none of the saved widgets yet: the state being saved is empty."""
    nb = notebook([widget_output("b0")], {})
    mend(nb, SAVED)
    assert state_of(nb) == SAVED  # the box, its children, its layout and the link between play and slider


def test_the_state_being_saved_wins_and_unreachable_models_go():
    live = {"b5": model("VBoxModel", children=["IPY_MODEL_a6"]), "a6": model("PlayModel"),
            "f7": model("VBoxModel", children=[])}  # a widget of a cell that was run again: no output shows it
    nb = notebook([widget_output("b5")], live)
    mend(nb, SAVED)
    assert set(state_of(nb)) == {"b5", "a6"}


def test_a_reference_found_nowhere_shows_the_still_picture():
    nb = notebook([widget_output("gone"), widget_output("gone2", still=False)], {})
    mend(nb, {})
    first, second = nb["cells"][0]["outputs"]
    assert VIEW not in first["data"] and "a still" in first["data"]["text/html"]
    assert VIEW not in second["data"] and second["data"]["text/html"] == NOT_SAVED


def test_a_notebook_without_widgets_saves_no_widget_state():
    """JupyterLab writes an empty state into every notebook it saves; chapter 00 has no widget, and its
    committed file has no state (found by the browser test: a save right after opening changed it)."""
    nb = notebook([], {})
    mend(nb, {})
    assert "widgets" not in nb["metadata"]


def test_progress_rewritten_in_place_is_saved_as_its_last_version():
    """nbconvert keeps every print of a cell as its own output; JupyterLab joins them and applies the
    carriage returns (found in chapter 07: a progress line saved as some forty outputs)."""
    stream = lambda text, name="stdout": {"output_type": "stream", "name": name, "text": text}  # noqa: E731
    cell = {"cell_type": "code", "outputs": [
        stream("⚠ busy\n"), stream(["\r", "round 1 of 2   "]), stream("\rround 2 of 2   "),
        stream("\rdone in 3.0 s\n"), stream("warned\n", "stderr"), stream("the words\n"),
        {"output_type": "display_data", "data": {"text/plain": "a plot"}, "metadata": {}}, stream("after\n")]}
    nb = {"cells": [cell, {"cell_type": "markdown", "source": "x"}]}
    coalesce_streams(nb)
    assert [o.get("text") for o in cell["outputs"]] == [
        "⚠ busy\ndone in 3.0 s  \n", "warned\n", "the words\n", None, "after\n"]
    coalesce_streams(nb)  # joined once, it stays as it is
    assert [o.get("text") for o in cell["outputs"]][0] == "⚠ busy\ndone in 3.0 s  \n"


def test_make_execute_joins_the_prints_of_a_real_notebook_file(tmp_path):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from widgets.save_hook import mend_files

    cell = new_code_cell("x", outputs=[new_output("stream", name="stdout", text="\rround 1"),
                                       new_output("stream", name="stdout", text="\rdone   \n")])
    path = tmp_path / "ch.ipynb"
    nbformat.write(new_notebook(cells=[cell]), path)
    mend_files([str(path)])
    outputs = nbformat.read(path, as_version=4).cells[0].outputs
    assert [o.text for o in outputs] == ["done   \n"]


def test_the_hook_reads_the_file_on_disk(tmp_path):
    (tmp_path / "ch.ipynb").write_text(json.dumps(notebook([widget_output("b0")], SAVED)))
    saving = {"type": "notebook", "content": notebook([widget_output("b0")], {})}

    class Contents:  # what the hook uses of the server's contents manager
        root_dir = str(tmp_path)

    keep_widget_pictures(saving, "/ch.ipynb", Contents())
    assert state_of(saving["content"]) == SAVED
    keep_widget_pictures({"type": "file", "content": "text"}, "/notes.txt", Contents())  # not a notebook: untouched


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_committed_chapter_is_saved_as_the_hook_saves_it(chapter):
    """Saved unchanged in JupyterLab, a committed chapter comes back byte for byte (`make execute`
    mends it the same way after executing it)."""
    nb = json.loads(chapter.read_text())
    before = copy.deepcopy(nb)
    mend(nb, {})
    assert nb == before, f"{chapter.name}: run `.venv/bin/python -m widgets.save_hook {chapter.relative_to(REPO)}`"


def test_make_lab_installs_the_hook_and_saves_widget_state():
    makefile = (REPO / "Makefile").read_text()
    assert "cp scripts/jupyter_server_config.json $(VENV)/etc/jupyter/jupyter_server_config.json" in makefile
    config = json.loads((REPO / "scripts" / "jupyter_server_config.json").read_text())
    assert config["ContentsManager"]["pre_save_hook"] == "widgets.save_hook.keep_widget_pictures"
    overrides = json.loads((REPO / "scripts" / "jupyterlab_overrides.json").read_text())
    assert overrides["@jupyter-widgets/jupyterlab-manager:plugin"]["saveState"] is True
