"""AttnLRP against its authors' code (LXT) on the same weights, and its conservation."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY, make_vit
from vit_explorer.core.attnlrp import attnlrp, input_relevance
from vit_explorer.models import adapter_for
from vit_explorer.models.timm_loading import from_timm_module

REFERENCE = Path(__file__).with_name("lxt_reference.py")


def timm_from_torchvision(state: dict[str, torch.Tensor], config: dict) -> torch.nn.Module:
    """A timm ViT holding a torchvision ViT's weights, mapped name by name."""
    timm = pytest.importorskip("timm")
    model = timm.create_model("vit_base_patch16_224", pretrained=False, img_size=config["image_size"],
                              patch_size=config["patch_size"],
                              embed_dim=config["hidden_dim"], depth=config["num_layers"], num_heads=config["num_heads"],
                              mlp_ratio=config["mlp_dim"] / config["hidden_dim"], num_classes=config["num_classes"]).eval()
    mapped = {"patch_embed.proj.weight": state["conv_proj.weight"], "patch_embed.proj.bias": state["conv_proj.bias"],
              "cls_token": state["class_token"], "pos_embed": state["encoder.pos_embedding"],
              "norm.weight": state["encoder.ln.weight"], "norm.bias": state["encoder.ln.bias"],
              "head.weight": state["heads.head.weight"], "head.bias": state["heads.head.bias"]}
    parts = {"ln_1": "norm1", "self_attention.in_proj": "attn.qkv", "self_attention.out_proj": "attn.proj", "ln_2": "norm2",
             "mlp.0": "mlp.fc1", "mlp.3": "mlp.fc2"}
    for layer in range(config["num_layers"]):
        for ours, theirs in parts.items():
            for kind in ("weight", "bias"):
                key = f"encoder.layers.encoder_layer_{layer}.{ours}{'_' if ours.endswith('in_proj') else '.'}{kind}"
                mapped[f"blocks.{layer}.{theirs}.{kind}"] = state[key]
    model.load_state_dict(mapped, strict=True)
    return model


@pytest.mark.slow
def test_attnlrp_equals_lxt_on_the_same_torchvision_weights(tmp_path):
    pytest.importorskip("lxt")
    pytest.importorskip("torchvision")
    out = tmp_path / "reference.pt"
    subprocess.run([sys.executable, str(REFERENCE), str(out)], check=True, capture_output=True)
    reference = torch.load(out)
    sys.path.insert(0, str(REFERENCE.parent))
    try:
        from lxt_reference import CONFIG
    finally:
        sys.path.pop(0)
    model = from_timm_module(timm_from_torchvision(reference["state"], CONFIG), "torchvision weights")
    with torch.no_grad():
        assert float(model.logits(reference["inputs"])[0, reference["target"]]) == pytest.approx(reference["logit"], abs=1e-5)
    ours = input_relevance(model, reference["inputs"], reference["target"])
    theirs = reference["relevance"]
    # the oracle is not trivially small: its relevance is spread and signed
    assert theirs.abs().max() > 1e-3 and (theirs < 0).any() and (theirs > 0).any()
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)
    patch = CONFIG["patch_size"]
    per_patch = theirs[0].sum(dim=0).reshape(4, patch, 4, patch).sum(dim=(1, 3))
    torch.testing.assert_close(attnlrp(model, reference["inputs"], reference["target"]), per_patch, rtol=1e-4, atol=1e-5)


def zero_biases(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "cls_token" in name or "pos_embed" in name:
                parameter.zero_()


def test_relevance_is_conserved_when_nothing_adds_a_bias():
    """With every bias, the class token and the position embedding at zero, the model is positively homogeneous under
    the rules, so the input relevance sums to the logit exactly."""
    from vit_explorer.models.base import LoadedModel, Preprocess

    module = make_vit(TINY, seed=3)
    zero_biases(module)
    adapter = adapter_for(module)
    model = LoadedModel(module=module, name="tiny", preprocess=Preprocess((64, 64)), layout=adapter.layout(module, (64, 64)),
                        adapter=adapter)
    pixels = torch.randn(1, 3, 64, 64)
    logits = model.logits(pixels)[0]
    for target in range(logits.numel()):
        assert float(input_relevance(model, pixels, target).sum()) == pytest.approx(float(logits[target]), rel=1e-4, abs=1e-5)


def test_the_rules_change_the_backward_pass_only_and_leave_no_hook_behind(tiny_vit):
    from vit_explorer.models.base import LoadedModel, Preprocess

    adapter = adapter_for(tiny_vit)
    model = LoadedModel(module=tiny_vit, name="tiny", preprocess=Preprocess((64, 64)), layout=adapter.layout(tiny_vit, (64, 64)),
                        adapter=adapter)
    pixels = torch.randn(1, 3, 64, 64, requires_grad=True)
    plain = tiny_vit(pixels)[0, 0]
    (gradient,) = torch.autograd.grad(plain, pixels)
    relevance = input_relevance(model, pixels, 0)
    # a rule that did nothing would give plain gradient × input
    assert not torch.allclose(relevance, (pixels * gradient).detach(), atol=1e-6)
    hooks = [len(part._forward_hooks) for part in tiny_vit.modules()]
    assert sum(hooks) == 0
    torch.testing.assert_close(tiny_vit(pixels)[0, 0], plain)
