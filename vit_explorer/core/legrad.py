"""LeGrad (Bousselham et al., ICCV 2025): every layer's own read-out of the target, differentiated by that layer's attention.

For each aggregated layer l, the target's score is computed from the residual stream after layer l as if it were the
last (the final norm, the model's pooling and its head: ``CaptureAdapter.layer_readout``; for a CLIP prompt, as the
authors read CLIP: the final norm of the mean of all tokens, projected, ``layer_embedding``); its gradient with respect to
layer l's post-softmax map A_l ``[heads, n, n]`` is clipped at zero and averaged over heads and query tokens, giving
one weight per key token ``[n]``. The layers' maps are averaged and the prefix tokens dropped.

Which layers: the authors' reference (WalBouss/LeGrad, ``legrad/wrapper.py``) aggregates the layers from
``layer_index=-2`` on, i.e. the last two; ``LAST_LAYERS`` follows it for a read-out of the model's pooling (a class, an
image's embedding). A clicked patch's own token (``CaptureAdapter.read_token``) is read out from all layers: in the last
layer only that query's own row of attention moves its read-out, and from the last two layers on the real DINOv2 file
the clicked eye ranked 67th–227th of 256 patches (astronaut, chelsea); over all layers it ranks 2nd–3rd, and the
labelled photos nobody tuned on are in ``docs/methods.md``. ``variant`` names the choice for captions. One forward pass
with the maps in the graph, then one short backward per layer (from its read-out to its own map only).
"""

from __future__ import annotations

import torch

from vit_explorer.core.capture import LayerSink, capture_lock, resolve
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import LoadedModel

LAST_LAYERS = 2  # the reference's default ``layer_index=-2``: the last two layers


def default_layers(model: LoadedModel) -> int:
    """How many of the last layers LeGrad aggregates for ``model``'s target: all of them for one token's read-out, else
    the reference's ``LAST_LAYERS``."""
    num_layers = model.map_shape[0]
    return num_layers if model.adapter.read_token is not None else min(LAST_LAYERS, num_layers)


def variant(model: LoadedModel) -> str:
    """The layers LeGrad aggregates for ``model``'s target, in words for a caption."""
    layers, num_layers = default_layers(model), model.map_shape[0]
    if layers == num_layers:
        return f"all {num_layers} layers' read-outs"
    return f"the last {layers} of {num_layers} layers' read-outs, the authors' default"


def legrad(model: LoadedModel, pixels: torch.Tensor, target: int, last_layers: int | None = None) -> torch.Tensor:
    """The LeGrad map of class ``target`` for one image ``pixels`` ``[1, 3, H, W]`` over the patch grid ``[grid_h, grid_w]``
    (float32, CPU, non-negative), aggregated over the model's ``last_layers`` layers (default: ``default_layers``)."""
    module, adapter = resolve(model)
    num_layers = model.map_shape[0]
    last_layers = default_layers(model) if last_layers is None else last_layers
    if not 1 <= last_layers <= num_layers:
        raise VitExplorerError(f"LeGrad aggregates 1…{num_layers} layers of this model, not {last_layers}")
    streams: dict[int, torch.Tensor] = {}
    maps = LayerSink()
    with (capture_lock(module), torch.enable_grad(), adapter.layer_outputs(module, streams.__setitem__),
          adapter.attached(module, maps) as forward):
        forward(pixels.detach().requires_grad_(True))
        per_layer = []
        for layer in range(num_layers - last_layers, num_layers):
            score = adapter.layer_readout(module, streams[layer])[0, target]
            # only this layer's map: the read-out of layer l is explained by where layer l looked
            (gradient,) = torch.autograd.grad(score, maps[layer], retain_graph=True)  # [1, heads, n, n]
            per_layer.append(gradient[0].float().clamp_min(0.0).mean(dim=(0, 1)))  # [n]: over heads, then queries
    return model.layout.patch_map(torch.stack(per_layer).mean(dim=0).cpu())
