"""Swin: each block's window maps placed on its stage's grid (``models.window_layout``), checked against the dense
attention written from the paper (``swin_reference``), and rollout across stages (``core.stage_rollout``)."""

from __future__ import annotations

import pytest
import torch
from swin_reference import hf_block_attention, timm_block_attention

from vit_explorer.core.stage_attribution import stage_attnlrp, stage_legrad
from vit_explorer.core.stage_rollout import capture_windows, stage_map, window_row
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.swin_adapter import HFSwinAdapter, TimmSwinAdapter
from vit_explorer.models.window_layout import WindowGeometry

timm = pytest.importorskip("timm")


@pytest.fixture(scope="module")
def swin():
    """A small Swin at 64 px: a 16 × 16 grid of 4 px patches in windows of 4 × 4 (shifted by 2 every other block), merged
    to 8 × 8; random relative-position biases, so that a bias looked up wrongly moves the maps."""
    torch.manual_seed(0)
    module = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=64, window_size=4, embed_dim=24,
                               depths=(2, 2), num_heads=(2, 4), num_classes=10).eval()
    with torch.no_grad():
        for block in TimmSwinAdapter().blocks(module):
            block.attn.relative_position_bias_table.normal_(0, 1.0)
    return module


def block_inputs(module, pixels: torch.Tensor) -> list[torch.Tensor]:
    inputs = []
    handles = [block.register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
               for block in TimmSwinAdapter().blocks(module)]
    try:
        with torch.no_grad():
            module(pixels)
    finally:
        for handle in handles:
            handle.remove()
    return inputs


def test_the_windows_round_trip_through_the_grid_and_a_patch_lands_in_its_shifted_window():
    geometry = WindowGeometry(grid_hw=(8, 12), window_hw=(4, 4), shift_hw=(2, 2), patch_hw=(4, 4))
    values = torch.arange(96.0).reshape(8, 12)
    assert torch.equal(geometry.from_windows(geometry.to_windows(values)), values)
    # after the roll by −2, patch (0, 0) sits at (6, 10): window row 1, column 2, inside position (2, 2)
    assert geometry.window_of(0, 0) == (1 * 3 + 2, 2 * 4 + 2)
    assert geometry.to_windows(values)[5, 10] == values[0, 0]
    with pytest.raises(VitExplorerError, match="not cut into whole"):
        WindowGeometry(grid_hw=(10, 12), window_hw=(4, 4), shift_hw=(0, 0), patch_hw=(4, 4))


def test_capture_placed_on_the_grid_equals_the_dense_attention_and_leaves_the_logits(swin):
    torch.manual_seed(1)
    pixels = torch.randn(1, 3, 64, 64)
    adapter = TimmSwinAdapter()
    windowed = capture_windows(swin, adapter, pixels)
    with torch.no_grad():
        torch.testing.assert_close(windowed.logits, swin(pixels)[0], atol=1e-5, rtol=1e-5)  # timm's own fused forward
    assert [g.grid_hw for g in windowed.geometries] == [(16, 16), (16, 16), (8, 8), (8, 8)]
    assert [g.shift_hw for g in windowed.geometries] == [(0, 0), (2, 2), (0, 0), (2, 2)]
    assert [g.patch_hw for g in windowed.geometries] == [(4, 4), (4, 4), (8, 8), (8, 8)]
    for block, (module_block, x) in enumerate(zip(adapter.blocks(swin), block_inputs(swin, pixels), strict=True)):
        with torch.no_grad():
            dense = timm_block_attention(module_block, x)[0]  # [heads, n, n]
        geometry, maps = windowed.geometries[block], windowed.maps[block]
        height, width = geometry.grid_hw
        for token in range(height * width):
            row, col = divmod(token, width)
            placed = window_row(maps, geometry, row, col)  # [heads, H, W]
            torch.testing.assert_close(placed.flatten(1), dense[:, token], atol=1e-6, rtol=1e-5)


def dense_factor(maps: torch.Tensor, geometry: WindowGeometry, residual_weight: float = 0.5) -> torch.Tensor:
    """A block's rollout factor as an n × n matrix, from its rows placed on the grid (the test's own chain)."""
    height, width = geometry.grid_hw
    mean = torch.stack([window_row(maps, geometry, *divmod(token, width)).mean(0).flatten()
                        for token in range(height * width)]).double()
    mixed = (1 - residual_weight) * mean + residual_weight * torch.eye(height * width, dtype=torch.float64)
    return mixed / mixed.sum(-1, keepdim=True)


