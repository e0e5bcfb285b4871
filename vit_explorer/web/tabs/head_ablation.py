"""The Head ablation tab: how the target class's probability changes when each head alone is removed (a layers ×
heads heat map, run by a button), the heads it needs most against gradient importance, and, for a clicked head,
the top-5 predictions without it beside the original."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr
import numpy as np

from vit_explorer.core.analysis import Prediction
from vit_explorer.core.interventions import HeadAblation, forward_equivalents
from vit_explorer.draw import pictures
from vit_explorer.draw.render import GridGeometry, grid_tile_px
from vit_explorer.errors import VitExplorerError
from vit_explorer.run import ablate, kept_ablation, prediction_without
from vit_explorer.web.captions import (
    ABLATION_NAMES,
    NO_CLASS_SCORE,
    ablation_note,
    ablation_text,
    predictions,
    top_predictions,
    without_target,
)
from vit_explorer.web.session import Controls, ModelCache, Session
from vit_explorer.web.tabs.base import (
    Tab,
    Wiring,
    in_order,
    map_image,
    refresh,
    require,
    run_progress,
    state_of,
    unchanged,
    user_errors,
)


@dataclass
class AblationView:
    """What the Head ablation tab keeps between events: the heat map as drawn, for tile clicks, and the head clicked in
    it: (mode, (layer, head), top-5 with that head removed)."""

    geometry: GridGeometry | None = None
    ablated: tuple[str, tuple[int, int], list[Prediction]] | None = None


def view(session: Session) -> AblationView:
    """This tab's own view state on the session (``AblationView``)."""
    return state_of(TAB, session)


OUTPUTS = ("ablation_view", "ablation_text", "ablation_original", "ablation_without")
TILE_PX = 56  # a tile shows one colour and one number: smaller than the attention grid's, so that deep models fit the screen
WITHOUT = "Top-5 with a head removed: click a tile"


def layout() -> dict:
    with gr.Row(equal_height=False):
        mode = gr.Radio([(name, key) for key, name in ABLATION_NAMES.items()], value="zero", label="Ablation mode",
                        info="how a head is removed", elem_id="ablation-mode", scale=2)
        run = gr.Button("Run ablation (1 + layers forward passes)", variant="primary", elem_id="run-ablation", scale=1)
    text = gr.Markdown("", elem_id="ablation-text")
    with gr.Row(equal_height=False):
        heat = map_image("ablation-view", "Δ target probability per head", scale=3, visible=False)
        with gr.Column(scale=2, min_width=260):
            original = gr.Label(num_top_classes=5, label="Top-5 with every head", elem_id="ablation-original", visible=False)
            without = gr.Label(num_top_classes=5, label=WITHOUT, elem_id="ablation-without", visible=False)
    return {"ablation_mode": mode, "run_ablation": run, "ablation_text": text, "ablation_view": heat,
            "ablation_original": original,
            "ablation_without": without}


def shown_ablation(session: Session, controls: Controls) -> HeadAblation | None:
    """The ablation of the target in the chosen mode, where it has run on this analysis."""
    return None if session.target is None else kept_ablation(session.analysis, session.target, controls.ablation_mode)


def selected_head(session: Session, controls: Controls) -> tuple[tuple[int, int], list] | None:
    """The clicked head and the predictions without it, where they are of the chosen mode."""
    ablated = view(session).ablated
    return ablated[1:] if ablated is not None and ablated[0] == controls.ablation_mode else None


def heat_map(ablation: HeadAblation, selected: tuple[int, int] | None) -> tuple[np.ndarray, GridGeometry]:
    """The tab's heat map of ``ablation``, ``selected`` (layer, head) outlined, and its geometry."""
    tile_px = min(TILE_PX, grid_tile_px(ablation.delta_probability.shape[1], pictures.GRID_PX))
    return pictures.ablation_picture(ablation, selected=selected, tile_px=tile_px)


