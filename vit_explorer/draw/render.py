"""Maps → pictures with numpy: colour lookup tables, colour scales, bilinear upsampling, overlays, colour
bars, labelled grids.

This is the render boundary: the analysis layer hands over CPU torch tensors, and ``to_numpy`` turns them
into numpy arrays once, where a picture, a chart or a file takes them.

No matplotlib figure is made here (matplotlib only provides the colormap tables, the font and the tick
positions); a whole layers × heads grid is filled into one preallocated array. Text is drawn at
``LABEL_PX`` pixels: the app shows pictures at their natural size (it never scales them up, and lays
them out to fit at 1280 px), so that is also the size on screen.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from vit_explorer.errors import VitExplorerError

COLORMAPS = ("inferno", "viridis", "magma", "jet", "turbo", "gray")
BACKGROUND = (255, 255, 255)
TEXT = (40, 40, 40)
HIGHLIGHT = (0, 200, 255)
LABEL_PX = 13  # text height in the pictures, in pixels
NOTE_PX = 11  # the head names written on tiles of an ordered grid
# how values map to colours: the map's full range, or its 1st–99th percentile range (clipped beyond), which
# keeps a few extreme patches of a heavy-tailed map (relevance) from washing out the rest
COLOUR_SCALES = {"linear": "0 to max", "percentile": "1st to 99th percentile"}  # a signed map's runs from its min
PERCENTILES = (1.0, 99.0)
# The colour range of a non-negative map (attention, rollout, relevance) starts at 0, not at its minimum:
# stretching min to max would paint a near-uniform map (a random model's attention, 1/n ± a few per cent)
# with the whole colour map, as if it had structure; from 0 it shows as nearly one colour. A trained
# model's maps have minima near 0 (measured on the shipped model: 0.3–10% of the maximum), so they barely change.
FLAT = 0.25  # a map whose maximum is within this share of its minimum is called flat on its colour bar


def to_numpy(values: torch.Tensor | np.ndarray, dtype: np.dtype | type | None = None) -> np.ndarray:
    """Values from the analysis layer (a CPU tensor) or already numpy, as a numpy array (of ``dtype`` where given):
    the one conversion from torch, where pictures, charts and files take a map."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=dtype)


@lru_cache(maxsize=16)
def colormap_lut(name: str) -> np.ndarray:
    """The colormap ``name`` as a ``[256, 3]`` uint8 table."""
    import matplotlib

    try:
        cmap = matplotlib.colormaps[name]
    except KeyError:
        raise VitExplorerError(f"unknown colormap {name!r}; try one of {', '.join(COLORMAPS)}") from None
    return (cmap(np.linspace(0.0, 1.0, 256))[:, :3] * 255).round().astype(np.uint8)


@lru_cache(maxsize=8)
def font(size: int = LABEL_PX) -> ImageFont.FreeTypeFont:
    """DejaVu Sans at ``size`` pixels. Matplotlib ships it, and unlike PIL's default font it has the arrows,
    × and ≥ the labels use (PIL's draws them as empty boxes)."""
    from matplotlib import font_manager

    path = font_manager.findfont(font_manager.FontProperties(family="DejaVu Sans"), fallback_to_default=True)
    return ImageFont.truetype(path, size)


def check_scale(scale: str) -> str:
    if scale not in COLOUR_SCALES:
        raise VitExplorerError(f"unknown colour scale {scale!r}; use one of {', '.join(COLOUR_SCALES)}")
    return scale


def value_range(maps: torch.Tensor | np.ndarray, shared: bool = False, scale: str = "linear") -> tuple[np.ndarray, np.ndarray]:
    """The values of ``[..., h, w]`` maps that the colormap's ends stand for, per map or shared (keepdims):
    min and max for ``"linear"``, the ``PERCENTILES`` for ``"percentile"``."""
    maps = to_numpy(maps, np.float32)
    axes = tuple(range(maps.ndim)) if shared else (-2, -1)
    if check_scale(scale) == "percentile":  # chosen to stretch a heavy-tailed map; its colour bar still says "flat"
        low, high = np.percentile(maps, PERCENTILES, axis=axes, keepdims=True)
        return low.astype(np.float32), high.astype(np.float32)
    low, high = maps.min(axis=axes, keepdims=True), maps.max(axis=axes, keepdims=True)
    low = np.minimum(low, 0)  # non-negative maps from 0 (see ``FLAT``); a signed map keeps its minimum
    return low.astype(np.float32), high.astype(np.float32)


