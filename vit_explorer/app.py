"""The Gradio app: layout and wiring only. Every callback calls into ``maps``/``pictures``/``charts``/``export``.

The model runs once per (image, model); the resulting ``Analysis`` (CPU arrays, no model reference)
is the session's state, and every other control re-renders from it.
"""

from __future__ import annotations

import functools
import sys
import tempfile
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import gradio as gr
import numpy as np

from . import charts, export, maps, pictures, render
from .analysis import DEFAULT_MEMORY_BUDGET, Analysis, analyze, class_evidence, recompute_query_rows
from .captions import (
    MEAN_HEADS,
    MEAN_PATCHES,
    grid_caption,
    head_choices,
    head_label,
    query_caption,
    query_choices,
    query_label,
    target_choices,
    top_heads_table,
    top_predictions,
)
from .errors import VitExplorerError
from .faithfulness import DEFAULT_RANDOM_ORDERS, deletion_insertion, forward_passes
from .models import DEFAULT_MODEL
from .models.builtin import EXAMPLES
from .rollout import HEAD_FUSIONS
from .session import CACHE_TTL_S, CONTROL_NAMES, Controls, ModelCache, Session, export_dir, model_choices, new_session
from .upload import image_upload

TITLE = "vit_explorer"
INTRO = (
    "See what a Vision Transformer looks at: upload an image, then compare the softmax attention of every head "
    "of every layer, click any patch to see where it looks, follow attention rollout to the class token, and see "
    "which patches a chosen class depends on, scored by deletion and insertion against random orders."
)
MAX_UPLOAD = "20mb"
MAP_VIEW = "map-view"  # the class of pictures with text in them (maps, grid, charts)
MAP_BUTTONS = ["download", "fullscreen"]
# Gradio floats an image's buttons over its top-right corner, where they hid column labels and map corners:
# on our pictures they get a line of their own above the picture instead
CSS = f""".{MAP_VIEW} .icon-button-wrapper {{ position: static; justify-content: flex-end; margin: 0 0 2px auto; }}"""
NORMALISATIONS = ("per tile", "shared")


def user_errors(callback: Callable) -> Callable:
    """Show a ``VitExplorerError`` raised by ``callback`` as a message in the page, not a bare "Error"."""

    @functools.wraps(callback)
    def wrapped(*args, **kwargs):
        try:
            return callback(*args, **kwargs)
        except VitExplorerError as error:
            raise gr.Error(str(error), print_exception=False) from None

    return wrapped


def query_update(session: Session) -> dict:
    """The query dropdown, showing the current query."""
    return gr.update(choices=query_choices(session.analysis, session.query), value=query_label(session))


RANDOM_WEIGHTS_NOTE = "Random weights: the token layout is the real one, but nothing is learned, so the maps show no learned attention."
BACKBONE_NOTE = "Backbone: no classifier head, so no predictions, class maps or faithfulness scores; attention, rollout and head statistics work."


def model_summary(analysis: Analysis) -> str:
    layout = analysis.layout
    layers, heads = analysis.map_shape
    tokens = layout.num_tokens
    prefix = ", ".join(layout.prefix_names) or "none (rollout and grid use the mean over patch queries)"
    summary = (
        f"**{analysis.model_name}** · input {layout.input_hw[0]}×{layout.input_hw[1]} px · {layers} layers × {heads} heads · "
        f"{tokens} tokens = {layout.grid_hw[0]}×{layout.grid_hw[1]} patches of {layout.patch_hw[0]}×{layout.patch_hw[1]} px "
        f"+ prefix: {prefix} · held: {analysis.nbytes / 2**20:.1f} MiB ({analysis.storage})"
    )
    if analysis.random_weights:
        summary += f"  \n**{RANDOM_WEIGHTS_NOTE}**"
    if analysis.num_classes == 0:
        summary += f"  \n{BACKBONE_NOTE}"
    if analysis.view_note:
        summary += f"  \n{analysis.view_note}"
    if analysis.ood is not None and analysis.ood.flagged:
        summary = f"> ⚠️ **Outside what this model knows.** {analysis.ood.notice(analysis.model_name)}\n\n{summary}"
    return summary


