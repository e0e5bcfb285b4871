import numpy as np
import pytest
import torch
from conftest import photo

from vit_explorer import VitExplorerError, analyze, load_model, record_attention
from vit_explorer.core import maps
from vit_explorer.core.analysis import MODEL_MAPS, choose_storage, class_evidence, map_bytes, recompute_query_rows
from vit_explorer.core.images import model_view, to_pixels
from vit_explorer.draw import pictures
from vit_explorer.models.layout import TokenLayout


def test_analyze_captures_once_and_returns_cpu_arrays(tiny_checkpoint, image_file):
    model = load_model(str(tiny_checkpoint))
    result = analyze(model, image_file)
    assert result.image.shape == (64, 64, 3) and result.image.dtype == np.uint8
    assert result.attentions.shape == (3, 4, 17, 17) and result.attentions.dtype == torch.float32
    assert result.grid == (4, 4) and result.num_prefix_tokens == 1
    np.testing.assert_allclose(result.probs.sum(), 1.0, rtol=1e-6)
    top = result.top_k(5)
    assert [p.prob for p in top] == sorted((p.prob for p in top), reverse=True)
    assert top[0].label == f"thing {int(result.logits.argmax())}"
    pixels = to_pixels(model_view(photo().convert("RGB"), model.preprocess), model.preprocess)
    logits, attentions = record_attention(model, pixels)
    np.testing.assert_allclose(result.attentions, attentions[0].numpy())
    np.testing.assert_allclose(result.logits, logits[0].numpy())


def test_analyze_accepts_pil_images_and_bytes(tiny_checkpoint, image_file):
    model = load_model(str(tiny_checkpoint))
    from_path = analyze(model, image_file)
    from_bytes = analyze(model, image_file.read_bytes())
    from_pil = analyze(model, photo())
    np.testing.assert_array_equal(from_path.attentions, from_bytes.attentions)
    np.testing.assert_allclose(from_path.attentions, from_pil.attentions, atol=1e-6)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()  # capture left no global mode behind


def test_dinov2_large_at_518_would_not_hold_float32_maps():
    layout = TokenLayout(("cls", "reg1", "reg2", "reg3", "reg4"), (37, 37), (14, 14))
    full = map_bytes(layout, layers=24, heads=16)
    assert full > 2.7e9
    assert choose_storage(full, 1 << 30) == "compact"
    assert choose_storage(map_bytes(TokenLayout(("cls",), (14, 14), (16, 16)), 12, 12), 1 << 30) == "float32"
    assert choose_storage(100, 60) == "float16" and choose_storage(100, 40) == "compact"


