"""Parts of the real photos that ship with scikit-image, boxed by hand on the 16×16 grid of 14-px patches a 224-px model
sees (each photo stretched to 224×224, the tool's default fit), for checking where a clicked patch's maps point.

How they were drawn: each photo was resized to 224×224 (bicubic), enlarged 2× and shown with the patch grid and its
row and column numbers over it; the boxes and clicks were read off by eye from that picture, never from any map.
``astronaut`` and ``chelsea`` are the photos the first patch-target tests were written against; the other four were
boxed after LeGrad's and the patch target's design were settled, and no code was tuned on them.

Each part: (photo, part name, rows, cols, clicks), rows and cols inclusive ranges, clicks (row, col) inside the box.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image
from skimage import data as skimage_data

from vit_explorer.core import maps
from vit_explorer.core.request import Request
from vit_explorer.core.targets import Target
from vit_explorer.run import run


@dataclass(frozen=True)
class Part:
    photo: str
    name: str
    rows: range
    cols: range
    clicks: tuple[tuple[int, int], ...]

    def holds(self, row: int, col: int, margin: int = 1) -> bool:
        """Whether (row, col) lies in the box or within ``margin`` patches of it (a hand-drawn box's edge is ±1 patch)."""
        rows, cols = self.rows, self.cols
        return rows.start - margin <= row < rows.stop + margin and cols.start - margin <= col < cols.stop + margin

    def mask(self, grid: int = 16) -> np.ndarray:
        """``[grid, grid]`` bool: the box itself."""
        inside = np.zeros((grid, grid), dtype=bool)
        inside[self.rows.start:self.rows.stop, self.cols.start:self.cols.stop] = True
        return inside


WRITTEN_AGAINST = ("astronaut", "chelsea")  # the photos the patch target and LeGrad's layers were chosen on
METHODS = ("attnlrp", "legrad", "relevance", "grad-rollout")  # the methods that take the patch target
# the plain cosine similarity of the output tokens to the clicked one (its own rank is 1 by construction), and the
# target-free rollout
BASELINES = ("cosine", "rollout")

PARTS = (
    # her face from the hairline to the chin; her eyes lie in row 3, cols 6–7
    Part("astronaut", "face", range(2, 6), range(5, 9), ((3, 6), (3, 7))),
    Part("chelsea", "left eye", range(4, 8), range(4, 8), ((6, 6),)),
    Part("chelsea", "right eye", range(5, 9), range(10, 13), ((7, 11),)),
    # the white cup seen from above, rim included (the saucer and spoon outside)
    Part("coffee", "cup", range(0, 8), range(5, 12), ((3, 5), (4, 8))),
    # the black silhouette on white: its head (ears to muzzle) and its barrel (back to belly, tail and legs outside)
    Part("horse", "head", range(0, 5), range(12, 16), ((2, 13),)),
    Part("horse", "body", range(4, 10), range(2, 12), ((6, 6),)),
    # the thin rocket on its pad, nose to the base of the tower's lights
    Part("rocket", "rocket", range(4, 16), range(7, 9), ((6, 7), (11, 8))),
    # stereo_motorcycle's left view: the front wheel (left) and the rear wheel (right), tyres included
    Part("motorcycle", "front wheel", range(7, 13), range(2, 6), ((10, 4),)),
    Part("motorcycle", "rear wheel", range(8, 15), range(11, 15), ((11, 12),)),
)


def photo(name: str) -> Image.Image:
    """The scikit-image photo ``name`` as an RGB image (``motorcycle``: the left view of ``stereo_motorcycle``)."""
    array = skimage_data.stereo_motorcycle()[0] if name == "motorcycle" else getattr(skimage_data, name)()
    if array.dtype == bool:
        array = array.astype(np.uint8) * 255
    return Image.fromarray(array).convert("RGB")


def measure(grid_map: np.ndarray, part: Part, click: tuple[int, int]) -> dict:
    """rank, pointing and mass of one ``[16, 16]`` map for ``click`` in ``part``."""
    flat = grid_map.reshape(-1)
    row, col = click
    rank = int((flat > flat[row * grid_map.shape[1] + col]).sum()) + 1
    peak = divmod(int(flat.argmax()), grid_map.shape[1])
    positive = np.clip(grid_map, 0, None)
    mass = float(positive[part.mask(grid_map.shape[0])].sum() / positive.sum()) if positive.sum() > 0 else 0.0
    return {"rank": rank, "pointing": bool(part.holds(*peak)), "mass": mass, "peak": list(peak)}


def part_maps(model, part: Part, click: tuple[int, int]) -> dict[str, np.ndarray]:
    """Every class-specific method's map (``METHODS``) and the baselines (``BASELINES``) ``[16, 16]`` for the target
    *this patch* at ``click`` of ``part``'s photo, from one run of ``model``."""
    result = run(model, photo(part.photo), Request(method="attnlrp", target=Target(click), every_map=True))
    found = {method: result.maps[method].map.numpy() for method in (*METHODS, "rollout")}
    query = result.analysis.layout.patch_token(*click)
    found["cosine"] = maps.token_similarity(result.analysis, query).numpy()
    return found
