"""Where each token of one windowed-attention block sits: a stage's patch grid, cut into windows after a cyclic shift.

A Swin block attends within windows of ``window_hw`` patches. Every other block first rolls its grid by ``-shift_hw``
(its windows straddle the previous block's), so that token (row, col) of the stage's grid sits at
((row − shift_h) mod H, (col − shift_w) mod W) of the shifted grid, which is cut into windows row by row. A block's maps
are ``[..., windows, window_area, window_area]`` in that order; ``to_windows`` and ``from_windows`` move values between
the grid and the windows, so that no caller repeats the shift and the cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vit_explorer.errors import VitExplorerError


@dataclass(frozen=True)
class WindowGeometry:
    """One block's windows on its stage's grid.

    Attributes:
        grid_hw: rows and columns of the stage's patch grid.
        window_hw: rows and columns of one window, in patches.
        shift_hw: the cyclic shift of the grid before it is cut ((0, 0): not shifted).
        patch_hw: one patch of this stage in input pixels (it doubles at each patch merging).
    """

    grid_hw: tuple[int, int]
    window_hw: tuple[int, int]
    shift_hw: tuple[int, int]
    patch_hw: tuple[int, int]

    def __post_init__(self) -> None:
        if any(size % window for size, window in zip(self.grid_hw, self.window_hw, strict=True)):
            raise VitExplorerError(f"a {self.grid_hw[0]}×{self.grid_hw[1]} grid is not cut into whole {self.window_hw[0]}×"
                                   f"{self.window_hw[1]} windows: the model pads it, and its padded tokens take attention "
                                   "that no patch holds; choose an input size whose every stage's grid is a multiple of the "
                                   "window")

    @property
    def windows_hw(self) -> tuple[int, int]:
        return self.grid_hw[0] // self.window_hw[0], self.grid_hw[1] // self.window_hw[1]

    @property
    def num_windows(self) -> int:
        return self.windows_hw[0] * self.windows_hw[1]

    @property
    def window_area(self) -> int:
        return self.window_hw[0] * self.window_hw[1]

    def to_windows(self, values: torch.Tensor) -> torch.Tensor:
        """Values on the grid ``[..., H, W]`` → the same values by window ``[..., windows, window_area]``."""
        (rows, cols), (win_h, win_w) = self.windows_hw, self.window_hw
        shifted = torch.roll(values, shifts=(-self.shift_hw[0], -self.shift_hw[1]), dims=(-2, -1))
        cut = shifted.reshape(*values.shape[:-2], rows, win_h, cols, win_w).transpose(-3, -2)
        return cut.reshape(*values.shape[:-2], rows * cols, win_h * win_w)

    def from_windows(self, values: torch.Tensor) -> torch.Tensor:
        """Values by window ``[..., windows, window_area]`` → the same values on the grid ``[..., H, W]``."""
        (rows, cols), (win_h, win_w) = self.windows_hw, self.window_hw
        joined = values.reshape(*values.shape[:-2], rows, cols, win_h, win_w).transpose(-3, -2)
        shifted = joined.reshape(*values.shape[:-2], *self.grid_hw)
        return torch.roll(shifted, shifts=self.shift_hw, dims=(-2, -1))

    def placement(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where the windows sit on the grid: the grid index (row by row) of each window position ``[windows, area]``,
        and each grid token's window ``[n]`` and position in it ``[n]``."""
        height, width = self.grid_hw
        order = self.to_windows(torch.arange(height * width).reshape(height, width))
        window, inside = torch.empty(height * width, dtype=torch.long), torch.empty(height * width, dtype=torch.long)
        window[order.flatten()] = torch.arange(order.shape[0]).repeat_interleave(order.shape[1])
        inside[order.flatten()] = torch.arange(order.shape[1]).repeat(order.shape[0])
        return order, window, inside
