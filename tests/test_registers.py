"""Test-time registers (Jiang et al. 2025): calibration and the edit equal an independent transcription of the authors'
algorithm on a model whose planted MLP neuron makes a high-norm patch; the register takes the artefact away from the
patch; without the planted neuron nothing is chosen and nothing changes."""

import json

import pytest
import torch
from conftest import TINY, make_vit, photo
from registers_reference import activate_on_registers, find_register_neurons, run_logging
from test_norms import OUT, PLANTED, loaded, planted_vit

from vit_explorer import VitExplorerError, analyze
from vit_explorer.core.images import model_view, to_pixels
from vit_explorer.core.register_neurons import REGISTER, RegisterNeurons
from vit_explorer.methods import norms
from vit_explorer.methods.registers import calibrate, move_to_register, with_test_time_register

IMAGES = [photo((64, 64), seed=seed) for seed in range(6)]


def pixels_of(model, image):
    return to_pixels(model_view(image, model.preprocess, "stretch"), model.preprocess)


def test_calibration_chooses_the_planted_neuron_and_ranks_as_the_authors_algorithm_does():
    model = loaded(planted_vit(), (64, 64))
    chosen = calibrate(model, IMAGES, top_k=5, highest_layer=2, detect_layer=-1)
    # the authors' ranking with their fixed threshold, set between the planted patch's norm and the rest's
    final_norms = run_logging(model.module, pixels_of(model, IMAGES[0]))[2][-1].norm(dim=1)
    threshold = float(final_norms[PLANTED] + final_norms.median()) / 2
    reference = find_register_neurons(model.module, [pixels_of(model, image) for image in IMAGES], threshold, -1)
    assert chosen.images == chosen.images_with_outliers == 6 and chosen.outlier_tokens == 6  # the planted patch, each image
    assert [(layer, neuron) for layer, neuron, _ in chosen.neurons] == [(layer, neuron) for layer, neuron, _ in reference[:5]]
    assert [score for *_, score in chosen.neurons] == pytest.approx([score for *_, score in reference[:5]], rel=1e-5)
    assert chosen.neurons[0][:2] == (1, 0)  # layer 1's hidden unit 0, the planted one
    limited = calibrate(model, IMAGES, top_k=3, highest_layer=0, detect_layer=-1)  # only layer 0 may be chosen
    assert [(layer, neuron) for layer, neuron, _ in limited.neurons] == [entry[:2] for entry in reference if entry[0] == 0][:3]


def test_the_edit_computes_what_the_authors_hook_computes_with_the_register_after_the_patches():
    model = loaded(planted_vit(), (64, 64))
    chosen = calibrate(model, IMAGES, top_k=4, highest_layer=2, detect_layer=-1)
    registered = with_test_time_register(model, chosen)
    assert registered.layout.prefix_names == ("cls", REGISTER) and registered.layout.grid_hw == model.layout.grid_hw
    edit = {layer: activate_on_registers(indices) for layer, indices in chosen.by_layer().items()}
    for image in IMAGES[:3]:
        pixels = pixels_of(model, image)
        logits, _, outputs = run_logging(model.module, pixels, append_register=True, edit=edit)
        torch.testing.assert_close(registered.logits(pixels), logits, atol=1e-5, rtol=1e-5)
        ours = analyze(registered, image, explain=False).token_norms  # [layers, n]: cls, the register, the patches
        for layer, output in enumerate(outputs):  # theirs: cls, the patches, the register
            torch.testing.assert_close(ours[layer], torch.cat([output[:1], output[-1:], output[1:-1]]).norm(dim=1),
                                       atol=1e-4, rtol=1e-4)
    assert model.layout.prefix_names == ("cls",)  # the model itself is untouched
    torch.testing.assert_close(model.logits(pixels), run_logging(model.module, pixels)[0])


