"""The Layers × heads tab: where the query looks in every layer and head (a grid of tiles; click one), and the
selected layer and head large."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import numpy as np
import torch

from vit_explorer.core import maps
from vit_explorer.draw import pictures
from vit_explorer.draw.render import GridGeometry
from vit_explorer.web.captions import MEAN_HEADS, grid_caption, head_choices, head_label
from vit_explorer.web.session import Controls, Session
from vit_explorer.web.tabs.base import Tab, Wiring, in_order, map_image, refresh, require, state_of, user_errors


@dataclass
class GridView:
    """What the Layers × heads tab keeps between events: the grid as drawn (its geometry and head order
    ``[layers, heads]``), through which a tile click is mapped to its head."""

    geometry: GridGeometry | None = None
    order: torch.Tensor | None = None


def view(session: Session) -> GridView:
    """This tab's own view state on the session (``GridView``)."""
    return state_of(TAB, session)


OUTPUTS = ("grid", "head_view", "grid_caption")


def layout() -> dict:
    grid_text = gr.Markdown("", elem_id="grid-caption")
    with gr.Row(equal_height=False):
        grid = map_image("grid", "Layers × heads", scale=3)
        with gr.Column(scale=2, min_width=300):
            with gr.Row():
                layer = gr.Slider(0, 1, value=0, step=1, label="Layer", min_width=140)
                head = gr.Dropdown([MEAN_HEADS], value=MEAN_HEADS, label="Head", min_width=120)
            head_view = map_image("head-view", "Selected layer and head")
    return {"grid_caption": grid_text, "grid": grid, "layer": layer, "head": head, "head_view": head_view}


def render_grid(session: Session, controls: Controls) -> np.ndarray:
    """The grid picture; its geometry and head order go on the session's screen, for tile clicks."""
    heads = maps.heads_view(session.analysis, session.query, controls.order_by, session.evidence)
    picture, geometry = pictures.grid_picture(session.analysis, heads, cmap=controls.cmap, overlay=controls.overlay,
                                              shared=controls.normalisation == "shared", selected=(session.layer, session.head),
                                              scale=controls.colour_scale)
    grid = view(session)
    grid.geometry, grid.order = geometry, heads.order
    return picture


def render_head(session: Session, controls: Controls) -> np.ndarray:
    """The selected layer and head (or mean of heads), large."""
    grid_map = maps.attention_map(session.analysis, session.query, session.layer, session.head)
    shared = controls.normalisation == "shared"
    # with one scale for the grid, the large view keeps it, so that a faint tile is not shown saturated here
    bounds = pictures.shared_bounds(maps.query_maps(session.analysis, session.query), controls.colour_scale) if shared else None
    unit = f"{pictures.ATTENTION}, the grid's one scale" if shared else pictures.ATTENTION
    return pictures.map_picture(session.analysis, grid_map, cmap=controls.cmap, overlay=controls.overlay, query=session.query,
                                unit=unit, scale=controls.colour_scale, bounds=bounds)


def render(session: Session, controls: Controls) -> dict:
    return {"grid": render_grid(session, controls), "head_view": render_head(session, controls),
            "grid_caption": grid_caption(session, controls)}


def depends(session: Session, controls: Controls) -> tuple:
    return (session.query, session.layer, session.head, session.target, controls.cmap, controls.overlay, controls.normalisation,
            controls.order_by, controls.colour_scale)


def set_ranges(session: Session) -> dict:
    return {"layer": gr.update(maximum=session.analysis.map_shape[0] - 1, value=session.layer),
            "head": gr.update(choices=head_choices(session.analysis), value=head_label(session.head))}


SELECTED = ("state", *OUTPUTS)
CLICKED = (*SELECTED, "layer", "head")


def tile_at(session: Session, x: int, y: int) -> tuple[int, int] | None:
    """The (layer, head) of the grid's tile at its picture's pixel (``x``, ``y``) as drawn last; None on a label or the
    margin."""
    grid = view(session)
    hit = grid.geometry.hit(x, y) if grid.geometry is not None else None
    if hit is None:
        return None
    layer, rank = hit
    return layer, int(grid.order[layer, rank])


@user_errors
def on_tile_click(evt: gr.SelectData, session: Session | None, *control_values) -> tuple:
    """A tile clicked: its layer and head are selected, and the layer and head controls show them (``CLICKED``)."""
    session = require(session)
    tile = tile_at(session, evt.index[0], evt.index[1])
    if tile is None:  # a label or the margin
        return in_order({"state": session, **dict.fromkeys(CLICKED[1:], gr.update())}, CLICKED)
    session.layer, session.head = tile
    values = {"state": session, **refresh(TAB, session, Controls.from_values(control_values)),
              "layer": gr.update(value=session.layer), "head": gr.update(value=head_label(session.head))}
    return in_order(values, CLICKED)


@user_errors
def on_layer_head(session: Session | None, layer: int, head: str | None, *control_values) -> tuple:
    """The layer or head control changed: that head is selected (``SELECTED``); the controls already show it."""
    session = require(session)
    session.layer, session.head = int(layer), None if head in (None, MEAN_HEADS) else int(head.removeprefix("h"))
    return in_order({"state": session, **refresh(TAB, session, Controls.from_values(control_values))}, SELECTED)


def wire(app: Wiring) -> None:
    state, layer, head = app["state"], app["layer"], app["head"]
    app["grid"].select(on_tile_click, [state, *app.controls], app.all(CLICKED), api_name="select_tile")
    for component in (layer, head):
        component.input(on_layer_head, [state, layer, head, *app.controls], app.all(SELECTED), api_name=False)


TAB = Tab("Layers × heads", OUTPUTS, layout, render, depends, wire, ranges=("layer", "head"), set_ranges=set_ranges,
          follows_query=True, state=GridView)
