"""The sanity check that a map depends on the weights (cascading randomisation, Adebayo et al. 2018)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import TINY, photo, write_checkpoint
from PIL import Image

from vit_explorer import analyze, load_model
from vit_explorer.cli import main
from vit_explorer.core.analysis import pixels_of
from vit_explorer.core.curves import SanityCurves
from vit_explorer.methods.sanity import randomise, sanity_check
from vit_explorer.shapes.generator import generate_set


def centre_prior(analysis, evidence) -> torch.Tensor:
    """A map that ignores the model: closeness of each patch to the image centre ``[grid_h, grid_w]``."""
    rows, cols = analysis.layout.grid_hw
    ys, xs = np.mgrid[:rows, :cols]
    return torch.from_numpy(-np.hypot(ys - (rows - 1) / 2, xs - (cols - 1) / 2))


def layer_class_row(layer: int):
    """A map read from one layer's attention only: the class token's row, mean of heads ``[grid_h, grid_w]``."""
    return lambda analysis, evidence: analysis.layout.patch_map(analysis.attentions[layer, :, 0, :].mean(axis=0))


@pytest.fixture(scope="module")
def shapes_run():
    """The shipped model on one generated shape (its true class as target), with a centre prior beside the
    map methods; the logits before the run are kept to check the model is untouched."""
    model = load_model("builtin:shapes", device="cpu")
    sample = generate_set(7, 3)[2]
    analysis = analyze(model, Image.fromarray(sample.image))
    before = model.logits(pixels_of(model, analysis))
    curves = sanity_check(model, analysis, sample.label, extra={"centre prior": centre_prior})
    return model, analysis, before, curves


def test_relevance_of_the_shipped_model_falls_below_half_with_every_layer_randomised(shapes_run):
    _, _, _, curves = shapes_run
    assert curves.methods == ("relevance", "attnlrp", "legrad", "grad-rollout", "rollout", "cls", "centre prior")
    assert curves.randomised_layers == list(range(7))  # the trained model, then 1…6 layers from the top
    assert curves.correlations["relevance"][0] == pytest.approx(1.0)
    assert curves.final["relevance"] < 0.5, curves.correlations["relevance"]  # measured -0.09


def test_a_map_that_ignores_the_weights_stays_at_one(shapes_run):
    _, _, _, curves = shapes_run
    assert curves.correlations["centre prior"] == pytest.approx([1.0] * 7)


def test_the_callers_model_is_unchanged(shapes_run):
    model, analysis, before, _ = shapes_run
    assert torch.equal(model.logits(pixels_of(model, analysis)), before)


def test_layers_are_randomised_from_the_top_one_more_per_step(tiny_checkpoint):
    # layer j's attention depends on layers 0…j only, so it keeps its ranking exactly until layer j is
    # re-drawn, at step depth - j, and loses it from then on
    model = load_model(str(tiny_checkpoint), device="cpu")
    analysis = analyze(model, photo((64, 64)))
    depth = TINY["depth"]
    curves = sanity_check(model, analysis, methods=(), extra={f"layer {layer}": layer_class_row(layer) for layer in range(depth)})
    for layer in range(depth):
        values = curves.correlations[f"layer {layer}"]
        first_random = depth - layer
        assert values[:first_random] == pytest.approx([1.0] * first_random), (layer, values)
        assert all(value < 0.99 for value in values[first_random:]), (layer, values)


def test_randomise_keeps_each_tensors_mean_and_spread_and_is_seeded():
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128))
    with torch.no_grad():
        block[0].weight.mul_(3.0).add_(0.5)
        block[1].weight.normal_(1.0, 0.1)
    block.register_parameter("scalar", torch.nn.Parameter(torch.tensor([2.5])))
    block.register_parameter("constant", torch.nn.Parameter(torch.full((8,), -0.25)))
    trained = {name: parameter.detach().clone() for name, parameter in block.named_parameters()}
    randomise(block, torch.Generator().manual_seed(3))
    for name, parameter in block.named_parameters():
        original = trained[name]
        if name in ("scalar", "constant", "1.bias"):  # LayerNorm's bias starts at 0: no spread to draw from
            assert torch.equal(parameter, original), name
            continue
        assert not torch.equal(parameter, original), name
        assert parameter.mean().item() == pytest.approx(original.mean().item(),
                                                        abs=4 * original.std().item() / original.numel() ** 0.5)
        assert parameter.std().item() == pytest.approx(original.std().item(), rel=0.15), name
    again = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128))
    again.register_parameter("scalar", torch.nn.Parameter(torch.tensor([2.5])))
    again.register_parameter("constant", torch.nn.Parameter(torch.zeros(8)))
    again.load_state_dict(trained)
    randomise(again, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(block.parameters(), again.parameters(), strict=True))


def test_analyze_sanity_writes_the_curves_and_their_chart(tmp_path, capsys):
    checkpoint = write_checkpoint(tmp_path / "tiny.safetensors", TINY)
    image = tmp_path / "input.png"
    photo((64, 64)).save(image)
    out = tmp_path / "out"
    assert main(["analyze", str(image), "--model", str(checkpoint), "--out", str(out), "--no-faithfulness", "--sanity"]) == 0
    record = json.loads((out / "sanity.json").read_text())
    assert set(record) == {"methods", "randomised_layers", "correlations", "target", "target_label", "model_name", "seed",
                           "fallen_below", "layers_to_fall_below", "summary"}
    for method, values in record["correlations"].items():  # the first step below 0.5, recomputed from the curve
        below = [step for step, value in enumerate(values) if value is not None and value < 0.5]
        assert record["layers_to_fall_below"][method] == (below[0] if below else None), method
    assert record["methods"] == ["relevance", "attnlrp", "legrad", "grad-rollout", "rollout", "cls"]
    assert record["randomised_layers"] == [0, 1, 2, 3]
    assert all(len(values) == 4 and values[0] == pytest.approx(1.0) for values in record["correlations"].values())
    assert record["target_label"].startswith("thing ")
    with Image.open(out / "sanity.png") as chart:
        assert chart.format == "PNG" and chart.width > 300
    printed = capsys.readouterr().out
    assert "fell below 0.5: relevance " in printed and printed.strip() == record["summary"]


@pytest.mark.slow
@pytest.mark.real_weights
@pytest.mark.timm
def test_rollout_of_real_dinov2_falls_below_half_with_every_layer_randomised(dinov2_weights):
    skimage_data = pytest.importorskip("skimage.data")
    model = load_model(f"timm:vit_small_patch14_dinov2@{dinov2_weights / 'timm.safetensors'}", input_hw=(224, 224), device="cpu")
    analysis = analyze(model, Image.fromarray(skimage_data.chelsea()))
    curves = sanity_check(model, analysis)
    assert curves.methods == ("rollout", "cls") and curves.target is None  # a backbone: no class-specific maps
    assert curves.randomised_layers == list(range(13))
    assert curves.correlations["rollout"][0] == pytest.approx(1.0)
    assert curves.final["rollout"] < 0.5, curves.correlations["rollout"]  # measured 0.04
    # but it holds on until most layers are random: the summary says how many it took, not only the end point
    fallen = curves.layers_to_fall()["rollout"]
    assert fallen is not None and fallen >= 11, curves.correlations["rollout"]  # measured: 12 of 12
    assert f"rollout {fallen} of 12 (ρ {curves.final['rollout']:.2f} with all 12)" in curves.summary()


def test_the_summary_counts_the_layers_each_map_took_to_fall():
    curves = SanityCurves(methods=("early", "late", "flat"), randomised_layers=[0, 1, 2, 3, 4],
                          correlations={"early": [1.0, 0.3, 0.6, 0.1, 0.0], "late": [1.0, 0.9, 0.8, 0.7, 0.2],
                                        "flat": [1.0, 0.9, 0.9, 0.8, 0.7]}, target=0, target_label="a", model_name="m", seed=0)
    assert curves.layers_to_fall() == {"early": 1, "late": 4, "flat": None}
    assert "early 1 of 4 (ρ 0.00 with all 4); late 4 of 4 (ρ 0.20 with all 4); flat never (ρ 0.70 with all 4)" in curves.summary()
