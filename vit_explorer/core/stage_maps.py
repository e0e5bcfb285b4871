"""The class maps of a stage of a windowed ViT (Swin): chained across every stage, then drawn on the stage's grid.

A ``swin_adapter.StageAdapter`` shows one stage as a plain ViT, so that every per-layer view reads it; but rollout, its
gradient-weighted form, relevance, LeGrad and AttnLRP explain the model's read-out, which draws on every stage. For such
a model the analysis keeps every block's window maps (``stage_rollout.WindowedAttention``, a few MB: each window's
``[heads, area, area]``), from one pass with the top class's gradients; the stage's views read its own blocks' windows
placed on its grid when asked (``map_store.WindowMaps``), and the class maps are chained from all of them
(``stage_rollout.stage_map``) or made by passes of their own (``stage_attribution``), on the first stage's grid, then
summed onto the stage's coarser one (each of its patches holds the first-stage patches it covers). Another target's
evidence is one more such pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vit_explorer.core.capture import read_norms, recording_norms
from vit_explorer.core.stage_attribution import legrad_blocks, stage_attnlrp, stage_legrad
from vit_explorer.core.stage_rollout import WindowedAttention, capture_windows, stage_map
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import LoadedModel
from vit_explorer.models.window_layout import WindowGeometry


def windows_of(model: LoadedModel, pixels: torch.Tensor, target: int | str | None) -> WindowedAttention:
    """Every block's window maps of one image (with ``target``, and that class's gradients) from one pass."""
    return capture_windows(model.module, model.adapter.window_adapter(model.module), pixels, target)


def windows_and_norms(model: LoadedModel, pixels: torch.Tensor,
                      target: int | str | None) -> tuple[WindowedAttention, tuple[torch.Tensor, ...]]:
    """``windows_of`` with, from the same pass, the stage's token norms, output tokens and layer tokens
    (``capture.read_norms``): everything an analysis of the stage keeps, without its grid's n × n maps."""
    with recording_norms(model.module, model.adapter, True) as recorded:
        windows = windows_of(model, pixels, target)
    return windows, read_norms(recorded, model.module, model.adapter)


def stage_blocks(windows: WindowedAttention, grid_hw: tuple[int, int]) -> list[int]:
    """The blocks of the stage whose grid is ``grid_hw`` (the grids halve from stage to stage: one stage has each)."""
    return [block for block, geometry in enumerate(windows.geometries) if geometry.grid_hw == tuple(grid_hw)]


def stage_form(windows: WindowedAttention, grid_hw: tuple[int, int]) -> tuple[list[torch.Tensor], list[WindowGeometry]]:
    """The stage's window maps and geometry, what ``map_store.WindowMaps`` keeps."""
    blocks = stage_blocks(windows, grid_hw)
    return [windows.maps[block] for block in blocks], [windows.geometries[block] for block in blocks]


def head_importance(windows: WindowedAttention, grid_hw: tuple[int, int]) -> torch.Tensor:
    """Σ |∇A ⊙ A| per head of the stage's layers ``[layers, heads]`` (``relevance.layer_evidence``'s, from the windows:
    the grid's map holds nothing else)."""
    return torch.stack([(windows.gradients[block] * windows.maps[block]).abs().sum(dim=(1, 2, 3))
                        for block in stage_blocks(windows, grid_hw)])


def on_grid(first_stage: torch.Tensor, grid_hw: tuple[int, int]) -> torch.Tensor:
    """A map on the first stage's grid ``[H₀, W₀]`` summed onto a stage's grid ``[h, w]`` (each of its patches covers a
    block of first-stage patches)."""
    rows, cols = first_stage.shape[0] // grid_hw[0], first_stage.shape[1] // grid_hw[1]
    return (F.avg_pool2d(first_stage[None, None].float(), (rows, cols)) * (rows * cols))[0, 0]


def chained_map(windows: WindowedAttention, method: str, grid_hw: tuple[int, int], head_fusion: str = "mean",
                residual_weight: float = 0.5, discard_ratio: float = 0.0, start_layer: int = 0) -> torch.Tensor:
    """``rollout``, ``grad-rollout`` or ``relevance`` chained across every stage, on the stage's grid ``grid_hw``."""
    if discard_ratio or start_layer:
        raise VitExplorerError("across a Swin's stages every block is chained from the read-out down: a start layer and "
                               "a discard ratio are not applied; set them to 0")
    return on_grid(stage_map(windows, method, residual_weight, head_fusion), grid_hw)


def stage_model_map(model: LoadedModel, method: str, pixels: torch.Tensor, target: int) -> torch.Tensor:
    """LeGrad's or AttnLRP's map of class ``target`` chained across every stage, on ``model``'s stage grid."""
    windows = model.adapter.window_adapter(model.module)
    compute = {"legrad": stage_legrad, "attnlrp": stage_attnlrp}[method]
    first_stage = compute(model.module, windows, pixels.to(model.device), target)
    grid = on_grid(first_stage, model.layout.grid_hw)
    # LeGrad's map is on the last stage's grid, repeated: a coarser view of it holds its values, not their sums
    return grid / (first_stage.numel() / grid.numel()) if method == "legrad" else grid


def legrad_variant(model: LoadedModel) -> str:
    """The blocks LeGrad reads for a windowed model, in words for a caption."""
    windows = model.adapter.window_adapter(model.module)
    blocks = legrad_blocks(windows, model.module)
    return (f"the read-outs of blocks {blocks[0]}…{blocks[-1]}, the last stage's among the last two (the only width the "
            "final norm and head take)")
