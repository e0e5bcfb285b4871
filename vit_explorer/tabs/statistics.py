"""The Head statistics tab: every head's mean attention distance, entropy, prefix-token share and gradient
importance against its layer, as interactive plots (values on hover), and the top heads by each ranking."""

from __future__ import annotations

import gradio as gr

from .. import maps, plots
from ..captions import statistic_title, top_heads_table
from ..session import Controls, Session
from .base import Tab

# plot component → the ranking it shows (``maps.RANKINGS``) and its vertical axis, whose title must be shorter than
# the axis: a longer one pushes the plot's title out of the picture
PLOTS = {
    "distance_plot": ("distance", "distance (px)"),
    "entropy_plot": ("entropy", "entropy (nats)"),
    "prefix_plot": ("prefix share", "prefix share"),
    "importance_plot": (maps.GRADIENT_IMPORTANCE, "importance"),
}
PLOT_HEIGHT = 260


def layout() -> dict:
    components = {
        name: gr.ScatterPlot(x="layer", y=plots.VALUE, color="head", x_title="layer", y_title=y_title, color_title="head",
                             height=PLOT_HEIGHT, label=statistic, show_label=False, buttons=["fullscreen", "export"], elem_id=name.replace("_", "-"))
        for name, (statistic, y_title) in PLOTS.items()
    }
    components["top_heads"] = gr.Dataframe(label="Top heads of this image by each ranking (gradient importance: Σ|∇A ⊙ A| for the target "
                                           "class); cells: layer, head · value", interactive=False, wrap=True, elem_id="top-heads")
    return components


def plot(session: Session, statistic: str) -> dict:
    """A statistic's plot: one point per head at its layer, coloured by head; hidden where there is no such statistic."""
    if statistic == maps.GRADIENT_IMPORTANCE and session.evidence is None:
        return gr.update(value=None, visible=False)
    values = maps.ranking_values(session.analysis, statistic, session.evidence)  # [layers, heads]
    return gr.update(value=plots.head_table(values), title=statistic_title(session, statistic),
                     sort=plots.layer_names(values.shape[0]), visible=True)


def render(session: Session, controls: Controls) -> dict:
    return {**{name: plot(session, statistic) for name, (statistic, _) in PLOTS.items()}, "top_heads": top_heads_table(session)}


def depends(session: Session, controls: Controls) -> tuple:
    return (session.target,)  # the gradient importance is the target's


TAB = Tab("Head statistics", (*PLOTS, "top_heads"), layout, render, depends)
