"""Saving a chapter keeps its widgets: a Jupyter server pre-save hook.

A widget output in a notebook is a reference (`model_id`) into the widget state stored in the
notebook's metadata. JupyterLab's widget manager (with `saveState` on) writes that state on save,
but only for the widgets the running kernel holds: save before running a cell, and the pictures
saved with the chapter lose their models; reopen it, and JupyterLab shows "Error displaying widget:
model not found". This hook mends the state on its way to disk:

    output refers to model 3f2a…   in the state being saved?    yes → keep it
                                   in the file on disk?          yes → keep that saved one
                                   nowhere                       → drop the reference, so the
                                                                   output's still picture shows

and leaves out models no output can reach any more (widgets of cells run again since). `make lab`
installs it (scripts/jupyter_server_config.json); every widget of the course carries a still
picture (`widgets/animation.py::StillFallback`), so a dropped reference still shows something.

`make execute` ends with `mend_files`, which also joins each cell's consecutive prints the way
JupyterLab's output area does (`coalesce_streams`): a progress line rewritten in place with a
carriage return is saved as its last version, not as one output per rewrite.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

VIEW = "application/vnd.jupyter.widget-view+json"
STATE = "application/vnd.jupyter.widget-state+json"
REFERENCE = re.compile(r"IPY_MODEL_([0-9a-f]+)")
LINKS = ("LinkModel", "DirectionalLinkModel")  # referenced by nothing, but they make an animation play
NOT_SAVED = ("<div class='widget-still'><p style='color:#666'><i>This widget was not saved with the notebook: "
             "run its cell to see it.</i></p></div>")


def keep_widget_pictures(model: dict, path: str = "", contents_manager: Any = None, **kwargs: Any) -> None:
    """The pre-save hook (`ContentsManager.pre_save_hook`): mend `model`'s widget state in place."""
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    on_disk = _saved_state(contents_manager, path)
    mend(model["content"], on_disk)


def mend(notebook: dict, on_disk: dict[str, dict]) -> None:
    """Give every widget output of `notebook` its model (from its own state, else from `on_disk`),
    drop the references to models found nowhere, and keep only the models the outputs can reach."""
    widgets = notebook.setdefault("metadata", {}).get("widgets", {})
    state = dict(widgets.get(STATE, {}).get("state", {}))
    known = {**on_disk, **state}  # the state being saved wins over the file's
    kept: dict[str, dict] = {}
    for output in _widget_outputs(notebook):
        model_id = output["data"][VIEW].get("model_id", "")
        if model_id in known:
            _reach(model_id, known, kept)
        else:  # its model is lost: show the still picture (or a note) instead of an error
            del output["data"][VIEW]
            output["data"].setdefault("text/html", NOT_SAVED)
    for model_id, m in known.items():  # links between kept widgets (Play ↔ slider) come along
        if m.get("model_name") in LINKS and set(_references(m)) <= set(kept):
            kept[model_id] = m
    if kept:
        version = widgets.get(STATE, {})
        notebook["metadata"]["widgets"] = {STATE: {"version_major": version.get("version_major", 2),
                                                   "version_minor": version.get("version_minor", 0), "state": kept}}
    else:  # no widget to show: no state at all, so a chapter without widgets saves as it was committed
        notebook["metadata"].pop("widgets", None)


def _widget_outputs(notebook: dict) -> list[dict]:
    return [o for cell in notebook.get("cells", []) if cell.get("cell_type") == "code"
            for o in cell.get("outputs", []) if isinstance(o.get("data"), dict) and VIEW in o["data"]]


def _references(model: dict) -> list[str]:
    return REFERENCE.findall(json.dumps(model.get("state", {})))


def _reach(model_id: str, known: dict[str, dict], kept: dict[str, dict]) -> None:
    """`model_id` and every model it refers to, transitively (children, layouts, styles)."""
    todo = [model_id]
    while todo:
        current = todo.pop()
        if current in kept or current not in known:
            continue
        kept[current] = known[current]
        todo += _references(known[current])


def _saved_state(contents_manager: Any, path: str) -> dict[str, dict]:
    """The widget state of the notebook as it is on disk now ({} if there is none). Read from the
    file itself: the server's contents manager is asynchronous, and a pre-save hook is not."""
    root = getattr(contents_manager, "root_dir", None)
    if not root or not path:
        return {}
    try:
        saved = json.loads((Path(root) / path.strip("/")).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no file yet, or not JSON: nothing to keep from it
        return {}
    widgets = saved.get("metadata", {}).get("widgets", {}) if isinstance(saved, dict) else {}
    return dict(widgets.get(STATE, {}).get("state", {}))


def coalesce_streams(notebook: dict) -> None:
    """Join each run of consecutive outputs of one stream (stdout, stderr) into one, and apply its
    carriage returns, as JupyterLab shows and saves a cell's prints."""
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        joined: list[dict] = []
        for output in cell.get("outputs", []):
            text = "".join(output["text"]) if output.get("output_type") == "stream" else None
            last = joined[-1] if joined else None
            if text is not None and last is not None and last.get("output_type") == "stream" \
                    and last.get("name") == output.get("name"):
                last["text"] += text
            else:
                if text is not None:
                    output["text"] = text  # in place: nbformat's outputs are its own dict type
                joined.append(output)
        for output in joined:
            if output.get("output_type") == "stream":
                output["text"] = _carriage_returns(output["text"])
        cell["outputs"] = joined


def _carriage_returns(text: str) -> str:
    """What a terminal shows: after a carriage return, a line's text is written over from its start."""
    lines = []
    for line in re.sub(r"\r+\n", "\n", text).split("\n"):
        shown = ""
        for piece in line.split("\r"):
            shown = piece + shown[len(piece):]
        lines.append(shown)
    return "\n".join(lines)


def mend_files(paths: list[str]) -> None:
    """Mend notebook files in place, as saving them in JupyterLab would (`make execute` runs this after
    executing the chapters, so that a committed chapter saved unchanged stays byte for byte the same)."""
    import nbformat

    for path in paths:
        notebook = nbformat.read(path, as_version=nbformat.NO_CONVERT)
        mend(notebook, {})
        coalesce_streams(notebook)
        nbformat.write(notebook, path, version=nbformat.NO_CONVERT)


if __name__ == "__main__":
    import sys

    mend_files(sys.argv[1:])