def test_above_the_budget_a_classifier_keeps_queries_and_keys_and_every_patch_rows_without_the_model(tiny_checkpoint,
                                                                                                        image_file):
    """Maps within the budget are kept whole from the pass with the gradients; above it, the queries and keys of a fused
    forward (float16 below their own size), from which every view, every patch's rows included, is derived without the
    model. A family that records no inputs falls back to float16, then compact maps."""
    model = load_model(str(tiny_checkpoint))
    full = analyze(model, image_file)
    assert full.storage == "float32" and full.queries_keys is None
    derived = analyze(model, image_file, memory_budget=full.store.full_bytes - 1)
    assert derived.attentions is None and derived.queries_keys.queries.dtype == torch.float32
    assert derived.nbytes < full.nbytes and derived.store.full_bytes == full.store.full_bytes
    half = analyze(model, image_file, memory_budget=derived.store.nbytes // 2 + 1)
    assert half.queries_keys.queries.dtype == torch.float16 and "float16" in half.storage
    Exploding.armed = False
    for analysis, tolerance in ((derived, 1e-6), (half, 2e-3)):  # float16 queries and keys: about 1e-3 of a weight
        assert analysis.store.keeps_rows_of(9)
        for query in (0, None, 9):  # class token, mean of patch queries, a patch
            np.testing.assert_allclose(maps.query_rows(analysis, query), maps.query_rows(full, query), atol=tolerance)
        for name in ("entropy", "distance", "prefix share"):
            np.testing.assert_allclose(maps.head_statistic(analysis, name), maps.head_statistic(full, name), rtol=tolerance,
                                       atol=tolerance)
        for options in (maps.RolloutOptions(discard_ratio=0.2, start_layer=1), maps.RolloutOptions(head_fusion="max")):
            np.testing.assert_allclose(maps.rollout_map(analysis, 0, options), maps.rollout_map(full, 0, options), atol=tolerance)
        assert analysis.evidence.keys() == full.evidence.keys()  # the gradients took their own pass
        np.testing.assert_allclose(next(iter(analysis.evidence.values())).weighted, next(iter(full.evidence.values())).weighted,
                                   atol=1e-6)


def test_a_family_without_recorded_inputs_keeps_float16_then_compact_maps(tiny_checkpoint, image_file, monkeypatch):
    model = load_model(str(tiny_checkpoint))
    full = analyze(model, image_file)
    monkeypatch.setattr(type(model.adapter), "reads_attention_inputs", False)
    full_bytes = full.attentions.nbytes
    half = analyze(model, image_file, memory_budget=full_bytes - 1)
    assert half.attentions.dtype == torch.float16 and half.storage == "float16"
    np.testing.assert_allclose(half.attentions, full.attentions, atol=1e-3)

    compact = analyze(model, image_file, memory_budget=full_bytes // 4)
    assert compact.attentions is None and compact.nbytes < full.nbytes
    np.testing.assert_allclose(compact.compact["head_mean"], full.attentions.mean(1), atol=1e-3)
    with pytest.raises(VitExplorerError, match="recomputed with the model"):
        maps.query_rows(compact, 9)  # a patch query's rows were not kept: only the explicit call brings them
    recompute_query_rows(model, compact, 9)
    for query in (0, None, 9):  # class token, mean of patch queries, a patch (recomputed by a forward pass)
        np.testing.assert_allclose(maps.query_rows(compact, query), maps.query_rows(full, query), atol=1e-3)
    for name in ("entropy", "distance", "prefix share"):
        np.testing.assert_allclose(maps.head_statistic(compact, name), maps.head_statistic(full, name), rtol=1e-4, atol=1e-5)
    options = maps.RolloutOptions(discard_ratio=0.2, start_layer=1)
    np.testing.assert_allclose(maps.rollout_map(compact, 0, options), maps.rollout_map(full, 0, options), atol=2e-3)
    picture, _ = pictures.grid_picture(compact, maps.heads_view(compact, 9))
    assert picture.shape == pictures.grid_picture(full, maps.heads_view(full, 9))[0].shape
    with pytest.raises(VitExplorerError, match="by mean only"):
        maps.rollout_map(compact, 0, maps.RolloutOptions(head_fusion="max"))


class Exploding(torch.nn.Module):
    """Stands in for a model's attention: once armed, any forward pass through it raises."""

    armed = False

    def forward(self, x):
        if Exploding.armed:
            raise AssertionError("a view ran the model")
        return x


def test_one_forward_and_one_backward_pass_per_analysis_and_views_never_run_the_model(tiny_checkpoint, image_file, monkeypatch):
    model = load_model(str(tiny_checkpoint))
    forwards, backwards = [], []
    model.module.register_forward_pre_hook(lambda *_: forwards.append(1))
    gradient = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda *args, **kwargs: backwards.append(1) or gradient(*args, **kwargs))
    analysis = analyze(model, image_file)
    assert len(forwards) == 1 and len(backwards) == 1
    assert list(analysis.evidence) == [analysis.top_k(1)[0].index]  # the top class's evidence came with the pass
    assert class_evidence(model, analysis) is analysis.evidence[analysis.top_k(1)[0].index] and len(forwards) == 1

    evidence = analysis.evidence[analysis.top_k(1)[0].index]
    for method in MODEL_MAPS:  # a view cannot run the model: the map must be asked for, with the model, first
        with pytest.raises(VitExplorerError, match="takes passes of the model of its own"):
            maps.class_map(analysis, method, evidence, maps.RolloutOptions())
    assert len(forwards) == 1
    for count, method in enumerate(MODEL_MAPS, start=2):  # each of these runs the model once, when asked, then is kept
        assert class_evidence(model, analysis, None, (method,)) is evidence and len(forwards) == count
    class_evidence(model, analysis, None, tuple(MODEL_MAPS))
    assert len(forwards) == 1 + len(MODEL_MAPS) and set(evidence.method_maps) == set(MODEL_MAPS)
    model.module.transformer.layers[0][0].attend = torch.nn.Sequential(model.module.transformer.layers[0][0].attend, Exploding())
    Exploding.armed = True
    try:
        options = maps.RolloutOptions(discard_ratio=0.1)
        for method in maps.CLASS_METHODS:
            maps.class_map(analysis, method, evidence, options)
        for query in (0, None, 7):
            pictures.grid_picture(analysis, maps.heads_view(analysis, query, "gradient importance", evidence))
            maps.rollout_map(analysis, query, options)
        for name in maps.RANKINGS:
            maps.head_order(analysis, name, evidence)
        with pytest.raises(AssertionError, match="a view ran the model"):  # the trap is live
            model.logits(torch.zeros(1, 3, 64, 64))
    finally:
        Exploding.armed = False


@pytest.mark.timm
@pytest.mark.parametrize("spec,input_hw,backward", [
    ("timm:vit_small_patch14_reg4_dinov2@random", (56, 56), False),  # a backbone: nothing to differentiate
    ("timm:vit_tiny_patch16_224@random", None, True),  # a classifier: the top class's evidence from the same pass
])
def test_the_backward_pass_is_taken_only_when_there_is_a_class(spec, input_hw, backward):
    pytest.importorskip("timm")
    model = load_model(spec, input_hw=input_hw, device="cpu")
    seen = []
    handle = model.module.register_forward_pre_hook(lambda _module, _inputs: seen.append(torch.is_grad_enabled()))
    try:
        analysis = analyze(model, photo((64, 64)))
    finally:
        handle.remove()
    assert model.num_classes == analysis.num_classes == analysis.logits.numel()
    assert seen == [backward] and (len(analysis.evidence) == 1) == backward
