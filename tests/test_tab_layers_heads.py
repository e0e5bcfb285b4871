"""The Layers × heads tab: tile clicks, head order, layer and head controls, shared normalisation."""

from dataclasses import replace

import numpy as np
from app_support import (
    CONTROLS,
    GRID,
    analysed,
    by_name,
    click,
    controls,
    is_unchanged,
    opened,
)

from vit_explorer.core import maps
from vit_explorer.draw import pictures, render
from vit_explorer.web.session import Controls
from vit_explorer.web.tabs import layers_heads


def test_tile_click_on_a_label_changes_nothing(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint, visible=GRID)
    result = layers_heads.on_tile_click(click(1, 1), session, *CONTROLS)
    assert result[0] is session and all(is_unchanged(value) for value in result[1:])


def test_ordered_grid_click_selects_the_head_shown_in_that_tile(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    ordered = controls(order_by="distance")
    opened(GRID, session, ordered)
    y, x = layers_heads.view(session).geometry.tile_origin(4, 0)
    clicked = layers_heads.on_tile_click(click(x + 1, y + 1), session, *ordered)[0]
    assert clicked.head == int(layers_heads.view(session).order[4, 0])


def test_layer_and_head_controls_select_a_head(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint, visible=GRID)
    selected = by_name(layers_heads.on_layer_head(session, 1, "h2", *CONTROLS), layers_heads.SELECTED)
    session = selected["state"]
    assert (session.layer, session.head) == (1, 2) and "layer 1, head h2" in selected["grid_caption"]
    mean = by_name(layers_heads.on_layer_head(session, 1, layers_heads.MEAN_HEADS, *CONTROLS), layers_heads.SELECTED)
    assert mean["state"].head is None and "layer 1, mean of heads" in mean["grid_caption"]
    assert not np.array_equal(selected["head_view"], mean["head_view"])
    assert not np.array_equal(selected["grid"], mean["grid"])  # the outline moves from the tile to the whole row


def test_with_shared_normalisation_the_large_view_keeps_the_grids_scale(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    query_maps = maps.query_maps(session.analysis, session.query)  # [layers, heads, gh, gw]
    peaks = query_maps.amax(dim=(-2, -1))
    layer, head = divmod(int(peaks.argmin()), peaks.shape[1])  # the faintest head: saturated on its own scale
    session = replace(session, layer=layer, head=head)
    gray = {"cmap": "gray", "overlay": False}
    own = layers_heads.render_head(session, Controls(**gray))
    kept = layers_heads.render_head(session, Controls(**gray, normalisation="shared"))
    height, width = pictures.view_hw(session.analysis)
    assert own[:height, :width].max() >= 245  # on its own scale its maximum is (nearly: bilinear upsampling) white
    low, high = pictures.shared_bounds(query_maps)
    expected = 255 * (float(peaks[layer, head]) - low) / (high - low)  # its tile's brightest value on the grid's scale
    assert expected < 200 and expected - 20 <= int(kept[:height, :width].max()) <= expected + 1
    grid, geometry = pictures.grid_picture(session.analysis, maps.heads_view(session.analysis, session.query), shared=True,
                                           overlay=False, cmap="gray")
    assert grid.shape[0] > geometry.size_hw[0] + 2 * render.LABEL_PX  # the grid's one scale has a colour bar
