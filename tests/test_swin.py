"""Swin: each block's window maps placed on its stage's grid (``models.window_layout``), checked against the dense
attention written from the paper (``swin_reference``), and rollout across stages (``core.stage_rollout``)."""

from __future__ import annotations

import pytest
import torch
from swin_reference import hf_block_attention, timm_block_attention

from vit_explorer.core.map_store import WindowMaps
from vit_explorer.core.stage_attribution import stage_attnlrp, stage_legrad
from vit_explorer.core.stage_rollout import capture_windows, stage_map
from vit_explorer.errors import VitExplorerError
from vit_explorer.models import load_model
from vit_explorer.models.layout import TokenLayout
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


def placed(maps: torch.Tensor, geometry: WindowGeometry) -> torch.Tensor:
    """One block's window maps ``[heads, windows, area, area]`` on its grid ``[heads, n, n]``, as an analysis of its stage
    places them (``map_store.WindowMaps``)."""
    layout = TokenLayout(prefix_names=(), grid_hw=geometry.grid_hw, patch_hw=geometry.patch_hw)
    return WindowMaps(layout, [maps], [geometry]).full_maps()[0]


def test_the_windows_round_trip_through_the_grid_and_a_patch_lands_in_its_shifted_window():
    geometry = WindowGeometry(grid_hw=(8, 12), window_hw=(4, 4), shift_hw=(2, 2), patch_hw=(4, 4))
    values = torch.arange(96.0).reshape(8, 12)
    assert torch.equal(geometry.from_windows(geometry.to_windows(values)), values)
    # after the roll by −2, patch (0, 0) sits at (6, 10): window row 1, column 2, inside position (2, 2)
    order, window, inside = geometry.placement()
    assert (window[0], inside[0]) == (1 * 3 + 2, 2 * 4 + 2) and order[5, 10] == 0
    assert geometry.to_windows(values)[5, 10] == values[0, 0]
    assert torch.equal(order[window, inside], torch.arange(96))  # every token placed once
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
        torch.testing.assert_close(placed(windowed.maps[block], windowed.geometries[block]), dense, atol=1e-6, rtol=1e-5)


def dense_factor(windowed, block: int, method: str, residual_weight: float = 0.5) -> torch.Tensor:
    """A block's factor for ``method`` as an n × n matrix, from its maps (and gradients) placed on the grid (the test's
    own chain): rownorm((1 − w)·Ā + w·I) of the head mean, or of Ē = mean over heads of (∇A ⊙ A)⁺, or I + Ē."""
    geometry = windowed.geometries[block]
    maps = placed(windowed.maps[block], geometry).double()
    n = maps.shape[-1]
    if method == "rollout":
        fused = maps.mean(0)
    else:
        fused = (placed(windowed.gradients[block], geometry).double() * maps).clamp_min(0).mean(0)
        if method == "relevance":
            return fused + torch.eye(n, dtype=torch.float64)
    mixed = (1 - residual_weight) * fused + residual_weight * torch.eye(n, dtype=torch.float64)
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


@pytest.mark.parametrize("method", ["rollout", "grad-rollout", "relevance"])
def test_each_chain_across_stages_equals_the_dense_product_read_by_the_average_pool(swin, method):
    torch.manual_seed(2)
    windowed = capture_windows(swin, TimmSwinAdapter(), torch.randn(1, 3, 64, 64), target=6)
    product = None
    for block, geometry in enumerate(windowed.geometries):
        factor = dense_factor(windowed, block, method)
        if product is not None and product.shape[0] != factor.shape[0]:
            product = merge_matrix(geometry.grid_hw) @ product
        product = factor if product is None else factor @ product
    expected = product.mean(dim=0).reshape(16, 16)  # the average pool's row
    chained = stage_map(windowed, method)
    assert chained.shape == (16, 16)
    # ∇A ⊙ A is formed in float32 before the float64 chain; the test forms it in float64
    torch.testing.assert_close(chained, expected, atol=1e-9, rtol=1e-7 if method == "rollout" else 1e-5)
    if method != "relevance":  # every rollout row is a distribution; relevance is not normalised
        torch.testing.assert_close(chained.sum(), torch.tensor(1.0, dtype=torch.float64))


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
        torch.testing.assert_close(placed(windowed.maps[block], geometry), dense, atol=1e-6, rtol=1e-5)


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
        dense = placed(windows, geometries[block])  # [heads, n, n]
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


