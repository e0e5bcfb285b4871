"""LeGrad (Bousselham et al., CVPR 2025): every layer's own read-out of the target, differentiated by that layer's attention.

For each aggregated layer l, the target's score is computed from the residual stream after layer l as if it were the
last (the final norm, the model's pooling and its head: ``CaptureAdapter.classify``); its gradient with respect to
layer l's post-softmax map A_l ``[heads, n, n]`` is clipped at zero and averaged over heads and query tokens, giving
one weight per key token ``[n]``. The layers' maps are averaged and the prefix tokens dropped.

Which layers: the authors' reference (WalBouss/LeGrad, ``legrad/wrapper.py``) aggregates the layers from
``layer_index=-2`` on, i.e. the last two; ``LAST_LAYERS`` follows it. One forward pass with the maps in the graph,
then one short backward per layer (from its read-out to its own map only).
"""

from __future__ import annotations

import torch

from vit_explorer.core.capture import LayerSink, capture_lock, resolve
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import LoadedModel

LAST_LAYERS = 2  # the reference's default ``layer_index=-2``: the last two layers


def legrad(model: LoadedModel, pixels: torch.Tensor, target: int, last_layers: int = LAST_LAYERS) -> torch.Tensor:
    """The LeGrad map of class ``target`` for one image ``pixels`` ``[1, 3, H, W]`` over the patch grid ``[grid_h, grid_w]``
    (float32, CPU, non-negative), aggregated over the model's ``last_layers`` layers."""
    module, adapter = resolve(model)
    num_layers = model.map_shape[0]
    if not 1 <= last_layers <= num_layers:
        raise VitExplorerError(f"LeGrad aggregates 1…{num_layers} layers of this model, not {last_layers}")
    streams: dict[int, torch.Tensor] = {}
    maps = LayerSink()
    with (capture_lock(module), torch.enable_grad(), adapter.layer_outputs(module, streams.__setitem__),
          adapter.attached(module, maps) as forward):
        forward(pixels.detach().requires_grad_(True))
        per_layer = []
        for layer in range(num_layers - last_layers, num_layers):
            score = adapter.classify(module, streams[layer])[0, target]
            # only this layer's map: the read-out of layer l is explained by where layer l looked
            (gradient,) = torch.autograd.grad(score, maps[layer], retain_graph=True)  # [1, heads, n, n]
            per_layer.append(gradient[0].float().clamp_min(0.0).mean(dim=(0, 1)))  # [n]: over heads, then queries
    return model.layout.patch_map(torch.stack(per_layer).mean(dim=0).cpu())
