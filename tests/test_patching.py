"""Activation patching between two images: the boundary cases that must hold exactly on every family, and each head's
patch against a forward written here on timm's blocks with that head's output taken from the other image."""

import pytest
import torch
import torch.nn.functional as F

from vit_explorer import VitExplorerError
from vit_explorer.core.targets import similarity_model
from vit_explorer.methods.patching import patch, patched_heads, patched_residual, record

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
from test_ablation import BRANCHING  # noqa: E402  (the families, built small)
from test_decomposition import dinov2_backbone, pixels_for, stirred  # noqa: E402


def scores(model, pixels, target) -> float:
    return float(model.logits(pixels)[0, target])


@pytest.mark.parametrize("family", BRANCHING)
def test_patching_all_of_a_layers_stream_gives_b_and_nothing_gives_a(family):
    model = stirred(BRANCHING[family]())
    a, b = pixels_for(model, 3), pixels_for(model, 4)
    target = int(model.logits(a)[0].argmin())
    score_a, score_b = scores(model, a, target), scores(model, b, target)
    assert abs(score_a - score_b) > 1e-3  # the two images differ for this target
    source = record(model, b)
    layers, heads = model.map_shape
    n = model.layout.num_tokens
    for layer in (0, layers - 1):
        every_none = torch.stack([torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)])
        patched = patched_residual(model, a, source, layer, every_none, target)
        assert float(patched[0]) == pytest.approx(score_b, abs=1e-4) and float(patched[1]) == pytest.approx(score_a, abs=1e-4)
    none = patched_heads(model, a, source, 0, torch.zeros(1, heads, dtype=torch.bool), target)
    assert float(none[0]) == pytest.approx(score_a, abs=1e-4)


def test_a_patched_head_equals_a_forward_with_that_heads_output_from_b():
    """On timm blocks written out here: run B and keep each head's output (its attention-weighted values), then run A
    with one head's output at one layer replaced, through the out-projection and the rest of the model."""
    from vit_explorer.models.timm_loading import from_timm_module

    torch.manual_seed(0)
    module = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, img_size=56, depth=3, num_classes=5)
    model = stirred(from_timm_module(module, "timm-dinov2-reg4"))
    a, b = pixels_for(model, 3), pixels_for(model, 4)
    target = 1

    def forward(pixels, replace=None, outputs_of_b=None):
        x = module.norm_pre(module._pos_embed(module.patch_embed(pixels)))
        kept = []
        for layer, block in enumerate(module.blocks):
            attention = block.attn
            bsz, n, dim = x.shape
            qkv = F.linear(block.norm1(x), attention.qkv.weight, attention.qkv.bias).reshape(bsz, n, 3, attention.num_heads, -1)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            out = ((q * attention.scale) @ k.transpose(-1, -2)).softmax(dim=-1) @ v  # [b, heads, n, head_dim]
            if replace is not None and replace[0] == layer:
                out = out.clone()
                out[:, replace[1]] = outputs_of_b[layer][:, replace[1]]
            kept.append(out)
            x = x + block.ls1(attention.proj(out.transpose(1, 2).reshape(bsz, n, dim)))
            x = x + block.ls2(block.mlp(block.norm2(x)))
        return module.forward_head(module.norm(x))[0, target], kept

    with torch.no_grad():
        score_a, _ = forward(a)
        _, outputs_of_b = forward(b)
        expected = torch.tensor([[float(forward(a, (layer, head), outputs_of_b)[0] - score_a) for head in range(6)]
                                 for layer in range(3)])
    assert float(score_a) == pytest.approx(scores(model, a, target), abs=1e-5)
    result = patch(model, a, b, target, tokens=False)
    assert expected.abs().max() > 1e-2
    torch.testing.assert_close(result.heads, expected.float(), rtol=1e-4, atol=1e-5)
    assert result.tokens is None and result.score_b == pytest.approx(scores(model, b, target), abs=1e-5)


def test_each_token_patch_is_one_unbatched_pass_and_the_cost_is_counted():
    model = stirred(BRANCHING["seed ViT"]())
    a, b = pixels_for(model, 3), pixels_for(model, 4)
    result = patch(model, a, b, 0)
    layers, heads = model.map_shape
    n = model.layout.num_tokens
    assert result.tokens.shape == (layers, n) and result.token_patches.shape == (layers, *model.layout.grid_hw)
    source = record(model, b)
    for layer, token in ((0, 0), (1, n - 1), (layers - 1, 3)):
        mask = torch.zeros(1, n, dtype=torch.bool)
        mask[0, token] = True
        alone = float(patched_residual(model, a, source, layer, mask, 0)[0]) - result.score_a
        assert float(result.tokens[layer, token]) == pytest.approx(alone, abs=1e-5)
    # the cost it states is the layer evaluations it ran (each layer once per copy of the stream), over the layers of one pass
    evaluated = []
    handles = [write.register_forward_hook(lambda _module, _inputs, output: evaluated.append(output.shape[0]))
               for write in model.adapter.attention_writes(model.module)]
    try:
        counted = patch(model, a, b, 0)
    finally:
        for handle in handles:
            handle.remove()
    assert counted.forward_passes == pytest.approx(sum(evaluated) / layers)


def test_a_backbones_similarity_is_patched_with_as_reference_held():
    backbone = stirred(dinov2_backbone())
    a, b = pixels_for(backbone, 3), pixels_for(backbone, 4)
    model = similarity_model(backbone, a)
    result = patch(model, a, b, 0, model.labels[0])
    assert result.score_a == pytest.approx(scores(model, a, 0), abs=1e-5)
    assert result.score_b == pytest.approx(scores(model, b, 0), abs=1e-5)
    n = backbone.layout.num_tokens
    everything = patched_residual(model, a, record(model, b), 1, torch.ones(1, n, dtype=torch.bool), 0)
    assert float(everything[0]) == pytest.approx(result.score_b, abs=1e-4)
    with pytest.raises(VitExplorerError, match="one size"):
        patch(model, a, torch.zeros(1, 3, 28, 28), 0)
