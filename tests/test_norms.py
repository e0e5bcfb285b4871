"""Token norms (Darcet et al. 2023): captured in the attention pass, equal to hand-computed hidden states in
every family; a planted high-norm patch is flagged where it is born and after, registers are reported apart."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import TINY, make_vit, photo

from vit_explorer import analyze, load_model
from vit_explorer.cli import main
from vit_explorer.core.capture import TOP, LayerSink, capture
from vit_explorer.core.token_norms import K
from vit_explorer.methods import norms
from vit_explorer.models import adapter_for
from vit_explorer.models.base import LoadedModel, Preprocess
from vit_explorer.models.layout import TokenLayout

PLANTED = 1 + 5  # the patch at row 1, col 1 of TINY's 4×4 grid
MARK, OUT = 0, 1  # residual coordinates: the planted marker, and where layer 1's MLP writes the artefact


def loaded(module: torch.nn.Module, input_hw: tuple[int, int], name: str = "planted") -> LoadedModel:
    adapter = adapter_for(module)
    return LoadedModel(module=module.eval(), name=name, preprocess=Preprocess(input_hw=input_hw),
                       layout=adapter.layout(module, input_hw), adapter=adapter)


def planted_vit() -> torch.nn.Module:
    """TINY with a small marker on one patch's position embedding that one MLP unit of layer 1 turns into a
    large residual write, as Darcet et al. describe artefacts being born in a middle layer's MLP."""
    vit = make_vit(TINY)
    with torch.no_grad():
        # coordinate MARK is 0 for every token but the planted one, and no layer writes to it
        embedding_norm = vit.to_patch_embedding[3]
        embedding_norm.weight[MARK] = embedding_norm.bias[MARK] = 0
        vit.cls_token[:, MARK] = 0
        vit.pos_embedding[:, MARK] = 0
        vit.pos_embedding[PLANTED, MARK] = 3.0
        for attention, feed_forward in vit.transformer.layers:
            attention.to_out[0].weight[MARK] = attention.to_out[0].bias[MARK] = 0
            feed_forward.net[4].weight[MARK] = feed_forward.net[4].bias[MARK] = 0
        # layer 1's hidden unit 0 fires on the marker only and writes 20 × its activation to coordinate OUT
        net = vit.transformer.layers[1][1].net
        net[1].weight[0] = 0
        net[1].weight[0, MARK], net[1].bias[0] = 10.0, -10.0
        net[4].weight[:, 0] = 0
        net[4].weight[OUT, 0] = 20.0
    return vit


def test_a_planted_high_norm_patch_is_flagged_from_the_layer_that_makes_it():
    model = loaded(planted_vit(), (64, 64))
    analysis = analyze(model, photo((64, 64)))
    result = norms.for_analysis(analysis)
    assert [result.flagged_tokens(layer).tolist() for layer in range(3)] == [[], [PLANTED], [PLANTED]]
    assert result.norms[1, PLANTED] > 10 * result.patch_median[1]
    # the share of attention on the flagged token, from the maps by hand: mean over heads and queries of its column
    attentions = analysis.attentions  # [layers, heads, n, n]
    for layer in (1, 2):
        assert result.flagged_attention_share[layer] == pytest.approx(attentions[layer, :, :, PLANTED].mean().item(), rel=1e-5)
    assert result.flagged_attention_share[0] == 0
    assert result.peak_layer == 2
    # above the budget the maps are derived from float16 queries and keys, which give the same shares
    compact = norms.for_analysis(analyze(model, photo((64, 64)), memory_budget=1))
    np.testing.assert_allclose(compact.flagged_attention_share, result.flagged_attention_share, rtol=2e-3)
    record = json.loads(result.to_json())
    assert [len(layer["flagged"]) for layer in record["layers"]] == [0, 1, 1]
    zeroed = {"norm": 0, "norm_over_median": 0, "attention_share": 0, "share_over_median": 0}
    assert record["layers"][1]["flagged"][0] | zeroed == {"token": PLANTED, "row": 1, "col": 1, **zeroed}
    # the planted token is far above the median norm but draws about a patch's share: flagged, not an artefact
    assert record["layers"][1]["flagged"][0]["share_over_median"] < 3 and record["layers"][1]["artefacts"] == []
    assert "not artefacts in Darcet et al.'s sense" in result.summary()


@pytest.mark.parametrize(("values", "flagged"), [
    # median 10, MAD 1 → σ̂ 1.4826, threshold 10 + 6 · 1.4826 = 18.90
    ([9, 9, 10, 10, 10, 11, 11, 18.8], []),
    ([9, 9, 10, 10, 10, 11, 11, 19.0], [7]),
    # MAD 0: σ̂ is 1% of the median, so float noise is not an outlier but a real jump is
    ([10, 10, 10, 10, 10, 10, 10, 10.0001], []),
    ([10, 10, 10, 10, 10, 10, 10, 10.7], [7]),
])
def test_the_rule_is_median_plus_six_scaled_mads_over_patches(values, flagged):
    layout = TokenLayout(prefix_names=("cls",), grid_hw=(2, 4), patch_hw=(16, 16))
    row = torch.tensor([[1000.0, *values]])  # a huge class token, which must change nothing
    shares = torch.full_like(row, 1 / row.shape[1])
    result = norms.token_norms(row, shares, layout)
    assert (result.flagged_tokens(0) - 1).tolist() == flagged
    assert result.prefix["cls"]["norm"][0] == 1000.0


