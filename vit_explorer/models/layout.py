"""Where each token of a ViT sequence sits: prefix tokens first, then the patch grid row by row."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vit_explorer.errors import VitExplorerError


@dataclass(frozen=True)
class TokenLayout:
    """The token layout of one model at one input size, read from the model, never from √n.

    Attributes:
        prefix_names: names of the tokens before the patches, in order
            (e.g. ``("cls",)``, ``("cls", "dist")``, ``("cls", "reg1", …, "reg4")``, or ``()``).
        grid_hw: rows and columns of the patch grid.
        patch_hw: height and width of one patch in input pixels.
    """

    prefix_names: tuple[str, ...]
    grid_hw: tuple[int, int]
    patch_hw: tuple[int, int]
    # counts every capture, map and picture reads, fixed with the layout: plain values, not recomputed on each read
    num_prefix_tokens: int = field(init=False)
    num_patches: int = field(init=False)
    num_tokens: int = field(init=False)
    has_class_token: bool = field(init=False)

    def __post_init__(self) -> None:
        counts = {"num_prefix_tokens": len(self.prefix_names), "num_patches": self.grid_hw[0] * self.grid_hw[1],
                  "has_class_token": "cls" in self.prefix_names}
        counts["num_tokens"] = counts["num_prefix_tokens"] + counts["num_patches"]
        for name, value in counts.items():
            object.__setattr__(self, name, value)  # frozen: set once, here

    @property
    def input_hw(self) -> tuple[int, int]:
        return (self.grid_hw[0] * self.patch_hw[0], self.grid_hw[1] * self.patch_hw[1])

    def patch_token(self, row: int, col: int) -> int:
        """The sequence index of the patch at grid position (row, col)."""
        rows, cols = self.grid_hw
        if not (0 <= row < rows and 0 <= col < cols):
            raise IndexError(f"patch at row {row}, col {col} is outside the {rows}×{cols} grid")
        return self.num_prefix_tokens + row * cols + col

    def token_patch(self, token: int) -> tuple[int, int] | None:
        """Grid position of a token, or None for a prefix token."""
        if token < self.num_prefix_tokens:
            return None
        return divmod(token - self.num_prefix_tokens, self.grid_hw[1])

    def token_name(self, token: int) -> str:
        """A prefix token's name, or where a patch is, row first and counted from 0: "patch at row 9, col 4"."""
        patch = self.token_patch(token)
        if patch is None:
            return self.prefix_names[token]
        return f"patch at row {patch[0]}, col {patch[1]}"

    def patch_map(self, row: torch.Tensor) -> torch.Tensor:
        """``[..., n]`` token weights → ``[..., grid_h, grid_w]`` weights on the patches."""
        if row.shape[-1] != self.num_tokens:
            raise ValueError(
                f"expected {self.num_tokens} tokens ({self.num_prefix_tokens} prefix + "
                f"{self.grid_hw[0]}×{self.grid_hw[1]} patches), got {row.shape[-1]}"
            )
        patches = row[..., self.num_prefix_tokens :]
        return patches.reshape(*row.shape[:-1], *self.grid_hw)


def check_input_hw(input_hw: tuple[int, int], patch_hw: tuple[int, int] | None) -> None:
    """Refuse an input size that is not a positive multiple of the patch size (both height × width): the patch grid
    would be empty or cut, and the model's own error would say so in its own words."""
    if patch_hw is None:
        return
    height, width = input_hw
    patch_h, patch_w = patch_hw
    if height < patch_h or width < patch_w or height % patch_h or width % patch_w:
        size = str(patch_h) if patch_h == patch_w else f"{patch_h}×{patch_w}"
        raise VitExplorerError(f"input size {height}×{width}: it must be a positive multiple of the patch size ({size}), "
                               f"e.g. {patch_h * max(1, round(height / patch_h))}×{patch_w * max(1, round(width / patch_w))}")
