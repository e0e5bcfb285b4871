"""The Class maps tab: which patches a target class depends on (relevance, AttnLRP, LeGrad, gradient-weighted
rollout, and the class-agnostic maps beside them), the chosen map's faithfulness score against random orders (blur,
mean or ROAD), the scoreboard of every method, and a sanity check that the maps depend on the weights."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TypeVar

import gradio as gr
import numpy as np

from vit_explorer.core import maps
from vit_explorer.core.analysis import MODEL_MAPS
from vit_explorer.core.curves import FaithfulnessCurves, Protocol, SanityCurves
from vit_explorer.core.ranking import Scoreboard
from vit_explorer.draw import charts, pictures, plots
from vit_explorer.errors import VitExplorerError
from vit_explorer.run import check, evidence, rank, score
from vit_explorer.web.captions import (
    NO_CLASSIFIER,
    board_rows,
    board_text,
    class_note,
    negligible_text,
    sanity_note,
    sanity_text,
    score_text,
    without_target,
)
from vit_explorer.web.session import SIMILARITY_TARGETS, Controls, ModelCache, Session
from vit_explorer.web.tabs.base import Tab, Wiring, in_order, map_image, require, run_progress, state_of, user_errors


@dataclass
class Results:
    """What the Class maps tab keeps between events: the last faithfulness score, sanity check and scoreboard, each with
    what it was computed for (``shown`` shows one only for the page's current target and options)."""

    score: tuple[Hashable, FaithfulnessCurves] | None = None
    sanity: tuple[Hashable, SanityCurves] | None = None
    board: tuple[Hashable, Scoreboard] | None = None


def view(session: Session) -> Results:
    """This tab's own view state on the session (``Results``)."""
    return state_of(TAB, session)


T = TypeVar("T")
OUTPUTS = ("class_view", "class_text", "faithfulness_plot", "sanity_text", "sanity_chart", "board_text", "board_table")
BOARD_COLUMNS = ["#", "method", "score", "vs chance", "del. AUC", "ins. AUC", "random-model ρ", "uses weights"]


def layout() -> dict:
    method = gr.Radio([(name, key) for key, name in maps.CLASS_METHODS.items()], value="relevance", label="Method",
                      info="the map, for the target class chosen above; rollout options (Rollout tab) apply to the "
                           "rollout-based maps", elem_id="method")
    with gr.Row(equal_height=False):
        with gr.Column(min_width=300):
            gr.Markdown("**The chosen map** for the target class; its colour bar says what it measures")
            class_view = map_image("class-view", "Class-specific map")
        with gr.Column(min_width=300):
            class_text = gr.Markdown("", elem_id="class-text")
            baseline = gr.Radio([("blur", "blur"), ("mean colour", "mean"), ("ROAD imputation", "road")], value="blur",
                                label="Removed patches show", elem_id="baseline",
                                info="ROAD fills them from their neighbours, so the removal itself leaves no shape (slower)")
            with gr.Row():
                score = gr.Button("Score faithfulness", elem_id="score")
                board = gr.Button("Score every method", elem_id="scoreboard")
                sanity = gr.Button("Sanity check", elem_id="sanity")
            sanity_words = gr.Markdown("", elem_id="sanity-text")
    # under the map, full width: its legend lies beside the axes
    sanity_picture = map_image("sanity-chart", "Sanity check: correlation against layers randomised", visible=False)
    board_words = gr.Markdown("", elem_id="board-text")
    board_table = gr.Dataframe(headers=BOARD_COLUMNS, interactive=False, visible=False, elem_id="board-table", show_label=False)
    # full width: its legend names four curves with their AUCs
    faithfulness = gr.LinePlot(x="share", y="probability", color="curve", x_title="share of patches deleted / inserted",
                               y_title="target probability", x_lim=[0, 1], x_axis_format=".0%", y_lim=[0, 1.05], height=300,
                               label="Deletion and insertion", show_label=False,
                               buttons=["fullscreen", "export"], visible=False, elem_id="faithfulness")
    return {"method": method, "class_view": class_view, "class_text": class_text, "score": score, "baseline": baseline,
            "faithfulness_plot": faithfulness, "sanity": sanity, "sanity_text": sanity_words, "sanity_chart": sanity_picture,
            "scoreboard": board, "board_text": board_words, "board_table": board_table}


def shown_method(session: Session, controls: Controls) -> str:
    """The chosen method, or rollout where it needs a classifier this model lacks (the method control then offers
    the class-agnostic maps only, ``set_ranges``)."""
    return "rollout" if session.evidence is None and controls.method in maps.CLASS_SPECIFIC else controls.method


def render_class(session: Session, controls: Controls) -> np.ndarray:
    """The tab's map."""
    shown = maps.trusted_map(session.analysis, shown_method(session, controls), session.evidence, controls.rollout)
    return pictures.class_map_picture(session.analysis, shown, controls.cmap, controls.colour_scale)


def prepare(session: Session, controls: Controls) -> None:
    """AttnLRP and LeGrad take passes of the model of their own: the chosen one's map for the target is computed here,
    once (``run.evidence`` keeps it on the evidence), before the tab draws."""
    if session.evidence is not None and controls.method in MODEL_MAPS:
        session.evidence = evidence(session.model(), session.analysis, session.evidence.target, (controls.method,))


def waiting(session: Session, controls: Controls, target: int | str | None) -> dict:
    """While the model computes the chosen class-specific map for ``target`` (a new target's pass, AttnLRP's or
    LeGrad's own passes: seconds on a large model), the previous map is cleared and the line says what is coming, so
    that no other method's or target's map stands under the chosen method."""
    method = controls.method
    if session.evidence is None or method not in maps.CLASS_SPECIFIC:
        return {}
    if target in SIMILARITY_TARGETS:  # a similarity target is a new analysis: every map is computed again
        label = SIMILARITY_TARGETS[target]
    else:
        kept = session.analysis.evidence.get(int(target)) if target is not None else session.evidence
        if kept is not None and (method not in MODEL_MAPS or method in kept.method_maps):
            return {}
        label = session.analysis.label(session.target if target is None else int(target))
    return {"class_view": gr.update(value=None),
            "class_text": f"Computing the **{maps.CLASS_METHODS[method]}** map for target **{label}**: the previous map is "
                          "cleared until this one is drawn."}


def set_ranges(session: Session) -> dict:
    """A backbone: only the maps that need no class, rollout chosen, and nothing to score, until a similarity target
    opens the others and scoring."""
    targeted = session.evidence is not None
    scoring = {"score": gr.update(interactive=targeted), "scoreboard": gr.update(interactive=targeted)}
    if session.evidence is None:
        agnostic = [(name, key) for key, name in maps.CLASS_METHODS.items() if key not in maps.CLASS_SPECIFIC]
        return {"method": gr.update(choices=agnostic, value="rollout"), **scoring}
    return {"method": gr.update(choices=[(name, key) for key, name in maps.CLASS_METHODS.items()]), **scoring}


def score_key(session: Session, controls: Controls) -> tuple:
    """Which map a faithfulness score is of: the method, the target, the rollout options."""
    return controls.method, session.target, controls.rollout


def faithfulness_plot(session: Session, method: str, curves) -> dict:
    """The interactive deletion and insertion curves of a score: values on hover, AUCs in the legend."""
    first, second = curves.curve_names
    title = f"{first.capitalize()} and {second}: {maps.CLASS_METHODS[method]} · target {session.analysis.label(curves.target)}"
    return gr.update(value=plots.faithfulness_table(curves), title=title, color_map=plots.curve_colours(curves), visible=True,
                     y_title=curves.measure, y_lim=list(charts.curve_limits(curves)), x_title=curves.protocol.axis_title)


def shown(kept: tuple[Hashable, T] | None, key: Hashable) -> T | None:
    """A kept result (``Screen.score``, ``sanity``, ``board``: (what it was computed for, the result)) where it was
    computed for ``key``, the page's current target and options; else None, never another target's."""
    return kept[1] if kept is not None and kept[0] == key else None


def render(session: Session, controls: Controls) -> dict:
    """The map, and the last score where it is of this map (else the note of what scoring does)."""
    curves = shown(view(session).score, score_key(session, controls))
    if curves is not None:
        plot, text = faithfulness_plot(session, controls.method, curves), score_text(session.analysis, controls.method, curves)
    else:
        plot, text = NO_PLOT, class_note(session, controls.method)
    method = shown_method(session, controls)
    grid_map = maps.class_map(session.analysis, method, session.evidence, controls.rollout)
    text = negligible_text(maps.map_strength(session.analysis, method, session.evidence, grid_map)) + text
    return {"class_view": render_class(session, controls), "class_text": text, "faithfulness_plot": plot,
            **sanity_views(session, controls), **board_views(session, controls)}


def depends(session: Session, controls: Controls) -> tuple:
    return session.target, controls.method, controls.rollout, controls.cmap, controls.colour_scale


def check_key(session: Session, controls: Controls) -> tuple:
    """What a sanity check ran for: the target (its class-specific maps) and the rollout options."""
    return session.target, controls.rollout


def sanity_views(session: Session, controls: Controls) -> dict:
    """The last sanity check's chart and summary where it ran for this target and these options; else what it would do."""
    sanity = shown(view(session).sanity, check_key(session, controls))
    if sanity is None:
        return {"sanity_text": sanity_note(session), "sanity_chart": gr.update(value=None, visible=False)}
    return {"sanity_text": sanity_text(sanity), "sanity_chart": gr.update(value=charts.sanity_chart(sanity), visible=True)}


def board_views(session: Session, controls: Controls) -> dict:
    """The last scoreboard where it ran for this target and these rollout options; else nothing (no empty table)."""
    board = shown(view(session).board, check_key(session, controls))
    if board is None:
        return {"board_text": "", "board_table": gr.update(value=None, visible=False)}
    return {"board_text": board_text(session.analysis, board),
            "board_table": gr.update(value=board_rows(board), headers=BOARD_COLUMNS, visible=True)}


NO_PLOT = gr.update(value=None, visible=False)  # no empty chart box before a score: the caption says what scoring draws
SCORED = ("faithfulness_plot", "class_text")
SANITY = ("sanity_text", "sanity_chart")
BOARD = ("board_text", "board_table")


@user_errors
def on_score(models: ModelCache, session: Session | None, baseline: str, *control_values,
             progress: Callable | None = None) -> tuple:
    """Deletion and insertion curves (ROAD: MoRF and LeRF) of the map on screen against random orders: the plot and the
    AUCs (``SCORED``)."""
    session, controls = require(session), Controls.from_values(control_values)
    if session.evidence is None:
        raise VitExplorerError(without_target(session, NO_CLASSIFIER))
    curves = score(session.model(models), session.analysis, session.evidence, controls.method, Protocol(baseline),
                       options=controls.rollout, progress=run_progress(progress))
    view(session).score = (score_key(session, controls), curves)
    values = {"faithfulness_plot": faithfulness_plot(session, controls.method, curves),
              "class_text": score_text(session.analysis, controls.method, curves)}
    return in_order(values, SCORED)


@user_errors
def on_sanity(models: ModelCache, session: Session | None, *control_values, progress: Callable | None = None) -> tuple:
    """Cascading randomisation of a copy of the model: layers + 1 forward and backward passes; the chart and its
    summary (``SANITY``), kept for this target and these rollout options."""
    session, controls = require(session), Controls.from_values(control_values)
    curves = check(session.model(models), session.analysis, session.evidence, options=controls.rollout,
                   progress=run_progress(progress))
    view(session).sanity = (check_key(session, controls), curves)
    return in_order(sanity_views(session, controls), SANITY)


@user_errors
def on_scoreboard(models: ModelCache, session: Session | None, baseline: str, *control_values,
                  progress: Callable | None = None) -> tuple:
    """Every method scored and ranked for the target (``scoreboard``): the words and the table (``BOARD``)."""
    session, controls = require(session), Controls.from_values(control_values)
    if session.evidence is None:
        raise VitExplorerError(without_target(session, NO_CLASSIFIER))
    board = rank(session.model(models), session.analysis, session.evidence, Protocol(baseline), options=controls.rollout,
                     progress=run_progress(progress))
    view(session).board = (check_key(session, controls), board)
    return in_order(board_views(session, controls), BOARD)


def wire(app: Wiring) -> None:
    state = app["state"]

    # Gradio passes its progress bar to a positional parameter whose default is one
    def score_map(session, baseline, progress=gr.Progress(), *values):
        return on_score(app.models, session, baseline, *values, progress=progress)

    def score_all(session, baseline, progress=gr.Progress(), *values):
        return on_scoreboard(app.models, session, baseline, *values, progress=progress)

    def check_sanity(session, progress=gr.Progress(), *values):
        return on_sanity(app.models, session, *values, progress=progress)

    app["score"].click(score_map, [state, app["baseline"], *app.controls], app.all(SCORED), api_name="score", concurrency_limit=2)
    app["scoreboard"].click(score_all, [state, app["baseline"], *app.controls], app.all(BOARD), api_name="scoreboard",
                            concurrency_limit=2)
    app["sanity"].click(check_sanity, [state, *app.controls], app.all(SANITY), api_name="sanity_check", concurrency_limit=2)


TAB = Tab("Class maps", OUTPUTS, layout, render, depends, wire, ranges=("method", "score", "scoreboard"), set_ranges=set_ranges,
          target_ranges=True, prepare=prepare, waiting=waiting, state=Results)
