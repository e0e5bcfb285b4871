"""Hugging Face models built from configs: eager capture equals a manual recomputation; sdpa is restored."""

import pytest
import torch
from conftest import assert_class_maps_work, photo

from vit_explorer import VitExplorerError, analyze, load_model, record_attention
from vit_explorer.models import adapter_for
from vit_explorer.models.hf_adapter import HFAdapter, from_hf_module

pytestmark = pytest.mark.hf
transformers = pytest.importorskip("transformers")

SMALL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}


def build(model_class, config):
    torch.manual_seed(0)
    return model_class._from_config(config, attn_implementation="sdpa").eval()


CASES = {
    "vit": (lambda: build(transformers.ViTForImageClassification,
                          transformers.ViTConfig(image_size=64, patch_size=16, num_labels=5, **SMALL)),
            ("cls",), (4, 4), (64, 64)),
    "deit-teacher": (lambda: build(transformers.DeiTForImageClassificationWithTeacher,
                                   transformers.DeiTConfig(image_size=64, patch_size=16, num_labels=3, **SMALL)),
                     ("cls", "dist"), (4, 4), (64, 64)),
    "dinov2-registers-56px": (lambda: build(
        transformers.Dinov2WithRegistersModel,
        transformers.Dinov2WithRegistersConfig(image_size=56, patch_size=14, num_register_tokens=4, **SMALL)),
                              ("cls", "reg1", "reg2", "reg3", "reg4"), (4, 4), (56, 56)),
}


def manual_maps(model, images):
    """softmax(q·kᵀ·scale) from each layer's q/k projections of that layer's attention input."""
    inputs = []
    attentions = [module for module in model.modules() if hasattr(module, "q_proj") and hasattr(module, "k_proj")]
    hooks = [attention.register_forward_pre_hook(lambda _m, args,
                                                 kwargs: inputs.append(args[0] if args else kwargs["hidden_states"]),
                                                 with_kwargs=True) for attention in attentions]
    try:
        with torch.no_grad():
            model(pixel_values=images)
    finally:
        for hook in hooks:
            hook.remove()
    maps = []
    with torch.no_grad():
        for attention, x in zip(attentions, inputs, strict=True):
            shape = (*x.shape[:-1], -1, attention.head_dim)
            q = attention.q_proj(x).view(shape).transpose(1, 2)
            k = attention.k_proj(x).view(shape).transpose(1, 2)
            maps.append(torch.softmax(q @ k.transpose(-2, -1) * attention.scaling, dim=-1))
    return torch.stack(maps, dim=1)


def output_of(model, images):
    with torch.no_grad():
        outputs = model(pixel_values=images)
    return outputs.logits if hasattr(outputs, "logits") else outputs.last_hidden_state