# ---- rendering of the views that follow the query -------------------------------------------

def render_grid(session: Session, controls: Controls) -> tuple[Session, np.ndarray]:
    picture, geometry, order = pictures.grid_picture(
        session.analysis, session.query, cmap=controls.cmap, overlay=controls.overlay,
        shared=controls.normalisation == "shared", order_by=controls.order_by,
        evidence=session.evidence, selected=(session.layer, session.head), scale=controls.colour_scale,
    )
    return replace(session, geometry=geometry, order=order), picture


def render_head(session: Session, controls: Controls) -> np.ndarray:
    grid_map = maps.attention_map(session.analysis, session.query, session.layer, session.head)
    return pictures.map_picture(session.analysis, grid_map, cmap=controls.cmap, overlay=controls.overlay, query=session.query,
                                unit=pictures.ATTENTION, scale=controls.colour_scale)


def render_rollout(session: Session, controls: Controls) -> np.ndarray:
    grid_map = maps.rollout_map(session.analysis, session.query, controls.rollout)
    return pictures.map_picture(session.analysis, grid_map, cmap=controls.cmap, overlay=controls.overlay, query=session.query,
                                unit=pictures.ROLLOUT, scale=controls.colour_scale)


NO_CLASSIFIER = "This model has no classifier head: class-specific maps and faithfulness scores need class scores."


def render_class(session: Session, controls: Controls) -> np.ndarray | None:
    """The class-maps tab's map, or None where the method needs a classifier this model lacks."""
    if session.evidence is None and controls.method in maps.CLASS_SPECIFIC:
        return None
    return pictures.class_map_picture(session.analysis, controls.method, session.evidence, controls.rollout, controls.cmap,
                                      controls.colour_scale)


def class_note(session: Session) -> str:
    if session.evidence is None:
        return NO_CLASSIFIER
    return (f"Target: **{session.analysis.label(session.evidence.target)}**. *Score faithfulness* deletes and inserts patches in "
            f"the map's order and against {DEFAULT_RANDOM_ORDERS} random orders ({forward_passes()} forward passes).")


def render_query_views(session: Session, controls: Controls) -> tuple:
    """State + the views that depend on the query: image, grid, head view, rollout, caption, grid caption."""
    session, grid = render_grid(session, controls)
    return (
        session,
        pictures.image_picture(session.analysis, session.query),
        grid,
        render_head(session, controls),
        render_rollout(session, controls),
        query_caption(session),
        grid_caption(session, controls),
    )


def render_overview(session: Session, controls: Controls) -> tuple:
    """Views that depend only on the analysis: top-5, rollout and last-layer attention of the default query."""
    analysis = session.analysis
    default = maps.default_query(analysis)
    rollout = maps.rollout_map(analysis, default, maps.RolloutOptions())
    last = maps.attention_map(analysis, default, analysis.map_shape[0] - 1, None)
    name = maps.query_name(analysis, default)
    return (
        top_predictions(analysis),
        pictures.map_picture(analysis, rollout, cmap=controls.cmap, overlay=True, query=None, unit=f"rollout weight of {name}",
                             scale=controls.colour_scale),
        pictures.map_picture(analysis, last, cmap=controls.cmap, overlay=True, query=None, unit=f"attention weight of {name}",
                             scale=controls.colour_scale),
    )


def render_statistics(analysis: Analysis) -> tuple:
    return (
        charts.distance_chart(maps.head_statistic(analysis, "distance")),
        charts.entropy_heatmap(maps.head_statistic(analysis, "entropy"), analysis.layout.num_tokens),
        charts.prefix_share_chart(maps.head_statistic(analysis, "prefix share"), analysis.layout),
    )


