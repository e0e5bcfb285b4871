"""Maps derived from queries and keys (``map_store.DerivedMaps``) equal the maps each family's explicit path computes, on
every family the tool loads, while the analysis's own pass stays on the model's fused path and gives its own logits."""

import numpy as np
import pytest
import torch
from conftest import photo

from vit_explorer import analyze, load_model, record_attention
from vit_explorer.core import map_store, maps
from vit_explorer.core.analysis import pixels_of
from vit_explorer.core.capture import InputsSink, InputStatisticsSink, capture
from vit_explorer.core.rollout import attention_rollout
from vit_explorer.core.statistics import HEAD_STATISTICS, head_statistics

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
pytest.importorskip("open_clip")

SMALL_HF = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}


def timm_model(name: str, **options):
    from vit_explorer.models.timm_loading import from_timm_module

    torch.manual_seed(0)
    return from_timm_module(timm.create_model(name, pretrained=False, depth=2, **options).eval(), f"timm:{name}@random")


def hf_model(model_class, config):
    from vit_explorer.models.hf_adapter import from_hf_module

    torch.manual_seed(0)
    return from_hf_module(model_class._from_config(config, attn_implementation="sdpa").eval(), "hf:tiny")


def clip_family(name: str):
    from test_clip_families import FAMILIES

    return FAMILIES[name]()[0]


FAMILIES = {
    "shipped": lambda: load_model(),
    "timm-vit": lambda: timm_model("vit_tiny_patch16_224", img_size=64, num_classes=5),
    "timm-deit": lambda: timm_model("deit_tiny_distilled_patch16_224", img_size=64),
    "timm-eva02-rope": lambda: timm_model("eva02_tiny_patch14_224", img_size=56),
    "timm-relpos": lambda: timm_model("vit_relpos_small_patch16_224", img_size=64),
    "timm-beit-relpos-bias": lambda: timm_model("beit_base_patch16_224", img_size=64),
    "timm-dinov2-registers": lambda: timm_model("vit_small_patch14_reg4_dinov2", img_size=56),
    # its attention-pooling head makes one more SDPA call, outside every block: not a layer's (it broke the pass once)
    "timm-siglip-pool-head": lambda: timm_model("vit_base_patch16_siglip_224", img_size=64, embed_dim=64, num_heads=4),
    "timm-eva-register-no-cls": lambda: timm_model("vit_medium_patch16_rope_reg1_gap_256", img_size=64),
    "hf-vit": lambda: hf_model(transformers.ViTForImageClassification,
                               transformers.ViTConfig(image_size=64, patch_size=16, num_labels=5, **SMALL_HF)),
    "hf-dinov2": lambda: hf_model(transformers.Dinov2Model, transformers.Dinov2Config(image_size=56, patch_size=14, **SMALL_HF)),
    "hf-clip": lambda: clip_family("hf-clip"),
    "open_clip": lambda: clip_family("open_clip"),
    "vit-pytorch": lambda: vit_pytorch_model(),
}


def vit_pytorch_model():
    from vit_pytorch import ViT as LucidViT

    from vit_explorer.models.base import LoadedModel, Preprocess
    from vit_explorer.models.vit_pytorch import VitPytorchAdapter

    torch.manual_seed(0)
    module = LucidViT(image_size=64, patch_size=16, num_classes=4, dim=32, depth=2, heads=4, mlp_dim=64, dim_head=8).eval()
    adapter = VitPytorchAdapter()
    return LoadedModel(module, "vit-pytorch:tiny", Preprocess((64, 64)), adapter.layout(module, (64, 64)), adapter)


@pytest.fixture(params=sorted(FAMILIES))
def family(request, monkeypatch):
    # blocks of 3 query rows: every reading crosses block boundaries, prefix and patch rows split between blocks
    model = FAMILIES[request.param]()
    layers, heads = model.map_shape
    monkeypatch.setattr(map_store, "BLOCK_BYTES", 3 * heads * model.layout.num_tokens * 4)
    return request.param, model


