"""Deletion / insertion curves: the masks follow the map's order, the curves' ends are the image and the baseline."""

import numpy as np
import pytest
import torch
from conftest import TINY, write_checkpoint

from vit_explorer import VitExplorerError, load_model
from vit_explorer.core.curves import MEAN, Protocol, area_under
from vit_explorer.core.images import to_pixels
from vit_explorer.methods.faithfulness import (
    baseline_view,
    deletion_insertion,
    forward_passes,
    importance_order,
    pixel_masks,
    step_masks,
)
from vit_explorer.models.layout import TokenLayout

LAYOUT = TokenLayout(prefix_names=("cls",), grid_hw=(2, 3), patch_hw=(4, 4))


def test_patches_go_most_important_first_in_even_steps():
    grid_map = torch.tensor([[0.1, 0.9, 0.3], [0.0, 0.5, 0.5]])
    order = importance_order(grid_map)
    assert order.tolist() == [1, 4, 5, 2, 0, 3]  # ties keep grid order
    masks = step_masks(order, steps=3)
    assert masks.sum(axis=1).tolist() == [0, 2, 4, 6]
    assert masks[1].nonzero(as_tuple=True)[0].tolist() == [1, 4]
    assert masks[2].nonzero(as_tuple=True)[0].tolist() == [1, 2, 4, 5]


def test_pixel_masks_cover_exactly_their_patches():
    masks = torch.zeros(1, 6, dtype=torch.bool)
    masks[0, 4] = True  # row 1, column 1
    pixels = pixel_masks(masks, LAYOUT, (8, 12))[0, 0]
    assert pixels.shape == (8, 12) and pixels.sum() == 16
    assert pixels[4:8, 4:8].all()


def test_area_and_baselines():
    fractions = torch.linspace(0, 1, 5)
    assert area_under(fractions, torch.ones(5)) == pytest.approx(1.0)
    assert area_under(fractions, fractions) == pytest.approx(0.5)
    view = np.zeros((8, 12, 3), dtype=np.uint8)
    view[:, :6] = 200
    assert (baseline_view(view, LAYOUT, "mean") == 100).all()
    blurred = baseline_view(view, LAYOUT, "blur")
    assert blurred.shape == view.shape and 0 < blurred[:, 5].mean() < 200
    with pytest.raises(VitExplorerError, match="no fill of kind 'noise'"):
        baseline_view(view, LAYOUT, "noise")
    with pytest.raises(VitExplorerError, match="unknown baseline 'noise'; use one of blur, mean, road"):
        Protocol("noise")


@pytest.fixture
def tiny_model(tmp_path):
    return load_model(str(write_checkpoint(tmp_path / "tiny.safetensors", TINY)))


def test_curves_start_at_the_image_and_end_at_the_baseline(tiny_model):
    rng = np.random.default_rng(0)
    view = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    grid_map = torch.from_numpy(rng.random((4, 4)))
    curves = deletion_insertion(tiny_model, view, grid_map, target=2, steps=4, random_orders=2, protocol=MEAN)

    def probs(image):
        return torch.softmax(tiny_model.logits(to_pixels(image, tiny_model.preprocess)), -1)[0, 2].item()

    image_prob, baseline_prob = probs(view), probs(baseline_view(view, tiny_model.layout, "mean"))
    for curve in (curves.deletion, curves.random_deletion):
        assert curve[0] == pytest.approx(image_prob, abs=1e-5) and curve[-1] == pytest.approx(baseline_prob, abs=1e-5)
    for curve in (curves.insertion, curves.random_insertion):
        assert curve[0] == pytest.approx(baseline_prob, abs=1e-5) and curve[-1] == pytest.approx(image_prob, abs=1e-5)
    # one step deletes the map's top 4 patches: the same probability as deleting them by hand
    top = importance_order(grid_map)[:4]
    by_hand = view.copy()
    blank = baseline_view(view, tiny_model.layout, "mean")
    for patch in top:
        row, col = divmod(int(patch), 4)
        by_hand[row * 16 : (row + 1) * 16, col * 16 : (col + 1) * 16] = blank[row * 16 : (row + 1) * 16,
                                                                              col * 16 : (col + 1) * 16]
    assert curves.deletion[1] == pytest.approx(probs(by_hand), abs=1e-5)
    inserted_by_hand = blank + (view - by_hand)  # the top patches of the image on the baseline
    assert curves.insertion[1] == pytest.approx(probs(inserted_by_hand), abs=1e-5)
    top_class = int(tiny_model.logits(to_pixels(by_hand, tiny_model.preprocess)).argmax())
    assert curves.deletion_top1[1] == float(top_class == 2)
    assert curves.deletion_top1[0] == float(int(tiny_model.logits(to_pixels(view, tiny_model.preprocess)).argmax()) == 2)
    seen = []
    logits = tiny_model.logits
    tiny_model.logits = lambda pixels: seen.append(len(pixels)) or logits(pixels)
    try:
        again = deletion_insertion(tiny_model, view, grid_map, target=2, steps=4, random_orders=2, protocol=MEAN, batch_size=5)
        ends_only = deletion_insertion(tiny_model, view, grid_map, target=2, steps=1, random_orders=2, protocol=MEAN)
    finally:
        del tiny_model.logits
    # every curve's ends are the same two images, which go through the model once: 6 curves × 3 steps between + 2
    assert sum(seen[:-1]) == forward_passes(4, 2, MEAN) == 20 and max(seen[:-1]) == 5 and seen[-1] == 2
    assert ends_only.deletion.tolist() == pytest.approx([image_prob, baseline_prob], abs=1e-5)
    torch.testing.assert_close(again.random_deletion, curves.random_deletion, rtol=0, atol=1e-7)  # seeded
    assert set(curves.as_dict()["auc"]) == {"deletion", "insertion", "random_deletion", "random_insertion"}


