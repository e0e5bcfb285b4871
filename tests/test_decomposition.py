"""The decomposition of a target's score into what each part of the model writes: exact on every family, and equal
to a computation written here on timm's blocks without the adapter."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vit_explorer import VitExplorerError
from vit_explorer.core.capture import capture
from vit_explorer.core.decomposition import Decomposition, reading
from vit_explorer.core.targets import similarity_model

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
from test_ablation import BRANCHING  # noqa: E402  (the families, built small)


def decompose_pixels(model, pixels: torch.Tensor, target: int) -> Decomposition:
    """The decomposition read off one capture pass of ``pixels`` for class ``target``; raises a refusal."""
    result = capture(model, pixels, target=target, graph_reader=reading).reading
    if isinstance(result, VitExplorerError):
        raise result
    return result


def stirred(model, seed: int = 0):
    """``model`` with every bias and layer scale moved off its initial value (random inits set biases to zero and
    DINOv2's layer scale to 1e-5, which would hide a bias or a scale the decomposition forgot)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.module.named_parameters():
            if name.endswith("bias") or "gamma" in name or "lambda1" in name:
                parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
    return model


def pixels_for(model, seed: int = 3) -> torch.Tensor:
    return torch.randn(1, 3, *model.preprocess.input_hw, generator=torch.Generator().manual_seed(seed))


def dinov2_backbone():
    from vit_explorer.models.hf_adapter import from_hf_module

    torch.manual_seed(0)
    config = transformers.Dinov2Config(image_size=56, patch_size=14, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                       initializer_range=0.3)
    return from_hf_module(transformers.Dinov2Model(config).eval(), "hf-dinov2-backbone")


@pytest.mark.parametrize("family", BRANCHING)
def test_the_parts_add_up_to_the_score_on_every_family(family):
    model = stirred(BRANCHING[family]())
    pixels = pixels_for(model)
    logits = model.logits(pixels)[0]
    target = int(logits.argmin())  # any class, not the top one
    result = decompose_pixels(model, pixels, target)
    assert result.score == pytest.approx(float(logits[target]), abs=1e-5)
    largest = max(float(result.heads.abs().max()), float(result.mlps.abs().max()), *map(abs, result.rest.values()))
    assert abs(result.total - result.score) <= 1e-4 * largest
    assert result.rest["attention biases"] != 0 and result.rest["final norm and head biases"] != 0
    layers, heads = model.map_shape
    assert result.heads.shape == (layers, heads) and result.mlps.shape == (layers,)
    torch.testing.assert_close(result.head_sources.sum(dim=-1), result.heads, rtol=1e-5, atol=1e-6)
    assert result.head_patches.shape == (layers, heads, *model.layout.grid_hw)
    # the logit lens: after the last layer it is the model's own output
    assert float(result.lens[-1]) == pytest.approx(result.score, abs=1e-5) and result.lens.shape == (layers,)


@pytest.mark.parametrize("patch", [None, (1, 2)], ids=["own embedding", "a patch"])
def test_a_backbones_similarity_score_is_decomposed_too(patch):
    backbone = stirred(dinov2_backbone())
    pixels = pixels_for(backbone)
    model = similarity_model(backbone, pixels, patch)
    result = decompose_pixels(model, pixels, 0)
    assert result.score == pytest.approx(float(model.logits(pixels)[0, 0]), abs=1e-5)
    assert result.total == pytest.approx(result.score, abs=1e-4 * max(1.0, float(result.heads.abs().max())))
    assert result.lens_top.shape == (backbone.map_shape[0], 1)


def test_a_model_whose_attention_writes_through_a_norm_is_refused():
    module = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1, num_classes=3,
                               scale_attn_norm=True)
    from vit_explorer.models.timm_loading import from_timm_module

    model = from_timm_module(module, "timm-scale-norm")
    with pytest.raises(VitExplorerError, match="cannot be read off exactly"):
        decompose_pixels(model, pixels_for(model), 0)