def merge_matrix(coarse_hw: tuple[int, int]) -> torch.Tensor:
    """[coarse tokens, fine tokens]: each merged token draws 1/4 on each of its 2 × 2 tokens."""
    rows, cols = coarse_hw
    matrix = torch.zeros(rows * cols, 4 * rows * cols, dtype=torch.float64)
    for r in range(rows):
        for c in range(cols):
            for dr in range(2):
                for dc in range(2):
                    matrix[r * cols + c, (2 * r + dr) * (2 * cols) + 2 * c + dc] = 0.25
    return matrix


def test_rollout_across_stages_equals_the_dense_product_read_by_the_average_pool(swin):
    torch.manual_seed(2)
    windowed = capture_windows(swin, TimmSwinAdapter(), torch.randn(1, 3, 64, 64))
    product = None
    for maps, geometry in zip(windowed.maps, windowed.geometries, strict=True):
        factor = dense_factor(maps, geometry)
        if product is not None and product.shape[0] != factor.shape[0]:
            product = merge_matrix(geometry.grid_hw) @ product
        product = factor if product is None else factor @ product
    expected = product.mean(dim=0).reshape(16, 16)  # the average pool's row
    rollout = stage_map(windowed, "rollout")
    assert rollout.shape == (16, 16)
    torch.testing.assert_close(rollout, expected, atol=1e-9, rtol=1e-7)
    torch.testing.assert_close(rollout.sum(), torch.tensor(1.0, dtype=torch.float64))  # every row is a distribution


def test_the_class_specific_chains_take_the_gradients_of_the_class_logit(swin):
    torch.manual_seed(3)
    pixels = torch.randn(1, 3, 64, 64)
    windowed = capture_windows(swin, TimmSwinAdapter(), pixels, target=4)
    # the gradient of the logit with respect to one block's softmax, by a finite difference of that softmax: scale
    # one window's row of one head and compare the logit's change with the gradient's prediction
    block, head, window, query = 2, 1, 1, 5
    captured = {}

    def nudge(_module, _inputs, output):
        changed = output.clone()
        changed[window, head, query] *= 1.001
        return changed

    attention = TimmSwinAdapter().blocks(swin)[block].attn
    handle = attention.softmax.register_forward_hook(nudge)
    try:
        with torch.no_grad():
            attention.fused_attn = False
            captured["nudged"] = swin(pixels)[0, 4]
    finally:
        handle.remove()
    maps, grads = windowed.maps[block], windowed.gradients[block]
    predicted = (grads[head, window, query] * maps[head, window, query] * 0.001).sum()
    torch.testing.assert_close(captured["nudged"] - windowed.logits[4], predicted, atol=2e-6, rtol=2e-2)
    for method in ("grad-rollout", "relevance"):
        explained = stage_map(windowed, method)
        assert explained.shape == (16, 16) and torch.isfinite(explained).all() and (explained >= 0).all()
    with pytest.raises(VitExplorerError, match="explains a class"):
        stage_map(capture_windows(swin, TimmSwinAdapter(), pixels), "relevance")


def hf_swin(model_type: str):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config_class, model_class = {"swin": ("SwinConfig", "SwinForImageClassification"),
                                 "swinv2": ("Swinv2Config", "Swinv2ForImageClassification")}[model_type]
    config = getattr(transformers, config_class)(image_size=64, patch_size=4, embed_dim=24, depths=[2, 2],
                                                 num_heads=[2, 4], window_size=4, num_labels=10)
    module = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for parameter_name, parameter in module.named_parameters():
            if "relative_position_bias_table" in parameter_name:
                parameter.normal_(0, 1.0)
    return module


def test_hugging_face_swin_capture_equals_the_dense_attention_and_leaves_the_logits():
    module = hf_swin("swin")
    adapter = HFSwinAdapter()
    torch.manual_seed(1)
    pixels = torch.randn(1, 3, 64, 64)
    inputs = []
    handles = [block.register_forward_pre_hook(lambda _m, args: inputs.append(args[0])) for block in adapter.blocks(module)]
    windowed = capture_windows(module, adapter, pixels)
    for handle in handles:
        handle.remove()
    assert module.config._attn_implementation == "sdpa"  # switched back after the capture
    with torch.no_grad():
        torch.testing.assert_close(windowed.logits, module(pixel_values=pixels).logits[0], atol=1e-5, rtol=1e-5)
    assert [g.shift_hw for g in windowed.geometries] == [(0, 0), (2, 2), (0, 0), (2, 2)]
    for block, geometry in enumerate(windowed.geometries):
        window, shift = geometry.window_hw[0], geometry.shift_hw[0]
        with torch.no_grad():
            dense = hf_block_attention(adapter.blocks(module)[block], inputs[block], geometry.grid_hw, window, shift)[0]
        height, width = geometry.grid_hw
        for token in range(height * width):
            placed = window_row(windowed.maps[block], geometry, *divmod(token, width))
            torch.testing.assert_close(placed.flatten(1), dense[:, token], atol=1e-6, rtol=1e-5)


