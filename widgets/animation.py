"""What every animated widget of the course shares: precomputed frames played in the browser.

    [▶ play] [━━━━━●━━━━ step 23 / 40]      Play and the step slider are linked in the browser
    ┌ panel 1: frame 23 ┐                    (`jslink`), and each panel is a Stack of HTML frames
    └ panel 2: frame 23 ┘                    showing the one the slider selects

Nothing runs in the kernel while it plays, so the animation also plays in a notebook opened
without a kernel (from its saved widget state). Where widgets cannot render at all — a notebook
not yet trusted, a code host's notebook viewer — a still frame stands in (`text/html` beside the
widget in the output), never the widget's raw Python repr.
"""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as W


class StillFallback:
    """A widget that carries a static HTML picture of itself for places widgets cannot render."""

    def still_html(self) -> str:
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            bundle["text/html"] = (f"<div class='widget-still'>{self.still_html()}<p style='color:#666'><i>A still "
                                   "picture: run the cell in JupyterLab to use the widget.</i></p></div>")
        return bundle


class Animation(StillFallback, W.VBox):
    """Panels of precomputed HTML frames (one list per panel, all the same length), one label per
    frame shown on the slider (e.g. "step 23 / 40"), the frame a still picture shows, and the frame
    shown first (`start`; Play from the last frame starts again at the first)."""

    def __init__(self, panels: Sequence[Sequence[str]], labels: Sequence[str], still: int = -1,
                 interval_ms: int = 120, start: int = 0):
        if not panels or any(len(frames) != len(labels) for frames in panels) or not labels:
            raise ValueError("every panel needs one frame per label, and there must be at least one")
        if len(set(labels)) != len(labels):
            raise ValueError("frame labels must be distinct")
        start = range(len(labels))[start]  # -1: the last frame
        self.stacks = [W.Stack([W.HTML(frame) for frame in frames], selected_index=start) for frames in panels]
        self.play = W.Play(value=start, min=0, max=len(labels) - 1, step=1, interval=interval_ms, description="play")
        self.slider = W.SelectionSlider(options=list(labels), index=start, description="", continuous_update=True,
                                        layout=W.Layout(width="480px"))
        W.jslink((self.play, "value"), (self.slider, "index"))
        for stack in self.stacks:
            W.jslink((self.play, "value"), (stack, "selected_index"))
        self._still = "".join(frames[still] for frames in panels)
        super().__init__([W.HBox([self.play, self.slider]), *self.stacks])

    def still_html(self) -> str:
        return self._still