CONTROL_UPDATES = ("layer", "head", "start_layer", "target", "query")


def control_updates(session: Session) -> tuple:
    """Slider and dropdown ranges for this analysis, in ``CONTROL_UPDATES`` order."""
    layers = session.analysis.map_shape[0]
    evidence = session.evidence
    return (
        gr.update(maximum=layers - 1, value=session.layer),
        gr.update(choices=head_choices(session.analysis), value=head_label(session.head)),
        gr.update(maximum=layers - 1, value=0),
        gr.update(choices=target_choices(session.analysis) if evidence else [], value=evidence.target if evidence else None,
                  interactive=evidence is not None),
        query_update(session),
    )


# the components an analysis fills, by name: ``build_demo`` wires them in this order, and the callbacks
# below return their values in it, so adding one cannot shift the others
FULL_OUTPUTS = ("state", "summary", "query_image", "top5", "overview_rollout", "overview_last", "grid", "head_view", "rollout_view",
                "distance_plot", "entropy_plot", "prefix_plot", "caption", "class_view", "top_heads", "faithfulness_plot", "class_text",
                "grid_caption", *CONTROL_UPDATES)


def in_order(values: dict[str, object], names: tuple[str, ...]) -> tuple:
    """``values`` by name → the tuple Gradio expects for the outputs ``names``; a missing or unknown name raises."""
    if set(values) != set(names):
        raise KeyError(f"outputs {sorted(set(names) ^ set(values))} are missing or unknown")
    return tuple(values[name] for name in names)


def empty_outputs() -> tuple:
    values: dict[str, object] = dict.fromkeys(FULL_OUTPUTS)
    values.update(summary="Upload an image to begin.", caption="", class_text="", **dict.fromkeys(CONTROL_UPDATES, gr.update()))
    return in_order(values, FULL_OUTPUTS)


def full_outputs(session: Session, controls: Controls) -> tuple:
    """Everything an analysis fills: state, summary, query views, overview, statistics, control ranges."""
    session, image, grid, head, rollout, caption, grid_text = render_query_views(session, controls)
    top5, overview_rollout, overview_last = render_overview(session, controls)
    distance, entropy, prefix = render_statistics(session.analysis)
    values = dict(state=session, summary=model_summary(session.analysis), query_image=image, top5=top5, overview_rollout=overview_rollout,
                  overview_last=overview_last, grid=grid, head_view=head, rollout_view=rollout, distance_plot=distance,
                  entropy_plot=entropy, prefix_plot=prefix, caption=caption, class_view=render_class(session, controls),
                  top_heads=top_heads_table(session), faithfulness_plot=None, class_text=class_note(session), grid_caption=grid_text,
                  **dict(zip(CONTROL_UPDATES, control_updates(session))))
    return in_order(values, FULL_OUTPUTS)


@user_errors
def run_analysis(models: ModelCache, upload: str | None, spec: str, *control_values) -> tuple:
    """Upload (or model change) → one forward pass, and one backward pass for the top class → all views."""
    if upload is None:
        return empty_outputs()
    model = models.get(spec)
    controls = Controls(*control_values)
    analysis = analyze(model, upload, name=Path(upload).name, memory_budget=models.memory_budget, fit=controls.fit)
    evidence = class_evidence(model, analysis) if analysis.num_classes else None
    return full_outputs(new_session(analysis, spec, evidence), controls)


def on_model_change(models: ModelCache, spec: str, current: str, upload: str | None, session: Session | None, *control_values) -> tuple:
    """Switch model; on failure keep the previous one (and its maps) and say why."""
    try:
        models.get(spec)
    except VitExplorerError as error:
        gr.Warning(f"{error} — still using {current}.")
        unchanged = (session, *(gr.update() for _ in range(len(empty_outputs()) - 1)))
        return (current, gr.update(value=current), *unchanged)
    return (spec, gr.update(), *run_analysis(models, upload, spec, *control_values))


