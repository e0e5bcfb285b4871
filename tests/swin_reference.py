"""A Swin V1 block's attention written densely over its whole stage grid (Liu et al., 2021), independent of the window
cut: every pair of tokens is compared on the unshifted grid, a pair in different shifted windows gets no weight, and
the relative-position bias and the shifted windows' region mask are looked up from each token's coordinates."""

from __future__ import annotations

import torch


def dense_window_attention(block, x: torch.Tensor) -> torch.Tensor:
    """``[b, heads, H·W, H·W]``: the softmax block ``block`` (timm ``SwinTransformerBlock``) applies to its input ``x``
    ``[b, H, W, C]`` (before ``norm1``), query and key tokens on the unshifted grid, row by row."""
    attention = block.attn
    b, height, width, channels = x.shape
    heads = attention.num_heads
    tokens = block.norm1(x).reshape(b, height * width, channels)
    q, k, _ = attention.qkv(tokens).reshape(b, height * width, 3, heads, -1).permute(2, 0, 3, 1, 4)
    logits = (q * attention.scale) @ k.transpose(-1, -2)  # [b, heads, n, n]
    (win_h, win_w), (shift_h, shift_w) = block.window_size, block.shift_size
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    rows, cols = (rows.flatten() - shift_h) % height, (cols.flatten() - shift_w) % width  # on the shifted grid
    same_window = ((rows[:, None] // win_h == rows[None] // win_h) & (cols[:, None] // win_w == cols[None] // win_w))
    inside_r, inside_c = rows % win_h, cols % win_w
    index = ((inside_r[:, None] - inside_r[None] + win_h - 1) * (2 * win_w - 1) + inside_c[:, None] - inside_c[None]
             + win_w - 1)
    bias = attention.relative_position_bias_table[index.clamp(0, attention.relative_position_bias_table.shape[0] - 1)]
    logits = logits + bias.permute(2, 0, 1)
    if shift_h or shift_w:
        def region(position, size, window, shift):
            return (position >= size - window).long() + (position >= size - shift).long()

        label = region(rows, height, win_h, shift_h) * 3 + region(cols, width, win_w, shift_w)
        logits = logits + torch.where(label[:, None] == label[None], 0.0, -100.0)
    logits = logits.masked_fill(~same_window, float("-inf"))
    return logits.softmax(dim=-1)
