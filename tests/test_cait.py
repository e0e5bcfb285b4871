"""CaiT: the self-attention layers over the patches and the class-attention layers laid on one sequence
(``models.cait_adapter``), checked against the forward written out from its parameters (``cait_reference``)."""

from __future__ import annotations

import pytest
import torch
from cait_reference import cait_pass
from conftest import photo

from vit_explorer import explain
from vit_explorer.core.analysis import analyze, class_evidence, pixels_of
from vit_explorer.core.capture import record_attention, record_attention_gradients
from vit_explorer.errors import VitExplorerError
from vit_explorer.methods.ablation import ablated_logits
from vit_explorer.methods.patching import patch
from vit_explorer.models import load_model
from vit_explorer.models.timm_loading import from_timm_module

timm = pytest.importorskip("timm")

SELF_LAYERS, CLASS_LAYERS, HEADS = 3, 2, 4


@pytest.fixture(scope="module")
def cait():
    """A small CaiT at 64 px (a 4 × 4 grid) whose layers all matter: layer scale 1, not timm's 1e-5, and random talking
    heads, so that a wrong map, head mix or layer order moves the logits."""
    torch.manual_seed(0)
    module = timm.create_model("cait_xxs24_224", pretrained=False, img_size=64, depth=SELF_LAYERS,
                               depth_token_only=CLASS_LAYERS, init_values=1.0, num_classes=10)
    with torch.no_grad():
        for block in module.blocks:
            block.attn.proj_w.weight.normal_(0, 0.5)
            block.attn.proj_w.bias.normal_(0, 0.02)
            block.attn.proj_l.bias.normal_(0, 0.5)
    return from_timm_module(module.eval(), "cait-test")


def images(count: int = 2) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(count, 3, 64, 64)


def test_cait_loads_by_name_with_random_weights_and_says_how_its_layers_are_laid_out():
    model = load_model("timm:cait_xxs24_224@random", device="cpu")
    assert model.map_shape == (26, 4) and model.layout.prefix_names == ("cls",) and model.layout.grid_hw == (14, 14)
    assert any("class token exists only in the last 2 layers" in note and "talking heads" in note for note in model.notes)


def test_capture_holds_each_layers_softmax_on_one_sequence_and_leaves_the_logits(cait):
    pixels = images()
    with torch.no_grad():
        reference = cait_pass(cait.module, pixels)
        logits, maps = record_attention(cait, pixels)  # [b, layers, heads, n, n]
    n = cait.layout.num_tokens
    assert maps.shape == (2, SELF_LAYERS + CLASS_LAYERS, HEADS, n, n)
    torch.testing.assert_close(logits, reference.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, cait.logits(pixels), atol=1e-5, rtol=1e-5)  # timm's own fused forward
    class_only = torch.zeros(n)
    class_only[0] = 1.0
    for layer, softmax in enumerate(reference.patch_softmaxes):
        torch.testing.assert_close(maps[:, layer, :, 1:, 1:], softmax, atol=1e-6, rtol=1e-5)
        assert torch.equal(maps[:, layer, :, 0], class_only.expand(2, HEADS, n))  # not yet in the sequence
        assert not maps[:, layer, :, 1:, 0].any()
    for offset, softmax in enumerate(reference.class_softmaxes):
        layer = SELF_LAYERS + offset
        torch.testing.assert_close(maps[:, layer, :, :1], softmax, atol=1e-6, rtol=1e-5)
        assert torch.equal(maps[:, layer, :, 1:], torch.eye(n)[1:].expand(2, HEADS, n - 1, n))  # patches unchanged
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, SELF_LAYERS + CLASS_LAYERS, HEADS, n), atol=1e-5, rtol=0)


def test_the_gradients_reach_each_softmax_as_in_the_written_out_forward(cait):
    pixels = images(1)
    target = 3
    reference = cait_pass(cait.module, pixels, grad=True)
    reference.logits[0, target].backward()
    _, _, gradients = record_attention_gradients(cait, pixels, torch.tensor([target]))
    for layer, softmax in enumerate(reference.patch_softmaxes):
        torch.testing.assert_close(gradients[0, layer, :, 1:, 1:], softmax.grad[0], atol=1e-6, rtol=1e-4)
        assert not gradients[0, layer, :, 0].any()
    for offset, softmax in enumerate(reference.class_softmaxes):
        torch.testing.assert_close(gradients[0, SELF_LAYERS + offset, :, :1], softmax.grad[0], atol=1e-6, rtol=1e-4)
        assert not gradients[0, SELF_LAYERS + offset, :, 1:].any()