def test_with_the_register_the_planted_patch_is_no_longer_an_outlier_and_draws_less_attention():
    model = loaded(planted_vit(), (64, 64))
    registered = with_test_time_register(model, calibrate(model, IMAGES, top_k=1, highest_layer=2, detect_layer=-1))
    image = photo((64, 64), seed=40)  # not one of the calibration images
    before = norms.for_analysis(analyze(model, image))
    after = norms.for_analysis(analyze(registered, image))
    assert before.flagged_tokens(2).tolist() == [PLANTED]
    assert after.flagged_tokens(1).tolist() == after.flagged_tokens(2).tolist() == []
    shifted = PLANTED + 1  # the patch, one token later behind the register
    # its norm falls to the rest's, and the register carries what it carried (layer 1 writes 20 × its activation)
    assert after.norms[2, shifted] < 2 * after.patch_median[2] < before.norms[2, PLANTED] / 5
    assert after.norms[2, 1] > 5 * after.patch_median[2]
    assert after.flagged_attention_share[2] == 0
    share_before = analyze(model, image).attentions[2, :, :, PLANTED].mean()
    share_after = analyze(registered, image).attentions[2, :, :, shifted].mean()
    assert share_after < share_before


def test_without_an_artefact_nothing_is_chosen_and_the_file_changes_nothing(tmp_path):
    model = loaded(make_vit(TINY), (64, 64), name="plain")
    chosen = calibrate(model, IMAGES, top_k=5, highest_layer=2, detect_layer=-1)
    assert chosen.changes_nothing and chosen.images_with_outliers == 0 and chosen.outlier_tokens == 0
    assert "no outlier tokens in 6 images" in chosen.summary() and "changes nothing" in chosen.summary()
    path = tmp_path / "registers.json"
    path.write_text(chosen.to_json())
    read = RegisterNeurons.read(path)
    assert read == chosen and json.loads(path.read_text())["neurons"] == []
    assert with_test_time_register(model, read) is model


def test_a_file_applies_to_its_own_model_only_and_a_bad_file_is_a_user_error(tmp_path):
    model = loaded(planted_vit(), (64, 64))
    chosen = calibrate(model, IMAGES, top_k=2, highest_layer=2, detect_layer=-1)
    path = tmp_path / "registers.json"
    path.write_text(chosen.to_json())
    assert RegisterNeurons.read(path) == chosen
    other = loaded(planted_vit(), (64, 64), name="other")
    with pytest.raises(VitExplorerError, match="calibrated for planted, not other"):
        with_test_time_register(other, chosen)
    path.write_text("{}")
    with pytest.raises(VitExplorerError, match="not a registers file"):
        RegisterNeurons.read(path)
    with pytest.raises(VitExplorerError, match="settings outside this model's 3 layers"):
        calibrate(model, IMAGES, highest_layer=3)


@pytest.mark.parametrize("negative", [False, True])
def test_the_register_takes_the_signed_largest_activation_as_the_authors_hook_gives_it(negative):
    """GELU's activations are rarely below -0.17, so the sign of ``sign_max`` matters only for other activations: a
    planted one here, with the largest magnitude negative or positive."""
    generator = torch.Generator().manual_seed(1)
    theirs = torch.randn(1, 8, 6, generator=generator)  # cls, 6 patches, the register last
    theirs[0, 3, 2] = -9.0 if negative else 9.0
    ours = torch.cat([theirs[:, :1], theirs[:, -1:], theirs[:, 1:-1]], dim=1)  # cls, the register, the patches
    edited = move_to_register(1, [2, 4], None, (), ours)
    activate_on_registers([2, 4])(None, (), theirs)
    torch.testing.assert_close(edited, torch.cat([theirs[:, :1], theirs[:, -1:], theirs[:, 1:-1]], dim=1))
    assert edited[0, 1, 2] == (-9.0 if negative else 9.0)


def planted_sink_vit() -> torch.nn.Module:
    """``planted_vit`` whose last layer also has an attention sink, as Darcet et al. describe the artefacts: head 0 of
    layer 2 attends from every token to the token that carries the artefact. Its norm holds one coordinate at 1 for
    every token (a query shared by all), and its keys read the artefact's coordinate."""
    vit = planted_vit()
    attention = vit.transformer.layers[2][0]
    inner, shared = attention.to_qkv.out_features // 3, 2  # 2: a residual coordinate, neither the marker nor OUT
    with torch.no_grad():
        attention.norm.weight[shared], attention.norm.bias[shared] = 0.0, 1.0
        queries, keys = attention.to_qkv.weight[:8], attention.to_qkv.weight[inner : inner + 8]  # head 0
        queries.zero_()
        queries[:, shared] = 1.0
        keys.zero_()
        keys[:, OUT] = 1.0
    return vit