def test_each_part_equals_a_computation_on_timms_blocks():
    """Heads, their spatial split, MLPs, biases and embeddings against a forward written here on timm's blocks: per head
    its values through its slice of the out-projection and its layer scale, read at the class token through the final
    norm with its standard deviation held and the head's row."""
    from vit_explorer.models.timm_loading import from_timm_module

    torch.manual_seed(0)
    module = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, img_size=56, depth=3, num_classes=5)
    model = stirred(from_timm_module(module, "timm-dinov2-reg4"))
    pixels = pixels_for(model)
    target = 2
    result = decompose_pixels(model, pixels, target)

    with torch.no_grad():
        x = module.norm_pre(module._pos_embed(module.patch_embed(pixels)))[0]  # [n, dim]
        final = x.clone()
        parts_x = {"embeddings": x.clone()}
        head_writes, head_sources, bias_writes, mlp_writes = [], [], [], []
        for block in module.blocks:
            attention = block.attn
            n, dim = x.shape
            heads = attention.num_heads
            qkv = F.linear(block.norm1(x), attention.qkv.weight, attention.qkv.bias).reshape(n, 3, heads, -1).permute(1, 2, 0, 3)
            q, k, v = qkv[0], qkv[1], qkv[2]  # [heads, n, head_dim]
            maps = ((q * attention.scale) @ k.transpose(-1, -2)).softmax(dim=-1)  # [heads, n, n]
            head_dim = dim // heads
            gamma = block.ls1.gamma
            # each source s's value through head h's slice of the out-projection and the layer scale [heads, n, dim]
            projected = torch.stack([v[h] @ attention.proj.weight[:, h * head_dim:(h + 1) * head_dim].T
                                     for h in range(heads)]) * gamma
            writes = maps @ projected  # [heads, n(query), dim]
            head_writes.append(writes)
            head_sources.append((maps, projected))
            bias_writes.append(attention.proj.bias * gamma)
            x = x + writes.sum(dim=0) + attention.proj.bias * gamma
            mlp = block.ls2(block.mlp(block.norm2(x)))
            mlp_writes.append(mlp)
            x = x + mlp
        # the read-out at the class token, the final norm's standard deviation held at the image's own
        sigma = (x[0].var(unbiased=False) + module.norm.eps).sqrt()
        row = module.head.weight[target]

        def read(part: torch.Tensor) -> float:  # a part's class token [dim] through the held norm and the head
            return float(row @ ((part - part.mean()) / sigma * module.norm.weight))

        torch.testing.assert_close(module(pixels)[0, target], torch.tensor(result.score), atol=1e-5, rtol=0)
        expected_heads = torch.tensor([[read(writes[h, 0]) for h in range(writes.shape[0])] for writes in head_writes])
        expected_sources = torch.stack([
            torch.stack([torch.stack([maps[h, 0, s] * read(projected[h, s]) for s in range(maps.shape[-1])])
                         for h in range(maps.shape[0])]) for maps, projected in head_sources])
        expected_mlps = torch.tensor([read(mlp[0]) for mlp in mlp_writes])
        expected_biases = torch.tensor([read(bias) for bias in bias_writes])
        readout_bias = float(row @ module.norm.bias + module.head.bias[target])
        embeddings = read(parts_x["embeddings"][0])
    assert float(expected_heads.abs().max()) > 1e-2  # the heads write something the head reads
    torch.testing.assert_close(result.heads, expected_heads.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(result.head_sources, expected_sources.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(result.mlps, expected_mlps.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(result.attention_biases, expected_biases.float(), rtol=1e-4, atol=1e-5)
    assert result.embeddings == pytest.approx(embeddings, rel=1e-4, abs=1e-5)
    assert result.readout_bias == pytest.approx(readout_bias, rel=1e-5, abs=1e-6)
    # the top parts are ranked by size
    top = result.top_parts(4)
    assert [abs(value) for _, value in top] == sorted((abs(value) for _, value in top), reverse=True)
    assert np.isclose(top[0][1], max([*expected_heads.flatten().tolist(), *expected_mlps.tolist()], key=abs), atol=1e-4)
    del final


def test_the_upload_pass_and_a_target_change_read_the_decomposition_of_their_own_target():
    """``analyze`` (maps, norms and the top class's gradients in one pass) carries the top class's decomposition, named,
    equal to one read off a bare capture; ``class_evidence`` for another class carries that class's; evidence kept
    without one gets it when asked."""
    from PIL import Image

    from vit_explorer.core.analysis import analyze, class_evidence, pixels_of

    model = stirred(BRANCHING["timm ViT"]())
    image = Image.fromarray(np.random.default_rng(5).integers(0, 256, (*model.preprocess.input_hw, 3), dtype=np.uint8))
    analysis = analyze(model, image, decompose=True)
    pixels = pixels_of(model, analysis)
    top = int(analysis.logits.argmax())
    upload = analysis.evidence[top].decomposition
    bare = decompose_pixels(model, pixels, top)
    assert upload.label == analysis.label(top) and upload.score == pytest.approx(float(analysis.logits[top]), abs=1e-5)
    for name in ("heads", "mlps", "attention_biases", "head_sources", "lens"):
        torch.testing.assert_close(getattr(upload, name), getattr(bare, name), rtol=1e-5, atol=1e-6)
    other = int(analysis.logits.argmin())
    changed = class_evidence(model, analysis, other, decompose=True).decomposition
    assert changed.target == other and changed.score == pytest.approx(float(analysis.logits[other]), abs=1e-5)
    assert abs(changed.total - changed.score) <= 1e-4 * float(changed.heads.abs().max())
    plain = analyze(model, image)
    assert plain.evidence[top].decomposition is None
    torch.testing.assert_close(class_evidence(model, plain, top, decompose=True).decomposition.heads, upload.heads)
    assert class_evidence(model, plain, top) is plain.evidence[top]  # kept, with its decomposition now


def test_weights_changed_in_place_are_read_with_their_new_attention_biases():
    """The zero-map writes are kept per model; moving a bias in place must not leave the kept ones stale (the parts would
    then not add up and the decomposition would be refused)."""
    model = BRANCHING["timm ViT"]()
    pixels = pixels_for(model)
    before = decompose_pixels(model, pixels, 0)
    stirred(model, seed=4)
    after = decompose_pixels(model, pixels, 0)
    assert not torch.allclose(before.attention_biases, after.attention_biases)
    assert after.score == pytest.approx(float(model.logits(pixels)[0, 0]), abs=1e-5)
    assert abs(after.total - after.score) <= 1e-4 * float(after.heads.abs().max())


def test_an_upload_on_a_model_that_cannot_be_decomposed_still_gives_its_maps():
    """The refusal travels with the evidence and is raised where the decomposition is asked for, never by the upload."""
    from PIL import Image

    from vit_explorer.core.analysis import analyze
    from vit_explorer.models.timm_loading import from_timm_module
    from vit_explorer.run import decompose

    module = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1, num_classes=3,
                               scale_attn_norm=True)
    model = from_timm_module(module, "timm-scale-norm")
    analysis = analyze(model, Image.new("RGB", (32, 32), (120, 30, 200)), decompose=True)
    assert analysis.attentions.shape[0] == 1
    evidence = next(iter(analysis.evidence.values()))
    # an explicit field says why, and the pass is not made again for it
    assert evidence.decomposition is None and "cannot be read off exactly" in evidence.not_decomposable
    assert evidence.decomposition_read
    with pytest.raises(VitExplorerError, match="cannot be read off exactly"):
        decompose(evidence)
