import numpy as np
from scipy import ndimage

from vit_explorer.shapes.generator import CLASSES, IMAGE_SIZE, MAX_SIZE, MIN_SIZE, generate_set, visible_contrast


def test_generator_is_deterministic_from_its_seed():
    first, again, other = generate_set(3, 4), generate_set(3, 4), generate_set(4, 4)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a.image, b.image)
        np.testing.assert_array_equal(a.mask, b.mask)
        assert a.label == b.label and a.bbox == b.bbox
    assert any(not np.array_equal(a.image, c.image) for a, c in zip(first, other, strict=True))


def test_samples_have_one_object_whose_mask_and_box_agree():
    samples = generate_set(11, 60)
    assert {sample.label for sample in samples} == set(range(len(CLASSES)))
    for sample in samples:
        assert sample.image.shape == (IMAGE_SIZE, IMAGE_SIZE, 3) and sample.image.dtype == np.uint8
        ys, xs = np.nonzero(sample.mask)
        assert sample.bbox == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
        parts, count = ndimage.label(sample.mask)
        sizes = np.bincount(parts.ravel())[1:]
        assert sizes.max() >= 0.99 * sizes.sum()  # one object (a sharp tip may rasterise as a stray pixel)
        width = max(sample.bbox[2] - sample.bbox[0], sample.bbox[3] - sample.bbox[1])
        assert 0.6 * MIN_SIZE <= width <= 1.1 * MAX_SIZE  # a rotated square reaches past its circle


def test_sizes_span_one_and_a_half_to_eight_patches():
    widths = [max(s.bbox[2] - s.bbox[0], s.bbox[3] - s.bbox[1]) for s in generate_set(12, 150)]
    assert min(widths) < 2.5 * 16 and max(widths) > 6.5 * 16


def band_and_edge(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    band = ndimage.binary_dilation(mask, iterations=6) & ~ndimage.binary_dilation(mask, iterations=2)
    return band, mask & ~ndimage.binary_erosion(mask, iterations=2)  # the edge is painted in every style


def test_visible_contrast_is_the_distance_of_edge_and_surround():
    mask = np.zeros((64, 64), dtype=bool)
    mask[20:44, 20:44] = True
    image = np.full((64, 64, 3), 100, dtype=np.uint8)
    assert visible_contrast(image, mask) == 0.0
    image[mask] = (130, 100, 60)
    assert abs(visible_contrast(image, mask) - 50.0) < 1e-4


def test_every_object_stays_visible_after_jitter_and_compression():
    """A grey-scale jitter can erase a difference in hue: such draws are redrawn, not kept with a label
    nobody could read off the picture. Measured here with other morphology than the generator's check."""
    for sample in generate_set(15, 200):
        band, edge = band_and_edge(sample.mask)
        distance = np.linalg.norm(sample.image[edge].mean(0).astype(float) - sample.image[band].mean(0))
        assert distance >= 18  # 20 by the generator's own check


def luminance(pixels: np.ndarray) -> np.ndarray:
    return pixels.astype(float) @ np.array([0.299, 0.587, 0.114])


def test_objects_are_darker_or_brighter_than_their_surround_and_stand_out():
    """No contrast polarity to learn instead of the shape: both occur often, and each object differs
    from a band of background around it."""
    differences, distances = [], []
    for sample in generate_set(13, 150):
        band, edge = band_and_edge(sample.mask)
        differences.append(luminance(sample.image[edge]).mean() - luminance(sample.image[band]).mean())
        distances.append(np.linalg.norm(sample.image[edge].mean(0) - sample.image[band].mean(0)))
    differences = np.array(differences)
    assert (differences > 10).mean() > 0.25 and (differences < -10).mean() > 0.25
    assert np.median(distances) > 40


def test_rings_have_a_hole_and_circles_do_not():
    for sample in generate_set(5, 120):
        cy, cx = [(lo + hi) // 2 for lo, hi in ((sample.bbox[1], sample.bbox[3]), (sample.bbox[0], sample.bbox[2]))]
        if sample.class_name == "ring":
            assert not sample.mask[cy, cx]
        if sample.class_name in ("circle", "square"):
            assert sample.mask[cy, cx]


def test_circles_are_one_colour_to_their_edge():
    """A circle with a border of another colour is a ring round a disc, so circles are only filled: the
    middle of each circle is the colour of its edge, not of its surround."""
    circles = [s for s in generate_set(17, 200) if s.class_name == "circle"
               and ndimage.binary_erosion(s.mask, iterations=4).sum() > 20]
    assert len(circles) > 15
    for sample in circles:
        band, edge = band_and_edge(sample.mask)
        core = sample.image[ndimage.binary_erosion(sample.mask, iterations=4)].mean(0).astype(float)
        assert np.linalg.norm(core - sample.image[edge].mean(0)) < np.linalg.norm(core - sample.image[band].mean(0))


def test_some_objects_are_hollow_or_outlined():
    """Outlined or hollow objects show the background through their silhouette: the middle of the mask
    looks like the band around it, not like the edge."""
    hollow = 0
    samples = [s for s in generate_set(14, 200) if s.class_name in ("square", "triangle", "star", "cross")]
    for sample in samples:
        core = ndimage.binary_erosion(sample.mask, iterations=5)
        if core.sum() < 20:
            continue
        band, edge = band_and_edge(sample.mask)
        to_band = np.linalg.norm(sample.image[core].mean(0) - sample.image[band].mean(0))
        to_edge = np.linalg.norm(sample.image[core].mean(0) - sample.image[edge].mean(0))
        hollow += to_band < to_edge
    assert 0.15 < hollow / len(samples) < 0.8


def test_pairs_are_two_different_shapes_apart_each_with_its_own_visible_mask():
    from vit_explorer.shapes.generator import PAIR_GAP, generate_pair

    rng = np.random.default_rng(11)
    for _ in range(12):
        pair = generate_pair(rng)
        assert pair.labels[0] != pair.labels[1] and pair.masks.shape == (2, IMAGE_SIZE, IMAGE_SIZE)
        boxes = []
        for mask in pair.masks:
            assert mask.any() and visible_contrast(pair.image, mask) >= 20
            ys, xs = np.nonzero(mask)
            boxes.append((xs.min(), ys.min(), xs.max(), ys.max()))
        (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) = boxes
        # the silhouettes' boxes are apart by the gap along at least one axis
        assert max(bx0 - ax1, ax0 - bx1, by0 - ay1, ay0 - by1) >= PAIR_GAP


def test_a_two_object_set_is_written_with_one_mask_per_shape(tmp_path):
    from PIL import Image

    from vit_explorer.shapes.generator import write_set

    write_set(tmp_path, 3, seed=5, objects=2)
    images = sorted((tmp_path / "images").rglob("*.png"))
    assert len(images) == 3
    for path in images:
        first, second = path.parent.name.split("+")
        assert first != second and {first, second} <= set(CLASSES)
        masks = [np.asarray(Image.open(tmp_path / "masks" / path.parent.name / path.stem / f"{name}.png")) > 127
                 for name in (first, second)]
        assert masks[0].any() and masks[1].any() and not (masks[0] & masks[1]).any()
