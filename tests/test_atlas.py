"""The head atlas (``methods.atlas``, ``vit-explorer atlas``): over a folder the project's generator draws, every head's
entry in ``atlas.json``; its figures checked against each image analysed on its own."""

import json

import numpy as np
import pytest
import torch

from vit_explorer import load_model
from vit_explorer.cli import main
from vit_explorer.core.analysis import analyze, class_evidence
from vit_explorer.core.statistics import head_statistics
from vit_explorer.core.targets import Prompts, prompt_model
from vit_explorer.methods.dataset import list_images


@pytest.fixture(scope="module")
def shapes_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("atlas")
    assert main(["make-shapes", str(folder / "set"), "--count", "24", "--seed", "17"]) in (0, None)
    return folder / "set" / "images"


def read_atlas(out):
    record = json.loads((out / "atlas.json").read_text(encoding="utf-8"))
    with np.load(out / "heads.npz") as arrays:
        return record, {name: arrays[name] for name in arrays.files}


def test_the_atlas_of_the_shipped_classifier_matches_each_image_analysed_alone(shapes_folder, tmp_path, capsys):
    out = tmp_path / "atlas"
    assert main(["atlas", str(shapes_folder), "--model", "builtin:shapes", "--out", str(out), "--batch-size", "5"]) in (0, None)
    record, arrays = read_atlas(out)
    model = load_model("builtin:shapes", device="cpu")
    layers, heads = model.map_shape
    assert (record["layers"], record["heads_per_layer"], record["images"]) == (layers, heads, 24)
    assert [(entry["layer"], entry["head"]) for entry in record["heads"]] == [(layer, head) for layer in range(layers)
                                                                            for head in range(heads)]
    assert all(entry["texts"] is None for entry in record["heads"]) and record["completeness"] is None
    paths = [str(path) for path in list_images(shapes_folder).paths]
    assert list(arrays["paths"]) == paths
    for index in (0, 13, 23):  # batches of 5: the first, a middle and the last batch
        analysis = analyze(model, paths[index], decompose=True)
        decomposition = class_evidence(model, analysis, decompose=True).decomposition
        assert arrays["answers"][index] == int(analysis.probs.argmax())
        np.testing.assert_allclose(arrays["contributions"][index], decomposition.heads.numpy(), rtol=1e-3, atol=1e-5)
        statistics = head_statistics(analysis.attentions, model.layout)
        np.testing.assert_allclose(arrays["statistic_entropy"][index], statistics["entropy"].numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(arrays["statistic_distance"][index], statistics["distance"].numpy(), rtol=1e-4)
    contributions = np.abs(arrays["contributions"])
    for entry in record["heads"]:
        values = contributions[:, entry["layer"], entry["head"]]
        assert entry["mean_abs_contribution"] == pytest.approx(values.mean(), rel=1e-5)
        assert entry["top_images"][0] == paths[int(values.argmax())]
        ranks = (contributions.reshape(24, -1) > values[:, None]).sum(axis=1)  # heads above this one, per image
        assert entry["top_share"] == pytest.approx(np.mean(ranks < 5))
    printed = capsys.readouterr().out
    assert printed.startswith("builtin:shapes: 24 images, 6 layers × 4 heads") and printed.count("\nL") == 10


def test_the_atlas_of_the_shapes_clip_describes_every_head_and_checks_completeness(shapes_folder, tmp_path):
    out = tmp_path / "atlas"
    assert main(["atlas", str(shapes_folder), "--model", "builtin:shapes-clip", "--out", str(out), "--texts-per-head", "3"]) \
        in (0, None)
    record, arrays = read_atlas(out)
    model = load_model("builtin:shapes-clip", device="cpu")
    layers, heads = model.map_shape
    assert all(len(entry["texts"]) == 3 and 0 <= entry["variance_explained"] <= 1 for entry in record["heads"])
    completeness = record["completeness"]
    assert completeness["late_layers"] == 2 and completeness["images"] == 24
    assert 0 <= completeness["replaced_accuracy"] <= 1 and completeness["accuracy"] > 0.5
    classes = sorted(path.name for path in shapes_folder.iterdir())
    assert record["answers"] == [f"a {name}" for name in classes]
    # an image's head vectors, read along its best prompt, are that prompt logit's decomposition
    prompted = prompt_model(model, Prompts(tuple(record["answers"])))
    index = 7
    analysis = analyze(prompted, str(arrays["paths"][index]), decompose=True)
    assert arrays["answers"][index] == int(analysis.probs.argmax())
    decomposition = class_evidence(prompted, analysis, decompose=True).decomposition
    np.testing.assert_allclose(arrays["contributions"][index], decomposition.heads.numpy(), rtol=1e-3,
                               atol=1e-4 * float(decomposition.heads.abs().max()))
    assert arrays["vectors"].shape == (24, layers, heads, prompted.adapter.texts.shape[1])
    accuracy = np.mean(arrays["answers"] == arrays["labels"])
    assert completeness["accuracy"] == pytest.approx(accuracy)


def test_a_model_that_reads_text_needs_something_to_answer_with(tmp_path):
    from vit_explorer.errors import VitExplorerError
    from vit_explorer.methods.atlas import collect

    folder = tmp_path / "flat"
    folder.mkdir()
    from conftest import photo

    photo((40, 40), seed=1).save(folder / "one.png")
    with pytest.raises(VitExplorerError, match="needs prompts"):
        collect(load_model("builtin:shapes-clip", device="cpu"), list_images(folder))
    atlas = collect(load_model("builtin:shapes-clip", device="cpu"), list_images(folder), prompts=["a star", "a ring"])
    assert atlas.answer_names == ["a star", "a ring"] and atlas.labels.tolist() == [-1]
    assert torch.isfinite(atlas.vectors).all()


def test_the_public_atlas_is_the_command_s(shapes_folder, tmp_path):
    import vit_explorer

    found = vit_explorer.atlas(shapes_folder, "builtin:shapes", limit=6, batch_size=4)
    assert main(["atlas", str(shapes_folder), "--out", str(tmp_path / "a"), "--limit", "6"]) in (0, None)
    _, arrays = read_atlas(tmp_path / "a")
    np.testing.assert_allclose(found.contributions.numpy(), arrays["contributions"], rtol=1e-5, atol=1e-7)


def test_shards_give_the_same_atlas_and_resume_loads_them_instead_of_computing(shapes_folder, tmp_path, monkeypatch):
    from vit_explorer.errors import VitExplorerError
    from vit_explorer.methods import atlas as atlas_method

    model = load_model("builtin:shapes", device="cpu")
    images = list_images(shapes_folder)
    whole = atlas_method.collect(model, images, batch_size=4)
    sharded = atlas_method.collect(model, images, batch_size=4, shard_folder=tmp_path / "shards", shard_size=5)
    assert sorted(path.name for path in (tmp_path / "shards").glob("atlas-*.pt")) == [f"atlas-{shard:06d}.pt"
                                                                                        for shard in range(5)]
    assert sharded.paths == whole.paths
    np.testing.assert_allclose(sharded.contributions.numpy(), whole.contributions.numpy(), rtol=1e-5, atol=1e-7)

    def no_pass(*args, **kwargs):
        raise AssertionError("a saved shard was computed again")

    monkeypatch.setattr(atlas_method, "embedding_parts", no_pass)
    resumed = atlas_method.collect(model, images, batch_size=4, shard_folder=tmp_path / "shards", shard_size=5, resume=True)
    assert torch.equal(resumed.contributions, sharded.contributions) and resumed.paths == sharded.paths
    with pytest.raises(VitExplorerError, match="made by another run"):
        atlas_method.collect(model, images, batch_size=4, shard_folder=tmp_path / "shards", shard_size=6, resume=True)


@pytest.mark.slow
def test_two_torchrun_processes_make_the_atlas_one_makes(shapes_folder, tmp_path):
    import os
    import subprocess
    import sys

    common = ["--model", "builtin:shapes-clip", "--texts-per-head", "2", "--shard-size", "5", "--batch-size", "3"]
    env = dict(os.environ, OMP_NUM_THREADS="1")  # one thread each: the same arithmetic, bit for bit
    one = subprocess.run([sys.executable, "-m", "vit_explorer", "atlas", str(shapes_folder), "--out", str(tmp_path / "one"),
                          *common], capture_output=True, text=True, timeout=600, env=env)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29541",
                          "-m", "vit_explorer", "atlas", str(shapes_folder), "--out", str(tmp_path / "two"), *common],
                         capture_output=True, text=True, timeout=600, env=env)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "in 2 processes" in two.stderr and two.stdout.count("completeness:") == 1  # only the first process writes
    (expected, expected_arrays), (found, found_arrays) = read_atlas(tmp_path / "one"), read_atlas(tmp_path / "two")
    assert found == expected
    for name, values in expected_arrays.items():
        np.testing.assert_array_equal(found_arrays[name], values, err_msg=name)


