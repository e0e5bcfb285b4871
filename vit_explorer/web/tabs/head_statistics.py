"""The Head statistics tab: every head's mean attention distance, entropy, prefix-token share and gradient
importance against its layer, as interactive plots (values on hover), against a dataset's means when a
``vit-explorer stats`` folder is given, and the top heads by each ranking."""

from __future__ import annotations

import gradio as gr

from vit_explorer.core import maps
from vit_explorer.core.statistics import DatasetStatistics
from vit_explorer.draw import charts, plots
from vit_explorer.errors import VitExplorerError
from vit_explorer.run import dataset_statistics
from vit_explorer.web.captions import dataset_note, statistic_title, top_heads_table
from vit_explorer.web.session import Controls, Session
from vit_explorer.web.tabs.base import Tab, map_image
from vit_explorer.web.tabs.head_ablation import shown_ablation

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
        "stats_folder": gr.Textbox("", label="Dataset statistics",
                                   placeholder="a folder written by vit-explorer stats, then Enter",
                                   info="shows each head of this image against the dataset's 5–95% range and mean, and names the "
                                        "heads outside the dataset's 5–95% range", elem_id="stats-folder"),
        "dataset_note": gr.Markdown(elem_id="dataset-note"),
        "dataset_chart": map_image("dataset-chart", "This image against the dataset", visible=False),
    }
    components.update({
        name: gr.ScatterPlot(x="layer", y=plots.VALUE, color="head", x_title="layer", y_title=y_title, color_title="head",
                             height=PLOT_HEIGHT, label=statistic, show_label=False, buttons=["fullscreen", "export"],
                             elem_id=name.replace("_", "-"))
        for name, (statistic, y_title) in PLOTS.items()
    })
    components["top_heads"] = gr.Dataframe(label="Top heads of this image by each ranking (gradient importance: Σ|∇A ⊙ A| "
                                                 "for the target class; ablation effect: once run in the Head ablation tab); "
                                                 "cells: layer, head · value",
                                           interactive=False, wrap=True, elem_id="top-heads")
    return components


def plot(session: Session, statistic: str) -> dict:
    """A statistic's plot: one point per head at its layer, coloured by head; hidden where there is no such statistic."""
    if statistic == maps.GRADIENT_IMPORTANCE and session.evidence is None:
        return gr.update(value=None, visible=False)
    values = maps.ranking_values(session.analysis, statistic, session.evidence)  # [layers, heads]
    return gr.update(value=plots.head_table(values), title=statistic_title(session, statistic),
                     sort=plots.layer_names(values.shape[0]),
                     y_lim=plots.padded_limits(values), visible=True)


def dataset_for(session: Session, folder: str) -> tuple[DatasetStatistics | None, str]:
    """The dataset statistics in ``folder`` when they fit this model, and the note that says what is shown."""
    if not folder.strip():
        return None, ""
    try:
        dataset = dataset_statistics(folder.strip())
    except VitExplorerError as error:
        return None, f"⚠️ {error}"
    if dataset.shape != session.analysis.map_shape:
        return None, (f"⚠️ {dataset.folder} holds statistics of {dataset.shape[0]} layers × {dataset.shape[1]} heads "
                      f"({dataset.model}); this model has {session.analysis.map_shape[0]} × {session.analysis.map_shape[1]}")
    return dataset, dataset_note(session, dataset)


def render(session: Session, controls: Controls) -> dict:
    dataset, note = dataset_for(session, controls.stats_folder)
    # a picture, not the interactive plots: Gradio 6.31 keeps a native plot's colours from its first drawing, so a
    # series added later (the dataset's) would be drawn without a colour
    chart = None if dataset is None else charts.against_dataset_chart(
        {name: maps.ranking_values(session.analysis, name, session.evidence) for name in dataset.mean}, dataset)
    return {**{name: plot(session, statistic) for name, (statistic, _) in PLOTS.items()},
            "top_heads": top_heads_table(session, shown_ablation(session, controls)), "dataset_note": note,
            "dataset_chart": gr.update(value=chart, visible=chart is not None)}


def depends(session: Session, controls: Controls) -> tuple:
    # the gradient importance is the target's; the ablation effect joins the table once it has run for the target and mode
    return (session.target, controls.stats_folder, controls.ablation_mode, shown_ablation(session, controls) is not None)


TAB = Tab("Head statistics", (*PLOTS, "top_heads", "dataset_note", "dataset_chart"), layout, render, depends)
