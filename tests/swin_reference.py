"""A Swin V1 block's attention written densely over its whole stage grid (Liu et al., 2021), independent of the window
cut: every pair of tokens is compared on the unshifted grid, a pair in different shifted windows gets no weight, and
the relative-position bias and the shifted windows' region mask are looked up from each token's coordinates."""

from __future__ import annotations

import torch


def dense_attention(q: torch.Tensor, k: torch.Tensor, table: torch.Tensor, grid_hw: tuple[int, int],
                    window_hw: tuple[int, int], shift_hw: tuple[int, int]) -> torch.Tensor:
    """``[b, heads, n, n]`` from scaled queries and keys ``[b, heads, n, d]`` of the grid's tokens row by row, and the
    relative-position bias table ``[(2·win_h − 1)·(2·win_w − 1), heads]``."""
    (height, width), (win_h, win_w), (shift_h, shift_w) = grid_hw, window_hw, shift_hw
    logits = q @ k.transpose(-1, -2)
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    rows, cols = (rows.flatten() - shift_h) % height, (cols.flatten() - shift_w) % width  # on the shifted grid
    same_window = (rows[:, None] // win_h == rows[None] // win_h) & (cols[:, None] // win_w == cols[None] // win_w)
    inside_r, inside_c = rows % win_h, cols % win_w
    index = ((inside_r[:, None] - inside_r[None] + win_h - 1) * (2 * win_w - 1) + inside_c[:, None] - inside_c[None]
             + win_w - 1)
    logits = logits + table[index.clamp(0, table.shape[0] - 1)].permute(2, 0, 1)
    if shift_h or shift_w:
        def region(position, size, window, shift):
            return (position >= size - window).long() + (position >= size - shift).long()

        label = region(rows, height, win_h, shift_h) * 3 + region(cols, width, win_w, shift_w)
        logits = logits + torch.where(label[:, None] == label[None], 0.0, -100.0)
    return logits.masked_fill(~same_window, float("-inf")).softmax(dim=-1)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, width = x.shape
    return x.reshape(b, n, heads, width // heads).transpose(1, 2)


def timm_block_attention(block, x: torch.Tensor) -> torch.Tensor:
    """The dense map of timm ``SwinTransformerBlock`` ``block`` for its input ``x`` ``[b, H, W, C]``."""
    attention = block.attn
    b, height, width, channels = x.shape
    tokens = block.norm1(x).reshape(b, height * width, channels)
    q, k, _ = (split_heads(part, attention.num_heads) for part in attention.qkv(tokens).chunk(3, dim=-1))
    return dense_attention(q * attention.scale, k, attention.relative_position_bias_table, (height, width),
                           tuple(block.window_size), tuple(block.shift_size))


def hf_block_attention(block, x: torch.Tensor, grid_hw: tuple[int, int], window: int, shift: int) -> torch.Tensor:
    """The dense map of Hugging Face ``SwinLayer`` ``block`` for its input ``x`` ``[b, n, C]`` on ``grid_hw``."""
    attention = block.attention
    tokens = block.layernorm_before(x)
    heads = attention.num_attention_heads
    q, k = split_heads(attention.q_proj(tokens), heads), split_heads(attention.k_proj(tokens), heads)
    return dense_attention(q * attention.scaling, k, attention.relative_position_bias.relative_position_bias_table,
                           grid_hw, (window, window), (shift, shift))
