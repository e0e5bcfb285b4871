import itertools

import numpy as np
import pytest

from vit_explorer import VitExplorerError
from vit_explorer.draw import render
from vit_explorer.draw.render import (
    GridGeometry,
    colorize,
    colormap_lut,
    heat,
    normalize,
    tile_grid,
    upsample,
    value_range,
    with_colorbar,
)


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
    np.testing.assert_allclose(normalize(np.ones((2, 2))), np.ones((2, 2)))  # constant: one colour, no division by zero


def test_a_near_uniform_map_is_drawn_near_uniform_and_called_flat():
    n = 1374  # a random-weights DINOv2's attention: 1/n everywhere, ±1%
    flat = np.full((37, 37), 1 / n) * (1 + 0.01 * np.random.default_rng(0).uniform(-1, 1, (37, 37)))
    scaled = normalize(flat)
    assert scaled.min() > 0.97  # coloured from 0: min–max would stretch it over the whole colour map
    low, high = value_range(flat)
    assert low.item() == 0 and high.item() == flat.max().astype(np.float32)
    assert render.flat_note(flat) == f"flat: max only {100 * (flat.max() / flat.min() - 1):.1f}% above min"  # about 2%
    assert render.flat_note(np.array([[0.0, 1.0]])) == ""
    assert render.flat_note(np.array([[1.0, 1.2]])).startswith("flat") and render.flat_note(np.array([[1.0, 1.3]])) == ""
    signed = np.array([[-1.0, 0.5], [1.0, 0.0]])  # a signed map keeps its own minimum
    np.testing.assert_allclose(normalize(signed), (signed + 1) / 2)
    # a colour bar for it labels both ends with digits that tell them apart
    labels = render.tick_labels([flat.min() / 2, flat.max()])
    assert len(set(labels)) == 2 and render.tick_labels([0.000728, 0.0007285, 0.000729]) == ["0.000728", "0.0007285", "0.000729"]


def test_percentile_scale_clips_the_tails_to_the_colormap_ends():
    values = np.arange(1000, dtype=np.float32).reshape(1, 10, 100)
    values[0, 0, 0], values[0, -1, -1] = -1e6, 1e6  # one extreme value at each end
    low, high = value_range(values, scale="percentile")
    np.testing.assert_allclose([low.item(), high.item()], np.percentile(values, render.PERCENTILES), rtol=1e-6)
    scaled = normalize(values, scale="percentile")
    assert scaled.min() == 0.0 and scaled.max() == 1.0 and 0.45 < scaled[0, 5, 0] < 0.55  # the bulk spans the colormap
    assert (scaled[0, 0, :5] == 0).all()  # below the 1st percentile: clipped to the low end
    assert 0.0 < normalize(values)[0, 5, 0] - 0.5 < 1e-3  # min–max: the two extremes squeeze the bulk into mid-grey
    with pytest.raises(VitExplorerError, match="unknown colour scale"):
        normalize(values, scale="log2")


def test_upsample_equals_torch_bilinear_interpolation():
    import torch

    maps = np.random.default_rng(0).random((2, 3, 5, 7)).astype(np.float32)
    expected = torch.nn.functional.interpolate(torch.from_numpy(maps.reshape(6, 1, 5, 7)), size=(40, 33), mode="bilinear",
                                               align_corners=False)
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