def write_planted_checkpoint(path):
    """The planted ViT with its attention sink as a checkpoint file with its config, as a user's model would be."""
    from safetensors.torch import save_file

    from vit_explorer.models.checkpoint import CONFIG_KEY

    meta = {"vit": TINY, "labels": [f"thing {i}" for i in range(TINY["num_classes"])]}
    save_file({key: value.contiguous() for key, value in planted_sink_vit().state_dict().items()}, str(path),
              metadata={CONFIG_KEY: json.dumps(meta)})
    return path


def test_the_cli_calibrates_over_a_folder_and_analyze_adds_the_register(tmp_path, capsys):
    import numpy as np

    from vit_explorer import explain
    from vit_explorer.cli import main

    checkpoint = write_planted_checkpoint(tmp_path / "planted.safetensors")
    folder = tmp_path / "images"
    folder.mkdir()
    for seed, image in enumerate(IMAGES):
        image.save(folder / f"{seed}.png")
    out = tmp_path / "registers.json"
    assert main(["registers", str(folder), "--model", str(checkpoint), "--out", str(out), "--top-k", "2",
                 "--highest-layer", "2", "--batch-size", "4"]) == 0
    said = capsys.readouterr().err
    assert "6 outlier tokens in 6 of 6 images at layer -1; 2 register neurons chosen in layer(s) 1" in said
    record = json.loads(out.read_text())
    assert record["model"] == checkpoint.name and record["neurons"][0]["layer"] == 1 and record["neurons"][0]["neuron"] == 0
    image = tmp_path / "new.png"
    photo((64, 64), seed=40).save(image)
    assert main(["analyze", str(image), "--model", str(checkpoint), "--registers", str(out), "--out", str(tmp_path / "a"),
                 "--no-faithfulness"]) == 0
    saved = np.load(tmp_path / "a" / "attention.npz")
    assert saved["prefix_names"].tolist() == ["cls", "tt-reg"] and saved["head_mean"].shape[-1] == 18
    assert "test-time register (2 register neurons moved to it)" in capsys.readouterr().err
    with_register = explain(str(image), model=str(checkpoint), method="rollout", registers=out)
    assert with_register.analysis.layout.prefix_names == ("cls", "tt-reg") and with_register.map.shape == (4, 4)
    # a file for another model is refused with what to run
    assert main(["analyze", str(image), "--registers", str(out), "--out", str(tmp_path / "b")]) == 1
    assert f"calibrated for {checkpoint.name}, not " in capsys.readouterr().err


def test_with_the_register_the_attention_sink_leaves_the_patch_for_the_register():
    """The spot the artefact makes in the class token's attention (head 0 of the last layer) moves to the register."""
    model = loaded(planted_sink_vit(), (64, 64))
    registered = with_test_time_register(model, calibrate(model, IMAGES, top_k=1, highest_layer=2, detect_layer=-1))
    image = photo((64, 64), seed=40)
    before = analyze(model, image).attentions[2, 0, 0]  # [n]: head 0's class-token row in the last layer
    after = analyze(registered, image).attentions[2, 0, 0]
    assert before[PLANTED] > 0.9  # the sink
    assert after[1] > 0.9 and after[PLANTED + 1] < 0.05  # on the register, off the patch


def family_models():
    """Each family a test-time register applies to, with the module its tokens pass before the first block."""
    timm = pytest.importorskip("timm")
    from test_clip_families import tiny_open_clip

    from vit_explorer.models.timm_loading import from_timm_module

    def timm_dinov2():
        torch.manual_seed(0)
        module = timm.create_model("vit_small_patch14_dinov2", pretrained=False, depth=2, img_size=56).eval()
        return from_timm_module(module, "timm:vit_small_patch14_dinov2@random")

    def hf(model_class, config_class, **options):
        transformers = pytest.importorskip("transformers")
        from vit_explorer.models.hf_adapter import from_hf_module

        torch.manual_seed(0)
        config = getattr(transformers, config_class)(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                     intermediate_size=64, **options)
        return from_hf_module(getattr(transformers, model_class)._from_config(config).eval(), "hf:tiny")

    return {"shipped": (lambda: loaded(make_vit(TINY), (64, 64)), lambda module: module.dropout),
            "timm-dinov2": (timm_dinov2, lambda module: module.patch_drop),
            "open_clip": (lambda: tiny_open_clip()[0], lambda module: module.patch_dropout),
            "hf-vit": (lambda: hf("ViTForImageClassification", "ViTConfig", image_size=64, patch_size=16, num_labels=3),
                       lambda module: module.base_model.embeddings),
            "hf-dinov2": (lambda: hf("Dinov2Model", "Dinov2Config", image_size=56, patch_size=14),
                          lambda module: module.base_model.embeddings)}