def flat_note(values: torch.Tensor | np.ndarray) -> str:
    """"flat: max only x% above min" for a positive map whose maximum is within ``FLAT`` of its minimum, else ""."""
    values = to_numpy(values, np.float64)
    low, high = float(values.min()), float(values.max())
    if low <= 0 or high > (1 + FLAT) * low:
        return ""
    return f"flat: max only {100 * (high / low - 1):.1f}% above min"


def normalize(maps: torch.Tensor | np.ndarray, shared: bool = False, scale: str = "linear",
              bounds: tuple[float, float] | None = None) -> np.ndarray:
    """Scale ``[..., h, w]`` maps to [0, 1]: each map on its own, all on one shared scale, or on given
    ``bounds`` (low, high); values outside the range (``value_range``) are clipped to its ends."""
    maps = to_numpy(maps, np.float32)
    low, high = value_range(maps, shared, scale) if bounds is None else (np.float32(bounds[0]), np.float32(bounds[1]))
    span = high - low
    return np.clip((maps - low) / np.where(span > 0, span, 1.0), 0.0, 1.0)


@lru_cache(maxsize=64)
def interpolation_matrix(size_in: int, size_out: int) -> np.ndarray:
    """``[size_out, size_in]`` weights of 1-D linear interpolation with half-pixel centres
    (torch's ``align_corners=False``), so that ``matrix @ values`` resamples ``values``."""
    centres = (np.arange(size_out, dtype=np.float64) + 0.5) * size_in / size_out - 0.5
    centres = np.clip(centres, 0, size_in - 1)
    low = np.floor(centres).astype(int)
    high = np.minimum(low + 1, size_in - 1)
    weight_high = centres - low
    matrix = np.zeros((size_out, size_in), dtype=np.float32)
    matrix[np.arange(size_out), low] += 1.0 - weight_high
    matrix[np.arange(size_out), high] += weight_high
    return matrix


