"""How two analyses line up in the Compare view: layers by relative depth, queries, and the signed difference picture."""

import numpy as np
import pytest
import torch
from conftest import TINY, photo, write_checkpoint

from vit_explorer.core.analysis import analyze
from vit_explorer.core.comparison import aligned_layer, counterpart_query, difference, grid_mismatch, queries, relative_depth
from vit_explorer.draw import pictures, render
from vit_explorer.errors import VitExplorerError
from vit_explorer.models import load_model


@pytest.mark.parametrize(("layer", "layers_a", "layers_b", "expected"), [
    (0, 6, 3, 0), (2, 6, 3, 1), (5, 6, 3, 2),  # 2·l/5 = 0.8 → 1, 2 → 2
    (1, 3, 2, 1), (3, 7, 2, 1),  # exactly half way: rounded up
    (2, 5, 9, 4), (6, 12, 24, 13),  # 6·23/11 = 12.55
    (3, 4, 12, 11), (0, 1, 4, 0), (11, 12, 12, 11),
])
def test_aligned_layer_is_at_the_same_relative_depth(layer, layers_a, layers_b, expected):
    assert aligned_layer(layer, layers_a, layers_b) == expected


def test_aligned_layer_refuses_a_layer_outside_the_model():
    with pytest.raises(VitExplorerError, match="outside 0…5"):
        aligned_layer(6, 6, 3)


def test_relative_depth_runs_from_first_to_last_layer():
    np.testing.assert_allclose(relative_depth(5), [0, 0.25, 0.5, 0.75, 1])
    np.testing.assert_allclose(relative_depth(1), [0])


@pytest.fixture
def tiny_analysis(tiny_checkpoint):
    return analyze(load_model(str(tiny_checkpoint)), photo((64, 64), seed=2))


def test_queries_keep_a_patch_on_the_same_grid_and_fall_back_elsewhere(tiny_analysis, tmp_path):
    other = analyze(load_model(str(write_checkpoint(tmp_path / "other.safetensors", TINY, seed=3))), photo((64, 64), seed=4))
    layout = tiny_analysis.layout
    patch = layout.patch_token(1, 2)
    assert counterpart_query(tiny_analysis, other, patch) == other.layout.patch_token(1, 2)
    assert queries(tiny_analysis, other, 0) == (0, 0) and queries(tiny_analysis, other, None) == (None, None)
    assert grid_mismatch(tiny_analysis, other) is None
    coarse_model = load_model(str(write_checkpoint(tmp_path / "coarse.safetensors", {**TINY, "image_size": 48})))
    coarse = analyze(coarse_model, photo((64, 64)))
    assert counterpart_query(tiny_analysis, coarse, patch) == -1
    assert queries(tiny_analysis, coarse, patch) == (0, 0)  # no such patch in B: each side's class token
    assert "4×4" in grid_mismatch(tiny_analysis, coarse) and "3×3" in grid_mismatch(tiny_analysis, coarse)


def test_difference_is_a_minus_b_and_refuses_other_grids():
    a, b = torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.ones(2, 3)
    np.testing.assert_array_equal(difference(a, b), [[-1, 0, 1], [2, 3, 4]])
    with pytest.raises(VitExplorerError, match="cannot be subtracted"):
        difference(a, torch.ones(3, 2))


def test_difference_picture_is_white_at_zero_and_symmetric_about_it(tiny_analysis):
    rows, cols = tiny_analysis.grid
    signed = np.zeros((rows, cols), dtype=np.float32)
    signed[0, 0], signed[-1, -1] = 2.0, -1.0
    picture = pictures.difference_picture(tiny_analysis, signed, "A − B")
    height, width = pictures.view_hw(tiny_analysis)
    assert picture.shape[1] == width and picture.shape[0] > height  # the colour bar under the map
    lut = render.colormap_lut(pictures.DIFFERENCE_CMAP)
    # the scale runs from −2 to +2: +2 is the top colour, −1 a quarter of the way up, 0 the middle (white)
    assert (picture[0, 0] == lut[255]).all()
    assert (picture[height - 1, width - 1] == lut[round(0.25 * 255)]).all()
    middle = (height // 2, width // 2)
    assert (picture[middle] == lut[128]).all() and picture[middle].min() > 240
