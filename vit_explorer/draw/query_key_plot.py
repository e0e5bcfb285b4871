"""One head's joint query–key embedding (``core.query_key_embedding``) as a self-contained SVG: queries as filled
dots, keys as rings, coloured by what the user picks. Each point names its token on hover (an SVG ``<title>``: the
browser shows it, no server round trip), and each query point carries its token index (``data-token``), which the app's
click handler makes the query."""

from __future__ import annotations

from html import escape

import matplotlib
import numpy as np
import torch

from vit_explorer.core.query_key_embedding import JointEmbedding
from vit_explorer.models.layout import TokenLayout

COLOURINGS = {"kind": "query or key", "row": "patch row", "column": "patch column", "colour": "the patch's colour"}
QUERY_COLOUR, KEY_COLOUR, PREFIX_COLOUR = "#d9480f", "#1864ab", "#868e96"
SIZE, MARGIN = 520, 28


def hex_colour(rgb: np.ndarray) -> str:
    return "#" + "".join(f"{int(round(channel)):02x}" for channel in np.clip(rgb, 0, 255))


def token_colours(layout: TokenLayout, image: np.ndarray, colouring: str) -> list[str] | None:
    """Each token's colour for ``colouring`` (a key of ``COLOURINGS``), prefix tokens grey; None for "kind" (queries and
    keys each in their own colour). ``image`` is the picture the model saw ``[H, W, 3]`` uint8."""
    if colouring == "kind":
        return None
    rows, cols = layout.grid_hw
    if colouring == "colour":
        patch_h, patch_w = layout.patch_hw
        means = image[: rows * patch_h, : cols * patch_w].reshape(rows, patch_h, cols, patch_w, 3).mean(axis=(1, 3))
        patches = [hex_colour(means[row, col]) for row in range(rows) for col in range(cols)]
    else:
        positions = np.array([divmod(index, cols)[0 if colouring == "row" else 1] for index in range(rows * cols)])
        span = max((rows if colouring == "row" else cols) - 1, 1)
        patches = [hex_colour(np.array(matplotlib.colormaps["viridis"](value / span)[:3]) * 255) for value in positions]
    return [PREFIX_COLOUR] * layout.num_prefix_tokens + patches


def query_key_svg(embedding: JointEmbedding, layout: TokenLayout, image: np.ndarray, colouring: str = "kind",
                  query: int | None = None, title: str = "") -> str:
    """The embedding as an SVG of ``SIZE`` pixels square: ``2n`` points, the ``query`` token's own query ringed."""
    points = torch.cat([embedding.queries, embedding.keys]).double().numpy()  # [2n, 2]
    low, high = points.min(axis=0), points.max(axis=0)
    span = np.maximum(high - low, 1e-12).max()  # one scale on both axes: a projection's distances are its only content
    centre = (low + high) / 2
    pixels = (points - centre) / span * (SIZE - 2 * MARGIN) + SIZE / 2
    pixels[:, 1] = SIZE - pixels[:, 1]  # up is up
    colours = token_colours(layout, image, colouring)
    count = layout.num_tokens
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="qk-plot" viewBox="0 0 {SIZE} {SIZE}" width="100%" '
             f'style="max-width:{SIZE}px;background:#fff" role="img" aria-label="{escape(title)}">',
             '<style>.qk-plot .q{cursor:pointer}.qk-plot circle:hover{stroke:#000;stroke-width:2}</style>']
    # keys first, so that the queries (the clickable points) lie on top
    for index in range(count):
        x, y = pixels[count + index]
        colour = KEY_COLOUR if colours is None else colours[index]
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#fff" fill-opacity="0.6" stroke="{colour}" '
                     f'stroke-width="1.6"><title>key · {escape(layout.token_name(index))}</title></circle>')
    for index in range(count):
        x, y = pixels[index]
        colour = QUERY_COLOUR if colours is None else colours[index]
        ring = ' stroke="#000" stroke-width="2.5"' if index == query else ""
        parts.append(f'<circle class="q" data-token="{index}" cx="{x:.1f}" cy="{y:.1f}" r="{6 if index == query else 4}" '
                     f'fill="{colour}"{ring}><title>query · {escape(layout.token_name(index))} (click: make it the query)'
                     '</title></circle>')
    parts.append(f'<text x="{MARGIN}" y="16" font-size="12" font-family="sans-serif" fill="#333">● query   ○ key'
                 f'{"   colour: " + COLOURINGS[colouring] if colouring != "kind" else ""}</text></svg>')
    return "".join(parts)