def require(session: Session | None) -> Session:
    if session is None:
        raise gr.Error("Upload an image first.", print_exception=False)
    return session


@user_errors
def on_controls(session: Session | None, *control_values) -> tuple:
    """A view control changed: re-render from the cached maps, no forward pass."""
    session = require(session)
    controls = Controls(*control_values)
    return (*render_query_views(session, controls), *render_overview(session, controls)[1:], render_class(session, controls))


@user_errors
def on_rollout_controls(session: Session | None, *control_values) -> tuple:
    """Rollout options changed: the rollout view and the class map (which shares them) re-render."""
    session, controls = require(session), Controls(*control_values)
    return render_rollout(session, controls), render_class(session, controls)


@user_errors
def on_method(session: Session | None, *control_values) -> tuple:
    """Another class-maps method: its map, and the previous map's score cleared."""
    session = require(session)
    return render_class(session, Controls(*control_values)), None, class_note(session)


@user_errors
def on_target(models: ModelCache, session: Session | None, target: int | None, *control_values) -> tuple:
    """Another target class: one forward and backward pass (none for a target seen before on this image)."""
    session = require(session)
    if session.evidence is None or target is None:
        return session, gr.update(), gr.update(), gr.update(), gr.update(), gr.update()
    evidence = class_evidence(models.get(session.model_spec), session.analysis, int(target))
    session, controls = replace(session, evidence=evidence), Controls(*control_values)
    session, grid = render_grid(session, controls)  # an ordering by gradient importance follows the target
    return session, render_class(session, controls), grid, top_heads_table(session), None, class_note(session)


@user_errors
def on_score(models: ModelCache, session: Session | None, *control_values) -> tuple:
    """Deletion and insertion curves of the map on screen against random orders: a chart and the AUCs."""
    session, controls = require(session), Controls(*control_values)
    if session.evidence is None:
        raise VitExplorerError(NO_CLASSIFIER)
    analysis, target = session.analysis, session.evidence.target
    grid_map = maps.class_map(analysis, controls.method, session.evidence, controls.rollout)
    curves = deletion_insertion(models.get(session.model_spec), analysis.image, grid_map, target)
    aucs, margins = curves.aucs, curves.margins
    title = f"{maps.CLASS_METHODS[controls.method]} · target {analysis.label(target)}"
    text = (f"**{maps.CLASS_METHODS[controls.method]}** for **{analysis.label(target)}** {curves.verdict}: "
            f"deletion AUC **{aucs['deletion']:.3f}** against {aucs['random_deletion']:.3f} (lower is better, margin {margins['deletion']:+.3f}), "
            f"insertion AUC **{aucs['insertion']:.3f}** against {aucs['random_insertion']:.3f} (higher is better, margin {margins['insertion']:+.3f}).")
    return charts.faithfulness_chart(curves, title), text


@user_errors
def on_patch_click(models: ModelCache, evt: gr.SelectData, session: Session | None, *control_values) -> tuple:
    """A patch clicked: the query views follow it. A compact analysis kept no patch query's rows, so they
    are recomputed here, with the model from the cache, before any view reads them."""
    session = require(session)
    size = pictures.view_hw(session.analysis)
    token = pictures.token_at(session.analysis, evt.index[0], evt.index[1], size)
    if session.analysis.attentions is None:
        recompute_query_rows(models.get(session.model_spec), session.analysis, token)
    session = replace(session, query=token)
    return render_query_views(session, Controls(*control_values)) + (query_update(session),)


@user_errors
def on_query_choice(session: Session | None, choice: str | None, *control_values) -> tuple:
    """A query picked from the dropdown: the query views follow it, and the dropdown shows it."""
    session = require(session)
    if choice in query_choices(session.analysis):  # else nothing, or the clicked patch that is already the query
        session = replace(session, query=None if choice == MEAN_PATCHES else session.analysis.layout.prefix_names.index(choice))
    # the dropdown too: a patch entry left from an earlier click goes once another query is chosen
    return render_query_views(session, Controls(*control_values)) + (query_update(session),)


