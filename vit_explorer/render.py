"""Maps → pictures with numpy: colour lookup tables, bilinear upsampling, overlays, labelled grids.

No matplotlib figure is made here (matplotlib only provides the colormap tables); a whole
layers × heads grid is filled into one preallocated array.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .errors import VitExplorerError

COLORMAPS = ("inferno", "viridis", "magma", "jet", "turbo", "gray")
BACKGROUND = (255, 255, 255)
TEXT = (40, 40, 40)
HIGHLIGHT = (0, 200, 255)


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
def font(size: int) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def normalize(maps: np.ndarray, shared: bool = False) -> np.ndarray:
    """Scale ``[..., h, w]`` maps to [0, 1]: each map on its own, or all on one shared scale."""
    maps = np.asarray(maps, dtype=np.float32)
    axes = tuple(range(maps.ndim)) if shared else (-2, -1)
    low = maps.min(axis=axes, keepdims=True)
    span = maps.max(axis=axes, keepdims=True) - low
    return (maps - low) / np.where(span > 0, span, 1.0)


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


def upsample(maps: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """Bilinear upsampling of ``[..., h, w]`` maps to ``[..., H, W]``, as two small matrix products."""
    maps = np.asarray(maps, dtype=np.float32)
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


def heat(maps: np.ndarray, out_hw: tuple[int, int], cmap: str = "inferno", image: np.ndarray | None = None, alpha: float = 0.6, shared: bool = False) -> np.ndarray:
    """Maps ``[..., h, w]`` → coloured pictures ``[..., H, W, 3]``, blended over ``image`` when given."""
    coloured = colorize(upsample(normalize(maps, shared), out_hw), cmap).astype(np.float32)
    if image is None:
        return coloured.astype(np.uint8)
    base = resize_image(image, out_hw).astype(np.float32)
    return (alpha * coloured + (1.0 - alpha) * base).astype(np.uint8)


def outline(picture: np.ndarray, box: tuple[int, int, int, int], colour: tuple[int, int, int] = HIGHLIGHT, width: int = 2) -> np.ndarray:
    """A copy of ``picture`` with the rectangle (x0, y0, x1, y1) outlined."""
    drawn = Image.fromarray(picture)
    ImageDraw.Draw(drawn).rectangle(box, outline=colour, width=width)
    return np.asarray(drawn)


def with_colorbar(picture: np.ndarray, cmap: str, low: float, high: float, label: str = "") -> np.ndarray:
    """``picture`` with a vertical colour bar and its value range to the right."""
    height = picture.shape[0]
    bar_width, margin, text_width = 14, 8, 84
    canvas = np.full((height, picture.shape[1] + margin + bar_width + text_width, 3), BACKGROUND, dtype=np.uint8)
    canvas[:, : picture.shape[1]] = picture
    ramp = np.linspace(1.0, 0.0, height - 20)[:, None].repeat(bar_width, axis=1)
    left = picture.shape[1] + margin
    canvas[10 : height - 10, left : left + bar_width] = colorize(ramp, cmap)
    image = Image.fromarray(canvas)
    draw = ImageDraw.Draw(image)
    for value, y in ((high, 4), ((low + high) / 2, height // 2 - 6), (low, height - 18)):
        draw.text((left + bar_width + 4, y), f"{value:.3g}", fill=TEXT, font=font(11))
    if label:
        draw.text((left + bar_width + 4, height // 2 + 10), label, fill=TEXT, font=font(10))
    return np.asarray(image)


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


@lru_cache(maxsize=8)
def _grid_frame(geometry: GridGeometry, row_labels: tuple[str, ...], col_labels: tuple[str, ...], axis_names: tuple[str, str]) -> np.ndarray:
    """The empty labelled canvas of a grid; cached because only the tiles change between renders."""
    height, width = geometry.size_hw
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for row, label in enumerate(row_labels):
        y, _ = geometry.tile_origin(row, 0)
        draw.text((4, y + geometry.tile // 2 - 7), label, fill=TEXT, font=font(12))
    for col, label in enumerate(col_labels):
        _, x = geometry.tile_origin(0, col)
        draw.text((x + geometry.tile // 2 - 4 * len(label), geometry.top - 18), label, fill=TEXT, font=font(12))
    draw.text((4, 4), f"{axis_names[0]} ↓  {axis_names[1]} →", fill=TEXT, font=font(11))
    return np.asarray(image)


def tile_grid(
    tiles: np.ndarray,
    row_labels: list[str],
    col_labels: list[str],
    axis_names: tuple[str, str] = ("layer", "head"),
    tile_notes: list[list[str]] | None = None,
    highlight: tuple[int, int] | None = None,
) -> tuple[np.ndarray, GridGeometry]:
    """Pictures ``[rows, cols, t, t, 3]`` → one labelled grid picture and its geometry."""
    rows, cols, tile = tiles.shape[0], tiles.shape[1], tiles.shape[2]
    geometry = GridGeometry(rows=rows, cols=cols, tile=tile, gap=3, left=62, top=40)
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
                draw.text((x + 3, y + 2), note, fill=(255, 255, 255), font=font(10), stroke_width=1, stroke_fill=(0, 0, 0))
    if highlight is not None:
        y, x = geometry.tile_origin(*highlight)
        draw.rectangle((x - 2, y - 2, x + tile + 1, y + tile + 1), outline=HIGHLIGHT, width=2)
    return np.asarray(image), geometry


def save_png(picture: np.ndarray, path: str) -> None:
    Image.fromarray(picture).save(path)
