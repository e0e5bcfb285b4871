"""The Compare tab: the main analysis (A) beside a second one (B) of a second image, a second model or both, in the
same view (rollout, the class map, one layer and head), with their signed difference where the patch grids match
and their head statistics in one plot. B is analysed once, by this tab's own events, and kept in its own state
(the ``comparison`` control); every other change redraws from the two analyses."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import gradio as gr
import numpy as np
import torch

from vit_explorer import run
from vit_explorer.core import maps
from vit_explorer.core.analysis import MODEL_MAPS
from vit_explorer.core.comparison import Comparison, Side, grid_mismatch, relative_depth, sides
from vit_explorer.core.comparison import difference as map_difference
from vit_explorer.core.interventions import Patching
from vit_explorer.core.targets import prompted
from vit_explorer.draw import pictures, plots
from vit_explorer.errors import VitExplorerError
from vit_explorer.models import DEFAULT_MODEL
from vit_explorer.web.captions import (
    COMPARE_NOTE,
    MEAN_HEADS,
    NO_TARGET_TO_PATCH,
    STATISTIC_NAMES,
    comparison_caption,
    difference_note,
    head_choices,
    patching_text,
    side_names,
    side_view_name,
    statistic_note,
)
from vit_explorer.web.session import CACHE_TTL_S, Controls, ModelCache, Session, model_choices
from vit_explorer.web.tabs import class_maps
from vit_explorer.web.tabs.base import Tab, Wiring, counter, in_order, map_image, refresh, require, run_progress, user_errors
from vit_explorer.web.upload import image_upload

VIEWS = ("rollout", "class map", "layer and head")
PATCH_TILE_PX = 56  # as the ablation's heat map: a colour and a number per tile
SIDES = ("A", "B")  # the plot's series; the headings above the pictures say what each side is
MAIN_MODEL = ""  # the second-model choice that keeps the main model
OUTPUTS = ("compare_caption", "compare_title_a", "compare_view_a", "compare_title_b", "compare_view_b", "compare_difference",
           "compare_difference_note", "compare_plot_note", "compare_plot", "compare_patch_text", "compare_patch_heads",
           "compare_patch_tokens")


def layout() -> dict:
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=240):
            second_image = image_upload(sources=["upload", "clipboard"], label="Second image (B)", height=190,
                                        elem_id="compare-upload")
        with gr.Column(scale=3):
            second_model = gr.Dropdown([("the main model", MAIN_MODEL), *model_choices(DEFAULT_MODEL)], value=MAIN_MODEL,
                                       allow_custom_value=True, label="Second model (B)",
                                       info="any spec: built-in, timm:NAME (@random: no download), hf:REPO or a checkpoint path",
                                       elem_id="compare-model")
            view = gr.Radio(list(VIEWS), value="rollout", label="View", elem_id="compare-view-choice")
            with gr.Row():
                layer = gr.Slider(0, 1, value=0, step=1, label="Layer of A", info="B: the layer at the same relative depth",
                                  min_width=160, elem_id="compare-layer")
                head = gr.Dropdown([MEAN_HEADS], value=MEAN_HEADS, label="Head of both", min_width=120, elem_id="compare-head")
            with gr.Row():
                run = gr.Button("Compare", size="sm", elem_id="compare-run")
                match = gr.Button("Why they match", size="sm", elem_id="compare-match")
            with gr.Row():
                patch = gr.Button("Patch B into A", size="sm", elem_id="compare-patch")
                patch_tokens = gr.Checkbox(False, label="every token too (slow)", elem_id="compare-patch-tokens-choice")
    caption = gr.Markdown(COMPARE_NOTE, elem_id="compare-caption")
    with gr.Row(equal_height=False):
        with gr.Column(min_width=300):
            title_a = gr.Markdown("**A**", elem_id="compare-title-a")
            view_a = map_image("compare-view-a", "A")
        with gr.Column(min_width=300):
            title_b = gr.Markdown("**B**", elem_id="compare-title-b")
            view_b = map_image("compare-view-b", "B")
    with gr.Row(equal_height=False):
        with gr.Column(min_width=300):
            difference_text = gr.Markdown("", elem_id="compare-difference-note")
            difference = map_image("compare-difference", "A − B")
        with gr.Column(min_width=300):
            statistic = gr.Dropdown([(name, key) for key, name in STATISTIC_NAMES.items()], value="distance",
                                    label="Head statistic of both", elem_id="compare-statistic")
            plot_note = gr.Markdown("", elem_id="compare-plot-note")
            # every setting of the chart is fixed here and updates send data only: Gradio 6 draws a chart whose title, axes,
            # colours or limits an update changes from the data before that update
            plot = gr.ScatterPlot(x="depth", y=plots.VALUE, color="side", x_title="relative depth: layer ÷ (layers − 1)",
                                  y_title="value", color_title="side",
                                  color_map=dict(zip(SIDES, plots.SIDE_COLOURS, strict=True)),
                                  x_lim=[-0.05, 1.05], height=280, label="Head statistics of both", show_label=False,
                                  buttons=["fullscreen", "export"], tooltip="all", elem_id="compare-plot")
    patch_text = gr.Markdown("", elem_id="compare-patch-text")
    with gr.Row(equal_height=False):
        patch_heads = map_image("compare-patch-heads", "A's score with each head's output from B", visible=False)
        patch_token_view = map_image("compare-patch-tokens", "A's score with the stream at each patch from B", visible=False)
    return {"comparison": gr.State(None, time_to_live=CACHE_TTL_S), "compare_upload": second_image,
            "compare_patch": patch, "compare_patch_tokens_choice": patch_tokens, "compare_patch_text": patch_text,
            "compare_patch_heads": patch_heads, "compare_patch_tokens": patch_token_view,
            "compare_model": second_model, "compare_view": view, "compare_layer": layer, "compare_head": head, "compare_run": run,
            "compare_match": match,
            "compare_statistic": statistic, "compare_caption": caption, "compare_title_a": title_a, "compare_view_a": view_a,
            "compare_title_b": title_b, "compare_view_b": view_b, "compare_difference_note": difference_text,
            "compare_difference": difference, "compare_plot_note": plot_note, "compare_plot": plot}


def head_of(label: str | None) -> int | None:
    """The head dropdown's value → a head index, None for the mean of heads."""
    return None if label in (None, MEAN_HEADS) else int(label.removeprefix("h"))


