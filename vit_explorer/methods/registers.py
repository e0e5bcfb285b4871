"""Test-time registers (Jiang, Dravid, Efros & Gandelsman, NeurIPS 2025, "Vision Transformers Don't Need Trained
Registers"; their code: nickjiang2378/test-time-registers).

Large ViTs park global information in a few high-norm patch tokens (Darcet et al. 2023), which makes their attention
maps spotty; a register is an extra token meant to take that role. Jiang et al. trace the high-norm tokens to a few MLP
neurons ("register neurons") of the early layers, and move those neurons' activation at test time onto one added token,
which then acts as a register, without training.

**Calibration** (``calibrate``, their ``find_register_neurons``), over a folder of images:

1. each image's outlier tokens at the output of layer ``detect_layer``: here by the rule of the Token norms tab
   (``core.token_norms.RULE``: a patch whose norm exceeds the layer's median patch norm by 6 σ̂, σ̂ from the MAD), where
   the authors use a fixed norm per model (30 for CLIP ViT-B/16, 150 for DINOv2-L/14), so that one rule serves every
   model and a small model's unremarkable norms flag nothing;
2. for each image with at least one outlier, every neuron's mean absolute activation over those tokens, in every layer;
3. averaged over those images, every (layer, neuron) sorted by it, those of layers up to ``highest_layer`` kept, and the
   first ``top_k`` chosen. Where no image has an outlier, nothing is chosen (the authors' code stops there): the file
   says so and changes nothing.

**The edit** (``with_test_time_register``, their ``activate_on_registers`` with ``normal_values="zero"``, ``scale=1``):
one token of zeros enters after the position embedding (which it does not get), and at each chosen neuron's layer the
register's activation of that layer's chosen neurons is set to their signed largest activation over every token of the
image (the value of largest magnitude, its sign kept: their ``sign_max``, one number for the layer), and every patch's
to 0; prefix tokens keep theirs. The authors append the token after the patches; here it is the last prefix token
(named ``REGISTER``), so that every view, rollout and method treats it as a trained register. Attention does not see
where a token without a position embedding sits, so the model computes the same (tested against an oracle that appends
it). The edit changes the model: its logits move, and the app says by how much.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial

import torch
from torch import nn

from vit_explorer.core.images import ImageSource, load_image, model_view, to_pixels
from vit_explorer.core.register_neurons import REGISTER, RegisterNeurons
from vit_explorer.errors import VitExplorerError
from vit_explorer.methods.norms import flag_patches
from vit_explorer.models.base import LoadedModel
from vit_explorer.models.layout import TokenLayout

# the authors' settings for the models they published (their configs/): family → (a word of its names, its depth,
# (top_k, highest_layer, detect_layer))
PUBLISHED = {"DINOv2-L/14": ("dinov2", 24, (50, 17, -2)), "CLIP ViT-B/16": ("clip", 12, (10, 5, -1))}


def default_settings(model: LoadedModel) -> tuple[int, int, int, str]:
    """``(top_k, highest_layer, detect_layer, where they come from)``: the authors' settings for a model of the families
    they published, else those of their 12-layer CLIP scaled to the model's depth."""
    depth = model.map_shape[0]
    for family, (word, family_depth, settings) in PUBLISHED.items():
        if depth == family_depth and word in model.name.lower():
            return (*settings, f"the authors' settings for {family}")
    return 10, max(depth * 5 // 12, 0), -1, f"the authors' CLIP ViT-B/16 settings scaled to {depth} layers"


def batches(model: LoadedModel, images: list[ImageSource], size: int, fit: str) -> Iterator[torch.Tensor]:
    """The images as the model's pixels (fitted by ``fit``, ``images.FITS``), ``size`` at a time ``[b, 3, H, W]``."""
    for start in range(0, len(images), size):
        views = [model_view(load_image(image), model.preprocess, fit) for image in images[start : start + size]]
        yield torch.cat([to_pixels(view, model.preprocess) for view in views]).to(model.device)


def activations_and_norms(model: LoadedModel, pixels: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One forward pass: every layer's MLP activations ``[b, n, hidden]`` and every layer's output token norms
    ``[b, layers, n]``."""
    adapter, module = model.adapter, model.module
    activations: list[torch.Tensor | None] = [None] * model.map_shape[0]
    norms: list[torch.Tensor | None] = [None] * model.map_shape[0]

    def keep_activation(layer: int, _module: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
        activations[layer] = output.detach().float()

    def keep_norms(layer: int, hidden: torch.Tensor) -> None:
        norms[layer] = hidden.detach().float().norm(dim=-1)

    handles = [part.register_forward_hook(partial(keep_activation, layer))
               for layer, part in enumerate(adapter.mlp_activations(module))]
    try:
        with adapter.layer_outputs(module, keep_norms):
            model.logits(pixels)
    finally:
        for handle in handles:
            handle.remove()
    return activations, torch.stack(norms, dim=1)


def calibrate(model: LoadedModel, images: list[ImageSource], *, top_k: int | None = None, highest_layer: int | None = None,
              detect_layer: int | None = None, batch_size: int = 8, fit: str = "stretch",
              step: Callable[[], None] | None = None) -> RegisterNeurons:
    """Choose ``model``'s register neurons over ``images`` (module doc); settings left None take ``default_settings``.
    ``step`` is called after each image."""
    default_k, default_highest, default_detect, source = default_settings(model)
    top_k = default_k if top_k is None else top_k
    highest_layer = default_highest if highest_layer is None else highest_layer
    detect_layer = default_detect if detect_layer is None else detect_layer
    layers = model.map_shape[0]
    if not -layers <= detect_layer < layers or not 0 <= highest_layer < layers or top_k < 1:
        raise VitExplorerError(f"settings outside this model's {layers} layers: detect layer {detect_layer}, highest layer "
                               f"{highest_layer}, top k {top_k}")
    model.adapter.mlp_activations(model.module)  # a family without the neurons is refused before any pass
    scores, outliers = [], 0
    for pixels in batches(model, images, batch_size, fit):
        activations, norms = activations_and_norms(model, pixels)
        for image in range(len(pixels)):
            if step is not None:
                step()
            flagged = flag_patches(norms[image], model.layout)[2][detect_layer]  # [n]
            if not flagged.any():
                continue
            outliers += int(flagged.sum())
            # [layers, hidden]: each neuron's mean absolute activation over this image's outlier tokens
            scores.append(torch.stack([layer[image, flagged].abs().mean(dim=0) for layer in activations]))
    chosen: tuple[tuple[int, int, float], ...] = ()
    if scores:
        mean = torch.stack(scores).mean(dim=0)  # [layers, hidden]
        values, order = mean.flatten().sort(descending=True, stable=True)
        hidden = mean.shape[1]
        ranked = [(int(index) // hidden, int(index) % hidden, float(value)) for index, value in zip(order, values, strict=True)]
        chosen = tuple(entry for entry in ranked if entry[0] <= highest_layer)[:top_k]
    return RegisterNeurons(model=model.name, neurons=chosen, top_k=top_k, highest_layer=highest_layer,
                           detect_layer=detect_layer,
                           images=len(images), images_with_outliers=len(scores), outlier_tokens=outliers, settings=source)


def move_to_register(register: int, neurons: list[int], _module: nn.Module, _inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    """A forward hook on a layer's MLP activation ``[b, n, hidden]``: the register token (at ``register``) takes the
    signed largest activation of ``neurons`` over every token of its image, and the patches after it take 0."""
    if max(neurons) >= output.shape[-1]:
        raise VitExplorerError(f"register neuron {max(neurons)} is not among this layer's {output.shape[-1]} MLP neurons")
    chosen = output[:, :, neurons]  # [b, n, k]
    largest, smallest = chosen.amax(dim=(1, 2)), chosen.amin(dim=(1, 2))  # [b]
    signed = torch.where(largest.abs() > smallest.abs(), largest, smallest)  # ties go to the minimum, as ``sign_max``'s
    edited = output.clone()
    index = torch.tensor(neurons, device=output.device)
    edited[:, register, index] = signed[:, None].to(output.dtype)
    edited[:, register + 1 :, index] = 0
    return edited


def with_test_time_register(model: LoadedModel, neurons: RegisterNeurons) -> LoadedModel:
    """A copy of ``model`` with a test-time register (module doc): its layout gains ``REGISTER`` as its last prefix token.
    A file that chose no neurons gives ``model`` itself, unchanged."""
    if neurons.model != model.name:
        raise VitExplorerError(f"these register neurons were calibrated for {neurons.model}, not {model.name}: run "
                               f"`vit-explorer registers FOLDER --model {model.name}`")
    if neurons.changes_nothing:
        return model
    module = copy.deepcopy(model.module)
    activations = model.adapter.mlp_activations(module)
    register = model.layout.num_prefix_tokens  # the register goes right after the model's own prefix tokens
    model.adapter.add_prefix_token(module, register)
    for layer, indices in neurons.by_layer().items():
        if not 0 <= layer < len(activations):
            raise VitExplorerError(f"register neurons of layer {layer}: this model has {len(activations)} layers")
        activations[layer].register_forward_hook(partial(move_to_register, register, indices))
    layout = TokenLayout(prefix_names=(*model.layout.prefix_names, REGISTER), grid_hw=model.layout.grid_hw,
                         patch_hw=model.layout.patch_hw)
    return replace(model, module=module, name=f"{model.name} + test-time register", layout=layout,
                   notes=[*model.notes, f"test-time register ({len(neurons.neurons)} register neurons moved to it): "
                                        "the model is edited, and its logits change"])
