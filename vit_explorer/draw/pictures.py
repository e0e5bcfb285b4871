"""Pictures of an analysis for the app and the CLI: large map views with colour bars, the image with the
query patch outlined, the layers × heads grid. Numbers come from ``maps`` as tensors; pixels from ``render``,
which turns them into numpy."""

from __future__ import annotations

import math

import numpy as np
import torch

from vit_explorer.core.analysis import Analysis
from vit_explorer.core.decomposition import Decomposition
from vit_explorer.core.interventions import HeadAblation, Patching
from vit_explorer.core.maps import (
    CONSERVATION_TOLERANCE,
    NEGLIGIBLE,
    ClassMap,
    HeadsView,
)
from vit_explorer.core.request import Run
from vit_explorer.core.token_norms import TokenNorms
from vit_explorer.draw import render
from vit_explorer.errors import VitExplorerError

# sizes in screen pixels: the app shows pictures at their natural size, and these fit its columns at 1280 px wide
VIEW_PX = 320  # longer side of the large views
GRID_PX = 500  # about the width of the layers × heads grid
ATTENTION = "attention weight"
ROLLOUT = "rollout weight"
# what the colour of each class-maps method measures, for its colour bar
# each names its method: the caption beside a picture can arrive before the picture does
UNITS = {"relevance": "relevance (Chefer et al.)", "attnlrp": "AttnLRP relevance (in units of the target score)",
         "legrad": "LeGrad weight", "grad-rollout": "gradient-weighted rollout weight", "rollout": ROLLOUT, "cls": ATTENTION}


