"""Hub names offline: a cached model loads with no request, an uncached one fails at once; ``@random`` anywhere."""

import time

import numpy as np
import pytest
import torch
from conftest import photo

from vit_explorer import VitExplorerError, analyze, load_model
from vit_explorer.draw.files import write_npz

pytestmark = [pytest.mark.timm, pytest.mark.slow]
timm = pytest.importorskip("timm")
constants = pytest.importorskip("huggingface_hub.constants")

# a blackhole address: connections to it neither open nor get refused, as when a firewall drops them
UNREACHABLE = "https://10.255.255.1"


@pytest.fixture
def empty_hub(tmp_path, monkeypatch):
    """An empty hub cache and a hub host that does not answer; no request may leave the test."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "ENDPOINT", UNREACHABLE)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return tmp_path / "hub"


def fill_cache(cache, repo_id: str, files: dict[str, bytes]) -> None:
    """Put ``files`` into the hub cache the way a download would have (refs/main → snapshot)."""
    commit = "0" * 40
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)


def test_an_uncached_timm_name_fails_at_once_without_network(empty_hub):
    started = time.perf_counter()
    with pytest.raises(VitExplorerError, match="not in the local cache and 10.255.255.1 cannot be reached") as error:
        load_model("timm:vit_tiny_patch16_224", device="cpu")
    elapsed = time.perf_counter() - started
    assert "@random" in str(error.value) and "Retrying" not in str(error.value)
    assert elapsed < 30, elapsed  # measured about 3 s: the one probe's timeout; the bound allows a loaded machine


def test_an_uncached_hf_name_fails_at_once_without_network(empty_hub):
    pytest.importorskip("transformers")
    started = time.perf_counter()
    with pytest.raises(VitExplorerError, match="not in the local cache"):
        load_model("hf:google/vit-base-patch16-224", device="cpu")
    assert time.perf_counter() - started < 30


def test_a_cached_timm_name_loads_with_no_network(empty_hub):
    from safetensors.torch import save

    torch.manual_seed(3)
    source = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    repo_id = source.pretrained_cfg["hf_hub_id"]
    fill_cache(empty_hub, repo_id, {"model.safetensors": save({k: v.contiguous() for k, v in source.state_dict().items()})})
    loaded = load_model("timm:vit_tiny_patch16_224", device="cpu")
    for name, tensor in source.state_dict().items():
        torch.testing.assert_close(loaded.module.state_dict()[name], tensor, msg=name)
    assert not loaded.random_weights and not any("resampled" in note for note in loaded.notes)
    # another input size: timm resamples the 14×14 position grid at load, and the model says so
    resized = load_model("timm:vit_tiny_patch16_224", input_hw=(112, 112), device="cpu")
    assert resized.layout.grid_hw == (7, 7)
    assert any("position embedding resampled by timm from the weights' 224×224 input to 112×112" in note
               for note in resized.notes)


@pytest.mark.parametrize("name,prefix,side", [
    ("vit_tiny_patch16_224", ("cls",), 224),
    ("deit_tiny_distilled_patch16_224", ("cls", "dist"), 224),
    ("vit_small_patch14_reg4_dinov2", ("cls", "reg1", "reg2", "reg3", "reg4"), 98),  # 518 px by default: smaller here
])
def test_random_timm_weights_give_the_real_layout_and_say_so(empty_hub, tmp_path, name, prefix, side):
    loaded = load_model(f"timm:{name}@random", device="cpu", input_hw=None if side == 224 else (side, side))
    assert loaded.random_weights and loaded.layout.prefix_names == prefix
    assert loaded.layout.grid_hw == (side // loaded.layout.patch_hw[0],) * 2
    analysis = analyze(loaded, photo((64, 64)))
    assert analysis.random_weights
    write_npz(analysis, tmp_path / "attention.npz")
    assert str(np.load(tmp_path / "attention.npz")["weights"]) == "random"


def test_random_hf_weights_from_a_config_folder(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.Dinov2WithRegistersConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                    intermediate_size=128,
                                                    image_size=56, patch_size=14, num_register_tokens=2)
    config.save_pretrained(tmp_path / "config")
    loaded = load_model(f"hf:{tmp_path / 'config'}@random", device="cpu")
    assert loaded.random_weights and loaded.name.endswith("@random")
    assert loaded.layout.prefix_names == ("cls", "reg1", "reg2") and loaded.layout.grid_hw == (4, 4)
    assert analyze(loaded, photo((56, 56))).random_weights
