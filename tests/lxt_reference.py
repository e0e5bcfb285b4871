"""The AttnLRP oracle: LXT's own ViT rules on a torchvision ViT, run as a script in a process of its own.

LXT patches torch.nn's LayerNorm, GELU and MultiheadAttention classes for every model in the process, so it must
never run inside the test session. lxt 2.1's package ``__init__`` also imports its BERT patches, which need
transformers < 5: the ViT patches and rules are imported from their own files, past the package ``__init__``s.

usage: python lxt_reference.py OUT.pt — writes the torchvision state dict, the input, the target and LXT's relevance
at every input value ``[1, 3, H, W]``.
"""

import importlib.util
import sys
import types
from pathlib import Path

import torch

CONFIG = {"image_size": 32, "patch_size": 8, "num_layers": 2, "num_heads": 2, "hidden_dim": 32, "mlp_dim": 64, "num_classes": 5}


def bare_lxt_packages() -> None:
    """``lxt.efficient`` and ``lxt.efficient.models`` as bare packages, so that their files import past the ``__init__``s."""
    root = Path(importlib.util.find_spec("lxt").origin).parent
    for package in ("lxt.efficient", "lxt.efficient.models"):
        bare = types.ModuleType(package)
        bare.__path__ = [str(root / package.split(".", 1)[1].replace(".", "/"))]
        sys.modules[package] = bare


def lxt_vit_rules() -> dict:
    """lxt's ``cp_LRP`` patch map for torchvision's ViT (``lxt/efficient/models/vit_torch.py``)."""
    bare_lxt_packages()
    from lxt.efficient.models.vit_torch import cp_LRP

    return cp_LRP


def main(out: Path) -> None:
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(**CONFIG).eval()
    with torch.no_grad():  # torchvision starts the head and class token at zero: give every weight a value
        for name, parameter in model.named_parameters():
            base = 1.0 if ("ln" in name and name.endswith("weight")) else 0.0
            parameter.copy_(base + 0.3 * torch.randn_like(parameter))
    state = {name: value.clone() for name, value in model.state_dict().items()}
    for target_class, patch in lxt_vit_rules().items():
        assert patch(target_class), f"lxt could not patch {target_class}"
    inputs = torch.randn(1, 3, CONFIG["image_size"], CONFIG["image_size"], requires_grad=True)
    logits = model(inputs)
    target = int(logits.argmax())
    logits[0, target].backward()
    torch.save({"state": state, "inputs": inputs.detach(), "target": target, "logit": float(logits[0, target].detach()),
                "relevance": (inputs * inputs.grad).detach()}, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