def side_options(side: Side, controls: Controls) -> maps.RolloutOptions:
    """The rollout options, from the side's start layer (B's is at the relative depth of A's)."""
    return replace(controls.rollout, start_layer=side.start_layer)


def side_map(side: Side, view: str, controls: Controls) -> torch.Tensor | None:
    """One side's ``[grid_h, grid_w]`` map of ``view``, or None where it has no such map (a class-specific map
    without that class's evidence)."""
    if view == "rollout":
        return maps.rollout_map(side.analysis, side.query, side_options(side, controls))
    if view == "layer and head":
        return maps.attention_map(side.analysis, side.query, side.layer, side.head)
    if controls.method in maps.CLASS_SPECIFIC and side.evidence is None:
        return None
    return maps.class_map(side.analysis, controls.method, side.evidence, side_options(side, controls))


def unit(view: str, method: str) -> str:
    """What the maps of ``view`` measure, as their colour bars say."""
    return {"rollout": pictures.ROLLOUT, "layer and head": pictures.ATTENTION}.get(view) or pictures.UNITS[method]


def side_picture(side: Side, view: str, controls: Controls, grid_map: torch.Tensor | None,
                 bounds: tuple[float, float] | None) -> np.ndarray | None:
    """One side's picture of its map, drawn by the function every other tab draws a map with, on the ``bounds``
    both sides share (``common_bounds``)."""
    if grid_map is None:
        return None
    return pictures.map_picture(side.analysis, grid_map, cmap=controls.cmap, overlay=controls.overlay or view == "class map",
                                query=None if view == "class map" else side.query, unit=unit(view, controls.method),
                                scale=controls.colour_scale, bounds=bounds)


def common_bounds(grid_maps: list[torch.Tensor | None], scale: str) -> tuple[float, float] | None:
    """One colour scale for every view of the comparison, whatever its kind: from the lower of the sides' low ends to
    the higher of their high ends, so that equal colours mean equal values on A and B."""
    ranges = [pictures.shared_bounds(grid_map, scale) for grid_map in grid_maps if grid_map is not None]
    if not ranges:
        return None
    return min(low for low, _ in ranges), max(high for _, high in ranges)


ONE_SCALE = " A and B are coloured on one scale (their colour bars are the same), so equal colours are equal values."


def statistics_plot(a: Side, b: Side, statistic: str) -> dict:
    """Both sides' ``statistic`` of every head in one plot, a colour per side, each layer at its relative depth, and the
    words above it (``compare_plot_note``, ``compare_plot``). A side without the statistic (gradient importance without a
    classifier) is left out."""
    values = {name: maps.ranking_values(side.analysis, statistic, side.evidence) for name, side in zip(SIDES, (a, b), strict=True)
              if statistic != maps.GRADIENT_IMPORTANCE or side.evidence is not None}  # [layers, heads] each
    depths = {name: relative_depth(side.analysis.map_shape[0]) for name, side in zip(SIDES, (a, b), strict=True)}
    return {"compare_plot_note": statistic_note(statistic, a, b, tuple(values)),
            "compare_plot": plots.sides_table(values, depths) if values else None}


