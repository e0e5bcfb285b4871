"""LeGrad against a line-by-line transcription of its authors' formula (WalBouss/LeGrad, ``legrad/wrapper.py``,
``compute_legrad_clip``), written on timm's ViT blocks without the adapter, on the same weights."""

import dataclasses

import pytest
import torch
from einops import rearrange

from vit_explorer.core.legrad import LAST_LAYERS, legrad
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.timm_loading import from_timm_module


def min_max(logits: torch.Tensor) -> torch.Tensor:  # legrad/utils.py
    batch, prompts = logits.shape[:2]
    low = logits.reshape(batch, prompts, -1).min(dim=-1, keepdim=True)[0].unsqueeze(-1)
    high = logits.reshape(batch, prompts, -1).max(dim=-1, keepdim=True)[0].unsqueeze(-1)
    return (logits - low) / (high - low)


def reference_legrad(model: torch.nn.Module, image: torch.Tensor, target: int, layer_index: int = -2,
                     read_out=None) -> torch.Tensor:
    """``compute_legrad_clip`` with the class score of the classifier in place of the text similarity, or ``read_out``'s
    score of the normed tokens ``[b, n, dim]``."""
    blocks = list(model.blocks)
    starting_depth = layer_index if layer_index >= 0 else len(blocks) + layer_index
    # the hooked forward: each block keeps its attention map and its output (feat_post_mlp)
    x = model._pos_embed(model.patch_embed(image))
    attention_maps, feats = [], []
    for block in blocks:
        attn = block.attn
        b, n, c = x.shape
        qkv = attn.qkv(block.norm1(x)).reshape(b, n, 3, attn.num_heads, c // attn.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn_map = ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        attention_maps.append(attn_map)
        out = attn.proj((attn_map @ v).transpose(1, 2).reshape(b, n, c))
        x = x + block.ls1(out)
        x = x + block.ls2(block.mlp(block.norm2(x)))
        feats.append(x)
    num_tokens = feats[-1].shape[1] - 1
    w = h = int(num_tokens**0.5)
    accum_expl_map = 0
    for layer in range(starting_depth, len(blocks)):
        model.zero_grad()
        tokens = model.norm(feats[layer])
        one_hot = model.head(tokens[:, 0])[0, target] if read_out is None else read_out(tokens)
        grad = torch.autograd.grad(one_hot, [attention_maps[layer]], retain_graph=True, create_graph=True)[0]
        grad = torch.clamp(grad, min=0.0)
        image_relevance = grad.mean(dim=1).mean(dim=1)[:, 1:]  # average attn over [CLS] + patch tokens
        accum_expl_map += rearrange(image_relevance, "b (w h) -> 1 b w h", w=w, h=h)
    return min_max(accum_expl_map)[0, 0]


@pytest.fixture
def small_timm():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    module = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=7, img_size=64, depth=4).eval()
    return from_timm_module(module, "small timm")


def test_legrad_equals_the_reference_formula_on_the_same_weights(small_timm):
    torch.manual_seed(1)
    image = torch.randn(1, 3, 64, 64)
    for target in (0, 3, 6):
        ours = legrad(small_timm, image, target)
        assert ours.shape == (4, 4) and (ours >= 0).all()
        expected = reference_legrad(small_timm.module, image, target, layer_index=-LAST_LAYERS)
        torch.testing.assert_close((ours - ours.min()) / (ours.max() - ours.min()), expected.detach(), rtol=1e-4, atol=1e-5)
    # more layers give another map, and that one matches the reference's own layer_index too
    torch.testing.assert_close(min_max(legrad(small_timm, image, 2, last_layers=4)[None, None])[0, 0],
                               reference_legrad(small_timm.module, image, 2, layer_index=0).detach(), rtol=1e-4, atol=1e-5)


def test_legrad_refuses_more_layers_than_the_model_has(small_timm):
    with pytest.raises(VitExplorerError, match="1…4 layers"):
        legrad(small_timm, torch.randn(1, 3, 64, 64), 0, last_layers=5)


def test_a_clicked_patch_is_read_out_from_its_own_token_in_every_layer():
    """For the target *this patch*, every layer's read-out is the clicked token's projection on its own direction, and
    all layers are aggregated (``legrad.default_layers``); the caption says so."""
    timm = pytest.importorskip("timm")
    from vit_explorer.core.legrad import variant
    from vit_explorer.core.targets import similarity_model

    torch.manual_seed(0)
    module = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=64, depth=4).eval()
    backbone = from_timm_module(module, "small backbone")
    image = torch.randn(1, 3, 64, 64)
    target = similarity_model(backbone, image, (2, 1))
    token = 1 + 2 * 4 + 1
    reference = module.forward_features(image)[0, token].detach()
    ours = legrad(target, image, 0)
    direction = reference / reference.norm()
    expected = reference_legrad(module, image, 0, layer_index=0, read_out=lambda tokens: tokens[0, token] @ direction)
    torch.testing.assert_close((ours - ours.min()) / (ours.max() - ours.min()), expected.detach(), rtol=1e-4, atol=1e-5)
    assert variant(target) == "all 4 layers' read-outs"
    assert variant(similarity_model(backbone, image)) == "the last 2 of 4 layers' read-outs, the authors' default"


@pytest.mark.slow
def test_legrad_for_a_text_prompt_equals_the_authors_package_on_openclip(tmp_path):
    """A random OpenCLIP model and two prompts: our LeGrad map of each prompt, upsampled and min-max normalised as the
    authors do, equals ``legrad-torch``'s ``compute_legrad_clip`` on the same weights, image and text embeddings (run in
    its own process with the OpenCLIP it pins), to 1e-4."""
    import torch.nn.functional as F
    from legrad_reference import run as run_reference
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg
    from real_weights import cache_dir

    from vit_explorer.core.targets import PromptAdapter
    from vit_explorer.models.open_clip_adapter import from_open_clip

    config = {"embed_dim": 16, "vision": {"layers": 4, "width": 32, "head_width": 8, "patch_size": 8, "image_size": 32},
              "text": {"context_length": 16, "vocab_size": 300, "width": 32, "heads": 4, "layers": 2}}
    torch.manual_seed(5)
    model = CLIP(embed_dim=config["embed_dim"], vision_cfg=CLIPVisionCfg(**config["vision"]),
                 text_cfg=CLIPTextCfg(**config["text"]))
    loaded = from_open_clip(model.eval(), "open_clip:tiny", random_weights=True)
    texts = F.normalize(torch.randn(2, 16), dim=-1)  # [prompts, dim]: the text tower is not what is compared
    image = torch.randn(1, 3, 32, 32)
    torch.save({"config": config, "state": model.state_dict(), "image": image, "texts": texts, "layer_index": -LAST_LAYERS},
               tmp_path / "in.pt")
    run_reference(cache_dir(), tmp_path / "in.pt", tmp_path / "out.pt")
    theirs = torch.load(tmp_path / "out.pt")  # [1, prompts, H, W]
    prompted = dataclasses.replace(loaded, adapter=PromptAdapter(loaded.adapter, texts, scale=14.3, bias=-2.0), labels=["a", "b"])
    for prompt in range(2):
        ours = legrad(prompted, image, prompt)  # [grid_h, grid_w]
        upsampled = F.interpolate(ours[None, None], scale_factor=8, mode="bilinear")
        torch.testing.assert_close(min_max(upsampled)[0, 0], theirs[0, prompt], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(theirs[0, 0], theirs[0, 1], atol=1e-2)  # the two prompts' maps differ: the text matters
