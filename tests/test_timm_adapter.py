"""timm models with random weights: capture equals a manual q·kᵀ recomputation, fused attention is restored."""

import pytest
import torch
from conftest import assert_class_maps_work, photo

from vit_explorer import VitExplorerError, analyze, load_model, record_attention
from vit_explorer.core import maps
from vit_explorer.models import adapter_for
from vit_explorer.models.timm_adapter import TimmAdapter
from vit_explorer.models.timm_loading import from_timm_module

pytestmark = pytest.mark.timm
timm = pytest.importorskip("timm")


def build(name, **kwargs):
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, **kwargs).eval()


CASES = {
    "vit": (lambda: build("vit_tiny_patch16_224", depth=2, img_size=64, num_classes=7), ("cls",), (4, 4), (64, 64)),
    "deit-distilled": (lambda: build("deit_tiny_distilled_patch16_224", depth=2, img_size=64), ("cls", "dist"), (4, 4), (64, 64)),
    "dinov2-reg4-98px": (lambda: build("vit_small_patch14_reg4_dinov2", depth=2, img_size=98, num_classes=3),
                         ("cls", "reg1", "reg2", "reg3", "reg4"), (7, 7), (98, 98)),
    "no-class-token": (lambda: timm.models.VisionTransformer(img_size=64, patch_size=16, embed_dim=64, depth=2, num_heads=4,
                                                            class_token=False, global_pool="avg", num_classes=4).eval(), (),
                       (4, 4), (64, 64)),
    "dynamic-96x64": (lambda: build("vit_tiny_patch16_224", depth=2, img_size=64, dynamic_img_size=True), ("cls",), (6, 4),
                      (96, 64)),
}


def manual_maps(model, images):
    """softmax(q·kᵀ·scale) from each block's own qkv weights and its input, [b, layers, heads, n, n]."""
    inputs = []
    handles = [block.register_forward_pre_hook(lambda _m, args: inputs.append(args[0])) for block in model.blocks]
    try:
        with torch.no_grad():
            model(images)
    finally:
        for handle in handles:
            handle.remove()
    maps = []
    with torch.no_grad():
        for block, x in zip(model.blocks, inputs, strict=True):
            attn = block.attn
            b, n, _ = x.shape
            qkv = attn.qkv(block.norm1(x)).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
            q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])
            maps.append(torch.softmax((q * attn.scale) @ k.transpose(-2, -1), dim=-1))
    return torch.stack(maps, dim=1)