def test_colorbar_adds_a_strip_below_with_ticks_and_unit():
    picture = np.zeros((100, 320, 3), dtype=np.uint8)
    barred = with_colorbar(picture, "viridis", 0.0, 0.5, "attention weight")
    assert barred.shape[1] == 320 and barred.shape[0] > 100 + 2 * render.LABEL_PX  # room for tick labels and the unit
    np.testing.assert_array_equal(barred[:100], picture)
    strip = barred[100:]
    bar_row = strip[10, 20:300]
    assert bar_row[0].tolist() != bar_row[-1].tolist()  # the colour ramp runs left to right
    text_rows = np.nonzero((strip < 128).all(axis=2).any(axis=1))[0]  # rows with dark (text) pixels
    assert text_rows.max() - text_rows.min() >= 2 * render.LABEL_PX  # two lines of text: ticks, then the unit
    narrow = with_colorbar(picture[:, :160], "viridis", 0.0, 0.5, "Δ target probability, percentage points (head removed)")
    assert narrow.shape[0] - 100 > barred.shape[0] - 100 + render.LABEL_PX  # a long unit wraps onto more lines, at full size
    unitless = with_colorbar(picture, "viridis", 0.0, 0.5, "")
    assert not np.array_equal(unitless, barred)
    assert render.tick_labels([0.0, 0.1, 0.2]) == ["0", "0.1", "0.2"]
    assert render.tick_labels([0.0, 0.0006, 0.0012, 0.00215]) == ["0", "0.00060", "0.00120", "0.00215"]
    assert render.tick_labels([0.002, 0.004]) == ["0.002", "0.004"]
    assert render.tick_labels([0.025, 0.05, 0.075]) == ["0.025", "0.050", "0.075"]  # not "0.03", "0.05", "0.08"
    assert render.tick_labels([0.0123, 0.05, 0.1, 0.1377]) == ["0.012", "0.050", "0.100", "0.138"]  # ends need not be round
    assert render.tick_labels([0.30, 0.3004]) == ["0.3000", "0.3004"]  # enough decimals to tell neighbours apart
    # 2 × 3 tiles of 4 px with 1 px gaps after each, below 7 px of labels and right of 5: counted by hand
    geometry = GridGeometry(rows=2, cols=3, tile=4, gap=1, left=5, top=7)
    assert geometry.size_hw == (7 + 2 * 5, 5 + 3 * 5) == (17, 20)
    assert geometry.hit(5, 7) == (0, 0) and geometry.hit(5 + 5 + 3, 7 + 5 + 3) == (1, 1) and geometry.hit(5 + 4, 7) is None


def glyph(font, character: str) -> np.ndarray:
    """The binary bitmap ``font`` draws for ``character``."""
    mask = font.getmask(character)
    return np.asarray(mask, dtype=np.uint8).reshape(mask.size[1], mask.size[0]) > 127


def test_grid_header_draws_arrows_not_missing_glyph_boxes():
    font = render.font(render.LABEL_PX)
    missing = glyph(font, "\U0010fffd")  # a private-use code point no font maps: the missing-glyph box
    for arrow in render.AXIS_ARROWS:
        drawn = glyph(font, arrow)
        assert drawn.any() and (drawn.shape != missing.shape or not np.array_equal(drawn, missing)), arrow
    # the grid's header is drawn in that font: each arrow's bitmap is found in it, and the missing box is not
    tiles = np.zeros((2, 3, 30, 30, 3), dtype=np.uint8)
    picture, geometry = tile_grid(tiles, ["L0", "L1"], ["h0", "h1", "h2"])
    header = (picture[: geometry.top] < 128).all(axis=2)

    def best_match(template: np.ndarray) -> float:
        windows = np.lib.stride_tricks.sliding_window_view(header, template.shape)
        return float((windows == template).mean(axis=(-2, -1)).max())

    for arrow in render.AXIS_ARROWS:
        assert best_match(glyph(font, arrow)) > 0.95, arrow
    assert best_match(missing) < 0.9
    assert render.AXIS_ARROWS[0] in render.axis_title(("layer", "head"))


def test_a_screen_png_is_read_back_exactly_by_an_independent_decoder(tmp_path):
    """The app's own PNG writer (unfiltered rows, stored as the screen's are, or deflated) against Pillow's decoder, on odd
    sizes and every byte value; a picture of another shape or type is refused."""
    import io

    from PIL import Image

    from vit_explorer.draw.files import png_bytes, screen_png

    rng = np.random.default_rng(3)
    for (height, width), level in itertools.product(((1, 1), (17, 23), (64, 5)), (0, 1)):
        picture = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        decoded = Image.open(io.BytesIO(png_bytes(picture, level)))
        assert decoded.mode == "RGB" and decoded.size == (width, height)
        np.testing.assert_array_equal(np.asarray(decoded), picture)
    path = screen_png(picture, str(tmp_path))
    assert screen_png(picture.copy(), str(tmp_path)) == path and np.array_equal(np.asarray(Image.open(path)), picture)
    with pytest.raises(ValueError, match="uint8"):
        png_bytes(picture.astype(np.float32))
