"""Head ablation against slow references that remove one head at a time in a hand-written forward.

The references write each attention layer out from the module's own weights (the rest of each block
is called as it is): "zero" sets the head's output after the product with the values (not its map),
"mean" swaps its map. They share nothing with the adapters' edits or the branched passes.
"""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, make_vit, photo, write_checkpoint

from vit_explorer import load_model
from vit_explorer.core.analysis import analyze, class_evidence, pixels_of
from vit_explorer.core.interventions import ABLATION_MODES, forward_equivalents
from vit_explorer.draw.words import ablation_cost
from vit_explorer.errors import VitExplorerError
from vit_explorer.methods.ablation import (
    ablated_logits,
    ablation_of,
    head_ablation,
    prediction_without,
)
from vit_explorer.models.base import LoadedModel, Preprocess
from vit_explorer.models.vit_pytorch import VitPytorchAdapter

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")


def heads_attention(q, k, v, scale, layer, ablate, mode, reference):
    """softmax(q·kᵀ·scale)·v of ``[b, heads, n, d]`` tensors, head ``ablate`` = (layer, head) removed when in this layer."""
    attention = torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1)
    if ablate is not None and ablate[0] == layer and mode == "mean":
        attention = attention.clone()
        attention[:, ablate[1]] = reference[layer, ablate[1]]
    out = attention @ v
    if ablate is not None and ablate[0] == layer and mode == "zero":
        out = out.clone()
        out[:, ablate[1]] = 0.0
    return out


def seed_vit_logits(module, pixels, ablate, mode, reference):
    x = module.to_patch_embedding(pixels)
    x = torch.cat([module.cls_token[None].expand(x.shape[0], -1, -1), x], dim=1) + module.pos_embedding[: x.shape[1] + 1]
    for layer, (attention, feed_forward) in enumerate(module.transformer.layers):
        normed = F.layer_norm(x, attention.norm.normalized_shape, attention.norm.weight, attention.norm.bias)
        b, n, _ = normed.shape
        q, k, v = (t.reshape(b, n, attention.heads, -1).transpose(1, 2)
                   for t in (normed @ attention.to_qkv.weight.T).chunk(3, dim=-1))
        out = heads_attention(q, k, v, attention.scale, layer, ablate, mode, reference)
        x = attention.to_out[0](out.transpose(1, 2).reshape(b, n, -1)) + x
        x = feed_forward(x) + x
    return module.mlp_head(module.transformer.norm(x)[:, 0])


def timm_logits(module, pixels, ablate, mode, reference):
    x = module.norm_pre(module._pos_embed(module.patch_embed(pixels)))
    for layer, block in enumerate(module.blocks):
        attention = block.attn
        normed = block.norm1(x)
        b, n, c = normed.shape
        qkv = F.linear(normed, attention.qkv.weight, attention.qkv.bias)
        qkv = qkv.reshape(b, n, 3, attention.num_heads, -1).permute(2, 0, 3, 1, 4)
        out = heads_attention(qkv[0], qkv[1], qkv[2], attention.scale, layer, ablate, mode, reference)
        x = x + block.ls1(attention.proj(out.transpose(1, 2).reshape(b, n, c)))
        x = x + block.ls2(block.mlp(block.norm2(x)))
    return module.forward_head(module.norm(x))


def hf_vit_logits(module, pixels, ablate, mode, reference):
    x = module.vit.embeddings(pixels)
    for layer, block in enumerate(module.vit.layers):
        attention = block.attention
        normed = block.layernorm_before(x)
        b, n, _ = normed.shape
        q, k, v = (projection(normed).reshape(b, n, attention.num_attention_heads, -1).transpose(1, 2)
                   for projection in (attention.q_proj, attention.k_proj, attention.v_proj))
        out = heads_attention(q, k, v, attention.head_dim**-0.5, layer, ablate, mode, reference)
        x = x + attention.o_proj(out.transpose(1, 2).reshape(b, n, -1))
        x = x + block.mlp(block.layernorm_after(x))
    return module.classifier(module.vit.layernorm(x)[:, 0])


def seed_model() -> LoadedModel:
    module = make_vit(TINY)
    adapter = VitPytorchAdapter()
    size = (TINY["image_size"],) * 2
    return LoadedModel(module=module, name="tiny", preprocess=Preprocess(input_hw=size), layout=adapter.layout(module, size),
                       adapter=adapter)


def timm_model() -> LoadedModel:
    from vit_explorer.models.timm_loading import from_timm_module

    torch.manual_seed(0)
    module = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=2, num_classes=7)
    return from_timm_module(module, "timm-tiny")


