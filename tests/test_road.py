"""ROAD's noisy linear imputation against the reference (grad-cam's copy of the ROAD authors' ``imputations.py``), and
the MoRF/LeRF curves built on it."""

import numpy as np
import pytest
import torch
from conftest import TINY, write_checkpoint

from vit_explorer import load_model
from vit_explorer.core.curves import ROAD
from vit_explorer.core.images import to_pixels
from vit_explorer.methods.faithfulness import deletion_insertion, forward_passes, pixel_masks, step_masks
from vit_explorer.methods.road import impute


def patch_mask(grid: int, patch: int, share: float, seed: int) -> torch.Tensor:
    removed = torch.rand(grid, grid, generator=torch.Generator().manual_seed(seed)) < share
    return removed.repeat_interleave(patch, 0).repeat_interleave(patch, 1)


@pytest.mark.parametrize("size, patch, share", [(32, 8, 0.3), (64, 16, 0.9), (96, 16, 0.5)])
def test_imputation_equals_the_reference_solve(size, patch, share):
    road = pytest.importorskip("pytorch_grad_cam.metrics.road")
    torch.manual_seed(size)
    image = torch.randn(3, size, size)
    removed = patch_mask(size // patch, patch, share, seed=size)
    assert removed.any() and not removed.all()
    reference = road.NoisyLinearImputer(noise=0.0)(image, (~removed).float())  # the reference's mask: 1 = kept
    ours = impute(image[None], removed[None, None], noise=0.0)[0]
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-3)  # float32 to a 1e-5 residual; the noise is 1e-2
    assert torch.equal(ours[:, ~removed], image[:, ~removed])  # kept pixels untouched
    # the fill is not a constant: it follows the neighbours
    assert ours[:, removed].std() > 0.05


def test_noise_is_drawn_from_the_generator_and_only_on_removed_pixels():
    image = torch.randn(1, 3, 32, 32)
    removed = patch_mask(4, 8, 0.5, seed=1)[None, None]
    quiet = impute(image, removed, noise=0.0)
    noisy = impute(image, removed, generator=torch.Generator().manual_seed(0))
    again = impute(image, removed, generator=torch.Generator().manual_seed(0))
    assert torch.equal(noisy, again)
    difference = (noisy - quiet)[0]
    assert torch.equal(difference[:, ~removed[0, 0]], torch.zeros_like(difference[:, ~removed[0, 0]]))
    assert 0.005 < float(difference[:, removed[0, 0]].std()) < 0.02  # the reference's 0.01


def test_everything_removed_is_the_normalised_mean():
    assert torch.equal(impute(torch.randn(1, 3, 16, 16), torch.ones(1, 1, 16, 16, dtype=torch.bool), noise=0.0),
                       torch.zeros(1, 3, 16, 16))


def test_road_curves_are_the_models_probabilities_on_reference_imputed_images(tmp_path):
    road = pytest.importorskip("pytorch_grad_cam.metrics.road")
    model = load_model(str(write_checkpoint(tmp_path / "tiny.safetensors", TINY)))
    rng = np.random.default_rng(0)
    view = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    grid_map = torch.from_numpy(rng.random((4, 4))).float()
    steps = 4
    curves = deletion_insertion(model, view, grid_map, 2, steps=steps, random_orders=2, protocol=ROAD, seed=3)
    assert curves.protocol == ROAD and curves.curve_names == ("MoRF", "LeRF")
    assert curves.road_combined == pytest.approx((curves.aucs["insertion"] - curves.aucs["deletion"]) / 2)
    image = to_pixels(view, model.preprocess)[0]
    order = (-grid_map.double().flatten()).argsort(stable=True)
    for name, removal in (("deletion", order), ("insertion", order.flip(0))):
        masks = pixel_masks(step_masks(removal, steps), model.layout, (64, 64))[:, 0].bool()
        for index in (1, 2, 3):
            imputed = road.NoisyLinearImputer(noise=0.0)(image, (~masks[index]).float())
            expected = float(torch.softmax(model.logits(imputed[None]), dim=-1)[0, 2])
            # the curves carry the noise (σ 0.01 in normalised units), the reference solve here none
            assert getattr(curves, name)[index] == pytest.approx(expected, abs=0.02), (name, index)
    assert curves.deletion[0] == pytest.approx(curves.insertion[0])  # nothing removed yet: the whole image, twice
    assert forward_passes(steps, 2, ROAD) == 4 * (steps + 1)


def test_road_curves_are_called_morf_and_lerf_wherever_they_are_shown(tmp_path):
    """The chart, the app's plot table, its title and the report name ROAD's curves MoRF and LeRF, never deletion and
    insertion (they are not: LeRF removes the least relevant patches, it inserts nothing)."""
    from vit_explorer import analyze
    from vit_explorer.core.analysis import class_evidence
    from vit_explorer.core.maps import RolloutOptions, class_map, overview
    from vit_explorer.core.request import Request, Run
    from vit_explorer.draw import plots
    from vit_explorer.draw.report import report_html

    model = load_model(str(write_checkpoint(tmp_path / "tiny.safetensors", TINY)))
    from PIL import Image

    analysis = analyze(model, Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)))
    evidence = class_evidence(model, analysis, None, ("attnlrp", "legrad"))
    curves = deletion_insertion(model, analysis.image, class_map(analysis, "relevance", evidence, RolloutOptions()),
                                evidence.target,
                                steps=4, random_orders=1, protocol=ROAD)
    names = set(plots.faithfulness_table(curves)["curve"])
    assert {name.split(" (")[0] for name in names} == {"MoRF", "random MoRF", "LeRF", "random LeRF"}
    assert set(plots.curve_colours(curves)) == names
    assert "MoRF" in curves.protocol.axis_title and "deleted" not in curves.protocol.axis_title
    page = report_html(Run(request=Request(method="relevance"), analysis=analysis, evidence=evidence, maps={}, curves=curves,
                           overview=overview(analysis)))
    section = page.split("<h2>Faithfulness")[1]
    assert "MoRF AUC" in section and "LeRF AUC" in section and "deletion AUC" not in section and "insertion AUC" not in section