def patch_box(analysis: Analysis, token: int | None, picture_hw: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """Pixel box (x0, y0, x1, y1) of a patch token in a picture of ``picture_hw``, None for others."""
    patch = None if token is None else analysis.layout.token_patch(token)
    if patch is None:
        return None
    rows, cols = analysis.grid
    cell_h, cell_w = picture_hw[0] / rows, picture_hw[1] / cols
    return (int(patch[1] * cell_w), int(patch[0] * cell_h), int((patch[1] + 1) * cell_w) - 1, int((patch[0] + 1) * cell_h) - 1)


def view_hw(analysis: Analysis, side: int = VIEW_PX) -> tuple[int, int]:
    """Display size of a large view with the image's aspect ratio, longer side ``side``."""
    height, width = analysis.image.shape[:2]
    scale = side / max(height, width)
    return (round(height * scale), round(width * scale))


def token_at(analysis: Analysis, x: float, y: float, picture_hw: tuple[int, int]) -> int:
    """The patch token under pixel (x, y) of a picture of ``picture_hw`` showing the image."""
    rows, cols = analysis.grid
    row = min(rows - 1, max(0, int(y * rows / picture_hw[0])))
    col = min(cols - 1, max(0, int(x * cols / picture_hw[1])))
    return analysis.layout.patch_token(row, col)


def map_picture(analysis: Analysis, grid_map: torch.Tensor | np.ndarray, *, cmap: str, overlay: bool, query: int | None,
                unit: str, scale: str = "linear", bounds: tuple[float, float] | None = None, note: str = "",
                muted: bool = False) -> np.ndarray:
    """A large view of one ``[grid_h, grid_w]`` map on the colour ``scale`` (``render.COLOUR_SCALES``), or on
    ``bounds`` (low, high) shared with other views, query patch outlined, with a colour bar of what the colour
    measures (``unit``) that says when the map is flat (``render.flat_note``) or what ``note`` says. ``muted``: the image
    under the map in grey, so that its own colours cannot be read as the scale's (a diverging map's red and blue)."""
    size = view_hw(analysis)
    under = None if not overlay else (render.greyed(analysis.image) if muted else analysis.image)
    picture = render.heat(grid_map, size, cmap, image=under, scale=scale, bounds=bounds)
    box = patch_box(analysis, query, size)
    if box is not None:
        picture = render.outline(picture, box)
    low, high = (np.float32(value) for value in bounds) if bounds is not None else render.value_range(grid_map, scale=scale)
    return render.with_colorbar(picture, cmap, low.item(), high.item(), unit, clipped=scale != "linear",
                                note=note or render.flat_note(grid_map))


def shared_bounds(maps: torch.Tensor | np.ndarray, scale: str = "linear") -> tuple[float, float]:
    """The (low, high) of one colour scale shared by all of ``maps`` ``[..., h, w]``: the grid's "shared" normalisation,
    which a large view of one of them follows."""
    low, high = render.value_range(maps, shared=True, scale=scale)
    return float(low.item()), float(high.item())


def image_picture(analysis: Analysis, query: int | None) -> np.ndarray:
    """The image as the model saw it, at display size, with the query patch outlined."""
    size = view_hw(analysis)
    picture = render.resize_image(analysis.image, size)
    box = patch_box(analysis, query, size)
    return render.outline(picture, box) if box is not None else picture


def grid_picture(
    analysis: Analysis,
    view: HeadsView,
    *,
    cmap: str = "inferno",
    overlay: bool = True,
    shared: bool = False,
    selected: tuple[int, int | None] | None = None,
    tile_px: int | None = None,
    scale: str = "linear",
) -> tuple[np.ndarray, render.GridGeometry]:
    """The layers × heads grid of ``view`` (``maps.heads_view``): picture and geometry.

    ``selected`` is (layer, head); that head is outlined wherever the ordering put it, and (layer, None), the layer's
    mean of heads, outlines the whole row.
    """
    layers, heads = analysis.map_shape
    tile_px = tile_px or render.grid_tile_px(heads, GRID_PX)
    maps, order, order_by = view.maps, view.order, view.order_by
    tiles = render.heat(maps, (tile_px, tile_px), cmap, image=analysis.image if overlay else None, shared=shared, scale=scale)
    bounds = shared_bounds(maps, scale) if shared else None
    highlight = None
    if selected is not None:
        layer, head = selected
        highlight = (layer, None if head is None else order[layer].tolist().index(head))
    ordered = order_by != "none"
    picture, geometry = render.tile_grid(
        tiles,
        row_labels=[f"L{layer}" for layer in range(layers)],
        col_labels=[f"#{rank + 1}" if ordered else f"h{rank}" for rank in range(heads)],
        axis_names=("layer", f"head by {order_by}" if ordered else "head"),
        tile_notes=[[f"h{head}" for head in order[layer].tolist()] for layer in range(layers)] if ordered else None,
        highlight=highlight,
    )
    if bounds is not None:  # one scale for every tile: say what it is, as the large views do
        picture = render.with_colorbar(picture, cmap, *bounds, f"{ATTENTION}, one scale for all tiles", clipped=scale != "linear")
    return picture, geometry


def run_map_picture(run: Run, method: str, cmap: str = "inferno", scale: str = "linear") -> np.ndarray:
    """The large view of ``method``'s map as ``run`` computed it (``Request.maps``)."""
    if method not in run.maps:
        raise VitExplorerError(f"this run did not compute the {method} map: ask for it (Request(method={method!r}) or "
                               "every_map=True)")
    return class_map_picture(run.analysis, run.maps[method], cmap, scale)


def class_map_picture(analysis: Analysis, shown: ClassMap, cmap: str = "inferno", scale: str = "linear") -> np.ndarray:
    """``method_picture`` of a ``maps.ClassMap``, its colour bar saying what can be trusted of it: how much of the score it
    carries and, for AttnLRP, how its relevance adds up."""
    return method_picture(analysis, shown.map, shown.method, cmap, scale, strength=shown.strength, conserved=shown.conserved,
                          variant=shown.variant)


def trust_note(strength: float | None, conserved: float | None = None) -> str:
    """The colour bar's words on what a map can be trusted for: negligible against its score (``maps.map_strength``),
    and for AttnLRP how its relevance adds up to the score (``maps.conservation``); "" when there is nothing to say."""
    notes = []
    if strength is not None and strength < NEGLIGIBLE:
        notes.append(f"negligible: the map carries {strength:.1e} of the score, pattern is noise")
    if conserved is not None:
        far = abs(conserved - 1) > CONSERVATION_TOLERANCE
        notes.append(f"relevance sums to {conserved:.2f}× the score" + (" (not conserved: red and blue do not add up to it)"
                                                                        if far else ""))
    return " · ".join(notes)


def method_picture(analysis: Analysis, grid_map: torch.Tensor, method: str, cmap: str = "inferno", scale: str = "linear",
                   strength: float | None = None, conserved: float | None = None, variant: str | None = None) -> np.ndarray:
    """A class map's large view. A signed map (AttnLRP's relevance also speaks against the class) goes on a diverging
    scale symmetric about 0, red for the target and blue against it, over the image in grey (so that a blue object is
    not read as evidence against), since a sequential scale would paint the strongest evidence against as the least
    important; any other map on ``cmap``. ``strength`` (``maps.map_strength``) below ``maps.NEGLIGIBLE``, and AttnLRP's
    conservation (``maps.conservation``), are said on the colour bar, as is how the method was run for this target
    (``variant``: LeGrad's layers)."""
    note = trust_note(strength, conserved)
    unit = UNITS[method] if variant is None else f"{UNITS[method]} ({variant})"
    if float(grid_map.min()) < 0:
        bound = float(grid_map.abs().max())
        return map_picture(analysis, grid_map, cmap=DIFFERENCE_CMAP, overlay=True, query=None, bounds=(-bound, bound),
                           unit=f"{unit}: red for the target, blue against", note=note, muted=True)
    return map_picture(analysis, grid_map, cmap=cmap, overlay=True, query=None, unit=unit, scale=scale, note=note)


DIFFERENCE_CMAP = "RdBu_r"  # diverging: red where the first map is higher, blue where the second is, white where they agree


def centred_on_zero(values: np.ndarray) -> tuple[np.ndarray, float]:
    """Signed ``values`` → [0, 1] with 0 at 0.5 (a diverging colour map's middle), on a scale symmetric about 0,
    and that scale's bound max|values| (all 0.5 when every value is 0)."""
    bound = float(np.abs(values).max())
    return (0.5 + values / (2 * bound) if bound > 0 else np.full(values.shape, 0.5)), bound


def difference_picture(analysis: Analysis, difference: torch.Tensor | np.ndarray, unit: str) -> np.ndarray:
    """A large view of a signed ``[grid_h, grid_w]`` difference of two maps on a scale symmetric about 0 (white),
    at the size of ``analysis``'s views, with a colour bar from −max|difference| to +max|difference| of ``unit``."""
    centred, bound = centred_on_zero(render.to_numpy(difference, np.float32))
    picture = render.colorize(render.upsample(centred, view_hw(analysis)), DIFFERENCE_CMAP)
    return render.with_colorbar(picture, DIFFERENCE_CMAP, -bound, bound, unit)


def components_picture(analysis: Analysis, components: torch.Tensor | np.ndarray) -> np.ndarray:
    """The patch tokens' first three principal components ``[grid_h, grid_w, 3]`` (0…1, ``maps.token_components``) as
    red, green and blue at the size of the large views, smooth between patch centres."""
    channels = np.moveaxis(render.to_numpy(components, np.float32), -1, 0)  # [3, grid_h, grid_w]
    picture = np.moveaxis(render.upsample(channels, view_hw(analysis)), 0, -1)  # [H, W, 3]
    return (np.clip(picture, 0.0, 1.0) * 255).round().astype(np.uint8)


NORM_RATIO = "token norm ÷ its layer's median patch norm"


def norm_map_picture(result: TokenNorms, cmap: str = "inferno", width: int = GRID_PX) -> np.ndarray:
    """The layers × tokens map of token norms (``norms.TokenNorms``), each over its layer's median patch norm,
    prefix tokens then patches row by row; a triangle marks each patch flagged in some layer."""
    layout = result.layout
    relative = result.relative  # [layers, n]
    low, high = render.value_range(relative, shared=True)
    values = render.normalize(relative, shared=True)
    layers = result.num_layers
    names = layout.prefix_names
    prefix = ", ".join(names) if len(names) <= 3 else f"{names[0]}, {names[1]}…{names[-1]}"
    picture = render.row_map(
        values, width - render.GRID_LEFT - 10, int(np.clip(240 // layers, 6, 20)), cmap,
        title=f"{render.axis_title(('layer', 'token'))}   ▲ high-norm patch (k = {result.k:g})",
        row_labels=[f"L{layer}" for layer in range(layers)],
        column_labels=(prefix, f"{layout.grid_hw[0]}×{layout.grid_hw[1]} patches, row by row →"),
        lead=layout.num_prefix_tokens, marks=result.flagged.any(dim=0),
    )
    return render.with_colorbar(picture, cmap, low.item(), high.item(), NORM_RATIO)


def outlier_picture(analysis: Analysis, result: TokenNorms, layer: int | None = None, cmap: str = "inferno") -> np.ndarray:
    """The image under one layer's token norms (default: the last layer), each patch flagged by ``result``
    outlined, with a colour bar of the norm over the layer's median patch norm."""
    layer = result.num_layers - 1 if layer is None else layer
    if not 0 <= layer < result.num_layers:
        raise VitExplorerError(f"layer {layer} is outside 0…{result.num_layers - 1}")
    grid_map = analysis.layout.patch_map(result.relative[layer])  # [grid_h, grid_w]
    size = view_hw(analysis)
    picture = render.heat(grid_map, size, cmap, image=analysis.image)
    for token in result.flagged_tokens(layer).tolist():
        picture = render.outline(picture, patch_box(analysis, token, size))
    low, high = render.value_range(grid_map)
    count = len(result.flagged_tokens(layer))
    unit = f"L{layer} norm ÷ median patch norm · {count} outlier{'' if count == 1 else 's'} outlined"
    return render.with_colorbar(picture, cmap, low.item(), high.item(), unit)


ABLATION_UNIT = "Δ target probability, percentage points (head removed)"
ABLATION_CMAP = "RdBu"  # diverging: red where removing the head lowers the target, blue where it raises it, white for no change


def signed_grid_picture(values: torch.Tensor | np.ndarray, unit: str, decimals: int, cmap: str, *,
                        selected: tuple[int, int] | None = None,
                        tile_px: int | None = None) -> tuple[np.ndarray, render.GridGeometry]:
    """A layers × heads heat map of signed ``values`` ``[layers, heads]`` on the diverging ``cmap`` symmetric about 0
    (white at 0), each tile labelled with its value to ``decimals``, a colour bar of ``unit`` below; and its
    geometry, which maps a click to (layer, head). ``selected`` (layer, head) is outlined."""
    values = render.to_numpy(values, np.float32)
    layers, heads = values.shape
    tile_px = tile_px or render.grid_tile_px(heads, GRID_PX)
    centred, bound = centred_on_zero(values)
    colours = render.colorize(centred, cmap)  # [layers, heads, 3]
    picture, geometry = render.tile_grid(np.broadcast_to(colours[:, :, None, None, :], (layers, heads, tile_px, tile_px, 3)),
                                         row_labels=[f"L{layer}" for layer in range(layers)],
                                         col_labels=[f"h{head}" for head in range(heads)], highlight=selected)
    picture = render.label_tiles(picture, geometry, [[signed(value, decimals) for value in row] for row in values], colours)
    return render.with_colorbar(picture, cmap, -bound, bound, unit), geometry


def ablation_picture(ablation: HeadAblation, *, selected: tuple[int, int] | None = None, tile_px: int | None = None,
                     as_drop: bool = False) -> tuple[np.ndarray, render.GridGeometry]:
    """The layers × heads heat map of how the target probability changes when each head alone is removed, in
    percentage points (``signed_grid_picture``: red where removing the head lowers the target).

    ``as_drop``: the drop instead (``HeadAblation.drop``, positive where the head helps the target) on
    ``contribution_picture``'s colours, red positive, so that the two grids side by side read the same way."""
    # a probability in percentage points; a single score (a backbone's similarity) as it is
    values = ablation.drop if as_drop else ablation.delta
    points = render.to_numpy(values, np.float32) * (1.0 if ablation.single_score else 100.0)  # [layers, heads]
    bound = float(np.abs(points).max())
    decimals = (3 if bound < 1 else 1) if ablation.single_score else (1 if bound < 10 else 0)
    if as_drop:
        unit = ("drop of the target score, head removed" if ablation.single_score
                else "drop of the target probability, percentage points (head removed)")
        return signed_grid_picture(points, unit, decimals, DIFFERENCE_CMAP, selected=selected, tile_px=tile_px)
    unit = "Δ target score (head removed)" if ablation.single_score else ABLATION_UNIT
    return signed_grid_picture(points, unit, decimals, ABLATION_CMAP, selected=selected, tile_px=tile_px)


def contribution_picture(decomposition: Decomposition, *, selected: tuple[int, int] | None = None,
                         tile_px: int | None = None) -> tuple[np.ndarray, render.GridGeometry]:
    """The layers × heads heat map of each head's direct contribution to the target's score
    (``decomposition.Decomposition``: red adds to it, blue takes from it), clickable like the ablation's."""
    bound = float(decomposition.heads.abs().max())
    return signed_grid_picture(decomposition.heads, f"direct contribution to the score of {decomposition.label!r}",
                               3 if bound < 1 else (2 if bound < 10 else 1), DIFFERENCE_CMAP, selected=selected, tile_px=tile_px)


def atlas_picture(record: dict, selected: tuple[int, int] | None = None) -> tuple[np.ndarray, render.GridGeometry]:
    """A head atlas (``files.atlas_record``) as a layers × heads grid: each tile coloured by the head's mean |direct
    contribution| to the images' answers and named by its first description (a model that reads text) or the answer it
    pushes up most; and its geometry, which maps a click to (layer, head). ``selected`` is outlined."""
    layers, heads = record["layers"], record["heads_per_layer"]
    values = np.array([entry["mean_abs_contribution"] for entry in record["heads"]], np.float32).reshape(layers, heads)
    colours = render.colorize(values / max(float(values.max()), 1e-12), "Blues")  # [layers, heads, 3]
    tile_px = render.grid_tile_px(heads, GRID_PX, high=ATLAS_TILE_PX)
    picture, geometry = render.tile_grid(np.broadcast_to(colours[:, :, None, None, :], (layers, heads, tile_px, tile_px, 3)),
                                         row_labels=[f"L{layer}" for layer in range(layers)],
                                         col_labels=[f"h{head}" for head in range(heads)], highlight=selected)
    names = [[atlas_name(record["heads"][layer * heads + head]) for head in range(heads)] for layer in range(layers)]
    picture = render.label_tiles(picture, geometry, names, colours)
    return render.with_colorbar(picture, "Blues", 0.0, float(values.max()), "mean |direct contribution| to the answers"), \
        geometry


ATLAS_TILE_PX = 132  # wide enough for a short description on two lines


def atlas_name(entry: dict) -> str:
    """A head's name on its tile: its first description, or the answer it pushes up most, on at most two lines."""
    name = (entry["texts"] or [""])[0] if entry.get("texts") else (entry["pushes_up"][0]["answer"] if entry["pushes_up"] else "")
    words = name.split()
    half = (len(words) + 1) // 2
    return name if len(name) <= 14 or len(words) < 2 else " ".join(words[:half]) + "\n" + " ".join(words[half:])


PATCH_UNIT = "Δ A's score"


def patched_heads_picture(patching: Patching, tile_px: int | None = None) -> np.ndarray:
    """Each head's output at each layer taken from B: how A's target score moves (``methods.patching``), layers × heads,
    red where B's output raises A's score."""
    bound = float(patching.heads.abs().max())
    return signed_grid_picture(patching.heads, f"{PATCH_UNIT} with that head's output from B", 3 if bound < 1 else 2,
                               DIFFERENCE_CMAP,
                               tile_px=tile_px)[0]


def patched_tokens_picture(patching: Patching, tile_px: int | None = None) -> np.ndarray | None:
    """The residual stream after each layer at each patch taken from B: how A's target score moves, one small map per
    layer (in a near-square grid, each named by its layer in its corner), on one scale symmetric about 0; None where tokens
    were not patched."""
    patches = patching.token_patches  # [layers, grid_h, grid_w]
    if patches is None:
        return None
    layers = patches.shape[0]
    cols = math.ceil(math.sqrt(layers))  # near square: 6 layers in 3 × 2, 12 in 4 × 3
    rows = -(-layers // cols)
    tile_px = tile_px or render.grid_tile_px(cols, GRID_PX - 120)  # beside the heads grid in half a page
    centred, bound = centred_on_zero(render.to_numpy(patches, np.float32))
    tiles = np.full((rows, cols, tile_px, tile_px, 3), 255, dtype=np.uint8)
    notes = [["" for _ in range(cols)] for _ in range(rows)]
    for layer in range(layers):
        row, col = divmod(layer, cols)
        tiles[row, col] = render.colorize(render.upsample(centred[layer], (tile_px, tile_px)), DIFFERENCE_CMAP)
        notes[row][col] = f"L{layer}"
    picture, _ = render.tile_grid(tiles, [""] * rows, [""] * cols, axis_names=("", ""), tile_notes=notes)
    prefix = ", ".join(f"{name} {signed(float(value), 3)}" for name, value in
                       zip(patching.layout.prefix_names, patching.tokens[-1, : patching.layout.num_prefix_tokens], strict=True))
    unit = (f"{PATCH_UNIT} with the stream after each layer (L0…) at that patch from B"
            + (f" (after the last layer: {prefix})" if prefix else ""))
    return render.with_colorbar(picture, DIFFERENCE_CMAP, -bound, bound, unit)


def head_split_picture(analysis: Analysis, decomposition: Decomposition, layer: int, head: int) -> np.ndarray:
    """Where one head's direct contribution comes from: its share from each patch it attended to, over the image on a
    scale symmetric about 0 (red adds to the score), with what it takes from the prefix tokens in the colour bar's words."""
    split = decomposition.head_patches[layer, head]  # [grid_h, grid_w]
    bound = max(float(split.abs().max()), 1e-12)
    prefix = decomposition.head_sources[layer, head, : decomposition.layout.num_prefix_tokens]
    from_prefix = ", ".join(f"{name} {signed(float(value), 3)}" for name,
                            value in zip(decomposition.layout.prefix_names, prefix, strict=True))
    unit = f"L{layer} h{head}'s direct contribution from each patch" + (f" (from {from_prefix})" if from_prefix else "")
    return map_picture(analysis, split, cmap=DIFFERENCE_CMAP, overlay=True, query=None, bounds=(-bound, bound),
                       unit=f"{unit}: red adds to the score, blue takes from it", muted=True)


def head_split_thumbnail(analysis: Analysis, decomposition: Decomposition, layer: int, head: int, px: int) -> np.ndarray:
    """``head_split_picture`` small (``px`` on the longer side) and without its colour bar: the patches a head writes
    from on one of the images where it writes most (the head atlas), red adding to the answer, blue taking from it, on a
    scale symmetric about 0 of its own."""
    split = decomposition.head_patches[layer, head]  # [grid_h, grid_w]
    bound = max(float(split.abs().max()), 1e-12)
    height, width = view_hw(analysis)
    size = (round(height * px / max(height, width)), round(width * px / max(height, width)))
    return render.heat(split, size, DIFFERENCE_CMAP, image=render.greyed(analysis.image), bounds=(-bound, bound))


def signed(value: float, decimals: int) -> str:
    """``value`` with its sign (a true minus), none when it rounds to zero."""
    text = f"{value:+.{decimals}f}"
    return text[1:] if float(text) == 0 else text.replace("-", "−")