def render(session: Session, controls: Controls) -> dict:
    """The heat map (its geometry kept for clicks) and its caption, or the note of what a run costs."""
    ablation = shown_ablation(session, controls)
    if ablation is None:
        view(session).geometry = None
        # no empty boxes before a run: the note says what running draws
        return {"ablation_view": gr.update(value=None, visible=False),
                "ablation_text": ablation_note(session, controls.ablation_mode),
                "ablation_original": gr.update(value=None, visible=False),
                "ablation_without": gr.update(value=None, label=WITHOUT, visible=False)}
    selected = selected_head(session, controls)
    head = None if selected is None else selected[0]
    picture, view(session).geometry = heat_map(ablation, head)
    if selected is None:
        without = gr.update(value=None, label=WITHOUT, visible=True)
    else:
        without = gr.update(value=predictions(selected[1]), visible=True,
                            label=f"Top-5 without L{head[0]} h{head[1]} ({ABLATION_NAMES[controls.ablation_mode]})")
    return {"ablation_view": gr.update(value=picture, visible=True), "ablation_text": ablation_text(session, ablation),
            "ablation_original": gr.update(value=top_predictions(session.analysis), visible=True), "ablation_without": without}


def depends(session: Session, controls: Controls) -> tuple:
    selected = selected_head(session, controls)
    return (session.target, controls.ablation_mode, shown_ablation(session, controls) is not None,
            None if selected is None else selected[0])


def set_ranges(session: Session) -> dict:
    layers, heads = session.analysis.map_shape
    return {"run_ablation": gr.update(value=f"Run ablation (≈{forward_equivalents(layers, heads):.0f}× one forward pass)",
                                      interactive=session.evidence is not None)}


@user_errors
def on_run(models: ModelCache, session: Session | None, *control_values, progress: Callable | None = None) -> tuple:
    """Remove each head in turn for the target class: 1 + layers forward passes (none where this target and mode
    have run on this image) (``OUTPUTS``)."""
    session, controls = require(session), Controls.from_values(control_values)
    if session.evidence is None:
        raise VitExplorerError(without_target(session, NO_CLASS_SCORE))
    ablate(session.model(models), session.analysis, session.evidence, controls.ablation_mode, progress=run_progress(progress))
    return in_order(refresh(TAB, session, controls), OUTPUTS)


@user_errors
def on_tile_click(models: ModelCache, evt: gr.SelectData, session: Session | None, *control_values) -> tuple:
    """A head clicked in the heat map: one forward pass without it, its top-5 beside the original (``OUTPUTS``)."""
    session, controls = require(session), Controls.from_values(control_values)
    geometry = view(session).geometry
    hit = geometry.hit(evt.index[0], evt.index[1]) if geometry is not None else None
    if hit is None or session.analysis.similarity:  # a label, the colour bar, no heat map yet, or a score with no top-5
        return in_order(unchanged(OUTPUTS), OUTPUTS)
    top = prediction_without(session.model(models), session.analysis, [hit], controls.ablation_mode)
    view(session).ablated = (controls.ablation_mode, hit, top)
    return in_order(refresh(TAB, session, controls), OUTPUTS)


def wire(app: Wiring) -> None:
    state = app["state"]

    def run(session, progress=gr.Progress(), *values):  # Gradio passes its progress bar to that default
        return on_run(app.models, session, *values, progress=progress)

    def click(evt: gr.SelectData, session, *values):
        return on_tile_click(app.models, evt, session, *values)

    app["run_ablation"].click(run, [state, *app.controls], app.all(OUTPUTS), api_name="run_ablation", concurrency_limit=2)
    app["ablation_view"].select(click, [state, *app.controls], app.all(OUTPUTS), api_name="select_ablated_head",
                                concurrency_limit=2)


# its run button follows the target: a backbone can run once a similarity target is chosen
TAB = Tab("Head ablation", OUTPUTS, layout, render, depends, wire, ranges=("run_ablation",), set_ranges=set_ranges,
          target_ranges=True, state=AblationView)