@pytest.mark.parametrize("family", ["shipped", "timm-dinov2", "open_clip", "hf-vit", "hf-dinov2"])
def test_each_family_computes_what_appending_the_register_with_the_authors_hook_computes(family):
    make, entry = family_models()[family]
    model = make()
    neurons = RegisterNeurons(model=model.name, neurons=((0, 3, 1.0), (0, 7, 0.9), (1, 5, 0.8)), top_k=3, highest_layer=1,
                              detect_layer=-1, images=1, images_with_outliers=1, outlier_tokens=1)
    registered = with_test_time_register(model, neurons)
    assert registered.layout.prefix_names == (*model.layout.prefix_names, REGISTER)
    pixels = torch.randn(1, 3, *model.preprocess.input_hw, generator=torch.Generator().manual_seed(2))

    def last_stream(loaded_model, *extra_hooks):
        adapter, module = loaded_model.adapter, loaded_model.module
        kept = {}
        handles = [make_hook(module) for make_hook in extra_hooks]
        handles.append(adapter.residual_modules(module)[-1].register_forward_hook(
            lambda _m, inputs, output: kept.setdefault("stream", adapter.residual_after(inputs, output))))
        try:
            with torch.no_grad():
                loaded_model.logits(pixels)
        finally:
            for handle in handles:
                handle.remove()
        return kept["stream"][0]  # [n, dim]

    activations = model.adapter.mlp_activations(model.module)
    append = lambda module: entry(module).register_forward_hook(  # noqa: E731 - the authors' token, after the patches
        lambda _m, _i, x: torch.cat([x, torch.zeros(x.shape[0], 1, x.shape[2])], dim=1))
    edits = [lambda module, layer=layer, indices=indices: activations[layer].register_forward_hook(
        activate_on_registers(indices)) for layer, indices in neurons.by_layer().items()]
    theirs = last_stream(model, append, *edits)  # cls, the patches, the register
    ours = last_stream(registered)  # cls, the register, the patches
    torch.testing.assert_close(ours, torch.cat([theirs[:1], theirs[-1:], theirs[1:-1]]), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(ours[1], torch.zeros(()))  # the register took the activations


def test_a_model_the_edit_does_not_fit_is_refused_with_the_reason():
    timm = pytest.importorskip("timm")
    transformers = pytest.importorskip("transformers")
    from vit_explorer.models.hf_adapter import from_hf_module
    from vit_explorer.models.timm_loading import from_timm_module

    def neurons_for(model):
        return RegisterNeurons(model=model.name, neurons=((0, 1, 1.0),), top_k=1, highest_layer=0, detect_layer=-1, images=1,
                               images_with_outliers=1, outlier_tokens=1)

    config = transformers.Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                       image_size=56, patch_size=14, num_labels=3)
    classifier = from_hf_module(transformers.Dinov2ForImageClassification._from_config(config).eval(), "hf:tiny")
    with pytest.raises(VitExplorerError, match="a DINOv2 classifier reads the mean of every token"):
        with_test_time_register(classifier, neurons_for(classifier))
    eva = from_timm_module(timm.create_model("eva02_tiny_patch14_224", pretrained=False, depth=2, img_size=56).eval(),
                           "timm:eva02_tiny_patch14_224@random")
    with pytest.raises(VitExplorerError, match="gated"):
        with_test_time_register(eva, neurons_for(eva))
    mean_pooled = loaded(make_vit({**TINY, "pool": "mean"}), (64, 64), name="mean")
    with pytest.raises(VitExplorerError, match="pools the mean of all its tokens"):
        with_test_time_register(mean_pooled, neurons_for(mean_pooled))