@pytest.mark.parametrize(("outlier_norm", "outlier_share", "artefact"), [
    (19.0, 1.0, False),  # just above the rule, a typical patch's share: an outlier by the rule, not an artefact
    (19.0, 8.0, False),  # draws attention but 1.9× the median norm
    (40.0, 1.0, False),  # 4× the median norm but draws no more than a patch
    (40.0, 8.0, True),  # many times the median and far more than its share: Darcet et al.'s artefact
])
def test_the_headline_states_the_ratios_and_calls_artefacts_only_what_behaves_like_them(outlier_norm, outlier_share, artefact):
    layout = TokenLayout(prefix_names=("cls",), grid_hw=(2, 4), patch_hw=(16, 16))
    row = torch.tensor([[10.0, 9, 9, 10, 10, 10, 11, 11, outlier_norm]])
    weights = torch.tensor([[1.0] * 8 + [outlier_share]])
    result = norms.token_norms(row, weights / weights.sum(), layout)
    assert result.flagged_tokens(0).tolist() == [8] and result.artefacts.any().item() == artefact
    headline = result.summary()
    assert f"{outlier_norm / 10:.1f}–{outlier_norm / 10:.1f}× the median patch norm" in headline
    assert f"each drawing {outlier_share:.1f}–{outlier_share:.1f}× a typical patch's attention share" in headline
    assert ("high-norm artefact tokens (Darcet et al. 2023) in layers 0" in headline) == artefact
    assert ("not artefacts in Darcet et al.'s sense" in headline) == (not artefact)
    assert json.loads(result.to_json())["layers"][0]["artefacts"] == ([8] if artefact else [])