def render(session: Session, controls: Controls) -> dict:
    """Both sides in the chosen view, their difference where the grids match, and their statistics; without a
    comparison, the note of how to make one."""
    comparison = controls.comparison
    if comparison is None:
        return {**dict.fromkeys(OUTPUTS), "compare_caption": COMPARE_NOTE, "compare_title_a": "**A**",
                "compare_title_b": "**B**", "compare_difference_note": "", "compare_plot_note": "", **patch_views(None)}
    view = controls.compare_view
    a, b = sides(session.analysis, session.evidence, comparison, session.query, int(controls.compare_layer),
                 head_of(controls.compare_head), int(controls.start_layer))
    map_a, map_b = side_map(a, view, controls), side_map(b, view, controls)
    bounds = common_bounds([map_a, map_b], controls.colour_scale)
    mismatch = grid_mismatch(a.analysis, b.analysis)
    shown = mismatch is None and map_a is not None and map_b is not None
    difference = (pictures.difference_picture(a.analysis, map_difference(map_a, map_b), f"A − B, {unit(view, controls.method)}")
                  if shown else None)
    names = side_names(session, comparison)
    outdated = comparison.outdated(session.analysis, session.model_spec, controls.fit)
    return {
        "compare_caption": comparison_caption(session, a, b, view, controls.method, outdated) + ONE_SCALE,
        "compare_title_a": f"**{names[0]}**: {side_view_name(a, view, controls.method)}",
        "compare_view_a": side_picture(a, view, controls, map_a, bounds),
        "compare_title_b": f"**{names[1]}**: {side_view_name(b, view, controls.method)}",
        "compare_view_b": side_picture(b, view, controls, map_b, bounds),
        "compare_difference": gr.update(value=difference, visible=shown),
        "compare_difference_note": difference_note(mismatch, map_a is None or map_b is None),
        **statistics_plot(a, b, controls.compare_statistic),
        **patch_views(comparison.patched(session.analysis, session.target)),
    }


def patch_views(patching: Patching | None) -> dict:
    """B patched into A, where it was for the shown analysis and target: its words, the heads' grid, the tokens' maps."""
    if patching is None:
        return {"compare_patch_text": "", "compare_patch_heads": gr.update(value=None, visible=False),
                "compare_patch_tokens": gr.update(value=None, visible=False)}
    tokens = pictures.patched_tokens_picture(patching)
    return {"compare_patch_text": patching_text(patching),
            "compare_patch_heads": gr.update(value=pictures.patched_heads_picture(patching, tile_px=PATCH_TILE_PX), visible=True),
            "compare_patch_tokens": gr.update(value=tokens, visible=tokens is not None)}


def depends(session: Session, controls: Controls) -> tuple:
    return (controls.comparison, session.query, session.target, controls.compare_view, controls.compare_layer,
            controls.compare_head, controls.compare_statistic, controls.method, controls.rollout, controls.cmap, controls.overlay,
            controls.colour_scale, controls.fit)


def set_ranges(session: Session) -> dict:
    layers = session.analysis.map_shape[0]
    return {"compare_layer": gr.update(maximum=layers - 1, value=layers - 1),
            "compare_head": gr.update(choices=head_choices(session.analysis), value=MEAN_HEADS)}


COMPARED = ("comparison", *OUTPUTS)


@user_errors
def on_patch(models: ModelCache, session: Session | None, tokens: bool, *control_values,
             progress: Callable | None = None) -> tuple:
    """B patched into A for A's target (``methods.patching``): each head's output at each layer, and with ``tokens``
    the stream after each layer at each token, taken from B in turn (``COMPARED``). Needs B to be a second image by the
    main model: the two then reach the model at one size."""
    session, controls = require(session), Controls.from_values(control_values)
    comparison = controls.comparison
    if comparison is None or comparison.image_name is None or comparison.second_model:
        raise VitExplorerError("patching replaces parts of A's computation with B's, by one model: upload a second image (B) "
                               "with the main model first")
    if session.evidence is None:
        raise VitExplorerError(NO_TARGET_TO_PATCH)
    patching = run.patch(session.model(models), session.analysis, comparison.analysis, session.target, tokens=tokens,
                         progress=run_progress(progress))
    patched = replace(comparison, patching=(weakref.ref(session.analysis), patching))
    return in_order({"comparison": patched, **refresh(TAB, session, controls.with_inputs(comparison=patched))}, COMPARED)
MATCHED = ("comparison", "compare_view", *OUTPUTS)