@user_errors
def on_reset_query(session: Session | None, *control_values) -> tuple:
    session = require(session)
    session = replace(session, query=maps.default_query(session.analysis))
    return render_query_views(session, Controls(*control_values)) + (query_update(session),)


@user_errors
def on_tile_click(evt: gr.SelectData, session: Session | None, *control_values) -> tuple:
    session = require(session)
    hit = session.geometry.hit(evt.index[0], evt.index[1]) if session.geometry is not None else None
    if hit is None:
        return session, gr.update(), gr.update(), gr.update(), gr.update(), gr.update()
    layer, rank = hit
    head = int(session.order[layer, rank])
    return select_head(replace(session, layer=layer, head=head), Controls(*control_values))


def select_head(session: Session, controls: Controls) -> tuple:
    """State, grid, head view and grid caption for the selected layer and head, then the layer and head controls."""
    session, grid = render_grid(session, controls)
    return (session, grid, render_head(session, controls), grid_caption(session, controls), gr.update(value=session.layer),
            gr.update(value=head_label(session.head)))


@user_errors
def on_layer_head(session: Session | None, layer: int, head: str, *control_values) -> tuple:
    session = require(session)
    head_index = None if head in (None, MEAN_HEADS) else int(head.removeprefix("h"))
    # the sliders already show this layer and head: only state, grid, large view and caption change
    return select_head(replace(session, layer=int(layer), head=head_index), Controls(*control_values))[:4]


@user_errors
def on_export(session: Session | None, *control_values, ttl_s: float = CACHE_TTL_S) -> str:
    """A zip of what ``vit-explorer analyze`` writes, for the current query and options, plus the selected head's
    view and the class-maps tab's map."""
    session = require(session)
    controls = Controls(*control_values)
    with tempfile.TemporaryDirectory() as staging:
        folder = Path(staging)
        written = export.write_views(session.analysis, folder, query=session.query, options=controls.rollout, cmap=controls.cmap,
                                     order_by=controls.order_by, evidence=session.evidence, shared=controls.normalisation == "shared",
                                     scale=controls.colour_scale)
        extra = {f"layer{session.layer}_{head_label(session.head).replace(' ', '_')}.png": render_head(session, controls),
                 f"{controls.method}.png": render_class(session, controls)}
        for name, picture in extra.items():
            if picture is not None:
                written.append(folder / name)
                render.save_png(picture, str(written[-1]))
        archive = export_dir(ttl_s) / f"vit-explorer-{uuid.uuid4().hex[:12]}.zip"
        with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
            for path in written:
                bundle.write(path, path.name)
    return str(archive)


