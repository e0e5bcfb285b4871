"""The AttnLRP oracle for Swin: LXT's own patches on Hugging Face's Swin, run as a script in a process of its own.

LXT ships no Swin rules, so the patch map is assembled from its own pieces as its model files assemble theirs (its GPT-2
``cp_LRP``): ``layer_norm_forward`` on every LayerNorm, ``non_linear_forward`` (the identity rule) on transformers' GELU,
and ``patch_cp_attention`` on ``modeling_swin``, which stops the gradient at the queries and keys of every attention
function it calls (CP-LRP). LXT patches classes for every model in the process, so it must never run inside the test
session; the package ``__init__``s, which import its BERT patches (transformers < 5), are passed by
(``lxt_reference.bare_lxt_packages``).

usage: python lxt_swin_reference.py OUT.pt — writes the config, the state dict, the input, the target and LXT's relevance
at every input value ``[1, 3, H, W]``.
"""

import sys
from functools import partial
from pathlib import Path

import torch
from lxt_reference import bare_lxt_packages

CONFIG = {"image_size": 64, "patch_size": 4, "embed_dim": 24, "depths": [2, 2], "num_heads": [2, 4], "window_size": 4,
          "num_labels": 10}


def lxt_swin_rules() -> dict:
    bare_lxt_packages()
    from lxt.efficient.patches import layer_norm_forward, non_linear_forward, patch_cp_attention, patch_method
    from transformers.activations import GELUActivation
    from transformers.models.swin import modeling_swin

    return {torch.nn.LayerNorm: partial(patch_method, layer_norm_forward),
            GELUActivation: partial(patch_method, non_linear_forward, keep_original=True),
            modeling_swin: patch_cp_attention}


def main(out: Path) -> None:
    import transformers

    torch.manual_seed(0)
    model = transformers.SwinForImageClassification(transformers.SwinConfig(**CONFIG)).eval()
    with torch.no_grad():  # every weight a value: the relative-position biases and the head start at zero or near it
        for name, parameter in model.named_parameters():
            if "relative_position_bias_table" in name or name.startswith("classifier"):
                parameter.normal_(0, 0.5)
    state = {name: value.clone() for name, value in model.state_dict().items()}
    for target_class, patch in lxt_swin_rules().items():
        assert patch(target_class), f"lxt could not patch {target_class}"
    inputs = torch.randn(1, 3, CONFIG["image_size"], CONFIG["image_size"], requires_grad=True)
    logits = model(pixel_values=inputs).logits
    target = int(logits.argmax())
    logits[0, target].backward()
    torch.save({"state": state, "inputs": inputs.detach(), "target": target, "logit": float(logits[0, target].detach()),
                "relevance": (inputs * inputs.grad).detach()}, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
