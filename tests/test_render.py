import numpy as np
import pytest

from vit_explorer import VitExplorerError
from vit_explorer.render import GridGeometry, colorize, colormap_lut, heat, normalize, tile_grid, upsample, with_colorbar


def test_colormap_lut_is_256_rgb_entries_from_dark_to_bright():
    lut = colormap_lut("inferno")
    assert lut.shape == (256, 3) and lut.dtype == np.uint8
    assert lut[0].sum() < lut[-1].sum()
    with pytest.raises(VitExplorerError, match="unknown colormap"):
        colormap_lut("no-such-map")


def test_normalize_per_map_and_shared():
    maps = np.stack([np.array([[0.0, 1.0]]), np.array([[0.0, 0.5]])])
    np.testing.assert_allclose(normalize(maps)[1], [[0.0, 1.0]])
    np.testing.assert_allclose(normalize(maps, shared=True)[1], [[0.0, 0.5]])
    np.testing.assert_allclose(normalize(np.ones((2, 2))), np.zeros((2, 2)))  # flat map: no division by zero


def test_upsample_equals_torch_bilinear_interpolation():
    import torch

    maps = np.random.default_rng(0).random((2, 3, 5, 7)).astype(np.float32)
    expected = torch.nn.functional.interpolate(torch.from_numpy(maps.reshape(6, 1, 5, 7)), size=(40, 33), mode="bilinear", align_corners=False)
    np.testing.assert_allclose(upsample(maps, (40, 33)), expected.reshape(2, 3, 40, 33).numpy(), atol=1e-5)


def test_upsample_is_bilinear_and_keeps_constant_maps():
    np.testing.assert_allclose(upsample(np.full((3, 4), 0.25), (30, 40)), np.full((30, 40), 0.25), rtol=1e-6)
    ramp = upsample(np.array([[0.0, 1.0]]), (1, 8))[0]
    assert np.all(np.diff(ramp) >= 0) and 0 < ramp[3] < 1  # interpolated, not nearest


def test_heat_overlay_blends_with_the_image():
    image = np.zeros((8, 8, 3), dtype=np.uint8)
    grid_map = np.array([[0.0, 1.0], [0.0, 1.0]])
    raw = heat(grid_map, (8, 8), "gray")
    blended = heat(grid_map, (8, 8), "gray", image=image, alpha=0.5)
    assert raw[0, -1].tolist() == [255, 255, 255] and raw[0, 0].tolist() == [0, 0, 0]
    assert blended[0, -1].tolist() == [127, 127, 127]
    np.testing.assert_array_equal(colorize(np.array([[0.0, 1.0]]), "gray")[0, 1], [255, 255, 255])


def test_grid_places_tiles_and_maps_clicks_back():
    tiles = np.zeros((3, 4, 10, 10, 3), dtype=np.uint8)
    tiles[2, 1] = 200
    picture, geometry = tile_grid(tiles, ["L0", "L1", "L2"], ["h0", "h1", "h2", "h3"])
    assert picture.shape[:2] == geometry.size_hw
    y, x = geometry.tile_origin(2, 1)
    assert (picture[y : y + 10, x : x + 10] == 200).all()
    assert geometry.hit(x + 5, y + 5) == (2, 1)
    assert geometry.hit(2, 2) is None  # the label margin
    assert geometry.hit(x + 11, y + 5) is None  # the gap between tiles
    highlighted, _ = tile_grid(tiles, ["L0", "L1", "L2"], ["h0", "h1", "h2", "h3"], highlight=(0, 0))
    assert (highlighted != picture).any()


def test_colorbar_adds_a_strip_to_the_right():
    picture = np.zeros((100, 50, 3), dtype=np.uint8)
    barred = with_colorbar(picture, "viridis", 0.0, 0.5)
    assert barred.shape[0] == 100 and barred.shape[1] > 50
    np.testing.assert_array_equal(barred[:, :50], picture)
    assert isinstance(GridGeometry(1, 1, 4, 1, 0, 0).size_hw, tuple)