@user_errors
def on_compare(models: ModelCache, session: Session | None, main_upload: str | None, second_image: str | None,
               second_model: str | None, *control_values, progress: Callable | None = None) -> tuple:
    """A second image or model chosen (or Compare pressed): B is analysed, one forward and one backward pass of the
    second image or model (none where the last comparison already analysed that image with that model), and shown
    (``COMPARED``). With neither, the comparison ends."""
    session, controls = require(session), Controls.from_values(control_values)
    spec = (second_model or MAIN_MODEL).strip() or session.model_spec
    if second_image is None and spec == session.model_spec:
        return in_order({"comparison": None, **refresh(TAB, session, controls.with_inputs(comparison=None))}, COMPARED)
    source = second_image or main_upload
    if source is None:
        raise VitExplorerError("the main image is no longer uploaded: upload it again, or upload a second image too")
    step = counter(progress, 2, f"B: loading {spec}, then one pass", "step")
    # a hub model not yet loaded: a download, the longest wait; a model that reads text is given the main one's prompts
    model = prompted(models.get(spec), controls.prompts)
    if step is not None:
        step()
    earlier = controls.comparison
    kept = earlier.analysis if earlier is not None and earlier.made_from(source, spec, controls.fit, model.labels) else None
    analysis, evidence = run.second_side(model, source, session.analysis, session.target, name=Path(source).name,
                                         memory_budget=models.memory_budget, fit=controls.fit, analysis=kept)
    comparison = Comparison(analysis, source, spec, controls.fit, None if second_image is None else Path(second_image).name,
                            spec != session.model_spec, weakref.ref(session.analysis), evidence)
    if step is not None:
        step()
    return in_order({"comparison": comparison, **refresh(TAB, session, controls.with_inputs(comparison=comparison))}, COMPARED)


@user_errors
def on_match(models: ModelCache, session: Session | None, *control_values, progress: Callable | None = None) -> tuple:
    """Why A and B match, for a backbone compared on two images: A's embedding explained on B's direction and B's on
    A's (``core.targets``: *another image*), each with every map that takes passes of its own; then the class map view
    shows both (``MATCHED``). Per side: a pass for the other's embedding, one for the similarity's analysis, and one
    forward and backward pass per map method."""
    session, controls = require(session), Controls.from_values(control_values)
    comparison = controls.comparison
    if comparison is None or comparison.image_name is None or comparison.second_model:
        raise VitExplorerError("why two images match compares their embeddings by one model: upload a second image (B) "
                               "with the main model first")
    found = run.match(models.get(session.model_spec), session.analysis, comparison.analysis, "A · the main image",
                      f"B · {comparison.image_name}", memory_budget=models.memory_budget, progress=run_progress(progress))
    matched = replace(comparison, match=found)
    controls = replace(controls.with_inputs(comparison=matched), compare_view="class map")
    return in_order({"comparison": matched, "compare_view": "class map", **refresh(TAB, session, controls)}, MATCHED)


def wire(app: Wiring) -> None:
    inputs = [app["state"], app["upload"], app["compare_upload"], app["compare_model"], *app.controls]

    def compare(session, main_upload, second_image, second_model, progress=gr.Progress(), *values):  # Gradio's bar there
        return on_compare(app.models, session, main_upload, second_image, second_model, *values, progress=progress)

    outputs = app.all(COMPARED)
    # not ``change``: Gradio fires it twice when an image replaces another (``app.wire``)
    app["compare_upload"].upload(compare, inputs, outputs, api_name="compare_image", concurrency_limit=2, show_progress="full")
    app["compare_upload"].clear(compare, inputs, outputs, api_name=False)  # ends the comparison
    app["compare_model"].input(compare, inputs, outputs, api_name="compare_model", concurrency_limit=2)
    app["compare_run"].click(compare, inputs, outputs, api_name="compare", concurrency_limit=2)

    def patched(session, tokens, progress=gr.Progress(), *values):
        return on_patch(app.models, session, tokens, *values, progress=progress)

    app["compare_patch"].click(patched, [app["state"], app["compare_patch_tokens_choice"], *app.controls], outputs,
                               api_name="compare_patch", concurrency_limit=2, show_progress="full")

    def match(session, progress=gr.Progress(), *values):
        return on_match(app.models, session, *values, progress=progress)

    app["compare_match"].click(match, [app["state"], *app.controls], app.all(MATCHED), api_name="compare_match",
                               concurrency_limit=2, show_progress="full")


def prepare(session: Session, controls: Controls) -> None:
    """Both sides' AttnLRP or LeGrad map, where the class map shows one, computed before drawing (``class_maps.prepare``)."""
    class_maps.prepare(session, controls)
    comparison = controls.comparison
    if controls.method in MODEL_MAPS and comparison is not None and comparison.evidence is not None:
        run.evidence(prompted(session.models.get(comparison.spec), controls.prompts), comparison.analysis,
                     comparison.evidence.target, (controls.method,))


TAB = Tab("Compare", OUTPUTS, layout, render, depends, wire, ranges=("compare_layer", "compare_head"), set_ranges=set_ranges,
          prepare=prepare, follows_query=True)
