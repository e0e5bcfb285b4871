from dataclasses import replace

import numpy as np
import pytest
import torch

from vit_explorer import VitExplorerError, analyze, load_model
from vit_explorer.core.analysis import ClassEvidence, class_evidence
from vit_explorer.core.capture import record_attention_gradients
from vit_explorer.core.images import to_pixels
from vit_explorer.core.maps import (
    CLASS_METHODS,
    RolloutOptions,
    attention_map,
    class_map,
    default_query,
    head_order,
    head_statistic,
    heads_view,
    overview,
    query_rows,
    rollout_map,
    top_heads,
)
from vit_explorer.core.relevance import relevance
from vit_explorer.core.rollout import attention_rollout
from vit_explorer.draw.pictures import grid_picture, map_picture, token_at, view_hw


@pytest.fixture
def model(tiny_checkpoint):
    return load_model(str(tiny_checkpoint))


@pytest.fixture
def analysis(model, image_file):
    return analyze(model, image_file)


def test_rollout_map_is_the_query_row_of_the_full_rollout(analysis):
    options = RolloutOptions(head_fusion="max", discard_ratio=0.2, start_layer=1, residual_weight=0.4)
    full = attention_rollout(analysis.attentions, "max", 0.2, 1, 0.4).numpy()
    for query in (0, 5, 16):
        np.testing.assert_allclose(rollout_map(analysis, query, options), full[query, 1:].reshape(4, 4), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(rollout_map(analysis, None, options), full[1:, 1:].mean(0).reshape(4, 4), rtol=1e-5, atol=1e-7)


def test_query_rows_and_attention_map_read_the_right_rows(analysis):
    rows = query_rows(analysis, 7)
    np.testing.assert_array_equal(rows, analysis.attentions[:, :, 7, :])
    np.testing.assert_allclose(attention_map(analysis, 7, 2, 3), analysis.attentions[2, 3, 7, 1:].reshape(4, 4))
    np.testing.assert_allclose(attention_map(analysis, 7, 2, None), analysis.attentions[2, :, 7, 1:].mean(0).reshape(4, 4),
                               rtol=1e-6)
    assert query_rows(analysis, 7) is rows  # memoised on the analysis
    assert default_query(analysis) == 0


def test_heads_view_and_overview_are_the_raw_rows_in_the_ranking_order(analysis):
    raw = analysis.attentions  # [layers, heads, n, n], one class token and a 4 × 4 grid
    view = heads_view(analysis, 7, order_by="entropy")
    entropy = -(raw * raw.clamp_min(1e-30).log()).sum(-1).mean(-1)  # [layers, heads]: each head's mean row entropy
    assert view.query == 7 and view.order_by == "entropy" and view.maps.shape == (3, 4, 4, 4)
    for layer in range(3):
        for rank, head in enumerate(view.order[layer].tolist()):
            np.testing.assert_allclose(view.maps[layer, rank], raw[layer, head, 7, 1:].reshape(4, 4))
    assert torch.equal(view.order, entropy.argsort(dim=1, stable=True))
    first = overview(analysis, RolloutOptions(discard_ratio=0.2))
    assert first.heads.query == 0 and first.heads.order.tolist() == [[0, 1, 2, 3]] * 3
    np.testing.assert_allclose(first.heads.maps, raw[:, :, 0, 1:].reshape(3, 4, 4, 4))
    np.testing.assert_allclose(first.last_layer, raw[-1, :, 0, 1:].mean(0).reshape(4, 4), rtol=1e-6)
    full = attention_rollout(raw, "mean", 0.2, 0, 0.5)
    np.testing.assert_allclose(first.rollout, full[0, 1:].reshape(4, 4), rtol=1e-5, atol=1e-7)


def test_heads_ordered_by_entropy_ascend_in_every_layer(analysis):
    order = head_order(analysis, "entropy")
    entropy = head_statistic(analysis, "entropy")
    assert (torch.take_along_dim(entropy, order, dim=1).diff(dim=1) >= 0).all()
    assert head_order(analysis, "none").tolist() == [[0, 1, 2, 3]] * 3


def test_grid_picture_changes_with_query_and_ordering_and_outlines_the_selected_head(analysis):
    base, geometry = grid_picture(analysis, heads_view(analysis, 0))
    assert base.shape[:2] == geometry.size_hw and (geometry.rows, geometry.cols) == (3, 4)
    other_query, _ = grid_picture(analysis, heads_view(analysis, 9))
    by_distance = heads_view(analysis, 0, order_by="distance")
    ordered, _ = grid_picture(analysis, by_distance)
    order = by_distance.order
    selected, _ = grid_picture(analysis, heads_view(analysis, 0), selected=(1, 2))
    mean_of_heads, _ = grid_picture(analysis, heads_view(analysis, 0), selected=(1, None))
    assert not np.array_equal(base, other_query)
    assert not np.array_equal(base, selected)
    # the mean of heads outlines its whole row: the gap left of the first tile and right of the last one
    y, x_first = geometry.tile_origin(1, 0)
    _, x_last = geometry.tile_origin(1, 3)
    gap = geometry.gap
    for picture, row_outlined in ((selected, False), (mean_of_heads, True)):
        assert (picture[y + 5, x_last + geometry.tile + gap // 2] == (0, 200, 255)).all() == row_outlined
        assert (picture[y + 5, x_first - 1 - gap // 2] == (0, 200, 255)).all() == row_outlined
    _, x_selected = geometry.tile_origin(1, 2)
    assert (selected[y + 5, x_selected - 1] == (0, 200, 255)).all()
    if not (order == np.arange(4)).all():
        assert not np.array_equal(base, ordered)


def test_clicks_map_to_patch_tokens(analysis):
    assert token_at(analysis, 0, 0, (384, 384)) == 1
    assert token_at(analysis, 383, 383, (384, 384)) == 16
    assert token_at(analysis, 100, 300, (384, 384)) == 1 + 3 * 4 + 1


def test_map_picture_has_a_colour_bar_below_and_outlines_the_query(analysis):
    grid_map = rollout_map(analysis, 6, RolloutOptions())
    with_query = map_picture(analysis, grid_map, cmap="viridis", overlay=True, query=6, unit="rollout weight")
    without = map_picture(analysis, grid_map, cmap="viridis", overlay=True, query=0, unit="rollout weight")
    height, width = view_hw(analysis)
    assert with_query.shape[:2] > (height, width - 1) and with_query.shape[1] == width  # the bar is under the map, not beside it
    assert not np.array_equal(with_query[:height], without[:height])


@pytest.mark.timm
def test_a_random_dinov2s_near_uniform_maps_are_drawn_near_uniform_and_called_flat():
    pytest.importorskip("timm")
    from conftest import photo

    from vit_explorer.draw import render

    torch.manual_seed(0)
    model = load_model("timm:vit_small_patch14_dinov2@random", input_hw=(98, 98), device="cpu")
    analysis = analyze(model, photo((98, 98)))
    for name, grid_map in {"cls": attention_map(analysis, 0, analysis.map_shape[0] - 1, None),
                           "rollout": rollout_map(analysis, 0, RolloutOptions())}.items():
        values = grid_map.numpy()
        assert values.max() < 1.25 * values.min(), name  # the model knows nothing: every patch about 1/n (measured ≤ 16% apart)
        assert render.flat_note(grid_map).startswith("flat: max only"), name
        height, width = view_hw(analysis)
        picture = map_picture(analysis, grid_map, cmap="gray", overlay=False, query=None, unit="attention weight")
        assert picture[:height, :width].min() > 200, name  # near white, not stretched over black…white


def test_the_analysis_layer_is_torch_and_pictures_are_numpy_from_the_render_boundary(model, analysis, image_file, maps_only):
    evidence = class_evidence(model, analysis)
    compact = analyze(model, image_file, memory_budget=1)
    computed = {
        "attentions": analysis.attentions,
        "logits": analysis.logits,
        "token norms": analysis.token_norms,
        "rollout map": rollout_map(analysis, 0, RolloutOptions()),
        "relevance map": class_map(analysis, "relevance", evidence, RolloutOptions()),
        "head statistic": head_statistic(analysis, "entropy"),
        "compact head statistic": head_statistic(compact, "entropy"),
        "compact rollout map": rollout_map(compact, 0, RolloutOptions()),
        "gradient importance": evidence.importance,
    }
    for name, values in computed.items():
        assert isinstance(values, torch.Tensor) and values.dtype == torch.float32 and values.device.type == "cpu", name
    assert compact.compact["head_mean"].dtype == torch.float16
    assert head_order(analysis, "entropy").dtype == torch.int64
    rollout = computed["rollout map"]
    picture = map_picture(analysis, rollout, cmap="inferno", overlay=True, query=0, unit="rollout weight")
    assert isinstance(picture, np.ndarray) and picture.dtype == np.uint8 and picture.ndim == 3 and picture.shape[2] == 3
    # the picture is of that map: the same values handed over as numpy draw the same pixels, another map does not
    assert np.array_equal(picture,
                          map_picture(analysis, rollout.numpy(), cmap="inferno", overlay=True, query=0, unit="rollout weight"))
    other = map_picture(analysis, computed["relevance map"], cmap="inferno", overlay=True, query=0, unit="rollout weight")
    assert not np.array_equal(picture, other)


def test_percentile_scale_spreads_a_heavy_tailed_map_over_the_colormap(analysis):
    grid_map = np.full((16, 16), 0.01, np.float32)  # a 16×16 patch grid: one patch is under 1% of them
    grid_map[6:10, 6:10] = np.linspace(0.02, 0.05, 16).reshape(4, 4)
    grid_map[0, 0] = 10.0  # one extreme patch
    height, _ = view_hw(analysis)
    linear = map_picture(analysis, grid_map, cmap="gray", overlay=False, query=None, unit="relevance")[:height]
    percentile = map_picture(analysis, grid_map, cmap="gray", overlay=False, query=None, unit="relevance",
                             scale="percentile")[:height]
    middle = (slice(height * 3 // 8, height * 5 // 8),) * 2  # the four graded patches
    assert np.ptp(linear[middle]) < 10  # on min–max, the extreme patch leaves them all one dark grey
    assert np.ptp(percentile[middle]) > 100  # clipped at the 99th percentile, they spread over the colormap


def test_class_maps_are_the_class_token_rows_of_their_chains(model, analysis):
    evidence = class_evidence(model, analysis, 3)
    _, attentions, gradients = record_attention_gradients(model, to_pixels(analysis.image, model.preprocess), torch.tensor([3]))
    expected = relevance(attentions[0], gradients[0]).numpy()[0, 1:].reshape(4, 4)
    np.testing.assert_allclose(class_map(analysis, "relevance", evidence, RolloutOptions()), expected, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(class_map(analysis, "rollout", evidence, RolloutOptions()),
                               rollout_map(analysis, 0, RolloutOptions()))
    np.testing.assert_allclose(class_map(analysis, "cls", None, RolloutOptions()), attention_map(analysis, 0, 2, None))
    assert class_evidence(model, analysis, "thing 3") is evidence  # kept on the analysis, found by name too
    other = class_evidence(model, analysis, 1)
    assert not np.allclose(class_map(analysis, "grad-rollout", evidence, RolloutOptions()),
                           class_map(analysis, "grad-rollout", other, RolloutOptions()))
    with pytest.raises(VitExplorerError, match="no classifier head"):
        class_map(analysis, "relevance", None, RolloutOptions())
    assert set(CLASS_METHODS) == {"relevance", "attnlrp", "legrad", "grad-rollout", "rollout", "cls"}


def test_targets_by_name_or_index_and_helpful_errors(analysis):
    assert analysis.class_index(None) == int(analysis.logits.argmax())
    assert analysis.class_index("THING 2") == 2 and analysis.class_index("4") == 4
    with pytest.raises(VitExplorerError, match="did you mean 'thing 1'"):
        analysis.class_index("thing1")
    with pytest.raises(VitExplorerError, match="outside 0…4"):
        analysis.class_index(9)


def test_heads_rank_by_gradient_importance_and_statistics(analysis):
    layers, heads = analysis.map_shape
    importance = torch.arange(layers * heads, dtype=torch.float32).reshape(layers, heads) % 5
    evidence = ClassEvidence(target=0, weighted=torch.zeros(layers, 17, 17), importance=importance)
    order = head_order(analysis, "gradient importance", evidence)
    assert (torch.take_along_dim(importance, order, dim=1).diff(dim=1) <= 0).all()  # most important first
    tops = top_heads(analysis, evidence, k=3)
    assert tops["gradient importance"] == [(1, 0, 4.0), (2, 1, 4.0), (0, 3, 3.0)]
    assert "gradient importance" not in top_heads(analysis, None)
    assert tops["entropy"][0][2] == pytest.approx(head_statistic(analysis, "entropy").min().item(), abs=1e-4)
    assert tops["distance"][0][2] <= tops["distance"][1][2] and tops["prefix share"][0][2] >= tops["prefix share"][1][2]
    with pytest.raises(VitExplorerError, match="needs a target class"):
        head_order(analysis, "gradient importance", None)


@pytest.mark.timm
def test_maps_that_carry_a_negligible_share_of_their_score_say_so_and_trained_ones_do_not():
    """Random-weight DINOv2 (LayerScale 1e-5) explains its embedding's length with maps of ~1e-5 of the score, drawn at
    full contrast; every class-specific method must say so. The shipped model's maps carry most of their score."""
    pytest.importorskip("timm")
    from PIL import Image

    from vit_explorer.core.analysis import pixels_of
    from vit_explorer.core.maps import CLASS_SPECIFIC, NEGLIGIBLE, RolloutOptions, class_map, map_strength
    from vit_explorer.core.targets import similarity_model
    from vit_explorer.draw.pictures import trust_note
    from vit_explorer.models.builtin import EXAMPLES

    backbone = load_model("timm:vit_small_patch14_dinov2@random", input_hw=(56, 56))
    image = Image.fromarray(np.random.default_rng(1).integers(0, 255, (56, 56, 3), dtype=np.uint8))
    # its own embedding: a patch's own token would be explained, rightly, by that patch itself (the blocks add nothing)
    scored = similarity_model(backbone, pixels_of(backbone, analyze(backbone, image)))
    analysis = analyze(scored, image)
    evidence = class_evidence(scored, analysis, None, CLASS_SPECIFIC)
    for method in CLASS_SPECIFIC:
        strength = map_strength(analysis, method, evidence, class_map(analysis, method, evidence, RolloutOptions()))
        assert strength < NEGLIGIBLE and trust_note(strength).startswith("negligible"), (method, strength)
    assert map_strength(analysis, "rollout", evidence, class_map(analysis, "rollout", evidence, RolloutOptions())) is None
    shipped = load_model("builtin:shapes")
    for path in sorted(EXAMPLES.glob("*.png")):
        trained = analyze(shipped, path)
        evidence = class_evidence(shipped, trained, None, CLASS_SPECIFIC)
        for method in CLASS_SPECIFIC:
            strength = map_strength(trained, method, evidence, class_map(trained, method, evidence, RolloutOptions()))
            assert strength >= NEGLIGIBLE and trust_note(strength) == "", (path.name, method, strength)


def test_a_signed_map_lies_over_the_image_in_grey(analysis):
    """A blue object under a diverging map must not read as "against": where the map is 0, the picture is grey."""
    from vit_explorer.draw.pictures import method_picture, view_hw

    blue = replace(analysis, image=np.broadcast_to(np.array([0, 0, 255], dtype=np.uint8), analysis.image.shape).copy())
    signed = torch.zeros(blue.grid)
    signed[0, 0], signed[-1, -1] = 1.0, -1.0
    picture = method_picture(blue, signed, "attnlrp")
    height, width = view_hw(blue)
    centre = picture[height // 2 - 4 : height // 2 + 4, width // 2 - 4 : width // 2 + 4].reshape(-1, 3).astype(int)
    assert np.abs(centre[:, 2] - centre[:, 0]).max() <= 12, centre[:3]  # grey, not the image's blue


def test_attnlrp_says_how_its_relevance_adds_up_to_the_score(model, analysis):
    """AttnLRP's map carries its conservation: the sum of its patches over the logit it explains, each read here
    independently; far from 1 the colour bar says red and blue do not add up to the score."""
    from vit_explorer.core.maps import RolloutOptions, class_map, conservation
    from vit_explorer.draw.pictures import trust_note

    evidence = class_evidence(model, analysis, None, ("attnlrp",))
    grid_map = class_map(analysis, "attnlrp", evidence, RolloutOptions())
    ratio = conservation(analysis, "attnlrp", evidence, grid_map)
    logits = model.logits(to_pixels(analysis.image, model.preprocess))
    expected = float(grid_map.double().sum()) / float(logits[0, evidence.target])
    assert ratio == pytest.approx(expected, rel=1e-4)
    assert conservation(analysis, "relevance", evidence, grid_map) is None
    assert trust_note(None, 1.1) == "relevance sums to 1.10× the score"
    assert trust_note(None, 3.0).endswith("(not conserved: red and blue do not add up to it)")


@pytest.mark.timm
def test_token_views_are_the_output_tokens_of_one_independent_pass():
    """The Tokens tab's numbers: cosine similarity and principal components of the output tokens, against tokens taken
    from a separate forward pass of the timm model (its own ``forward_features``, which ends in the final norm)."""
    timm = pytest.importorskip("timm")
    from PIL import Image

    from vit_explorer.core.maps import token_components, token_similarity

    model = load_model("timm:vit_small_patch14_reg4_dinov2@random", input_hw=(56, 56))
    with torch.no_grad():  # random DINOv2 blocks add almost nothing (LayerScale 1e-5): let them, so that layers differ
        for block in model.module.blocks:
            block.ls1.gamma.fill_(0.5)
            block.ls2.gamma.fill_(0.5)
    image = Image.fromarray(np.random.default_rng(7).integers(0, 255, (56, 56, 3), dtype=np.uint8))
    analysis = analyze(model, image)
    with torch.no_grad():
        tokens = model.module.forward_features(to_pixels(analysis.image, model.preprocess))[0]  # [n, dim], registers included
    assert isinstance(model.module, timm.models.VisionTransformer) and analysis.output_tokens.shape == tokens.shape
    query = analysis.layout.patch_token(2, 1)
    # 1 class + 4 registers
    expected = torch.nn.functional.cosine_similarity(tokens[5:], tokens[query][None], dim=-1).reshape(4, 4)
    torch.testing.assert_close(token_similarity(analysis, query), expected, rtol=1e-4, atol=1e-5)
    assert float(token_similarity(analysis, query)[2, 1]) == pytest.approx(1.0, abs=1e-5)
    # the components: numpy's SVD of the centred patch tokens, each scaled to 0…1, up to the sign of each component
    patches = tokens[5:].double().numpy()
    centred = patches - patches.mean(axis=0)
    _, _, directions = np.linalg.svd(centred, full_matrices=False)
    components = token_components(analysis).reshape(16, 3).double().numpy()
    for index in range(3):
        raw = centred @ directions[index]
        for signed in (raw, -raw):
            scaled = (signed - signed.min()) / (signed.max() - signed.min())
            if np.allclose(scaled, components[:, index], atol=1e-4):
                break
        else:
            raise AssertionError(f"component {index} is not the SVD's, either sign")
    # at an earlier layer: timm's own intermediate features (that layer's tokens through the final norm), kept in float16
    pixels = to_pixels(analysis.image, model.preprocess)
    with torch.no_grad():
        (early, early_prefix), = model.module.get_intermediate_layers(pixels, n=[1], norm=True, return_prefix_tokens=True)
    early = torch.cat([early_prefix, early], dim=1)[0]  # [n, dim]
    expected = torch.nn.functional.cosine_similarity(early[5:], early[query][None], dim=-1).reshape(4, 4)
    torch.testing.assert_close(token_similarity(analysis, query, layer=1), expected, rtol=0, atol=2e-3)
    assert float((token_similarity(analysis, query) - expected).abs().max()) > 0.03  # the layer is not the output
    assert token_components(analysis, layer=1).shape == (4, 4, 3)
    with pytest.raises(VitExplorerError, match="layers 0 to 11"):
        token_similarity(analysis, query, layer=12)