# ---- a stage read as a plain ViT (``StageAdapter``), and its class maps chained across stages -----------------------


@pytest.fixture(scope="module")
def swin_model(swin):
    from vit_explorer.models.timm_loading import from_timm_module

    return from_timm_module(swin, "swin-test")


def test_a_swin_loads_as_its_first_stage_and_each_stage_is_a_view_of_its_own(swin_model):
    from vit_explorer.models import stage_view

    assert swin_model.layout.grid_hw == (16, 16) and swin_model.layout.prefix_names == () and swin_model.map_shape == (2, 2)
    assert swin_model.adapter.num_stages(swin_model.module) == 2
    last = stage_view(swin_model, 1)
    assert last.layout.grid_hw == (8, 8) and last.layout.patch_hw == (8, 8) and last.map_shape == (2, 4)
    assert any("stage 1 of stages 0…1: blocks 2…3 on a 8×8 grid of 8 px patches" in note for note in last.notes)
    with pytest.raises(VitExplorerError, match="stage 2 is outside"):
        stage_view(swin_model, 2)
    loaded = load_model("timm:swin_tiny_patch4_window7_224@random", device="cpu")
    assert loaded.layout.grid_hw == (56, 56) and loaded.map_shape == (2, 3)
    assert stage_view(loaded, 3).layout.grid_hw == (7, 7) and stage_view(loaded, 3).map_shape == (2, 24)


@pytest.mark.parametrize("stage", [0, 1])
def test_a_stages_maps_and_gradients_are_its_windows_placed_on_its_grid(swin_model, stage):
    from vit_explorer.core.capture import record_attention_gradients
    from vit_explorer.models import stage_view

    view = stage_view(swin_model, stage)
    torch.manual_seed(6)
    pixels = torch.randn(1, 3, 64, 64)
    logits, maps, gradients = record_attention_gradients(view, pixels, torch.tensor([3]))
    windowed = capture_windows(swin_model.module, TimmSwinAdapter(), pixels, target=3)
    torch.testing.assert_close(logits[0], windowed.logits, atol=1e-5, rtol=1e-5)
    first = 2 * stage
    for layer in range(2):
        geometry = windowed.geometries[first + layer]
        torch.testing.assert_close(maps[0, layer], placed(windowed.maps[first + layer], geometry))
        torch.testing.assert_close(gradients[0, layer], placed(windowed.gradients[first + layer], geometry),
                                   atol=1e-9, rtol=1e-5)


def test_removing_a_stage_head_equals_zeroing_its_windows(swin_model):
    from vit_explorer.methods.ablation import ablated_logits
    from vit_explorer.models import stage_view

    view = stage_view(swin_model, 1)
    torch.manual_seed(7)
    pixels = torch.randn(1, 3, 64, 64)
    attention = TimmSwinAdapter().blocks(swin_model.module)[3].attn  # stage 1's second block

    def without_head(_module, _inputs, output):
        return output * (torch.arange(4) != 2).to(output.dtype)[None, :, None, None]

    handle = attention.softmax.register_forward_hook(without_head)
    try:
        with torch.no_grad():
            attention.fused_attn = False
            expected = swin_model.module(pixels)
    finally:
        handle.remove()
    logits = ablated_logits(view, pixels, [[], [(1, 2)]])
    torch.testing.assert_close(logits[1:], expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits[0], logits[1], atol=1e-4)