@pytest.mark.parametrize("case", CASES)
def test_capture_matches_manual_attention_and_keeps_logits(case):
    make, prefix, grid, input_hw = CASES[case]
    model = make()
    assert isinstance(adapter_for(model), TimmAdapter)
    assert all(block.attn.fused_attn for block in model.blocks)  # the fused path is what runs normally
    images = torch.randn(2, 3, *input_hw)
    with torch.no_grad():
        fused_logits = model(images)
    logits, attentions = record_attention(model, images)
    assert all(block.attn.fused_attn for block in model.blocks)  # restored
    torch.testing.assert_close(logits, fused_logits, rtol=1e-4, atol=1e-5)
    assert adapter_for(model).num_classes(model) == logits.shape[-1]  # known before any pass
    torch.testing.assert_close(attentions, manual_maps(model, images), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(attentions.sum(-1), torch.ones(attentions.shape[:-1]), atol=1e-5, rtol=0)
    layout = adapter_for(model).layout(model, input_hw)
    assert layout.prefix_names == prefix and layout.grid_hw == grid
    assert attentions.shape[-1] == layout.num_tokens


@pytest.mark.parametrize("case", ["vit", "dinov2-reg4-98px"])
def test_one_image_without_gradients_is_captured_in_place_with_the_same_maps_and_logits(case):
    """The app's pass (one image, no gradients, every map kept): the softmax is written straight into the kept stack."""
    from vit_explorer.core.capture import StackingSink, capture

    make, _, _, input_hw = CASES[case]
    model = make()
    images = torch.randn(1, 3, *input_hw)
    with torch.no_grad():
        fused_logits = model(images)
    seen = []  # where each map the capture's hook sees lives
    handles = [block.attn.attn_drop.register_forward_hook(lambda _m, _i, output: seen.append(output.data_ptr()))
               for block in model.blocks]
    sink = StackingSink(len(model.blocks))
    captured = capture(model, images, sink)
    for handle in handles:
        handle.remove()
    assert seen == [sink.stacked[:, layer].data_ptr() for layer in range(len(model.blocks))]  # no copy
    assert all("forward" not in block.attn.__dict__ for block in model.blocks)  # timm's own forward again
    torch.testing.assert_close(captured.logits, fused_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(captured.kept, manual_maps(model, images), rtol=1e-4, atol=1e-6)
    seen.clear()
    handles = [block.attn.attn_drop.register_forward_hook(lambda _m, _i, output: seen.append(output.data_ptr()))
               for block in model.blocks]
    graph_sink = StackingSink(len(model.blocks))
    with_gradients = capture(model, images, graph_sink, target=0)  # timm's own path: out= takes no gradients
    assert seen and not set(seen) & {graph_sink.stacked[:, layer].data_ptr() for layer in range(len(model.blocks))}
    torch.testing.assert_close(with_gradients.kept, captured.kept, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("case", CASES)
def test_class_specific_maps_and_faithfulness(case):
    make, _, _, input_hw = CASES[case]
    module = make()
    assert_class_maps_work(from_timm_module(module, f"timm-{case}", input_hw), photo((input_hw[1], input_hw[0])))
    assert all(block.attn.fused_attn for block in module.blocks)  # restored after the gradient pass too


def test_fused_attention_is_restored_when_the_forward_raises():
    model = CASES["vit"][0]()
    with pytest.raises(RuntimeError):
        record_attention(model, torch.randn(1, 5, 64, 64))
    assert all(block.attn.fused_attn for block in model.blocks)
    assert sum(len(m._forward_hooks) for m in model.modules()) == 0


def test_a_failure_inside_the_gradient_pass_restores_everything():
    from vit_explorer.core.capture import record_attention_gradients

    model = CASES["vit"][0]()

    def fail(*_):
        raise RuntimeError("injected failure in block 1")

    failing = model.blocks[1].mlp.register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="injected"):
        record_attention_gradients(model, torch.randn(1, 3, 64, 64))
    failing.remove()
    assert all(block.attn.fused_attn for block in model.blocks)
    assert sum(len(m._forward_hooks) for m in model.modules()) == 0
    logits, attentions, _ = record_attention_gradients(model, torch.randn(1, 3, 64, 64))  # and it works again
    assert attentions.shape[1] == 2


def test_analyze_and_views_on_registers_and_no_class_token(tmp_path):
    registers = from_timm_module(CASES["dinov2-reg4-98px"][0](), "dinov2-test")
    result = analyze(registers, photo((120, 90)))
    assert result.attentions.shape == (2, 6, 54, 54) and result.layout.num_prefix_tokens == 5
    assert maps.default_query(result) == 0
    assert maps.rollout_map(result, 3, maps.RolloutOptions()).shape == (7, 7)  # a register token as query
    no_cls = from_timm_module(CASES["no-class-token"][0](), "gap-test")
    assert no_cls.notes and "mean over patch queries" in no_cls.notes[0]
    result = analyze(no_cls, photo())
    assert maps.default_query(result) is None
    assert maps.rollout_map(result, None, maps.RolloutOptions()).shape == (4, 4)


def test_local_timm_safetensors_file_loads_offline(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = build("vit_tiny_patch16_224", depth=12)
    path = tmp_path / "vit_tiny.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    loaded = load_model(f"timm:vit_tiny_patch16_224@{path}")
    assert loaded.layout.grid_hw == (14, 14) and loaded.preprocess.input_hw == (224, 224)
    assert loaded.labels is not None and len(loaded.labels) == 1000
    images = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(loaded.module(images), source(images))


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_weights_run_at_the_position_grid_they_hold_unless_asked_and_resampling_is_said(tmp_path, monkeypatch, suffix):
    from safetensors.torch import save_file

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = build("vit_tiny_patch16_224", img_size=64)  # a 4×4 position grid, not the name's 14×14
    path = tmp_path / f"small{suffix}"
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    save_file(state, str(path)) if suffix == ".safetensors" else torch.save(state, path)
    native = load_model(f"timm:vit_tiny_patch16_224@{path}", device="cpu")
    assert native.preprocess.input_hw == (64, 64) and native.layout.grid_hw == (4, 4)
    assert any("runs at 64×64, the position grid the weights hold, not timm's 224×224" in note for note in native.notes)
    torch.testing.assert_close(native.module.pos_embed, source.pos_embed)  # not resampled
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(native.module(images), source(images))
    resized = load_model(f"timm:vit_tiny_patch16_224@{path}", input_hw=(128, 128), device="cpu")
    assert resized.layout.grid_hw == (8, 8)
    assert any("position embedding resampled by timm from the weights' 64×64 input to 128×128" in note for note in resized.notes)


# every family the issue trackers ask for that is not a plain ViT, and those that crashed the loader with an AttributeError
# (XCiT's, LeViT's and Hiera's patch embedding; Twins', CrossViT's and TNT's blocks without ``attn``): the class, the
# family the sentence names, and a word of the reason it gives
UNREADABLE = {
    "swinv2_cr_tiny_ns_224": ("SwinTransformerV2Cr", "Swin", "a variant whose blocks are not the ones read"),
    "pit_ti_224": ("PoolingVisionTransformer", "PiT", "pools its tokens"),
    "xcit_tiny_12_p16_224": ("Xcit", "XCiT", "over channels, not tokens"),
    "levit_128s": ("LevitDistilled", "LeViT", "convolutional stem"),
    "hiera_tiny_224": ("Hiera", "Hiera", "mask units"),
    "mvitv2_tiny": ("MultiScaleVit", "MViT", "pools its queries and keys"),
    "twins_svt_small": ("Twins", "Twins", "subsampled grid"),
    "crossvit_tiny_240": ("CrossVit", "CrossViT", "two token streams"),
    "tnt_s_patch16_224": ("TNT", "TNT", "inside each patch"),
    "convit_tiny": ("ConVit", "ConViT", "gated positional"),
    "pvt_v2_b0": ("PyramidVisionTransformerV2", "PVT", "spatially reduced grid"),
    "volo_d1_224": ("VOLO", "VOLO", "outlook attention"),
    "samvit_base_patch16": ("VisionTransformerSAM", "SAM encoder", "within windows"),
    "maxvit_tiny_tf_224": ("MaxxVit", "hybrid and hierarchical ViT", "no single patch grid"),
    "vitamin_small_224": ("VisionTransformer", "hybrid ViT", "convolutional stem's features"),
    "vit_small_patch16_18x2_224": ("VisionTransformer", "parallel-block ViT", "side by side"),
}


@pytest.mark.parametrize("name", sorted(UNREADABLE))
def test_a_model_that_is_not_a_plain_vit_is_refused_in_one_sentence_that_names_its_family_and_why(name):
    architecture, family, reason = UNREADABLE[name]
    with pytest.raises(VitExplorerError) as refused:
        load_model(f"timm:{name}@random")
    message = str(refused.value)
    assert message.startswith(f"timm:{name}@random: vit_explorer cannot read {architecture}, the {family} family, ")
    assert reason in message.split("; it reads")[0]
    assert "; it reads timm's plain ViTs" in message and "\n" not in message


def test_a_model_of_no_known_family_is_refused_with_what_the_loader_reads():
    with pytest.raises(VitExplorerError, match=r"^timm:resnet18@random: vit_explorer cannot read ResNet, which is not one "
                                               r"of the families this loader reads; it reads timm's plain ViTs"):
        load_model("timm:resnet18@random")


def test_an_eva_with_a_register_and_no_class_token_loads_with_the_register_as_its_one_prefix_token():
    """timm's ``Eva`` counts its registers only in ``reg_token``'s shape: the loader stopped on an assertion."""
    model = load_model("timm:vit_medium_patch16_rope_reg1_gap_256@random", input_hw=(64, 64))
    assert model.layout.prefix_names == ("reg1",) and model.layout.grid_hw == (4, 4)
    assert model.notes == ["no class token: maps use the mean over patch queries"]
    images = torch.randn(1, 3, 64, 64)
    logits, captured = record_attention(model, images)
    assert captured.shape[-2:] == (17, 17) and torch.allclose(captured.sum(-1), torch.ones(()), atol=1e-5)
    torch.testing.assert_close(logits, model.logits(images), atol=1e-5, rtol=1e-5)


def test_unknown_timm_name_is_a_user_error():
    from vit_explorer import VitExplorerError

    with pytest.raises(VitExplorerError, match="timm has no model 'not_a_model_xyz'"):
        load_model("timm:not_a_model_xyz")


def test_without_network_a_hub_name_says_how_to_load_a_local_file(tmp_path):
    import os
    import subprocess
    import sys

    image = tmp_path / "image.png"
    photo((64, 64)).save(image)
    # a fresh process: huggingface_hub reads its offline switch and cache folder once, at import
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty-cache")}
    result = subprocess.run([sys.executable, "-m", "vit_explorer.cli", "analyze", str(image), "--model",
                             "timm:vit_tiny_patch16_224",
                             "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[-1].startswith("vit-explorer: error: could not fetch weights for timm:vit_tiny_patch16_224")
    assert "timm:vit_tiny_patch16_224@/path/to/model.safetensors" in lines[-1]
    assert not (tmp_path / "out").exists()


def test_timm_weights_without_their_head_load_as_a_backbone_and_others_are_refused(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from vit_explorer import VitExplorerError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    state = {k: v.contiguous() for k, v in build("vit_tiny_patch16_224", depth=12).state_dict().items()}
    headless = {k: v for k, v in state.items() if not k.startswith("head.")}
    save_file(headless, str(tmp_path / "backbone.safetensors"))
    loaded = load_model(f"timm:vit_tiny_patch16_224@{tmp_path / 'backbone.safetensors'}", device="cpu")
    assert loaded.module.num_classes == 0 and loaded.labels is None
    assert loaded.notes
    assert loaded.notes[0].startswith("backbone: the weights have no classifier head ('head.weight', 'head.bias')")
    assert loaded.logits(torch.randn(1, 3, 224, 224)).shape == (1, 0)
    for name, tensor in headless.items():
        torch.testing.assert_close(loaded.module.state_dict()[name], tensor, msg=name)
    # without the head the load is still strict: a missing block parameter is named, not initialised
    del headless["blocks.7.mlp.fc2.bias"]
    save_file(headless, str(tmp_path / "broken.safetensors"))
    with pytest.raises(VitExplorerError,
                       match=r"lack 'blocks\.7\.mlp\.fc2\.bias', which would be initialised at random \(the classifier"):
        load_model(f"timm:vit_tiny_patch16_224@{tmp_path / 'broken.safetensors'}", device="cpu")
    del state["blocks.7.mlp.fc2.bias"]
    save_file(state, str(tmp_path / "broken-with-head.safetensors"))
    with pytest.raises(VitExplorerError, match=r"lack 'blocks\.7\.mlp\.fc2\.bias', which would be initialised at random$"):
        load_model(f"timm:vit_tiny_patch16_224@{tmp_path / 'broken-with-head.safetensors'}", device="cpu")