def test_a_map_of_the_wrong_shape_is_refused(tiny_model):
    with pytest.raises(VitExplorerError, match="patch grid"):
        deletion_insertion(tiny_model, np.zeros((64, 64, 3), np.uint8), torch.zeros(3, 3), target=0)


def test_beating_chance_needs_a_margin_at_both_curves():
    from vit_explorer.core.curves import FaithfulnessCurves

    fractions = torch.linspace(0, 1, 3, dtype=torch.float64)

    def curves(deletion, insertion):
        return FaithfulnessCurves(target=0, fractions=fractions, deletion=torch.tensor(deletion),
                                  insertion=torch.tensor(insertion),
                                  random_deletion=torch.tensor([1.0, 0.5, 0.0]), random_insertion=torch.tensor([0.0, 0.5, 1.0]),
                                  deletion_top1=torch.ones(3), random_deletion_top1=torch.ones(3))

    good = curves([1.0, 0.1, 0.0], [0.0, 0.9, 1.0])
    assert good.margins == pytest.approx({"deletion": 0.2, "insertion": 0.2}) and good.beats_chance()
    assert not curves([1.0, 0.1, 0.0], [0.0, 0.52, 1.0]).beats_chance()  # insertion only 0.01 above chance
    assert not curves([1.0, 0.5, 0.0], [0.0, 0.5, 1.0]).beats_chance()


def test_a_similarity_is_followed_as_a_share_of_the_images_score(tmp_path):
    """A one-output model's curves: its score over the unchanged image's, checked on images perturbed by hand."""
    from conftest import photo, write_backbone_checkpoint

    from vit_explorer import analyze
    from vit_explorer.core.analysis import pixels_of
    from vit_explorer.core.targets import similarity_model

    backbone = load_model(str(write_backbone_checkpoint(tmp_path / "backbone.safetensors", TINY)))
    analysis = analyze(backbone, photo((64, 64), seed=3))
    similarity = similarity_model(backbone, pixels_of(backbone, analysis))
    view = analysis.image
    grid_map = torch.from_numpy(np.random.default_rng(1).random((4, 4)))
    curves = deletion_insertion(similarity, view, grid_map, target=0, steps=4, random_orders=2, protocol=MEAN)

    def score(image):
        with torch.no_grad():
            return float(similarity.logits(to_pixels(image, similarity.preprocess))[0, 0])

    whole, blank = score(view), score(baseline_view(view, similarity.layout, "mean"))
    assert curves.measure == "share of the image's score" and curves.as_dict()["measure"] == curves.measure
    assert curves.deletion[0] == pytest.approx(1.0) and curves.deletion[-1] == pytest.approx(blank / whole, rel=1e-4)
    by_hand = view.copy()
    mean = baseline_view(view, similarity.layout, "mean")
    for patch in importance_order(grid_map)[:4]:
        row, col = divmod(int(patch), 4)
        by_hand[row * 16 : (row + 1) * 16, col * 16 : (col + 1) * 16] = mean[row * 16 : (row + 1) * 16, col * 16 : (col + 1) * 16]
    assert curves.deletion[1] == pytest.approx(score(by_hand) / whole, rel=1e-4)
    # a negative score is divided by its magnitude: the curves start at −1 and still fall where the score falls
    negative = similarity_model(backbone, pixels_of(backbone, analysis))
    negative.adapter.reference = -negative.adapter.reference
    flipped = deletion_insertion(negative, view, grid_map, target=0, steps=4, random_orders=2, protocol=MEAN)
    torch.testing.assert_close(flipped.deletion, -curves.deletion, rtol=1e-4, atol=1e-6)
    negative.adapter.reference = negative.adapter.reference * 0
    with pytest.raises(VitExplorerError, match="score is 0"):
        deletion_insertion(negative, view, grid_map, target=0, steps=2, random_orders=1)


def test_shares_of_a_small_reference_score_are_not_judged():
    """Perturbed images scoring many times the image's own: the areas say nothing about the map, so no verdict."""
    from vit_explorer.core.curves import LARGEST_READABLE_SHARE, SHARE_OF_SCORE, FaithfulnessCurves, fractions_of

    fractions = fractions_of(4)
    steady = torch.tensor([1.0, 0.8, 0.6, 0.4, 0.2], dtype=torch.float64)
    wild = torch.tensor([1.0, 3.0, 9.0, 4.0, 0.5], dtype=torch.float64)
    def curves(insertion, measure=SHARE_OF_SCORE):
        return FaithfulnessCurves(target=0, fractions=fractions, deletion=steady, insertion=insertion, random_deletion=steady,
                                  random_insertion=steady, deletion_top1=steady, random_deletion_top1=steady, measure=measure)
    assert curves(steady.flip(0)).warning == "" and curves(steady.flip(0)).verdict != "cannot be judged"
    assert float(wild.max()) > LARGEST_READABLE_SHARE
    assert "9× the image's own score" in curves(wild).warning and curves(wild).verdict == "cannot be judged"
    assert curves(wild, measure="target probability").warning == ""  # a probability is never a share of anything