def build_demo(model_spec: str = DEFAULT_MODEL, models: ModelCache | None = None, cache_ttl_s: int = CACHE_TTL_S) -> gr.Blocks:
    """The app's layout and wiring; ``model_spec`` is the model selected at start.

    Every rendered view is a file in Gradio's cache; files older than ``cache_ttl_s`` are deleted
    (checked every ``cache_ttl_s / 2`` seconds, at most every 10 minutes), and all of them when the
    server stops, so disk use is bounded by what one ``cache_ttl_s`` of use produces.
    """
    models = models or ModelCache()
    with gr.Blocks(title=TITLE, delete_cache=(max(1, min(600, cache_ttl_s // 2)), cache_ttl_s)) as demo:
        state = gr.State(None, time_to_live=CACHE_TTL_S)
        current_model = gr.State(model_spec)
        gr.Markdown(f"# {TITLE}\n{INTRO}")
        # maps carry no Gradio label (it floats over the picture's top edge): a Markdown caption sits above each
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=280):
                upload = image_upload(sources=["upload", "clipboard"], label="Image (upload or paste)", height=270,
                                      elem_id="upload")
            with gr.Column(scale=5):
                with gr.Row():
                    model = gr.Dropdown(model_choices(model_spec), value=model_spec, allow_custom_value=True, label="Model",
                                        info="built-in, timm:NAME, hf:REPO or a checkpoint path; hub models download once", scale=3)
                    fit = gr.Radio([("stretch", "stretch"), ("pad to square", "pad")], value="stretch", label="Fit to the model's input",
                                   info="for images of other proportions", scale=2, min_width=220)
                summary = gr.Markdown("Upload an image to begin.", elem_id="summary")
                if EXAMPLES.is_dir():
                    gr.Examples(sorted(str(path) for path in EXAMPLES.glob("*.png")), inputs=upload, label="Examples (generated shapes)")
        # the query image sits beside the tabs, level with the grid and the maps that follow the query
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=280):
                gr.Markdown("**The image as the model sees it** — click a patch to make it the query")
                query_image = gr.Image(show_label=False, label="The image as the model sees it", interactive=False, format="png",
                                       buttons=[], elem_id="query-image")
                caption = gr.Markdown("", elem_id="query-caption")
                query = gr.Dropdown([], label="Query token", info="a prefix token, the mean of patch queries, or the clicked patch",
                                    elem_id="query")
                reset = gr.Button("Back to class token", size="sm")
                top5 = gr.Label(num_top_classes=5, label="Top-5 predictions", elem_id="top5")
            with gr.Column(scale=5):
                with gr.Row():
                    cmap = gr.Dropdown(list(render.COLORMAPS), value="inferno", label="Colormap", min_width=110)
                    colour_scale = gr.Dropdown([(name, key) for key, name in render.COLOUR_SCALES.items()], value="linear",
                                               label="Colour scale", min_width=170)
                    overlay = gr.Checkbox(True, label="Overlay on image", min_width=110)
                    normalisation = gr.Dropdown(list(NORMALISATIONS), value="per tile", label="Normalisation", min_width=130)
                    order_by = gr.Dropdown(list(maps.ORDERINGS), value="none", label="Order heads by", min_width=140)
                with gr.Tabs():
                    with gr.Tab("Overview"):
                        with gr.Row():
                            with gr.Column(min_width=300):
                                gr.Markdown("**Attention rollout** through all layers")
                                overview_rollout = gr.Image(show_label=False, label="Attention rollout", format="png", interactive=False,
                                                            buttons=MAP_BUTTONS, elem_classes=MAP_VIEW, elem_id="overview-rollout")
                            with gr.Column(min_width=300):
                                gr.Markdown("**Last layer**, mean over heads")
                                overview_last = gr.Image(show_label=False, label="Last layer, mean over heads", format="png",
                                                         interactive=False, buttons=MAP_BUTTONS, elem_classes=MAP_VIEW, elem_id="overview-last")
                    with gr.Tab("Layers × heads"):
                        grid_caption = gr.Markdown("", elem_id="grid-caption")
                        with gr.Row(equal_height=False):
                            grid = gr.Image(show_label=False, label="Layers × heads", format="png", interactive=False, scale=3,
                                            buttons=MAP_BUTTONS, elem_classes=MAP_VIEW, elem_id="grid")
                            with gr.Column(scale=2, min_width=300):
                                with gr.Row():
                                    layer = gr.Slider(0, 1, value=0, step=1, label="Layer", min_width=140)
                                    head = gr.Dropdown([MEAN_HEADS], value=MEAN_HEADS, label="Head", min_width=120)
                                head_view = gr.Image(show_label=False, label="Selected layer and head", format="png", interactive=False,
                                                     buttons=MAP_BUTTONS, elem_classes=MAP_VIEW, elem_id="head-view")
                    with gr.Tab("Rollout"):
                        with gr.Row():
                            head_fusion = gr.Radio(list(HEAD_FUSIONS), value="mean", label="Head fusion")
                            discard_ratio = gr.Slider(0.0, 0.95, value=0.0, step=0.05, label="Discard ratio")
                            start_layer = gr.Slider(0, 1, value=0, step=1, label="Start layer")
                            residual_weight = gr.Slider(0.0, 1.0, value=0.5, step=0.05, label="Residual weight")
                        gr.Markdown("**Attention rollout of the query** (Abnar & Zuidema 2020): attention multiplied through the "
                                    "layers from the start layer on, with the residual weight as the skip connection's share")
                        rollout_view = gr.Image(show_label=False, label="Attention rollout of the query", format="png", interactive=False,
                                                buttons=MAP_BUTTONS, elem_classes=MAP_VIEW, elem_id="rollout-view")
                    with gr.Tab("Class maps"):
                        with gr.Row():
                            target = gr.Dropdown([], label="Target class", info="default: the top prediction; type to search",
                                                 elem_id="target")
                            method = gr.Radio([(name, key) for key, name in maps.CLASS_METHODS.items()], value="relevance",
                                              label="Map", info="rollout options (Rollout tab) apply to the rollout-based maps")
                        with gr.Row(equal_height=False):
                            with gr.Column(min_width=300):
                                gr.Markdown("**The chosen map** for the target class; its colour bar says what it measures")
                                class_view = gr.Image(show_label=False, label="Class-specific map", format="png", interactive=False,
                                                      buttons=MAP_BUTTONS, elem_classes=MAP_VIEW, elem_id="class-view")
                            with gr.Column(min_width=300):
                                class_text = gr.Markdown("")
                                score = gr.Button("Score faithfulness", elem_id="score")
                                faithfulness_plot = gr.Image(label="Deletion and insertion", show_label=False, format="png",
                                                             interactive=False, buttons=MAP_BUTTONS, elem_classes=MAP_VIEW,
                                                             elem_id="faithfulness")
                    with gr.Tab("Head statistics"):
                        with gr.Row():
                            distance_plot = gr.Image(label="Mean attention distance", show_label=False, format="png",
                                                     interactive=False, buttons=MAP_BUTTONS, elem_classes=MAP_VIEW)
                            entropy_plot = gr.Image(label="Entropy", show_label=False, format="png", interactive=False,
                                                    buttons=MAP_BUTTONS, elem_classes=MAP_VIEW)
                            prefix_plot = gr.Image(label="Prefix-token share", show_label=False, format="png", interactive=False,
                                                   buttons=MAP_BUTTONS, elem_classes=MAP_VIEW)
                        top_heads = gr.Dataframe(label="Top heads of this image by each ranking "
                                                 "(gradient importance: Σ|∇A ⊙ A| for the target class)", interactive=False, wrap=True,
                                                 elem_id="top-heads")
                    with gr.Tab("Export"):
                        gr.Markdown("A zip with `attention.npz` (raw maps), `rollout.png`, `heads.png` and the selected head's view, "
                                    "for the current query and options — the same files `vit-explorer analyze` writes.")
                        export_button = gr.Button("Export")
                        export_file = gr.File(label="Download", interactive=False)

        ui = locals()  # every component above, by its variable's name
        controls = [ui[name] for name in CONTROL_NAMES]  # by name: a control without a component fails here
        query_outputs = [state, query_image, grid, head_view, rollout_view, caption, grid_caption]
        full = [ui[name] for name in FULL_OUTPUTS]

        def analyse(upload_path, spec, *values):
            return run_analysis(models, upload_path, spec, *values)

        def switch_model(spec, current, upload_path, session, *values):
            return on_model_change(models, spec, current, upload_path, session, *values)

        def choose_target(session, target_index, *values):
            return on_target(models, session, target_index, *values)

        def score_map(session, *values):
            return on_score(models, session, *values)

        upload.change(analyse, [upload, current_model, *controls], full, api_name="analyze", concurrency_limit=2,
                      show_progress="full")
        fit.input(analyse, [upload, current_model, *controls], full, api_name="set_fit", concurrency_limit=2)
        model.input(switch_model, [model, current_model, upload, state, *controls], [current_model, model, *full],
                    api_name="change_model", concurrency_limit=2)
        def select_patch(evt: gr.SelectData, session, *values):
            return on_patch_click(models, evt, session, *values)

        query_image.select(select_patch, [state, *controls], [*query_outputs, query], api_name="select_patch")
        query.input(on_query_choice, [state, query, *controls], [*query_outputs, query], api_name="select_query")
        reset.click(on_reset_query, [state, *controls], [*query_outputs, query], api_name="reset_query")
        grid.select(on_tile_click, [state, *controls], [state, grid, head_view, grid_caption, layer, head],
                    api_name="select_tile")
        for component in (layer, head):
            component.input(on_layer_head, [state, layer, head, *controls], [state, grid, head_view, grid_caption], api_name=False)
        for component in (cmap, colour_scale, overlay, normalisation, order_by):
            component.input(on_controls, [state, *controls], [*query_outputs, overview_rollout, overview_last, class_view],
                            api_name=f"set_{component.label.lower().replace(' ', '_')}")
        for component in (head_fusion, discard_ratio, start_layer, residual_weight):
            component.input(on_rollout_controls, [state, *controls], [rollout_view, class_view],
                            api_name=f"set_{component.label.lower().replace(' ', '_')}")
        method.input(on_method, [state, *controls], [class_view, faithfulness_plot, class_text], api_name="set_method")
        target.input(choose_target, [state, target, *controls], [state, class_view, grid, top_heads, faithfulness_plot, class_text],
                     api_name="set_target", concurrency_limit=2)
        score.click(score_map, [state, *controls], [faithfulness_plot, class_text], api_name="score", concurrency_limit=2)

        def export(session, *values):
            return on_export(session, *values, ttl_s=cache_ttl_s)

        export_button.click(export, [state, *controls], export_file, api_name="export")
    return demo


SHARE_WARNING = ("vit-explorer: warning: --share opens a public Gradio link: anyone with it can use this app, upload files to "
                 "this machine and run the model here")


def serve(model_spec: str = DEFAULT_MODEL, host: str = "127.0.0.1", port: int = 7860, share: bool = False, open_browser: bool = True,
          memory_budget: int = DEFAULT_MEMORY_BUDGET, cache_ttl_s: int = CACHE_TTL_S) -> None:
    """Load ``model_spec`` (failing early with a message if it cannot be), then serve the app."""
    models = ModelCache(memory_budget=memory_budget)
    models.get(model_spec)
    if share:
        print(SHARE_WARNING, file=sys.stderr, flush=True)
    demo = build_demo(model_spec, models, cache_ttl_s)
    demo.queue(default_concurrency_limit=4)
    demo.launch(server_name=host, server_port=port, share=share, inbrowser=open_browser, max_file_size=MAX_UPLOAD,
                allowed_paths=[str(EXAMPLES)] if EXAMPLES.is_dir() else None, footer_links=["api"],
                theme=gr.themes.Soft(), css=CSS, quiet=True, prevent_thread_lock=True)
    print(serving_line(model_spec, host, demo.server_port, demo.share_url), file=sys.stderr, flush=True)
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        demo.close()


def serving_line(model_spec: str, host: str, port: int, share_url: str | None) -> str:
    """The one line ``serve`` prints: where the app is, who can reach it, and how to stop it."""
    local = host in ("127.0.0.1", "localhost", "::1")
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    reach = "this machine only" if local else f"other machines that can reach {host} too"
    if share_url:
        reach += f", and anyone with the public link {share_url}"
    return f"vit-explorer: serving {model_spec} at http://{shown}:{port} ({reach}); press Ctrl+C to stop"