def class_token_rollout(reference, residual_weight: float = 0.5) -> torch.Tensor:
    """The class token's rollout written from CaiT's structure: the patches' rollout over the self-attention layers, then
    the class token's row through the class-attention layers (each mixes the class token's own row with its softmax),
    the last layer first."""
    p = reference.patch_softmaxes[0].shape[-1]
    row = torch.zeros(1 + p, dtype=torch.float64)
    row[0] = 1.0
    for softmax in reversed(reference.class_softmaxes):
        mixed = (1 - residual_weight) * softmax[0, :, 0].double().mean(0)
        mixed[0] += residual_weight
        row = row[0] * mixed + torch.cat([torch.zeros(1, dtype=torch.float64), row[1:]])
    for softmax in reversed(reference.patch_softmaxes):
        factor = (1 - residual_weight) * softmax[0].double().mean(0) + residual_weight * torch.eye(p, dtype=torch.float64)
        row = torch.cat([row[:1], row[1:] @ factor])
    return row


def test_rollout_runs_through_the_class_attention_then_the_self_attention(cait):
    image = photo((64, 64), seed=5)
    analysis = analyze(cait, image, explain=False)
    with torch.no_grad():
        reference = cait_pass(cait.module, pixels_of(cait, analysis))
    expected = class_token_rollout(reference)
    rollout = explain(image, cait, "rollout").map.double()
    patches = expected[1:].reshape(cait.layout.grid_hw)
    torch.testing.assert_close(rollout / rollout.sum(), patches / patches.sum(), atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("removed", [(1, 2), (SELF_LAYERS + 1, 0)], ids=["self-attention", "class-attention"])
def test_removing_a_head_equals_zeroing_its_softmax_in_the_written_out_forward(cait, removed):
    pixels = images(1)
    with torch.no_grad():
        expected = cait_pass(cait.module, pixels, zeroed=removed).logits
        original = cait_pass(cait.module, pixels).logits
    logits = ablated_logits(cait, pixels, [[], [removed]])  # branched: both sets from one pass
    torch.testing.assert_close(logits[0:1], original, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[1:2], expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(expected, original, atol=1e-3)


def test_every_layers_stream_is_the_class_token_then_the_patches(cait):
    pixels = images(1)
    streams: dict[int, torch.Tensor] = {}
    with torch.no_grad(), cait.adapter.layer_outputs(cait.module, streams.__setitem__):
        cait.logits(pixels)
        reference = cait_pass(cait.module, pixels)
    assert sorted(streams) == list(range(SELF_LAYERS + CLASS_LAYERS))
    for layer, stream in enumerate(reference.streams):
        torch.testing.assert_close(streams[layer], stream, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ["rollout", "cls", "grad-rollout", "relevance", "legrad", "attnlrp"])
def test_explain_gives_a_map_for_every_method(cait, method):
    explained = explain(photo((64, 64), seed=2), cait, method)
    assert explained.map.shape == (4, 4) and torch.isfinite(explained.map).all() and explained.map.abs().sum() > 0


def test_what_talking_heads_rule_out_is_refused_by_name(cait):
    pixels = images(1)
    evidence = class_evidence(cait, analyze(cait, photo((64, 64), seed=3)), decompose=True)
    assert evidence.decomposition is None
    assert "CaiT" in evidence.not_decomposable and "talking heads" in evidence.not_decomposable
    with pytest.raises(VitExplorerError, match="CaiT.*talking heads"):
        patch(cait, pixels, pixels, target=0)


def test_every_tab_of_the_app_opens_on_cait_and_the_queries_and_keys_tab_says_why_it_cannot(cait, tmp_path):
    from app_support import analysed_model, open_every_tab

    photo((64, 64), seed=4).save(tmp_path / "upload.png")
    _, session, outputs = analysed_model(cait, "cait", tmp_path / "upload.png")
    assert "5 layers × 4 heads" in outputs["summary"] and "class token exists only in the last 2 layers" in outputs["summary"]
    open_every_tab(session, {"Queries and keys": "CaiT mixes its heads' logits before the softmax"})


def test_attnlrp_conserves_the_logit_where_nothing_but_the_pixels_holds_relevance(cait):
    """With every bias, the class token and the position embedding at zero, AttnLRP's rules leave a linear map from
    pixels to logit (the talking heads mix maps the rules hold constant): the relevance sums to the logit."""
    import copy

    from vit_explorer.core.attnlrp import input_relevance

    unbiased = copy.deepcopy(cait)
    with torch.no_grad():
        for name, parameter in unbiased.module.named_parameters():
            if name.endswith("bias") or name in ("cls_token", "pos_embed"):
                parameter.zero_()
    pixels = images(1)
    logits = unbiased.logits(pixels)[0]
    for target in (0, 5):
        relevance = input_relevance(unbiased, pixels, target)
        assert float(relevance.sum()) == pytest.approx(float(logits[target]), rel=1e-4, abs=1e-5)
