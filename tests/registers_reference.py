"""An independent transcription of Jiang et al.'s test-time registers (nickjiang2378/test-time-registers:
``find_register_neurons`` in shared/algorithms.py, ``activate_on_registers`` and ``sign_max`` in shared/hook_fn.py and
shared/utils.py), written for these tests from what their code does, on this project's ``ViT``: one image at a time,
their fixed norm threshold over every token, the register appended after the patches as their models do, and their
hooks' arithmetic on the first image of the batch."""

from __future__ import annotations

import torch


def run_logging(vit, image, append_register: bool = False, edit=None):
    """One image ``[1, 3, H, W]`` through ``vit``: the logits, each layer's MLP activations ``[n, hidden]`` and each
    layer's output ``[n, dim]``; ``append_register`` appends one zero token after the position embedding, ``edit`` is
    their register-neuron hook by layer."""
    activations, outputs, handles = {}, {}, []
    if append_register:
        handles.append(vit.dropout.register_forward_hook(
            lambda _m, _i, x: torch.cat([x, torch.zeros(x.shape[0], 1, x.shape[2])], dim=1)))
    for layer, (_, feed_forward) in enumerate(vit.transformer.layers):
        gelu = feed_forward.net[2]
        if edit is not None and layer in edit:
            handles.append(gelu.register_forward_hook(edit[layer]))
        handles.append(gelu.register_forward_hook(
            lambda _m, _i, out, layer=layer: activations.__setitem__(layer, out[0].detach())))
        handles.append(feed_forward.register_forward_hook(
            lambda _m, inputs, out, layer=layer: outputs.__setitem__(layer, (out + inputs[0])[0].detach())))
    try:
        with torch.no_grad():
            logits = vit(image)
    finally:
        for handle in handles:
            handle.remove()
    layers = len(vit.transformer.layers)
    return logits, [activations[layer] for layer in range(layers)], [outputs[layer] for layer in range(layers)]


def find_register_neurons(vit, images, norm_threshold: float, detect_outliers_layer: int):
    """Their ranking: every (layer, neuron, score), best first."""
    per_image = []
    for image in images:
        _, activations, outputs = run_logging(vit, image)
        norms = torch.norm(outputs[detect_outliers_layer], dim=1)
        locations = torch.where(norms > norm_threshold)[0]
        if len(locations) == 0:
            continue
        per_image.append(torch.stack([torch.abs(layer[locations]).mean(dim=0) for layer in activations]))
    assert per_image, "no image had an outlier"
    mean = torch.stack(per_image).mean(dim=0)
    values, indices = torch.sort(mean.flatten(), descending=True)
    neurons = mean.shape[1]
    return [(int(index) // neurons, int(index) % neurons, float(value)) for index, value in zip(indices, values, strict=True)]


def sign_max(tensor):
    largest, smallest = torch.max(tensor), torch.min(tensor)
    return largest if abs(largest) > abs(smallest) else smallest


def activate_on_registers(neuron_indices, num_registers=1):
    """Their hook with ``normal_values="zero"`` and ``scale=1``: the registers (the last tokens) take the signed largest
    activation of the neurons over every token, and every token between the class token and them takes 0."""
    def hook(_module, _inputs, output):
        output[0, -num_registers:, neuron_indices] = sign_max(output[0, :, neuron_indices]).unsqueeze(0).expand(num_registers, -1)
        output[0, 1:-num_registers, neuron_indices] = 0
    return hook