def upsample(maps: torch.Tensor | np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """Bilinear upsampling of ``[..., h, w]`` maps to ``[..., H, W]``, as two small matrix products."""
    maps = to_numpy(maps, np.float32)
    rows = interpolation_matrix(maps.shape[-2], out_hw[0])
    cols = interpolation_matrix(maps.shape[-1], out_hw[1])
    return rows @ maps @ cols.T


def colorize(values: np.ndarray, cmap: str = "inferno") -> np.ndarray:
    """``[..., H, W]`` values in [0, 1] → ``[..., H, W, 3]`` uint8 through the colormap's table."""
    indices = np.clip(values * 255.0 + 0.5, 0, 255).astype(np.uint8)
    return colormap_lut(cmap)[indices]


def resize_image(image: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    if image.shape[:2] == out_hw:
        return image
    return np.asarray(Image.fromarray(image).resize((out_hw[1], out_hw[0]), Image.Resampling.BILINEAR))


def heat(maps: torch.Tensor | np.ndarray, out_hw: tuple[int, int], cmap: str = "inferno", image: np.ndarray | None = None,
         alpha: float = 0.6, shared: bool = False, scale: str = "linear",
         bounds: tuple[float, float] | None = None) -> np.ndarray:
    """Maps ``[..., h, w]`` → coloured pictures ``[..., H, W, 3]`` on the colour ``scale`` (or on ``bounds``), blended
    over ``image`` when given."""
    coloured = colorize(upsample(normalize(maps, shared, scale, bounds), out_hw), cmap).astype(np.float32)
    if image is None:
        return coloured.astype(np.uint8)
    base = resize_image(image, out_hw).astype(np.float32)
    return (alpha * coloured + (1.0 - alpha) * base).astype(np.uint8)


def greyed(image: np.ndarray) -> np.ndarray:
    """An RGB picture ``[H, W, 3]`` uint8 in grey (luma, ITU-R 601), still RGB: the image under a diverging map, whose
    red and blue must be the scale's alone."""
    luma = image.astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    return np.repeat(luma.round().astype(np.uint8)[..., None], 3, axis=-1)


def outline(picture: np.ndarray, box: tuple[int, int, int, int], colour: tuple[int, int, int] = HIGHLIGHT,
            width: int = 2) -> np.ndarray:
    """A copy of ``picture`` with the rectangle (x0, y0, x1, y1) outlined."""
    drawn = Image.fromarray(picture)
    ImageDraw.Draw(drawn).rectangle(box, outline=colour, width=width)
    return np.asarray(drawn)


def colour_bar(width: int, cmap: str, low: float, high: float, unit: str, clipped: bool = False, note: str = "") -> np.ndarray:
    """A horizontal colour bar ``[height, width, 3]`` from ``low`` to ``high``: both ends and round values between
    them labelled below it, each with the digits that tell it from its neighbours, then ``unit`` (and, when
    ``clipped``, that values beyond the ends take the end colours; then ``note``)."""
    from matplotlib.ticker import MaxNLocator

    label_font = font(LABEL_PX)
    pad, bar_h, tick_h, line_h = 10, 12, 4, LABEL_PX + 5
    caption = f"{unit}, {COLOUR_SCALES['percentile'].replace(' to ', '–')}" if clipped else unit
    caption_lines = wrapped(f"{caption} · {note}" if note else caption, label_font, width - 4)
    height = 6 + bar_h + tick_h + (1 + len(caption_lines)) * line_h + 4
    image = Image.new("RGB", (width, height), BACKGROUND)
    left, right = pad, width - pad
    ramp = np.linspace(0.0, 1.0, right - left)[None].repeat(bar_h, axis=0)
    image.paste(Image.fromarray(colorize(ramp, cmap)), (left, 6))
    draw = ImageDraw.Draw(image)
    draw.rectangle((left - 1, 5, right, 6 + bar_h), outline=TEXT, width=1)
    span = high - low
    # the ends, and round values at least a quarter of the bar away from them (so that no two labels collide)
    inner = [value for value in MaxNLocator(nbins=4).tick_values(low, high)
             if span > 0 and low + span / 4 <= value <= high - span / 4]
    ticks = [low, *inner, high] if span > 0 else []
    labels = tick_labels(ticks)
    for value, text in zip(ticks if span > 0 else [low], labels if span > 0 else [f"{low:.3g}"], strict=True):
        x = left + (0.5 if span <= 0 else (value - low) / span) * (right - left - 1)
        draw.line((x, 6 + bar_h, x, 6 + bar_h + tick_h), fill=TEXT, width=1)
        # a label keeps inside the picture: anchored at its middle, unless that would cut it off at an edge
        text_w = draw.textlength(text, font=label_font)
        x_text = min(max(x, text_w / 2 + 1), width - text_w / 2 - 1)
        draw.text((x_text, 6 + bar_h + tick_h + 1), text, fill=TEXT, font=label_font, anchor="mt")
    for index, line in enumerate(caption_lines):  # a long unit in a narrow view wraps rather than shrinks
        draw.text((width / 2, 6 + bar_h + tick_h + (1 + index) * line_h + 2), line, fill=TEXT, font=label_font, anchor="mt")
    return np.asarray(image)


def wrapped(text: str, text_font: ImageFont.FreeTypeFont, width: int) -> list[str]:
    """``text`` in lines no wider than ``width`` pixels, broken between words."""
    lines: list[str] = []
    for word in text.split(" "):
        joined = f"{lines[-1]} {word}" if lines else word
        if lines and text_font.getlength(joined) <= width:
            lines[-1] = joined
        else:
            lines.append(word)
    return lines or [""]


def tick_labels(ticks: list[float]) -> list[str]:
    """Short labels for tick values: the fewest decimals (at least the significant digits that tell each label
    from its neighbours) that write round values exactly (0.025, 0.05, 0.075 → "0.025", "0.050", "0.075"),
    at most one decimal beyond those; very large or small values in exponent notation."""
    if not ticks:
        return []
    magnitude = max(abs(value) for value in ticks)
    if magnitude >= 1e4 or 0 < magnitude < 1e-3:
        digits = next((d for d in range(2, 9) if distinct([f"{value:.{d}g}" for value in ticks])), 8)
        return [f"{value:.{digits}g}" for value in ticks]
    gaps = [abs(b - a) for a, b in zip(ticks, ticks[1:], strict=False) if b != a]
    # the decimals that make neighbouring labels differ (a step of 0.0004 needs 4), then those that write them exactly
    needed = max(0, -int(np.floor(np.log10(min(gaps))))) if gaps else 0
    tolerance = 1e-6 * (magnitude or 1.0)
    exact = next((d for d in range(needed, needed + 2) if all(abs(round(value, d) - value) < tolerance for value in ticks)),
                 needed + 1)
    return ["0" if value == 0 else f"{value:.{exact}f}" for value in ticks]  # "0", not "0.00000"


def distinct(labels: list[str]) -> bool:
    return all(a != b for a, b in zip(labels, labels[1:], strict=False))


def with_colorbar(picture: np.ndarray, cmap: str, low: float, high: float, unit: str = "", clipped: bool = False,
                  note: str = "") -> np.ndarray:
    """``picture`` with a horizontal colour bar under it (``colour_bar``): below rather than beside, so the
    view stays as narrow as the map and the bar's labels lie on neither the map nor the view's toolbar."""
    return np.concatenate([picture, colour_bar(picture.shape[1], cmap, low, high, unit, clipped, note)], axis=0)


@dataclass(frozen=True)
class GridGeometry:
    """Where the tiles of a grid picture are, so a click can be mapped back to (row, column)."""

    rows: int
    cols: int
    tile: int
    gap: int
    left: int
    top: int

    @property
    def size_hw(self) -> tuple[int, int]:
        return (self.top + self.rows * (self.tile + self.gap), self.left + self.cols * (self.tile + self.gap))

    def tile_origin(self, row: int, col: int) -> tuple[int, int]:
        return (self.top + row * (self.tile + self.gap), self.left + col * (self.tile + self.gap))

    def hit(self, x: int, y: int) -> tuple[int, int] | None:
        """The (row, column) of the tile under pixel (x, y), or None for labels and gaps."""
        row, dy = divmod(y - self.top, self.tile + self.gap)
        col, dx = divmod(x - self.left, self.tile + self.gap)
        if 0 <= row < self.rows and 0 <= col < self.cols and dy < self.tile and dx < self.tile:
            return int(row), int(col)
        return None


AXIS_ARROWS = ("↓", "→")  # rows go down, columns go right


def axis_title(axis_names: tuple[str, str]) -> str:
    """The corner label of a grid: what its rows and its columns are (none for a grid whose tiles name themselves)."""
    if not any(axis_names):
        return ""
    return f"{axis_names[0]} {AXIS_ARROWS[0]}   {axis_names[1]} {AXIS_ARROWS[1]}"


@lru_cache(maxsize=8)
def _grid_frame(geometry: GridGeometry, row_labels: tuple[str, ...], col_labels: tuple[str, ...],
                axis_names: tuple[str, str]) -> np.ndarray:
    """The empty labelled canvas of a grid; cached because only the tiles change between renders."""
    height, width = geometry.size_hw
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    label_font = font(LABEL_PX)
    for row, label in enumerate(row_labels):
        y, _ = geometry.tile_origin(row, 0)
        draw.text((geometry.left - 8, y + geometry.tile / 2), label, fill=TEXT, font=label_font, anchor="rm")
    for col, label in enumerate(col_labels):
        _, x = geometry.tile_origin(0, col)
        draw.text((x + geometry.tile / 2, geometry.top - 5), label, fill=TEXT, font=label_font, anchor="md")
    draw.text((4, 3), axis_title(axis_names), fill=TEXT, font=label_font, anchor="lt")
    return np.asarray(image)


def tile_grid(
    tiles: np.ndarray,
    row_labels: list[str],
    col_labels: list[str],
    axis_names: tuple[str, str] = ("layer", "head"),
    tile_notes: list[list[str]] | None = None,
    highlight: tuple[int, int | None] | None = None,
) -> tuple[np.ndarray, GridGeometry]:
    """Pictures ``[rows, cols, t, t, 3]`` → one labelled grid picture and its geometry.

    ``highlight`` (row, column) outlines one tile; (row, None) outlines the whole row (a layer's mean of heads).
    """
    rows, cols, tile = tiles.shape[0], tiles.shape[1], tiles.shape[2]
    # the outline is drawn in the gaps, so the selected tile's own pixels stay visible
    geometry = GridGeometry(rows=rows, cols=cols, tile=tile, gap=GRID_GAP, left=GRID_LEFT, top=GRID_TOP)
    canvas = _grid_frame(geometry, tuple(row_labels), tuple(col_labels), axis_names).copy()
    for row in range(rows):
        for col in range(cols):
            y, x = geometry.tile_origin(row, col)
            canvas[y : y + tile, x : x + tile] = tiles[row, col]
    if tile_notes is None and highlight is None:
        return canvas, geometry
    image = Image.fromarray(canvas)
    draw = ImageDraw.Draw(image)
    if tile_notes is not None:
        for row, notes in enumerate(tile_notes):
            for col, note in enumerate(notes):
                y, x = geometry.tile_origin(row, col)
                draw.text((x + 3, y + 2), note, fill=(255, 255, 255), font=font(NOTE_PX), stroke_width=1, stroke_fill=(0, 0, 0))
    if highlight is not None:
        row, col = highlight
        y, x = geometry.tile_origin(row, 0 if col is None else col)
        right = x + tile if col is not None else geometry.tile_origin(row, cols - 1)[1] + tile
        draw.rectangle((x - GRID_GAP, y - GRID_GAP, right + GRID_GAP - 1, y + tile + GRID_GAP - 1), outline=HIGHLIGHT,
                       width=GRID_GAP)
    return np.asarray(image), geometry


GRID_GAP, GRID_LEFT, GRID_TOP = 4, 44, 40  # pixels between tiles, of row labels, of column labels and the axis title


def grid_tile_px(cols: int, width: int, low: int = 24, high: int = 96) -> int:
    """The tile side that makes a grid of ``cols`` columns about ``width`` pixels wide, within [low, high]."""
    return int(np.clip((width - GRID_LEFT) // max(cols, 1) - GRID_GAP, low, high))


def row_map(values: torch.Tensor | np.ndarray, width: int, row_px: int, cmap: str, *, title: str, row_labels: list[str],
            column_labels: tuple[str, str] = ("", ""), lead: int = 0,
            marks: torch.Tensor | np.ndarray | None = None) -> np.ndarray:
    """Values ``[rows, cols]`` in [0, 1] → a labelled picture with one band of ``row_px`` pixels per row.

    The first ``lead`` columns (prefix tokens) get ``LEAD_PX`` pixels each and a white gap after them, so a single
    token stays visible beside hundreds; the other columns fill the rest of ``width``, and where there are more of
    them than pixels, a pixel shows the largest value of the columns it covers, so that a single bright column
    never disappears. ``title`` goes above, ``row_labels`` to the left, ``column_labels`` (under the lead
    columns, right-aligned under the rest) below, and a triangle under every column where ``marks`` ``[cols]`` is True.
    """
    rows, cols = values.shape
    lead_px = lead * min(LEAD_PX, width // (4 * max(lead, 1)))
    gap_x = LEAD_GAP if lead else 0
    rest = width - lead_px - gap_x
    # the first column under each pixel; the gap repeats the last lead column and is painted over below
    starts = np.concatenate([np.arange(lead_px) * lead // max(lead_px, 1), np.full(gap_x, max(lead - 1, 0)),
                             lead + (np.arange(rest) * (cols - lead)) // rest])
    # reduceat gives the max of each run of columns, or the single column where runs repeat (fewer columns than pixels)
    pixels = np.maximum.reduceat(to_numpy(values, np.float32), starts, axis=1)  # [rows, width]
    gap = 1 if row_px >= 6 else 0  # a white line between rows keeps neighbouring layers apart
    band = np.repeat(colorize(pixels, cmap), row_px, axis=0).reshape(rows, row_px, width, 3)
    band[:, row_px - gap:] = BACKGROUND
    band[:, :, lead_px:lead_px + gap_x] = BACKGROUND

    def centre(col: int) -> float:
        if col < lead:
            return (col + 0.5) * lead_px / lead
        return lead_px + gap_x + (col - lead + 0.5) * rest / (cols - lead)

    left, top, mark_h = GRID_LEFT, LABEL_PX + 12, 9
    height = top + rows * row_px + mark_h + LABEL_PX + 10
    canvas = Image.new("RGB", (left + width + 10, height), BACKGROUND)
    canvas.paste(Image.fromarray(band.reshape(rows * row_px, width, 3)), (left, top))
    draw = ImageDraw.Draw(canvas)
    label_font = font(LABEL_PX)
    draw.text((4, 3), title, fill=TEXT, font=label_font, anchor="lt")
    every = int(np.ceil((LABEL_PX + 1) / row_px))  # label as many rows as fit without overlapping
    for row in range(0, rows, every):
        draw.text((left - 6, top + row * row_px + (row_px - gap) / 2), row_labels[row], fill=TEXT, font=label_font, anchor="rm")
    bottom = top + rows * row_px
    for col in np.flatnonzero(to_numpy(marks)) if marks is not None else ():
        x = left + centre(int(col))
        draw.polygon([(x, bottom + 1), (x - 4, bottom + mark_h), (x + 4, bottom + mark_h)], fill=HIGHLIGHT, outline=TEXT)
    draw.text((left, bottom + mark_h + 3), column_labels[0], fill=TEXT, font=label_font, anchor="lt")
    draw.text((left + width, bottom + mark_h + 3), column_labels[1], fill=TEXT, font=label_font, anchor="rt")
    return np.asarray(canvas)


LEAD_PX, LEAD_GAP = 8, 3  # pixels of each lead column of a row map, and of the gap after them


def label_tiles(picture: np.ndarray, geometry: GridGeometry, texts: list[list[str]], colours: np.ndarray) -> np.ndarray:
    """A copy of a grid ``picture`` with ``texts[row][col]`` centred on each tile, black on light tile
    ``colours`` ``[rows, cols, 3]`` and white on dark ones, at the largest of ``LABEL_PX`` and ``NOTE_PX`` at
    which the widest text fits its tile (no text on tiles too small for it)."""
    image = Image.fromarray(picture)
    draw = ImageDraw.Draw(image)
    lines = [line for row in texts for text in row for line in text.split("\n")]  # a text may take two lines
    widest = max(lines, key=len, default="")
    label_font = next((font(size) for size in (LABEL_PX, NOTE_PX)
                       if draw.textlength(widest, font=font(size)) <= geometry.tile - 4), None)
    if label_font is None:
        return picture
    luminance = np.asarray(colours, dtype=np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)  # [rows, cols]
    for row, row_texts in enumerate(texts):
        for col, text in enumerate(row_texts):
            y, x = geometry.tile_origin(row, col)
            colour = TEXT if luminance[row, col] > 140 else BACKGROUND
            draw.multiline_text((x + geometry.tile / 2, y + geometry.tile / 2), text, fill=colour, font=label_font, anchor="mm",
                                align="center")
    return np.asarray(image)