def test_hugging_face_swin_v2_capture_is_its_own_attention_output_and_leaves_the_logits():
    module = hf_swin("swinv2")
    torch.manual_seed(1)
    pixels = torch.randn(1, 3, 64, 64)
    windowed = capture_windows(module, HFSwinAdapter(), pixels)
    with torch.no_grad():
        own = module(pixel_values=pixels, output_attentions=True)
    torch.testing.assert_close(windowed.logits, own.logits[0], atol=1e-5, rtol=1e-5)
    # transformers returns each stage's last block's maps [windows, heads, area, area]: blocks 1 and 3
    assert len(own.attentions) == 2
    for block, attentions in zip((1, 3), own.attentions, strict=True):
        torch.testing.assert_close(windowed.maps[block], attentions.transpose(0, 1), atol=1e-6, rtol=1e-5)
    rollout = stage_map(windowed)
    assert rollout.shape == (16, 16) and torch.isclose(rollout.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_legrad_reads_the_last_stages_blocks_through_the_head_as_the_dense_formula_does(swin):
    """LeGrad by hand on the dense maps: each last-stage block's read-out (final norm, average pool, head) differentiated
    by its softmax, placed on the grid, clipped, averaged over heads and every query of the stage, then over blocks."""
    torch.manual_seed(4)
    pixels = torch.randn(1, 3, 64, 64)
    adapter = TimmSwinAdapter()
    blocks = adapter.blocks(swin)
    softmaxes, streams = {}, {}
    handles = [blocks[b].attn.softmax.register_forward_hook(lambda _m, _i, out, b=b: softmaxes.__setitem__(b, out))
               for b in (2, 3)]
    handles += [blocks[b].register_forward_hook(lambda _m, _i, out, b=b: streams.__setitem__(b, out)) for b in (2, 3)]
    for block in (2, 3):
        blocks[block].attn.fused_attn = False
    try:
        swin(pixels)
    finally:
        for handle in handles:
            handle.remove()
    geometries = adapter.geometries(swin)
    per_block = []
    for block in (2, 3):
        score = swin.head(swin.norm(streams[block]))[0, 7]
        (gradient,) = torch.autograd.grad(score, softmaxes[block], retain_graph=True)
        windows = adapter.by_window(gradient, 1)[0]  # [heads, windows, area, area]
        height, width = geometries[block].grid_hw
        dense = torch.stack([window_row(windows, geometries[block], *divmod(t, width)).flatten(1)
                             for t in range(height * width)], dim=1)  # [heads, n, n]
        per_block.append(dense.clamp_min(0).mean(dim=(0, 1)).reshape(height, width))
    expected = torch.stack(per_block).mean(0).repeat_interleave(2, 0).repeat_interleave(2, 1)
    torch.testing.assert_close(stage_legrad(swin, adapter, pixels, 7), expected, atol=1e-9, rtol=1e-5)


@pytest.mark.parametrize("family", ["timm", "hf-swin", "hf-swinv2"])
def test_attnlrp_conserves_the_logit_where_nothing_but_the_pixels_holds_relevance(swin, family):
    """With every bias zero, the rules leave a linear map from pixels to logit: the relevance sums to the logit. With
    the biases back, the map differs from plain gradient × input (the rules are in place)."""
    import copy

    model, adapter = {"timm": (swin, TimmSwinAdapter()), "hf-swin": (hf_swin("swin"), HFSwinAdapter()),
                      "hf-swinv2": (hf_swin("swinv2"), HFSwinAdapter())}[family]
    unbiased = copy.deepcopy(model)
    with torch.no_grad():
        for name, parameter in unbiased.named_parameters():
            if name.endswith("bias") and "relative_position" not in name and "logit_scale" not in name:
                parameter.zero_()
    torch.manual_seed(5)
    pixels = torch.randn(1, 3, 64, 64)
    relevance = stage_attnlrp(unbiased, adapter, pixels, 2)
    assert relevance.shape == (16, 16)
    with torch.no_grad():
        logit = adapter.logits(unbiased, pixels)[0, 2]
    torch.testing.assert_close(relevance.sum(), logit, atol=1e-4, rtol=1e-4)
    inputs = pixels.clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(adapter.logits(model, inputs)[0, 2], inputs)
    plain = torch.nn.functional.avg_pool2d((inputs * gradient).sum(1, keepdim=True), 4)[0, 0] * 16
    assert not torch.allclose(stage_attnlrp(model, adapter, pixels, 2), plain, atol=1e-3)