def seed_hidden_states(vit: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """The seed ViT's residual stream after each layer by a hand-written forward ``[b, layers, n, dim]``."""
    x = vit.to_patch_embedding(pixels)
    x = torch.cat([vit.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + vit.pos_embedding
    states = []
    for attention, feed_forward in vit.transformer.layers:
        x = attention(x) + x
        x = feed_forward(x) + x
        states.append(x)
    return torch.stack(states, dim=1)


def timm_hidden_states(module: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """timm's own ``forward_intermediates`` (before the final norm), prefix tokens put back in front."""
    pairs = module.forward_intermediates(pixels, return_prefix_tokens=True, output_fmt="NLC", intermediates_only=True)
    return torch.stack([torch.cat([prefix, patches], dim=1) for patches, prefix in pairs], dim=1)


def hf_hidden_states(module: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """transformers' ``output_hidden_states`` without the embeddings (each layer's output, before the final norm)."""
    return torch.stack(module(pixel_values=pixels, output_hidden_states=True).hidden_states[1:], dim=1)


def seed_model() -> tuple[LoadedModel, object]:
    return loaded(make_vit(TINY), (64, 64), "seed"), seed_hidden_states


def timm_model() -> tuple[LoadedModel, object]:
    pytest.importorskip("timm")
    torch.manual_seed(0)
    return load_model("timm:vit_small_patch14_reg4_dinov2@random", input_hw=(56, 56), device="cpu"), timm_hidden_states


HF_SMALL = {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 64}


def hf_model(model_class: str, config_class: str, **config) -> tuple[LoadedModel, object]:
    transformers = pytest.importorskip("transformers")
    from vit_explorer.models.hf_adapter import from_hf_module

    torch.manual_seed(0)
    module = getattr(transformers, model_class)._from_config(getattr(transformers, config_class)(**config, **HF_SMALL),
                                                              attn_implementation="sdpa").eval()
    return from_hf_module(module, f"hf:{model_class}"), hf_hidden_states


@pytest.mark.parametrize("build", [
    seed_model,
    pytest.param(timm_model, marks=pytest.mark.timm),
    pytest.param(lambda: hf_model("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", image_size=56, patch_size=14,
                                  num_register_tokens=4), marks=pytest.mark.hf),
    pytest.param(lambda: hf_model("ViTModel", "ViTConfig", image_size=64, patch_size=16), marks=pytest.mark.hf),
], ids=["seed", "timm", "hf-dinov2-registers", "hf-vit"])
def test_captured_norms_equal_the_norms_of_independently_computed_hidden_states(build):
    model, hidden_states = build()
    pixels = torch.randn(2, 3, *model.preprocess.input_hw)
    with torch.no_grad():
        expected = hidden_states(model.module, pixels).norm(dim=-1)  # [b, layers, n]
    captured = capture(model, pixels, LayerSink(), norms=True)
    layers, _ = model.map_shape
    assert captured.token_norms.shape == (2, layers, model.layout.num_tokens)
    torch.testing.assert_close(captured.token_norms, expected, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(captured.logits, model.adapter.logits(model.module, pixels), rtol=1e-5, atol=1e-5)
    # the gradient pass that ``analyze`` runs records the same norms
    explained = capture(model, pixels, LayerSink(), target=TOP, norms=True)
    torch.testing.assert_close(explained.token_norms, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.timm
def test_timm_registers_are_reported_by_name_and_never_flagged():
    pytest.importorskip("timm")
    torch.manual_seed(0)
    model = load_model("timm:vit_small_patch14_reg4_dinov2@random", input_hw=(56, 56), device="cpu")
    with torch.no_grad():
        # registers far above every patch, each larger than the one before, so that a mix-up of names shows
        direction = torch.nn.functional.normalize(torch.randn(model.module.embed_dim), dim=0)
        for index in range(4):
            model.module.reg_token[0, index] = 200.0 * (index + 1) * direction
    analysis = analyze(model, photo((56, 56)))
    result = norms.for_analysis(analysis)
    assert list(result.prefix) == ["cls", "reg1", "reg2", "reg3", "reg4"]
    assert not result.flagged[:, :5].any()
    assert not result.flagged.any()  # the registers do not pull the patches' median or MAD either
    register_norms = torch.stack([result.prefix[f"reg{index + 1}"]["norm"] for index in range(4)])  # [4, layers]
    np.testing.assert_array_equal(register_norms, analysis.token_norms[:, 1:5].T)
    assert (register_norms[:, 0].diff() > 0).all() and (register_norms[0] > 10 * result.patch_median).all()
    np.testing.assert_allclose(result.patch_median, np.median(analysis.token_norms[:, 5:].numpy(), axis=1))
    for index in range(4):
        np.testing.assert_allclose(result.prefix[f"reg{index + 1}"]["attention_share"],
                                   analysis.store.full_maps()[:, :, :, 1 + index].mean(axis=(1, 2)), rtol=1e-5)
    assert json.loads(result.to_json())["prefix"]["reg4"]["norm"][0] == pytest.approx(float(register_norms[3, 0]), rel=1e-6)


def test_analyze_norms_writes_the_json_and_pictures_and_the_npz_gains_token_norms(tmp_path, tiny_checkpoint, image_file):
    out = tmp_path / "out"
    assert main(["analyze", str(image_file), "--model", str(tiny_checkpoint), "--out", str(out), "--norms",
                 "--no-faithfulness"]) == 0
    for name in ("norms.json", "norms.png", "norms_chart.png", "norm_outliers.png"):
        assert (out / name).stat().st_size > 0, name
    token_norms = np.load(out / "attention.npz")["token_norms"]
    assert token_norms.shape == (TINY["depth"], 17) and (token_norms > 0).all()
    record = json.loads((out / "norms.json").read_text(encoding="utf-8"))
    assert record["k"] == K and record["prefix_names"] == ["cls"]
    np.testing.assert_allclose([layer["patch_median_norm"] for layer in record["layers"]], np.median(token_norms[:, 1:], axis=1),
                               rtol=1e-6)
    without = tmp_path / "without"
    assert main(["analyze", str(image_file), "--model", str(tiny_checkpoint), "--out", str(without), "--no-faithfulness"]) == 0
    assert not (without / "norms.json").exists()


def test_the_upload_sets_the_layer_slider_from_the_norms_without_reading_the_maps():
    """``peak_layer`` (what the upload sets the Token norms slider to) equals ``TokenNorms.peak_layer`` and reads no map:
    the attention each token receives is computed when the tab opens, not on every upload."""
    from vit_explorer.core.analysis import Analysis
    from vit_explorer.methods.norms import for_analysis, peak_layer
    from vit_explorer.models.layout import TokenLayout

    layout = TokenLayout(prefix_names=("cls",), grid_hw=(4, 4), patch_hw=(4, 4))
    generator = torch.Generator().manual_seed(2)
    token_norms = 1 + 0.05 * torch.rand(5, 17, generator=generator)
    token_norms[1, 3] = token_norms[3, 5] = token_norms[3, 9] = 40.0  # layer 3 has the most outliers
    maps = torch.rand(5, 2, 17, 17, generator=generator).softmax(dim=-1)
    analysis = Analysis(image=np.zeros((16, 16, 3), np.uint8), attentions=maps, logits=torch.zeros(2), layout=layout, labels=None,
                        model_name="m", token_norms=token_norms)
    assert peak_layer(analysis) == 3 and ("received_attention",) not in analysis.derived
    assert for_analysis(analysis).peak_layer == 3