@pytest.mark.parametrize("case", CASES)
def test_capture_matches_manual_attention_and_restores_sdpa(case):
    make, prefix, grid, input_hw = CASES[case]
    model = make()
    assert isinstance(adapter_for(model), HFAdapter)
    images = torch.randn(2, 3, *input_hw)
    with torch.no_grad():
        assert model(pixel_values=images, output_attentions=True).attentions in (None, ())  # sdpa gives nothing
    reference = output_of(model, images)
    logits, attentions = record_attention(model, images)
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(attentions, manual_maps(model, images), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(attentions.sum(-1), torch.ones(attentions.shape[:-1]), atol=1e-5, rtol=0)
    if hasattr(model, "classifier") or hasattr(model, "cls_classifier"):
        torch.testing.assert_close(logits, reference, rtol=1e-4, atol=1e-5)
    layout = adapter_for(model).layout(model, input_hw)
    assert layout.prefix_names == prefix and layout.grid_hw == grid and attentions.shape[-1] == layout.num_tokens


@pytest.mark.parametrize("case", ["vit", "dinov2-registers-56px"])
def test_one_image_without_gradients_is_captured_in_place_with_the_same_maps_and_output(case):
    """The app's pass (one image, no gradients, every map kept): each softmax is written straight into the kept stack
    (the sink is asked for its place, and the map it keeps is that place), with the maps and output of the plain path."""
    from vit_explorer.core.capture import StackingSink, capture

    make, _, _, input_hw = CASES[case]
    model = make()
    images = torch.randn(1, 3, *input_hw)
    layers = adapter_for(model).map_shape(model)[0]

    class Watched(StackingSink):
        def __init__(self) -> None:
            super().__init__(layers)
            self.places, self.handed = [], []

        def slot(self, layer, shape, dtype, device):
            place = super().slot(layer, shape, dtype, device)
            self.places.append(place.data_ptr())
            return place

        def __setitem__(self, layer, attention):
            self.handed.append(attention.data_ptr())
            super().__setitem__(layer, attention)

    sink = Watched()
    captured = capture(model, images, sink)
    assert sink.handed == sink.places[::2] == [sink.stacked[:, layer].data_ptr() for layer in range(layers)]  # no copy
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(captured.kept, manual_maps(model, images), rtol=1e-4, atol=1e-6)
    if hasattr(model, "classifier"):
        torch.testing.assert_close(captured.logits, output_of(model, images), rtol=1e-4, atol=1e-5)
    with_gradients = Watched()  # out= takes no gradients: the maps are handed over after the backward pass, and copied
    capture(model, images, with_gradients, target=0 if hasattr(model, "classifier") else "top")
    assert not set(with_gradients.handed) & {with_gradients.stacked[:, layer].data_ptr() for layer in range(layers)}
    torch.testing.assert_close(with_gradients.stacked, captured.kept, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("case", ["vit", "deit-teacher"])
def test_class_specific_maps_and_faithfulness(case):
    module = CASES[case][0]()
    assert_class_maps_work(from_hf_module(module, f"hf-{case}"), photo((64, 64)))
    assert module.config._attn_implementation == "sdpa"


def test_a_backbone_has_no_class_to_explain():
    from vit_explorer.core.analysis import class_evidence

    backbone = from_hf_module(CASES["dinov2-registers-56px"][0](), "dinov2-test")
    with pytest.raises(VitExplorerError, match="no classifier head"):
        class_evidence(backbone, analyze(backbone, photo((56, 56))))


def test_labels_come_from_id2label_and_backbones_have_none():
    model = CASES["vit"][0]()
    model.config.id2label = {i: f"kind {i}" for i in range(5)}
    loaded = from_hf_module(model, "hf-test")
    assert loaded.labels == [f"kind {i}" for i in range(5)]
    result = analyze(loaded, photo())
    assert result.top_k(1)[0].label.startswith("kind ")
    backbone = from_hf_module(CASES["dinov2-registers-56px"][0](), "dinov2-test")
    assert backbone.labels is None
    assert analyze(backbone, photo()).top_k(5) == []


def test_saved_folder_loads_through_the_spec(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = CASES["vit"][0]()
    model.save_pretrained(tmp_path / "vit")
    loaded = load_model(f"hf:{tmp_path / 'vit'}")
    images = torch.randn(1, 3, 64, 64)
    torch.testing.assert_close(loaded.module(pixel_values=images).logits, output_of(model, images))
    assert loaded.layout.grid_hw == (4, 4) and loaded.num_classes == loaded.logits(images).shape[-1] == 5


@pytest.mark.parametrize("backbone_class, config_class, extra", [
    (transformers.Dinov2Model, transformers.Dinov2Config, {"image_size": 56, "patch_size": 14}),
    (transformers.ViTModel, transformers.ViTConfig, {"image_size": 64, "patch_size": 16}),  # saved with its pooler
])
def test_a_saved_backbone_loads_as_a_backbone_not_with_a_random_head(tmp_path, monkeypatch, backbone_class, config_class, extra):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = build(backbone_class, config_class(**SMALL, **extra))
    source.save_pretrained(tmp_path / "backbone")
    loaded = load_model(f"hf:{tmp_path / 'backbone'}", device="cpu")
    assert type(loaded.module) is backbone_class and loaded.labels is None and not loaded.random_weights
    assert loaded.notes and loaded.notes[0].startswith("backbone: the weights have no classifier head ('classifier.bias'")
    side = extra["image_size"]
    images = torch.randn(1, 3, side, side)
    assert loaded.logits(images).shape == (1, 0) and loaded.num_classes == 0
    for name, tensor in source.state_dict().items():
        if not name.startswith("pooler."):
            torch.testing.assert_close(loaded.module.state_dict()[name], tensor, msg=name)


def test_weights_lacking_a_parameter_other_than_the_head_are_refused(tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    CASES["vit"][0]().save_pretrained(tmp_path / "vit")
    weights = tmp_path / "vit" / "model.safetensors"
    state = load_file(str(weights))
    del state["vit.encoder.layer.1.layernorm_after.bias"]
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(VitExplorerError, match=r"lack 1 parameter.*initialised at random: '[\w.]+\.1\.layernorm_after\.bias'\. "):
        load_model(f"hf:{tmp_path / 'vit'}", device="cpu")


def test_a_config_saved_on_its_own_builds_and_another_family_is_refused_in_one_sentence(tmp_path):
    """A config saved without a model names no architecture: transformers' Auto classes then raised a TypeError from
    inside (DeiT, LeViT). It builds; a family the adapter does not read is one sentence naming it."""
    small = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64, "image_size": 32,
             "patch_size": 8}
    transformers.DeiTConfig(**small).save_pretrained(tmp_path / "deit")
    deit = load_model(f"hf:{tmp_path / 'deit'}@random")
    assert deit.layout.prefix_names == ("cls", "dist") and deit.map_shape == (2, 2)
    transformers.LevitConfig().save_pretrained(tmp_path / "levit")
    with pytest.raises(VitExplorerError) as refused:
        load_model(f"hf:{tmp_path / 'levit'}@random")
    assert str(refused.value).startswith(f"hf:{tmp_path / 'levit'}@random: vit_explorer cannot read LevitForImageClassification, "
                                         "the LeViT family, which starts from a convolutional stem")
    assert "; it reads the Hugging Face ViTs of types deit, dinov2" in str(refused.value)


# Hugging Face's families that are not its plain ViTs: the config class, and the family the refusal names
HF_UNREADABLE = {"HieraConfig": "Hiera", "PvtV2Config": "PVT",
                 "LevitConfig": "LeViT", "MobileViTConfig": "MobileViT", "CvtConfig": "hybrid and hierarchical ViT"}


@pytest.mark.parametrize("config", sorted(HF_UNREADABLE))
def test_a_hierarchical_family_is_refused_by_name_before_any_pass(tmp_path, config):
    getattr(transformers, config)().save_pretrained(tmp_path / config)
    with pytest.raises(VitExplorerError) as refused:
        load_model(f"hf:{tmp_path / config}@random")
    message = str(refused.value)
    assert f"ForImageClassification, the {HF_UNREADABLE[config]} family, " in message and "\n" not in message
    assert "; it reads the Hugging Face ViTs of types" in message
