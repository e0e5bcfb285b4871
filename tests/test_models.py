import json

import pytest
import torch
from conftest import TINY, make_vit, write_backbone_checkpoint, write_checkpoint
from safetensors.torch import save_file

from vit_explorer import VitExplorerError, load_model


def test_safetensors_with_embedded_config_loads_with_layout_and_labels(tiny_checkpoint):
    model = load_model(str(tiny_checkpoint))
    assert model.layout.grid_hw == (4, 4) and model.layout.prefix_names == ("cls",)
    assert model.labels == [f"thing {i}" for i in range(5)] and model.num_classes == 5
    assert model.preprocess.input_hw == (64, 64)
    assert not model.module.training
    reference = make_vit(TINY)
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model.module(images), reference(images))


def test_pt_state_dict_with_json_beside_it(tmp_path):
    config = {**TINY, "pool": "mean", "image_size": [64, 32]}
    path = tmp_path / "mine.pt"
    torch.save(make_vit({**config, "image_size": (64, 32)}).state_dict(), path)
    path.with_suffix(".json").write_text(json.dumps({"vit": config, "mean": [0.5] * 3, "std": [0.5] * 3}))
    model = load_model(str(path))
    assert model.layout.grid_hw == (4, 2) and model.layout.num_prefix_tokens == 0
    assert model.preprocess.mean == (0.5, 0.5, 0.5) and model.labels is None


class Payload:
    """A pickle that would create a file when loaded with weights_only=False."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (str(self.target), "w"))


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    target = tmp_path / "pwned.txt"
    path = tmp_path / "evil.pt"
    with open(path, "wb") as handle:
        torch.save({"state_dict": {"x": torch.zeros(1)}, "extra": Payload(target)}, handle)
    path.with_suffix(".json").write_text(json.dumps({"vit": TINY}))
    with pytest.raises(VitExplorerError, match="refused to load"):
        load_model(str(path))
    assert not target.exists()
    torch.load(path, weights_only=False)  # the payload is real: an unsafe load does create the file
    assert target.exists()


def test_shape_mismatch_names_the_first_bad_parameter(tmp_path):
    path = write_checkpoint(tmp_path / "small.safetensors", TINY)
    tensors_path = tmp_path / "wrong.safetensors"
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    save_file(tensors, str(tensors_path), metadata={"vit_explorer": json.dumps({"vit": {**TINY, "dim": 48}})})
    with pytest.raises(VitExplorerError, match=r"parameter 'cls_token' has shape \(1, 32\) in the checkpoint but \(1, 48\)"):
        load_model(str(tensors_path))


@pytest.mark.parametrize(
    "spec, message",
    [("nonsense", "unknown model spec"), ("builtin:nope", "no built-in model 'nope'"),
     ("/no/such/model.safetensors", "does not exist")],
)
def test_bad_specs_are_user_errors(spec, message):
    with pytest.raises(VitExplorerError, match=message):
        load_model(spec)


def test_corrupt_checkpoint_and_missing_config(tmp_path):
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x00" * 100)
    with pytest.raises(VitExplorerError, match="not a readable safetensors"):
        load_model(str(corrupt))
    bare = tmp_path / "bare.pt"
    torch.save(make_vit(TINY).state_dict(), bare)
    with pytest.raises(VitExplorerError, match="no config found"):
        load_model(str(bare))


def test_device_choice_is_checked(tiny_checkpoint):
    from vit_explorer.models import default_device

    assert load_model(str(tiny_checkpoint), device="cpu").device.type == "cpu"
    assert load_model(str(tiny_checkpoint)).device == default_device()
    with pytest.raises(VitExplorerError, match="unknown device 'gpu0'"):
        load_model(str(tiny_checkpoint), device="gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(VitExplorerError, match="no CUDA GPU"):
            load_model(str(tiny_checkpoint), device="cuda")


def test_a_checkpoint_without_its_head_loads_as_a_backbone(tmp_path):
    path = write_backbone_checkpoint(tmp_path / "backbone.safetensors", TINY)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        headless = {key: handle.get_tensor(key) for key in handle.keys()}
    config = json.dumps({"vit": TINY, "labels": [f"thing {i}" for i in range(5)]})
    model = load_model(str(path))
    assert model.module.mlp_head is None and model.labels is None
    assert model.notes
    assert model.notes[0].startswith("backbone: the checkpoint has no classifier head ('mlp_head.weight', 'mlp_head.bias')")
    assert model.logits(torch.randn(1, 3, 64, 64)).shape == (1, 0) and model.num_classes == 0
    del headless["transformer.layers.1.1.net.1.weight"]
    save_file(headless, str(tmp_path / "broken.safetensors"), metadata={"vit_explorer": config})
    with pytest.raises(VitExplorerError,
                       match=r"lacks parameter\(s\) 'transformer\.layers\.1\.1\.net\.1\.weight'.*initialised at random"):
        load_model(str(tmp_path / "broken.safetensors"))