def hf_vit_model(model_class=None, config=None) -> LoadedModel:
    from vit_explorer.models.hf_adapter import from_hf_module

    torch.manual_seed(0)
    config = config or transformers.ViTConfig(image_size=64, patch_size=16, num_labels=5, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=4, intermediate_size=64, initializer_range=0.3)
    model = (model_class or transformers.ViTForImageClassification)._from_config(config, attn_implementation="sdpa")
    return from_hf_module(model, "hf-tiny")


FAMILIES = {"seed ViT": (seed_model, seed_vit_logits), "timm ViT": (timm_model, timm_logits),
            "hf ViT": (hf_vit_model, hf_vit_logits)}


def random_reference(model: LoadedModel, seed: int = 1) -> torch.Tensor:
    """Row-stochastic stand-ins for mean maps ``[layers, heads, n, n]``, unlike any map the image produces."""
    layers, heads = model.map_shape
    n = model.layout.num_tokens
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(layers, heads, n, n, generator=generator).softmax(dim=-1)


@pytest.mark.parametrize(("layers", "heads", "equivalents"), [
    (3, 4, 10.0),  # 3 + (0 + 12) + (1 + 8) + (2 + 4) = 30 layer evaluations, over 3 per pass
    (12, 12, 84.5),  # ViT-B/16: 1014 over 12 (the module doc's count)
    (1, 1, 2.0),  # one layer, one head: the original pass and one more
])
def test_the_cost_is_counted_in_plain_forward_passes(layers, heads, equivalents):
    assert forward_equivalents(layers, heads) == equivalents
    assert f"about {equivalents:.0f}× the cost of one forward pass (1 + {layers} passes" in ablation_cost(layers, heads)


