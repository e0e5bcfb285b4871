"""How faithful a map is: deletion and insertion curves (Petsiuk et al., RISE, 2018) against random orders.

Deletion replaces the patches, most important first by the map, with a baseline (the image blurred,
or its mean colour) and records the target class's probability; a faithful map makes it fall fast
(low area under the curve). Insertion starts from the baseline and puts the patches back in the same
order; a faithful map makes the probability rise fast (high area). The same curves for random patch
orders say what chance gives, so a user sees whether a map beats it. All perturbed images of one
score run through the model in a few batches.

With the ``road`` baseline (Rong et al., ICML 2022), a removed patch is filled by ROAD's noisy linear imputation
(``road``) instead, so that the removal itself leaves no shape for the model to react to, and the two curves are
ROAD's: MoRF (most relevant removed first, in place of deletion) and LeRF (least relevant removed first, in place of
insertion: a faithful map keeps the probability high). Their combined score is (AUC_LeRF − AUC_MoRF) / 2.

A model with one output (a backbone's similarity target, ``core.targets``) has no probability: a softmax over one
score is 1 whatever the image. Its curves follow the score itself as a share of the unchanged image's score (divided
by its magnitude: 1 on the unchanged image, −1 where that score is negative), so that the areas, margins and verdict
read as they do for a probability, and lower still means less of the score.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image, ImageFilter

from vit_explorer.core.curves import (
    BLUR,
    DEFAULT_RANDOM_ORDERS,
    DEFAULT_STEPS,
    PROBABILITY,
    SHARE_OF_SCORE,
    FaithfulnessCurves,
    Protocol,
    Sweep,
    forward_passes,
    fractions_of,
)
from vit_explorer.core.images import to_pixels
from vit_explorer.errors import VitExplorerError
from vit_explorer.methods.road import impute
from vit_explorer.models.base import LoadedModel
from vit_explorer.models.layout import TokenLayout

# images per pass: small batches keep the perturbed images and the attention maps in cache, so on 2 cores 8 a batch
# scored twice as fast as 64 on the shipped model and a quarter faster than 32 on a ViT-B/16
BATCH_SIZE = 8


def batches(steps: int = DEFAULT_STEPS, random_orders: int = DEFAULT_RANDOM_ORDERS, batch_size: int = BATCH_SIZE,
            protocol: Protocol = BLUR) -> int:
    """How many batches ``deletion_insertion`` runs (a progress bar's length)."""
    return math.ceil(forward_passes(steps, random_orders, protocol) / batch_size)


def importance_order(grid_map: torch.Tensor) -> torch.Tensor:
    """Patch indices (row-major) from the most to the least important ``[patches]``; ties keep grid order."""
    return (-grid_map.double().flatten()).argsort(stable=True)


def step_masks(order: torch.Tensor, steps: int) -> torch.Tensor:
    """``[steps + 1, patches]`` bool: at step s, the first round(s/steps · patches) patches of ``order`` (halves
    rounded to even)."""
    patches = order.numel()
    counts = (torch.arange(steps + 1, dtype=torch.float64) * (patches / steps)).round()  # [steps + 1]
    rank = torch.empty(patches, dtype=torch.long)
    rank[order] = torch.arange(patches)
    return rank[None, :] < counts[:, None]


def pixel_masks(masks: torch.Tensor, layout: TokenLayout, input_hw: tuple[int, int]) -> torch.Tensor:
    """Patch masks ``[k, patches]`` bool → pixel masks ``[k, 1, H, W]`` float (1 where the patch is changed)."""
    rows, cols = layout.grid_hw
    height, width = input_hw
    pixel_rows = torch.arange(height) * rows // height  # the patch row of every pixel row
    pixel_cols = torch.arange(width) * cols // width
    patch_index = pixel_rows[:, None] * cols + pixel_cols[None, :]  # [H, W]
    return masks[:, patch_index].float()[:, None]


def baseline_view(view: np.ndarray, layout: TokenLayout, kind: str = "blur") -> np.ndarray:
    """What a removed patch shows ``[H, W, 3]`` uint8: the image blurred over about a patch, or its mean colour."""
    if kind == "blur":
        radius = max(layout.patch_hw)
        return np.asarray(Image.fromarray(view).filter(ImageFilter.GaussianBlur(radius)), dtype=np.uint8)
    if kind == "mean":
        return np.broadcast_to(view.reshape(-1, 3).mean(axis=0).round().astype(np.uint8), view.shape).copy()
    raise VitExplorerError(f"the image has no fill of kind {kind!r}; use blur or mean (ROAD imputes instead)")


def measure_of(model: LoadedModel) -> str:
    """What faithfulness curves of ``model`` follow (module doc)."""
    if model.num_classes == 0:
        raise VitExplorerError(f"{model.name} has no classifier head, so there is no class score to score maps by; "
                               "choose a similarity target for a backbone")
    return SHARE_OF_SCORE if model.num_classes == 1 else PROBABILITY


def target_probabilities(model: LoadedModel, pixels: torch.Tensor, target: int, measure: str) -> tuple[torch.Tensor,
                                                                                                       torch.Tensor]:
    """Softmax probability of ``target`` for every image of ``pixels`` ``[b, 3, H, W]`` → ``[b]`` (``measure``
    ``SHARE_OF_SCORE``: the score as it is, scaled later), and whether ``target`` is the top class ``[b]``."""
    logits = model.logits(pixels).float()
    values = logits[:, target] if measure == SHARE_OF_SCORE else torch.softmax(logits, dim=-1)[:, target]
    return values.cpu(), (logits.argmax(-1) == target).cpu()


def deletion_insertion(
    model: LoadedModel,
    view: np.ndarray,
    grid_map: torch.Tensor,
    target: int,
    *,
    steps: int = DEFAULT_STEPS,
    random_orders: int = DEFAULT_RANDOM_ORDERS,
    protocol: Protocol = BLUR,
    seed: int = 0,
    batch_size: int = BATCH_SIZE,
    step: Callable[[], None] | None = None,
) -> FaithfulnessCurves:
    """Deletion and insertion curves of ``grid_map`` ``[grid_h, grid_w]`` for the image ``view`` ``[H, W, 3]``
    (as the model sees it) and class ``target``, with ``random_orders`` random orders as the baseline; with the
    ``ROAD`` protocol, ROAD's MoRF and LeRF curves in their place (module doc), the noise drawn from ``seed``.

    Costs ``forward_passes(steps, random_orders, protocol)`` images through the model, in batches of ``batch_size``;
    ``step`` is called after each batch (``batches`` of them: a progress bar's advance).
    """
    check_map(model.layout, grid_map)
    randoms = random_patch_orders(model.layout, random_orders, seed)
    order = importance_order(grid_map)
    probs, tops = perturbed_probabilities(model, view, protocol.map_runs(order) + protocol.random_runs(randoms), target, steps,
                                          protocol, seed, batch_size, step)
    return curves_of(target, steps, protocol, probs[:2], tops[:2], probs[2:], tops[2:], measure_of(model))


def check_map(layout: TokenLayout, grid_map: torch.Tensor) -> None:
    if tuple(grid_map.shape) != layout.grid_hw:
        raise VitExplorerError(f"map of shape {tuple(grid_map.shape)} does not match the {layout.grid_hw} patch grid")


def random_patch_orders(layout: TokenLayout, count: int, seed: int) -> list[torch.Tensor]:
    """``count`` random patch orders ``[patches]``, drawn by numpy's generator from ``seed``: the orders every published
    figure was scored with (torch's generator would draw others), turned into tensors at once."""
    if count < 1:
        raise VitExplorerError("faithfulness needs at least one random order")
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.permutation(layout.num_patches)) for _ in range(count)]