@pytest.mark.parametrize("stage", [0, 1])
def test_every_class_map_of_a_stage_is_chained_across_every_stage_and_drawn_on_its_grid(swin_model, stage):
    from conftest import photo

    from vit_explorer import explain
    from vit_explorer.core.analysis import analyze, pixels_of
    from vit_explorer.models import stage_view

    view = stage_view(swin_model, stage)
    image = photo((64, 64), seed=8)
    pixels = pixels_of(view, analyze(view, image, explain=False))
    target = int(swin_model.module(pixels).argmax())
    windowed = capture_windows(swin_model.module, TimmSwinAdapter(), pixels, target=target)
    side = 16 >> stage

    def pooled(first_stage, mean=False):
        summed = first_stage.double().reshape(side, 16 // side, side, 16 // side).sum(dim=(1, 3))
        return summed / (16 // side) ** 2 if mean else summed

    expected = {"rollout": pooled(stage_map(windowed, "rollout")),
                "grad-rollout": pooled(stage_map(windowed, "grad-rollout")),
                "relevance": pooled(stage_map(windowed, "relevance")),
                "legrad": pooled(stage_legrad(swin_model.module, TimmSwinAdapter(), pixels, target), mean=True),
                "attnlrp": pooled(stage_attnlrp(swin_model.module, TimmSwinAdapter(), pixels, target))}
    for method, wanted in expected.items():
        explained = explain(image, view, method)
        assert explained.map.shape == (side, side), method
        torch.testing.assert_close(explained.map.double(), wanted, atol=1e-7, rtol=1e-4, msg=method)
    with pytest.raises(VitExplorerError, match="a start layer and a discard ratio are not applied"):
        from vit_explorer.core.maps import RolloutOptions

        explain(image, view, "rollout", options=RolloutOptions(discard_ratio=0.5))


def test_hugging_face_swin_loads_as_stages_and_explains_across_them(tmp_path):
    from conftest import photo

    from vit_explorer import explain
    from vit_explorer.models import stage_view

    module = hf_swin("swin")
    module.save_pretrained(tmp_path / "swin")
    model = load_model(f"hf:{tmp_path / 'swin'}", device="cpu")
    assert model.layout.grid_hw == (16, 16) and model.map_shape == (2, 2)
    for method in ("rollout", "grad-rollout", "relevance", "legrad", "attnlrp"):
        explained = explain(photo((64, 64), seed=9), stage_view(model, 1), method)
        assert explained.map.shape == (8, 8) and torch.isfinite(explained.map).all(), method


def test_every_tab_of_the_app_opens_on_a_swin_stage(swin_model, tmp_path):
    from app_support import analysed_model, open_every_tab
    from conftest import photo

    photo((64, 64), seed=10).save(tmp_path / "upload.png")
    _, session, outputs = analysed_model(swin_model, "swin", tmp_path / "upload.png")
    assert "2 layers × 2 heads" in outputs["summary"] and "stage 0 of stages 0…1" in outputs["summary"]
    open_every_tab(session, {"Queries and keys": "attends within windows"})


def test_a_stage_is_named_by_its_spec_and_the_cache_reads_it_from_the_loaded_model(swin_model):
    from vit_explorer.models import stage_specs
    from vit_explorer.web.session import ModelCache, model_choices

    models = ModelCache()
    models.put("swin-test", swin_model)
    second = models.get("swin-test#stage=1")
    assert second.module is swin_model.module and second.name == "swin-test#stage=1" and second.layout.grid_hw == (8, 8)
    assert stage_specs(second) == ["swin-test#stage=0", "swin-test#stage=1"]
    assert stage_specs(load_model("builtin:shapes")) == []
    assert model_choices("swin-test", stage_specs(swin_model))[:3] == ["swin-test", "swin-test#stage=0", "swin-test#stage=1"]
    loaded = load_model("timm:swin_tiny_patch4_window7_224@random#stage=2", device="cpu")
    assert loaded.name == "timm:swin_tiny_patch4_window7_224@random#stage=2" and loaded.layout.grid_hw == (14, 14)
    with pytest.raises(VitExplorerError, match="a stage is a number"):
        load_model("builtin:shapes#stage=last")
    with pytest.raises(VitExplorerError, match="has one patch grid, not stages"):
        load_model("builtin:shapes#stage=1")


@pytest.mark.slow
def test_attnlrp_equals_lxt_on_the_same_hugging_face_swin(tmp_path):
    """LXT's own LayerNorm, GELU and CP-LRP attention patches on Hugging Face's Swin, in a process of its own
    (``lxt_swin_reference``), against ``stage_attnlrp`` on the same weights and input."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("lxt")
    transformers = pytest.importorskip("transformers")
    script = Path(__file__).with_name("lxt_swin_reference.py")
    out = tmp_path / "reference.pt"
    subprocess.run([sys.executable, str(script), str(out)], check=True, capture_output=True)
    reference = torch.load(out)
    sys.path.insert(0, str(script.parent))
    try:
        from lxt_swin_reference import CONFIG
    finally:
        sys.path.pop(0)
    module = transformers.SwinForImageClassification(transformers.SwinConfig(**CONFIG)).eval()
    module.load_state_dict(reference["state"])
    with torch.no_grad():
        assert float(module(pixel_values=reference["inputs"]).logits[0, reference["target"]]) == pytest.approx(
            reference["logit"], abs=1e-5)
    theirs = reference["relevance"][0].sum(dim=0).reshape(16, 4, 16, 4).sum(dim=(1, 3))
    assert theirs.abs().max() > 1e-2 and (theirs < 0).any() and (theirs > 0).any()  # spread and signed
    ours = stage_attnlrp(module, HFSwinAdapter(), reference["inputs"], reference["target"])
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)


def test_switching_stage_keeps_the_clicked_patch_where_it_was_on_the_image(swin_model, tmp_path):
    from app_support import CONTROLS, analysed_model
    from conftest import photo

    from vit_explorer.web.tabs.shared import FULL_OUTPUTS, on_model_change

    upload = tmp_path / "upload.png"
    photo((64, 64), seed=11).save(upload)
    models, session, _ = analysed_model(swin_model, "swin-test", upload)
    session.query = session.analysis.layout.patch_token(5, 9)  # of the 16 × 16 grid
    spec, _, *views = on_model_change(models, "swin-test#stage=1", "swin-test", str(upload), session, "Overview", *CONTROLS)
    switched = views[FULL_OUTPUTS.index("state")]
    assert spec == "swin-test#stage=1" and switched.analysis.grid == (8, 8)
    assert switched.query == switched.analysis.layout.patch_token(2, 4)  # the 8 × 8 patch that covers it
    session.query = None  # the default query stays the default
    _, _, *views = on_model_change(models, "swin-test#stage=1", "swin-test", str(upload), session, "Overview", *CONTROLS)
    assert views[FULL_OUTPUTS.index("state")].query is None


def test_what_windows_rule_out_is_refused_with_the_reason(swin_model):
    from conftest import photo

    from vit_explorer.core.analysis import analyze, class_evidence, pixels_of
    from vit_explorer.methods.patching import patch
    from vit_explorer.models import stage_view

    view = stage_view(swin_model, 1)
    analysis = analyze(view, photo((64, 64), seed=12))
    evidence = class_evidence(view, analysis, decompose=True)
    assert evidence.decomposition is None and "not split over heads" in evidence.not_decomposable
    pixels = pixels_of(view, analysis)
    with pytest.raises(VitExplorerError, match="heads meet window by window"):
        patch(view, pixels, pixels, target=0)
    with pytest.raises(VitExplorerError, match="whose width only the last stage has: choose stage 1"):
        from vit_explorer.core.legrad import legrad

        legrad(stage_view(swin_model, 0), pixels, 0)


@pytest.mark.parametrize("stage", [0, 1])
def test_an_analysis_of_a_stage_keeps_windows_and_reads_as_the_dense_maps_would(swin_model, stage):
    """The analysis keeps every block's windows, never a grid's n × n; its store answers rows, blocks, statistics and
    the attention received exactly as a store of the dense maps (captured through the stage's placement) does."""
    from conftest import photo

    from vit_explorer.core.analysis import analyze, pixels_of
    from vit_explorer.core.capture import record_attention, record_attention_gradients
    from vit_explorer.core.map_store import FullMaps
    from vit_explorer.models import stage_view

    view = stage_view(swin_model, stage)
    analysis = analyze(view, photo((64, 64), seed=13))
    assert "window maps" in analysis.storage and analysis.attentions is None
    n = view.layout.num_tokens
    assert analysis.store.nbytes < 2 * 2 * 4 * n * n  # less than two layers' dense maps would be
    _, dense = record_attention(view, pixels_of(view, analysis))
    full = FullMaps(view.layout, dense[0])
    torch.testing.assert_close(analysis.store.full_maps(), dense[0])
    for token in (0, 17, n - 1):
        torch.testing.assert_close(analysis.store.token_rows(token), full.token_rows(token))
    for name in ("entropy", "distance"):
        torch.testing.assert_close(analysis.store.head_statistic(name), full.head_statistic(name), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(analysis.store.received_attention(), full.received_attention(), atol=1e-7, rtol=1e-5)
    evidence = next(iter(analysis.evidence.values()))
    assert evidence.weighted is None
    _, maps, gradients = record_attention_gradients(view, pixels_of(view, analysis), torch.tensor([evidence.target]))
    torch.testing.assert_close(evidence.importance, (gradients[0] * maps[0]).abs().sum(dim=(-2, -1)), atol=1e-9, rtol=1e-5)
