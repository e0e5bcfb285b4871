import numpy as np

from vit_explorer.shapes import CLASSES, IMAGE_SIZE, MAX_SIZE, MIN_SIZE, generate_set


def test_generator_is_deterministic_from_its_seed():
    first, again, other = generate_set(3, 4), generate_set(3, 4), generate_set(4, 4)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a.image, b.image)
        np.testing.assert_array_equal(a.mask, b.mask)
        assert a.label == b.label and a.bbox == b.bbox
    assert any(not np.array_equal(a.image, c.image) for a, c in zip(first, other))


def test_samples_have_one_object_whose_mask_and_box_agree():
    samples = generate_set(11, 60)
    assert {sample.label for sample in samples} == set(range(len(CLASSES)))
    for sample in samples:
        assert sample.image.shape == (IMAGE_SIZE, IMAGE_SIZE, 3) and sample.image.dtype == np.uint8
        ys, xs = np.nonzero(sample.mask)
        assert sample.bbox == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
        width = sample.bbox[2] - sample.bbox[0]
        assert 0.4 * MIN_SIZE <= width <= 1.1 * MAX_SIZE  # a rotated square reaches past its circle
        inside = sample.image[sample.mask].astype(float).mean(axis=0)
        outside = sample.image[~sample.mask].astype(float).mean(axis=0)
        assert np.linalg.norm(inside - outside) > 40  # the object stands out from its background


def test_rings_have_a_hole_and_circles_do_not():
    samples = generate_set(5, 120)
    for sample in samples:
        cy, cx = [(lo + hi) // 2 for lo, hi in ((sample.bbox[1], sample.bbox[3]), (sample.bbox[0], sample.bbox[2]))]
        if sample.class_name == "ring":
            assert not sample.mask[cy, cx]
        if sample.class_name in ("circle", "square"):
            assert sample.mask[cy, cx]