def perturbed_probabilities(model: LoadedModel, view: np.ndarray, runs: list[Sweep], target: int, steps: int, protocol: Protocol,
                            seed: int, batch_size: int, step: Callable[[], None] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's probability (a one-output model: its score over the whole image's) ``[runs, steps + 1]`` and
    whether it is the top class (1.0 or 0.0) along each run, all the perturbed images through the model in batches of
    ``batch_size`` (``step`` after each)."""
    measure = measure_of(model)
    if steps < 1:
        raise VitExplorerError("faithfulness needs at least one step")
    layout = model.layout
    image = to_pixels(view, model.preprocess)[0]  # [3, H, W]
    masks = torch.stack([step_masks(order, steps) for order, _ in runs])  # [runs, steps + 1, patches]
    inserting = torch.tensor([mode == "insert" for _, mode in runs])  # [runs]
    generator = torch.Generator().manual_seed(seed)
    if protocol.imputes:
        changing, shared = masks, torch.empty(0, *image.shape)
    else:  # the steps between each curve's ends, which are the image and the fill for every curve
        blank = to_pixels(baseline_view(view, layout, protocol.name), model.preprocess)[0]
        changing, shared = masks[:, 1:-1], torch.stack([image, blank])  # [runs, steps - 1, patches], [2, 3, H, W]
    changing_inserting = inserting.repeat_interleave(changing.shape[1])  # [runs · changing steps]
    changing = changing.flatten(0, 1)

    def perturbed(rows: slice) -> torch.Tensor:
        changed = pixel_masks(changing[rows], layout, tuple(image.shape[1:]))  # [k, 1, H, W]
        if protocol.imputes:
            return impute(image.expand(len(changed), *image.shape), changed.bool(), generator=generator)
        # deletion shows the baseline on the changed patches, insertion the image only there
        return torch.where(changing_inserting[rows, None, None, None], blank * (1 - changed) + image * changed,
                           image * (1 - changed) + blank * changed)

    probs, tops = [], []
    for start in range(0, len(shared) + len(changing), batch_size):
        stop = start + batch_size
        rows = slice(max(start - len(shared), 0), max(stop - len(shared), 0))
        batch_probs, batch_tops = target_probabilities(model, torch.cat([shared[start:stop], perturbed(rows)]), target, measure)
        probs.append(batch_probs)
        tops.append(batch_tops)
        if step is not None:
            step()
    probs, tops = torch.cat(probs).double(), torch.cat(tops).double()
    if measure == SHARE_OF_SCORE:  # the first image is the unchanged one: the shared image, or ROAD's first run at step 0
        whole = abs(float(probs[0]))
        if whole == 0:
            raise VitExplorerError("the unchanged image's score is 0, so a map's effect on it has no scale; choose another "
                                   "target")
        probs = probs / whole
    if protocol.imputes:
        return probs.reshape(len(runs), steps + 1), tops.reshape(len(runs), steps + 1)
    # each curve: its start, its steps between, its end; deletion starts on the image (shared[0]), insertion on the baseline
    starts = inserting.long()
    return tuple(torch.cat([values[starts][:, None], values[2:].reshape(len(runs), steps - 1), values[1 - starts][:, None]],
                           dim=1)
                 for values in (probs, tops))


def curves_of(target: int, steps: int, protocol: Protocol, map_probs: torch.Tensor, map_tops: torch.Tensor,
              random_probs: torch.Tensor,
              random_tops: torch.Tensor, measure: str = PROBABILITY) -> FaithfulnessCurves:
    """One map's curves from its two runs ``[2, steps + 1]`` and chance's runs (``Protocol.random_runs``)."""
    if protocol.imputes:
        random_deletion = random_insertion = random_probs.mean(dim=0)
        random_deletion_top1 = random_tops.mean(dim=0)
    else:
        orders = len(random_probs) // 2
        random_deletion, random_insertion = random_probs[:orders].mean(dim=0), random_probs[orders:].mean(dim=0)
        random_deletion_top1 = random_tops[:orders].mean(dim=0)
    return FaithfulnessCurves(
        target=target,
        fractions=fractions_of(steps),
        deletion=map_probs[0],
        insertion=map_probs[1],
        random_deletion=random_deletion,
        random_insertion=random_insertion,
        deletion_top1=map_tops[0],
        random_deletion_top1=random_deletion_top1,
        protocol=protocol,
        measure=measure,
    )