def test_the_atlas_page_and_the_report_of_an_image_show_the_atlas(shapes_folder, tmp_path, capsys):
    out = tmp_path / "atlas"
    assert main(["atlas", str(shapes_folder), "--model", "builtin:shapes", "--out", str(out), "--limit", "8"]) in (0, None)
    page = (out / "atlas.html").read_text(encoding="utf-8")
    record, _ = read_atlas(out)
    strongest = max(record["heads"], key=lambda entry: entry["mean_abs_contribution"])
    assert "<h2>Head atlas: builtin:shapes</h2>" in page and "data:image/png;base64," in page
    assert f"<td>L{strongest['layer']} h{strongest['head']}</td>" in page  # the table leads with the head that writes most
    image = next(shapes_folder.rglob("*.png"))
    assert main(["analyze", str(image), "--out", str(tmp_path / "one"), "--atlas", str(out), "--no-faithfulness"]) in (0, None)
    report = (tmp_path / "one" / "report.html").read_text(encoding="utf-8")  # --atlas implies the report
    assert "<h2>Head atlas: builtin:shapes</h2>" in report and "<h2>Class maps" in report
    assert main(["analyze", str(image), "--out", str(tmp_path / "two"), "--atlas", str(tmp_path)]) == 1  # no atlas there
    assert not (tmp_path / "two").exists()  # refused before anything is written
    assert "no atlas in" in capsys.readouterr().err


@pytest.mark.timm
def test_the_atlas_of_a_backbone_splits_its_own_embedding_score(shapes_folder, tmp_path):
    """A backbone has no answer to choose: each head's share is of the projection of the image's embedding on its own
    direction, as ``decompose`` splits it with no target."""
    pytest.importorskip("timm")
    import vit_explorer

    spec = "timm:vit_small_patch14_reg4_dinov2@random"
    torch.manual_seed(3)
    model = load_model(spec, input_hw=(56, 56), device="cpu")
    out = tmp_path / "atlas"
    found = vit_explorer.atlas(shapes_folder, model, limit=4, batch_size=2)
    from vit_explorer.draw import files

    files.write_atlas(found, out)
    record, arrays = read_atlas(out)
    assert all(entry["texts"] is None and entry["pushes_up"] == [] for entry in record["heads"])
    assert record["completeness"] is None and list(arrays["answers"]) == [-1] * 4
    parts = vit_explorer.decompose(str(arrays["paths"][1]), model)
    np.testing.assert_allclose(arrays["contributions"][1], parts.heads.numpy(), rtol=1e-3,
                               atol=1e-4 * float(parts.heads.abs().max()))