@pytest.mark.parametrize("mode", ABLATION_MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_each_delta_equals_a_hand_written_forward_without_that_head(family, mode):
    make, reference_forward = FAMILIES[family]
    model = make()
    pixels = torch.randn(1, 3, *model.preprocess.input_hw, generator=torch.Generator().manual_seed(3))
    reference = random_reference(model) if mode == "mean" else None
    layers, heads = model.map_shape
    with torch.no_grad():
        original = reference_forward(model.module, pixels, None, mode, reference)[0].double()
        # the hand forward is the model
        np.testing.assert_allclose(original.float().numpy(), model.logits(pixels)[0].numpy(), atol=1e-5)
        target = int(original.argmin())  # not the top class: any target works
        expected_logit = np.zeros((layers, heads))
        expected_probability = np.zeros((layers, heads))
        for layer in range(layers):
            for head in range(heads):
                ablated = reference_forward(model.module, pixels, (layer, head), mode, reference)[0].double()
                expected_logit[layer, head] = ablated[target] - original[target]
                expected_probability[layer, head] = ablated.softmax(-1)[target] - original.softmax(-1)[target]
    result = head_ablation(model, pixels, target=target, mode=mode, reference=reference)
    assert result.delta_logit.shape == result.delta_probability.shape == (layers, heads)
    assert result.forward_passes == 1 + layers and result.target == target
    assert np.abs(expected_logit).mean() > 1e-3  # a hundred times the tolerance: a no-op ablation would fail
    np.testing.assert_allclose(result.delta_logit, expected_logit, atol=1e-5)
    np.testing.assert_allclose(result.delta_probability, expected_probability, atol=1e-6)
    assert result.original_probability == pytest.approx(float(original.softmax(-1)[target]), abs=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_mean_mode_without_a_reference_is_uniform_attention(family):
    model = FAMILIES[family][0]()
    pixels = torch.randn(1, 3, *model.preprocess.input_hw, generator=torch.Generator().manual_seed(4))
    layers, heads = model.map_shape
    n = model.layout.num_tokens
    uniform = torch.full((layers, heads, n, n), 1.0 / n)
    default = head_ablation(model, pixels, mode="mean")
    np.testing.assert_allclose(default.delta_logit, head_ablation(model, pixels, mode="mean", reference=uniform).delta_logit,
                               atol=1e-6)
    assert not np.allclose(default.delta_logit, head_ablation(model, pixels, mode="zero").delta_logit, atol=1e-4)


def timm_deit_model() -> LoadedModel:
    from vit_explorer.models.timm_loading import from_timm_module

    torch.manual_seed(0)
    return from_timm_module(timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=64, depth=2),
                            "timm-deit")


SMALL_HF = {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "num_labels": 3, "initializer_range": 0.3}
BRANCHING = {
    **{name: make for name, (make, _) in FAMILIES.items()},
    "timm DeiT distilled": timm_deit_model,
    "hf DINOv2 registers": lambda: hf_vit_model(
        transformers.Dinov2WithRegistersForImageClassification,
        transformers.Dinov2WithRegistersConfig(image_size=56, patch_size=14, num_register_tokens=2, **SMALL_HF)),
    "hf DeiT teacher": lambda: hf_vit_model(transformers.DeiTForImageClassificationWithTeacher,
                                            transformers.DeiTConfig(image_size=64, patch_size=16, intermediate_size=64,
                                                                    **SMALL_HF)),
}


@pytest.mark.parametrize("family", BRANCHING)
def test_one_branched_pass_equals_a_pass_per_head_set(family):
    model = BRANCHING[family]()
    pixels = torch.randn(1, 3, *model.preprocess.input_hw, generator=torch.Generator().manual_seed(5))
    layers, heads = model.map_shape
    head_sets = [[(1, 0)], [], [(1, heads - 1), (layers - 1, 0)], [(layers - 1, h) for h in range(heads)]]
    together = ablated_logits(model, pixels, head_sets)
    apart = torch.cat([ablated_logits(model, pixels, [heads_removed]) for heads_removed in head_sets])
    np.testing.assert_allclose(together.numpy(), apart.numpy(), atol=1e-5)
    np.testing.assert_allclose(apart[1].numpy(), model.logits(pixels)[0].numpy(), atol=1e-5)  # nothing removed: the model itself
    assert (apart[0] - apart[1]).abs().max() > 1e-4  # and removing a head does change the logits


def test_prediction_without_a_head_matches_the_heat_map_and_ablation_is_kept_on_the_analysis():
    from scipy.stats import spearmanr

    model = seed_model()
    analysis = analyze(model, photo((64, 64)), explain=False)
    result = ablation_of(model, analysis)
    assert ablation_of(model, analysis) is result  # the heat map and the ranking share one computation
    assert result.target == analysis.top_k(1)[0].index
    assert result.original_probability == pytest.approx(float(analysis.probs[result.target]), abs=1e-6)
    layer, head, drop = result.ranked(1)[0]
    assert drop == pytest.approx(-float(result.delta_probability.min()))
    predictions = prediction_without(model, pixels_of(model, analysis), [(layer, head)], k=TINY["num_classes"])
    assert [p.label for p in predictions[:1]] == [f"class {predictions[0].index}"]  # this model has no labels
    assert all(first.prob >= second.prob for first, second in zip(predictions, predictions[1:], strict=False))
    probability = {p.index: p.prob for p in predictions}
    assert probability[result.target] == pytest.approx(result.original_probability - drop, abs=1e-6)
    importance = class_evidence(model, analysis, result.target).importance
    record = json.loads(result.to_json(importance))
    expected = spearmanr(result.delta_probability.abs().ravel(), importance.ravel()).statistic
    assert record["spearman_abs_delta_probability_vs_gradient_importance"] == pytest.approx(expected, abs=1e-9)
    assert [(entry["layer"], entry["head"]) for entry in record["ranked_by_drop"][:1]] == [(layer, head)]
    assert len(record["ranked_by_drop"]) == TINY["depth"] * TINY["heads"]


def test_bad_requests_are_user_errors():
    model = seed_model()
    pixels = torch.randn(1, 3, 64, 64)
    with pytest.raises(VitExplorerError, match="mode"):
        head_ablation(model, pixels, mode="half")
    with pytest.raises(VitExplorerError, match="one image"):
        head_ablation(model, torch.randn(2, 3, 64, 64))
    with pytest.raises(VitExplorerError, match="outside"):
        ablated_logits(model, pixels, [[(TINY["depth"], 0)]])
    with pytest.raises(VitExplorerError, match="same input size"):
        head_ablation(model, pixels, mode="mean", reference=torch.ones(TINY["depth"], TINY["heads"], 5, 5))


def test_edits_are_undone_after_the_pass():
    model = timm_model()
    pixels = torch.randn(1, 3, 64, 64)
    before = model.logits(pixels)
    ablated_logits(model, pixels, [[(0, 0)], [(1, 1)]])
    assert all(block.attn.fused_attn for block in model.module.blocks)
    assert not any(block._forward_hooks or block._forward_pre_hooks or block.attn.attn_drop._forward_hooks
                   for block in model.module.blocks)
    torch.testing.assert_close(model.logits(pixels), before)


def test_cli_ablation_writes_ablation_json(tmp_path, image_file):
    from vit_explorer.cli import main

    checkpoint = write_checkpoint(tmp_path / "tiny.safetensors", TINY)
    out = tmp_path / "out"
    assert main(["analyze", str(image_file), "--model", str(checkpoint), "--out", str(out), "--no-faithfulness", "--ablation",
                 "--ablation-mode", "mean"]) == 0
    record = json.loads((out / "ablation.json").read_text())
    assert record["mode"] == "mean" and record["forward_passes"] == 1 + TINY["depth"]
    shape = (TINY["depth"], TINY["heads"])
    assert np.asarray(record["delta_probability"]).shape == np.asarray(record["delta_logit"]).shape == shape
    from scipy.stats import spearmanr  # an independent rank correlation of the file's own numbers

    importance = class_evidence(load_model(str(checkpoint)), analyze(load_model(str(checkpoint)), image_file),
                                record["target"]).importance
    expected = spearmanr(np.abs(np.asarray(record["delta_probability"])).ravel(), importance.ravel()).statistic
    assert record["spearman_abs_delta_probability_vs_gradient_importance"] == pytest.approx(expected, abs=1e-6)
    assert (out / "ablation.png").is_file()
    model = load_model(str(checkpoint))
    analysis = analyze(model, image_file)
    np.testing.assert_allclose(record["delta_probability"], ablation_of(model, analysis, mode="mean").delta_probability,
                               atol=1e-6)


@pytest.mark.slow
def test_on_held_out_shapes_the_largest_effects_matter_more_than_random_or_smallest_heads():
    """Mean drop of the target (top) probability over 20 held-out images, three heads removed together
    (zero mode), measured: largest effects 0.342 (± 0.045 s.e.), random 0.117 (± 0.039), smallest 0.009
    (± 0.009); the largest beat the random three on 20 of 20 images."""
    from vit_explorer.core.images import to_pixels
    from vit_explorer.shapes.generator import generate_set
    from vit_explorer.shapes.train import HELDOUT_SEED

    model = load_model("builtin:shapes")
    rng = np.random.default_rng(0)
    drops = {"largest": [], "random": [], "smallest": []}
    for sample in generate_set(HELDOUT_SEED, 20):
        pixels = to_pixels(sample.image, model.preprocess)
        result = head_ablation(model, pixels)
        drop, delta = result.drop.numpy(), result.delta_probability.numpy()
        order = np.argsort(-drop, axis=None, kind="stable")
        quiet = np.argsort(np.abs(delta), axis=None, kind="stable")
        shape = drop.shape
        chosen = {"largest": order[:3], "random": rng.choice(drop.size, 3, replace=False), "smallest": quiet[:3]}
        sets = [[tuple(int(i) for i in np.unravel_index(flat, shape)) for flat in chosen[name]] for name in drops]
        probabilities = ablated_logits(model, pixels, sets).double().softmax(-1)[:, result.target].numpy()
        for name, probability in zip(drops, probabilities, strict=True):
            drops[name].append(result.original_probability - probability)
    means = {name: float(np.mean(values)) for name, values in drops.items()}
    print(f"mean drop of the target probability, 3 heads removed: {means}")
    assert means["largest"] > means["random"] and means["largest"] > means["smallest"]
    assert means["largest"] > means["random"] + 0.1 and abs(means["smallest"]) < 0.05


def test_heat_map_is_red_where_removal_lowers_the_target_and_clicks_map_to_heads():
    from vit_explorer.core.interventions import HeadAblation
    from vit_explorer.draw.pictures import ablation_picture

    delta = torch.zeros(3, 4)
    delta[1, 2], delta[2, 0] = -0.3, 0.1
    picture, geometry = ablation_picture(HeadAblation("zero", 0, delta, delta, 0.0, 0.5, 4), selected=(1, 2))
    assert picture.shape[0] > geometry.size_hw[0]  # the colour bar below the grid

    def corner(layer, head):  # a tile pixel away from the centred label
        y, x = geometry.tile_origin(layer, head)
        assert geometry.hit(x + 2, y + 2) == (layer, head)
        return picture[y + 2, x + 2].astype(int)

    lowered, raised, unchanged = corner(1, 2), corner(2, 0), corner(0, 0)
    assert lowered[0] > 2 * lowered[2] + 40 and raised[2] > raised[0] + 50  # red, blue
    assert unchanged.min() > 200  # no change is near white
