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
from vit_explorer.draw.render import HIGHLIGHT
from vit_explorer.models.layout import TokenLayout

COLOURINGS = {"kind": "query or key", "row": "patch row", "column": "patch column",
              "colour": "the patch's colour (contrast stretched)"}
QUERY_COLOUR, KEY_COLOUR, PREFIX_COLOUR = "#d9480f", "#1864ab", "#868e96"
SIZE, MARGIN = 520, 28
TOP = 60  # room for the legend above the points


def hex_colour(rgb: np.ndarray) -> str:
    return "#" + "".join(f"{int(round(channel)):02x}" for channel in np.clip(rgb, 0, 255))


def viridis(value: float) -> str:
    """The colour of ``value`` in [0, 1] on viridis, as the row and column colourings use it."""
    return hex_colour(np.array(matplotlib.colormaps["viridis"](value)[:3]) * 255)


def token_colours(layout: TokenLayout, image: np.ndarray, colouring: str) -> list[str] | None:
    """Each token's colour for ``colouring`` (a key of ``COLOURINGS``), prefix tokens grey; None for "kind" (queries and
    keys each in their own colour). ``image`` is the picture the model saw ``[H, W, 3]`` uint8."""
    if colouring == "kind":
        return None
    rows, cols = layout.grid_hw
    if colouring == "colour":
        patch_h, patch_w = layout.patch_hw
        means = image[: rows * patch_h, : cols * patch_w].reshape(rows, patch_h, cols, patch_w, 3).mean(axis=(1, 3))
        # each channel stretched over the patches' range: an image of close colours (most photos' backgrounds) would
        # otherwise colour every point alike
        low, high = means.min(axis=(0, 1)), means.max(axis=(0, 1))
        means = (means - low) / np.maximum(high - low, 1e-6) * 255
        patches = [hex_colour(means[row, col]) for row in range(rows) for col in range(cols)]
    else:
        positions = np.array([divmod(index, cols)[0 if colouring == "row" else 1] for index in range(rows * cols)])
        span = max((rows if colouring == "row" else cols) - 1, 1)
        patches = [viridis(value / span) for value in positions]
    return [PREFIX_COLOUR] * layout.num_prefix_tokens + patches


def legend(colouring: str) -> str:
    """The line above the points: which mark is which, and what the colour says (a row or column's colour ramp)."""
    query, key = (QUERY_COLOUR, KEY_COLOUR) if colouring == "kind" else ("#495057", "#495057")
    text = (f'<text x="{MARGIN}" y="20" font-size="16" font-family="sans-serif" fill="#212529">'
            f'<tspan fill="{query}">● query</tspan>  <tspan fill="{key}">○ key</tspan>'
            f'{"  · colour: " + escape(COLOURINGS[colouring]) if colouring != "kind" else ""}</text>')
    if colouring not in ("row", "column"):
        return text
    ramp = "".join(f'<stop offset="{stop / 4:.2f}" stop-color="{viridis(stop / 4)}"/>' for stop in range(5))
    first, last = ("top", "bottom") if colouring == "row" else ("left", "right")
    return (text + f'<defs><linearGradient id="qk-ramp">{ramp}</linearGradient></defs>'
            f'<rect x="{SIZE - MARGIN - 150}" y="30" width="150" height="8" fill="url(#qk-ramp)"/>'
            f'<text x="{SIZE - MARGIN - 150}" y="52" font-size="13" font-family="sans-serif" fill="#495057">{first}</text>'
            f'<text x="{SIZE - MARGIN}" y="52" font-size="13" font-family="sans-serif" fill="#495057" '
            f'text-anchor="end">{last}</text>')


def query_key_svg(embedding: JointEmbedding, layout: TokenLayout, images: list[np.ndarray], colouring: str = "kind",
                  query: int | None = None, title: str = "", names: list[str] | None = None) -> str:
    """The embedding as an SVG of ``SIZE`` pixels square: for each of ``images`` (as the model saw them; one, or a sample
    named by ``names``) its ``n`` queries and ``n`` keys, the ``query`` token's own query ringed. The query points of a
    single image carry their token, for a click."""
    points = torch.cat([embedding.queries, embedding.keys]).double().numpy()  # [2 · images · n, 2]
    low, high = points.min(axis=0), points.max(axis=0)
    span = np.maximum(high - low, 1e-12).max()  # one scale on both axes: a projection's distances are its only content
    centre = (low + high) / 2
    factor = min(SIZE - 2 * MARGIN, SIZE - TOP - MARGIN) / span
    pixels = np.stack([SIZE / 2 + (points[:, 0] - centre[0]) * factor,
                       (TOP + SIZE - MARGIN) / 2 - (points[:, 1] - centre[1]) * factor], axis=1)  # up is up
    count, total = layout.num_tokens, len(embedding.queries)
    single = len(images) == 1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="qk-plot" viewBox="0 0 {SIZE} {SIZE}" width="{SIZE}" '
             f'height="{SIZE}" style="max-width:100%;height:auto;background:#fff" role="img" aria-label="{escape(title)}">',
             '<style>.qk-plot .q{cursor:pointer}.qk-plot circle:hover{stroke:#000;stroke-width:2}</style>']
    keys, queries, the_query = [], [], []
    for image_index, image in enumerate(images):
        colours = token_colours(layout, image, colouring)
        source = "" if names is None else f"{escape(names[image_index])} · "
        for index in range(count):
            point = image_index * count + index
            name = escape(layout.token_name(index))
            x, y = pixels[total + point]
            colour = KEY_COLOUR if colours is None else colours[index]
            keys.append(f'<circle class="k" cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#fff" fill-opacity="0.6" '
                        f'stroke="{colour}" stroke-width="1.6"><title>{source}key · {name}</title></circle>')
            x, y = pixels[point]
            colour = QUERY_COLOUR if colours is None else colours[index]
            ringed = single and index == query
            clickable = f' class="q" data-token="{index}"' if single else ""
            ring = ' stroke="#000" stroke-width="2.5"' if ringed else ""
            point_svg = (f'<circle{clickable} cx="{x:.1f}" cy="{y:.1f}" r="{6 if ringed else 4}" fill="{colour}"{ring}>'
                         f'<title>{source}query · {name}{" (click: make it the query)" if single else ""}</title></circle>')
            if ringed:  # drawn last, above every point, in the colour that outlines the query patch on the image
                the_query = [point_svg, f'<circle class="mark" cx="{x:.1f}" cy="{y:.1f}" r="12" fill="none" '
                                        f'stroke="{hex_colour(np.array(HIGHLIGHT))}" stroke-width="3" pointer-events="none"/>']
            else:
                queries.append(point_svg)
    # keys first, so that the queries (the clickable points) lie on top, and the query's own point above all
    parts += keys + queries + the_query
    parts.append(legend(colouring))
    parts.append("</svg>")
    return "".join(parts)