def test_derived_maps_equal_the_explicit_path_and_the_pass_is_the_models_own(family):
    name, model = family
    image = photo((64, 64), seed=3)
    analysis = analyze(model, image, explain=False)
    assert isinstance(analysis.store, map_store.DerivedMaps), name
    assert analysis.store.block_rows == 3
    pixels = pixels_of(model, analysis)
    _, captured = record_attention(model, pixels)  # the explicit path's softmax, [1, layers, heads, n, n]
    captured = captured[0]
    torch.testing.assert_close(analysis.store.full_maps(), captured, atol=1e-6, rtol=0)
    # the analysis's pass is the fused forward: its logits are the model's own, bit for bit
    torch.testing.assert_close(analysis.logits, model.logits(pixels)[0].float().cpu(), atol=0, rtol=0)
    for token in (0, analysis.layout.num_tokens - 1, None):
        expected = captured[:, :, analysis.layout.num_prefix_tokens:].mean(dim=2) if token is None else captured[:, :, token]
        torch.testing.assert_close(maps.query_rows(analysis, token), expected, atol=1e-6, rtol=0)
    by_name = head_statistics(captured, analysis.layout)
    for statistic in HEAD_STATISTICS:
        torch.testing.assert_close(maps.head_statistic(analysis, statistic), by_name[statistic], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(analysis.store.received_attention(), captured.mean(dim=(1, 2)), atol=1e-6, rtol=0)
    prefix = analysis.layout.num_prefix_tokens
    torch.testing.assert_close(analysis.store.compact_form()["prefix_rows"].float(), captured[:, :, :prefix], atol=1e-3, rtol=0)
    query = maps.default_query(analysis)
    for options in (maps.RolloutOptions(), maps.RolloutOptions(head_fusion="max", discard_ratio=0.3, start_layer=1)):
        protected = int(analysis.layout.has_class_token)
        whole = attention_rollout(captured, options.head_fusion, options.discard_ratio, options.start_layer,
                                  options.residual_weight, protected)
        vector = maps.query_vector(analysis, query)
        torch.testing.assert_close(maps.rollout_map(analysis, query, options), analysis.layout.patch_map(vector @ whole),
                                   atol=1e-5, rtol=1e-5)


def test_the_sink_keeps_float16_queries_and_keys_within_their_stated_error():
    model = load_model()
    pixels = to_model(model)
    float32 = capture(model, pixels, InputsSink(model.map_shape[0])).kept[0]
    float16 = capture(model, pixels, InputsSink(model.map_shape[0], torch.float16)).kept[0]
    assert float16.queries.dtype == float16.keys.dtype == torch.float16 and float16.nbytes * 2 == float32.nbytes
    layout = model.layout
    exact, rounded = map_store.DerivedMaps(layout, float32), map_store.DerivedMaps(layout, float16)
    # float16 keeps 11 bits: a logit of size s moves by about s·2⁻¹¹, a weight by a few 1e-3 at most on this model
    error = (rounded.full_maps() - exact.full_maps()).abs().max().item()
    assert 0 < error < 5e-3


def to_model(model):
    from vit_explorer.core.images import model_view, to_pixels

    return to_pixels(model_view(photo((64, 64), seed=1), model.preprocess, "stretch"), model.preprocess)


def test_a_batch_gives_each_image_its_own_queries_keys_bias_and_statistics(monkeypatch):
    model = timm_model("beit_base_patch16_224", img_size=64)  # a relative-position bias shared by the batch
    images = torch.stack([to_model(model)[0], torch.zeros(3, 64, 64)])
    kept = capture(model, images, InputsSink(model.map_shape[0])).kept
    _, captured = record_attention(model, images)
    for image, inputs in enumerate(kept):
        derived = map_store.DerivedMaps(model.layout, inputs).full_maps()
        np.testing.assert_allclose(derived, captured[image], atol=1e-6)
    assert not torch.equal(kept[0].queries, kept[1].queries)
    # a dataset batch's statistics, derived layer by layer from the fused pass in blocks of 5 rows, equal the maps'
    monkeypatch.setattr(map_store, "BLOCK_BYTES", 5 * 2 * model.map_shape[1] * model.layout.num_tokens * 4)
    streamed = capture(model, images, InputStatisticsSink(model.layout)).kept  # {name: [b, layers, heads]}
    for name, values in head_statistics(captured, model.layout).items():
        torch.testing.assert_close(streamed[name], values, atol=2e-5, rtol=1e-5)
