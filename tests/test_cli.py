import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CLI_MODEL, photo, write_backbone_checkpoint, write_checkpoint
from PIL import Image
from test_images import encoded, png_header_claiming

from vit_explorer.cli import main


@pytest.fixture
def cli_checkpoint(tmp_path):
    return write_checkpoint(tmp_path / "six-layers.safetensors", CLI_MODEL)


def test_analyze_writes_maps_and_scores_and_prints_the_aucs(tmp_path, cli_checkpoint):
    image = tmp_path / "input.png"
    photo((256, 256)).save(image)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "vit_explorer.cli", "analyze", str(image), "--model", str(cli_checkpoint), "--out", str(out),
         "--steps", "4", "--random-orders", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("rollout map (the same for every target) scored for 'thing ")
    assert "deletion AUC" in result.stdout and "insertion AUC" in result.stdout
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr, result.stderr
    assert sorted(path.name for path in out.iterdir()) == ["attention.npz", "faithfulness.json", "faithfulness.png", "heads.png",
                                                           "rollout.png"]
    saved = np.load(out / "attention.npz")
    assert "attentions" not in saved and saved["head_mean"].shape == (6, 257, 257)  # the compact form by default
    assert saved["prefix_rows"].shape == (6, 4, 1, 257) and saved["statistic_entropy"].shape == (6, 4)
    size = (out / "attention.npz").stat().st_size
    assert f"attention.npz: {size / 2**20:.1f} MiB, the compact form" in result.stderr
    assert "every head's full map would add 6.0 MiB" in result.stderr  # 6 × 4 × 257² float32
    assert saved["grid"].tolist() == [16, 16] and int(saved["num_prefix_tokens"]) == 1
    assert saved["labels"].tolist() == [f"thing {i}" for i in range(4)]
    np.testing.assert_allclose(saved["probs"].sum(), 1.0, rtol=1e-5)
    heads = Image.open(out / "heads.png")
    assert heads.width > 4 * 64 and heads.height > 6 * 64  # 6 rows × 4 columns of tiles plus labels
    assert Image.open(out / "rollout.png").mode == "RGB"


BAD_INPUTS = {
    "missing": None,
    "not-an-image.png": b"<html><body>hello</body></html>",
    "truncated.jpg": encoded(photo((256, 256)), "JPEG")[:900],
    "bomb.png": png_header_claiming(50_000, 50_000),
    "sliver.png": encoded(Image.new("RGB", (4000, 3)), "PNG"),
}


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_bad_images_give_one_line_and_no_output_folder(tmp_path, capsys, name, cli_checkpoint):
    path = tmp_path / name
    if BAD_INPUTS[name] is not None:
        path.write_bytes(BAD_INPUTS[name])
    out = tmp_path / "out"
    assert main(["analyze", str(path), "--model", str(cli_checkpoint), "--out", str(out)]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("vit-explorer: error:") and name in error[0]
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".vit-explorer-")] == []


def test_unknown_model_spec_is_one_line(tmp_path, capsys, image_file):
    assert main(["analyze", str(image_file), "--model", "nonsense", "--out", str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert error[-1].startswith("vit-explorer: error: unknown model spec 'nonsense'")
    assert not (tmp_path / "out").exists()


def test_method_and_target_choose_the_map_and_its_json(tmp_path, capsys, cli_checkpoint, image_file):
    out = tmp_path / "out"
    args = ["analyze", str(image_file), "--model", str(cli_checkpoint), "--out", str(out), "--steps", "5", "--random-orders", "2"]
    assert main([*args, "--method", "relevance", "--target", "thing 2"]) == 0
    assert (out / "relevance.png").is_file() and (out / "rollout.png").is_file()
    record = json.loads((out / "faithfulness.json").read_text())
    assert record["method"] == "relevance" and record["target"] == 2 and record["target_label"] == "thing 2"
    assert len(record["deletion"]) == 6 and record["steps"] == 5 and record["random_orders"] == 2
    assert record["auc"]["deletion"] == pytest.approx(float(np.trapezoid(record["deletion"], record["fractions"])), abs=1e-5)
    printed = capsys.readouterr().out
    assert f"deletion AUC {record['auc']['deletion']:.3f}" in printed
    assert main([*args, "--method", "grad-rollout", "--target", "3"]) == 0
    assert json.loads((out / "faithfulness.json").read_text())["target"] == 3


def test_percentile_scale_recolours_every_written_map(tmp_path, cli_checkpoint, image_file):
    args = ["analyze", str(image_file), "--model", str(cli_checkpoint), "--method", "relevance", "--no-faithfulness"]
    assert main([*args, "--out", str(tmp_path / "linear")]) == 0
    assert main([*args, "--out", str(tmp_path / "percentile"), "--scale", "percentile"]) == 0
    for name in ("relevance.png", "rollout.png", "heads.png"):
        linear, percentile = (np.asarray(Image.open(tmp_path / folder / name)) for folder in ("linear", "percentile"))
        # the percentile bar's caption may wrap onto one more line: compare the pictures above it
        rows = min(linear.shape[0], percentile.shape[0]) - 60
        assert linear.shape[1] == percentile.shape[1] and not np.array_equal(linear[:rows], percentile[:rows]), name


def test_an_unknown_target_is_one_line(tmp_path, capsys, cli_checkpoint, image_file):
    out = tmp_path / "out"
    assert main(["analyze", str(image_file), "--model", str(cli_checkpoint), "--out", str(out), "--target", "thing 7"]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert error[-1].startswith("vit-explorer: error:") and "no class named 'thing 7'" in error[-1]
    assert not out.exists()


def test_version_and_every_option_says_its_default(capsys):
    with pytest.raises(SystemExit) as exit_code:
        main(["--version"])
    assert exit_code.value.code == 0 and capsys.readouterr().out.startswith("vit-explorer 0.")
    from vit_explorer.cli import parser

    commands = parser()._subparsers._group_actions[0].choices
    for name, command in commands.items():
        for action in command._actions:
            if action.dest in ("help", "image") or action.required:
                continue
            assert action.help, (name, action.dest)
            text = " ".join(command.format_help().split())
            if action.default is not None and action.default is not False:  # 0 and 0.0 are defaults a user needs too
                assert f"(default: {action.default})" in text or "(default" in action.help, (name, action.dest)
    for name in ("analyze", "serve", "train-default"):
        assert commands[name].description, name  # `vit-explorer NAME --help` says what the command does
    assert "(default: 0.0)" in " ".join(commands["analyze"].format_help().split())  # --discard-ratio
    assert "(default: 0)" in " ".join(commands["train-default"].format_help().split())  # --seed


@pytest.mark.parametrize("port", ["99999", "-5", "0", "http"])
def test_a_port_out_of_range_is_one_line(capsys, port):
    with pytest.raises(SystemExit) as exit_code:
        main(["serve", "--port", port, "--no-browser"])
    error = capsys.readouterr().err
    assert exit_code.value.code == 2 and "a port is a whole number from 1 to 65535" in error and "Traceback" not in error


def test_an_out_that_cannot_be_a_folder_is_refused_before_any_pass(tmp_path, capsys, image_file, monkeypatch):
    import vit_explorer.models as models

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(models, "load_model", never)
    existing = tmp_path / "a-file"
    existing.write_text("keep me")
    for out, words in ((existing, "is a file, not a folder"), (Path("/proc/nope"), "cannot write to /proc/nope")):
        with pytest.raises(SystemExit) as exit_code:
            main(["analyze", str(image_file), "--out", str(out)])
        error = capsys.readouterr().err
        assert exit_code.value.code == 2 and words in error and "Traceback" not in error, error
    assert existing.read_text() == "keep me"


def test_train_default_never_writes_over_the_shipped_model_unless_asked(tmp_path, capsys, monkeypatch):
    import vit_explorer.shapes.train as train
    import vit_explorer.shapes.train_clip as train_clip
    from vit_explorer.models.builtin import ASSETS

    written = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "train_default", lambda out, **kwargs: written.append(out) or {"heldout_accuracy": 0.5})
    monkeypatch.setattr(train_clip, "train_clip", lambda out,
                        **kwargs: written.append(out) or {"heldout_zero_shot_accuracy": 0.5})
    assert main(["train-default"]) == 0 and main(["train-default", "--clip"]) == 0
    # beside the user, not in the package
    assert written == [Path("shapes.safetensors"), Path("shapes-clip.safetensors")]
    for shipped, flags in (("shapes.safetensors", []), ("shapes-clip.safetensors", ["--clip"])):
        assert main(["train-default", *flags, "--out", str(ASSETS / shipped)]) == 1
        assert "--replace-shipped" in capsys.readouterr().err
    assert len(written) == 2


@pytest.mark.timm
@pytest.mark.parametrize("size", ["7", "20", "27x28"])
def test_an_input_size_off_the_patch_grid_says_the_patch_size(capsys, image_file, tmp_path, size):
    pytest.importorskip("timm")
    code = main(["analyze", str(image_file), "--model", "timm:vit_small_patch14_dinov2@random", "--input-size", size,
                 "--out", str(tmp_path / "out")])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and "must be a positive multiple of the patch size (14)" in error[-1], error


@pytest.mark.slow
def test_a_backbone_refuses_class_options_before_any_pass(tmp_path, capsys, image_file):
    backbone = write_backbone_checkpoint(tmp_path / "backbone.safetensors", CLI_MODEL)
    out = tmp_path / "out"
    assert main(["analyze", str(image_file), "--model", str(backbone), "--out", str(out), "--sanity", "--scoreboard",
                 "--target", "cat"]) == 1
    error = capsys.readouterr().err
    assert "has no class 'cat'" in error and "patch:ROW,COL" in error
    assert "analysing" not in error and "sanity check" not in error and not out.exists()  # before any pass
    # a backbone's class-specific map, ablation, sanity, faithfulness and scoreboard explain a similarity: to a patch's here
    assert main(["analyze", str(image_file), "--model", str(backbone), "--out", str(out), "--sanity", "--norms", "--ablation",
                 "--scoreboard", "--method", "attnlrp", "--target", "patch:2,3"]) == 0
    assert {"sanity.json", "norms.json", "attention.npz", "attnlrp.png", "ablation.json", "faithfulness.json",
            "scoreboard.json"} <= {path.name for path in out.iterdir()}
    assert json.loads((out / "sanity.json").read_text())["target_label"] == "patch (row 2, col 3): its own output token"
    faithfulness = json.loads((out / "faithfulness.json").read_text())
    board = json.loads((out / "scoreboard.json").read_text())
    assert faithfulness["measure"] == board["measure"] == "share of the image's score"
    assert abs(faithfulness["deletion"][0]) == pytest.approx(1.0)  # the unchanged image, over its own score's magnitude
    captured = capsys.readouterr()
    assert "target: patch (row 2, col 3): its own output token" in captured.err
    assert "(curves of the share of the image's score)" in captured.out and "scoreboard for 'patch (row 2, col 3)" in captured.out


def test_full_maps_on_request_equal_a_fresh_capture(tmp_path, capsys, cli_checkpoint, image_file):
    from vit_explorer import analyze, load_model

    assert main(["analyze", str(image_file), "--model", str(cli_checkpoint), "--out", str(tmp_path / "out"), "--no-faithfulness",
                 "--full-maps"]) == 0
    assert "every head's full map and the compact form" in capsys.readouterr().err
    saved = np.load(tmp_path / "out" / "attention.npz")
    expected = analyze(load_model(str(cli_checkpoint)), image_file).attentions.numpy()
    np.testing.assert_allclose(saved["attentions"], expected, atol=1e-6)
    np.testing.assert_allclose(saved["head_mean"], expected.mean(axis=1), atol=1e-3)  # float16
    # maps kept compactly (a tiny memory budget) have no full stack: refused before the pass, nothing written
    assert main(["analyze", str(image_file), "--model", str(cli_checkpoint), "--out", str(tmp_path / "small"), "--full-maps",
                 "--memory-budget-mb", "0.001"]) == 1
    error = capsys.readouterr().err
    assert "--full-maps" in error and "analysing" not in error and not (tmp_path / "small").exists()


@pytest.mark.timm
def test_evaluate_on_random_weights_says_so_and_its_relative_scores_stay_readable(tmp_path, capsys):
    pytest.importorskip("timm")
    from vit_explorer import analyze, load_model

    spec = "timm:vit_tiny_patch16_224@random"
    folder = tmp_path / "images"
    folder.mkdir()
    for seed in range(2):
        photo((224, 224), seed=seed).save(folder / f"photo{seed}.png")
    torch.manual_seed(5)  # the same random weights for the run and for the oracle below
    assert main(["evaluate", str(folder), "--model", spec, "--methods", "rollout", "--steps", "2", "--out",
                 str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"{spec}: random weights: the token layout is the real one, but nothing is learned")
    report = json.loads((tmp_path / "out" / "evaluation.json").read_text())
    assert report["weights"] == "random"
    # a 1000-class random head: absolute probabilities near 1/1000; relative to the whole image's they read near 1
    torch.manual_seed(5)
    model = load_model(spec, device="cpu")
    for index, path in enumerate(sorted(folder.glob("*.png"))):
        whole = float(analyze(model, path).probs.max())  # the target: the top class, with no labels
        assert whole < 0.01
        for score in ("deletion", "insertion"):
            assert report["per_image"][f"rollout/{score}_relative"][index] == pytest.approx(
                report["per_image"][f"rollout/{score}"][index] / whole, rel=1e-3)
    assert 0.3 < np.mean(report["per_image"]["rollout/insertion_relative"]) < 3


def test_help_prints_for_the_program_and_every_command(capsys):
    from vit_explorer.cli import parser

    commands = list(parser()._subparsers._group_actions[0].choices)
    printed = {}
    for argv in [["--help"], *[[name, "--help"] for name in commands]]:
        with pytest.raises(SystemExit) as exit_code:
            main(argv)
        assert exit_code.value.code == 0, argv
        printed[argv[0]] = " ".join(capsys.readouterr().out.split())
        assert printed[argv[0]].startswith("usage: vit-explorer"), argv
    assert "with 95% intervals" in printed["--help"]  # a literal per cent sign, not a format
    assert all(f"usage: vit-explorer {name}" in printed[name] for name in commands)


def test_a_wide_image_is_stretched_by_default_and_padded_on_request(tmp_path, capsys, cli_checkpoint):
    image = tmp_path / "wide.png"
    photo((512, 256)).save(image)
    assert main(["analyze", str(image), "--model", str(cli_checkpoint), "--out", str(tmp_path / "a"), "--no-faithfulness"]) == 0
    assert "512×256 image stretched to 256×256 (proportions changed 2.00×; nothing cropped)" in capsys.readouterr().err
    assert main(["analyze", str(image), "--model", str(cli_checkpoint), "--out", str(tmp_path / "b"), "--no-faithfulness",
                 "--fit", "pad"]) == 0
    assert "padded to the model's 256×256 proportions" in capsys.readouterr().err
    padded = np.load(tmp_path / "b" / "attention.npz")["image"]
    assert np.ptp(padded[:50].reshape(-1, 3), axis=0).max() <= 1 and np.ptp(padded[100:150].reshape(-1, 3), axis=0).max() > 10


def hand_rollout_and_last_layer(maps: np.ndarray, residual_weight: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Oracle for the evaluate test, from full maps ``[layers, heads, n, n]`` of a one-class-token model:
    the class token's rollout row and its last-layer mean-over-heads row, patches only ``[n - 1]``."""
    tokens = maps.shape[-1]
    joint = np.eye(tokens)
    for layer in maps.astype(np.float64):
        mixed = residual_weight * np.eye(tokens) + (1 - residual_weight) * layer.mean(0)
        joint = (mixed / mixed.sum(-1, keepdims=True)) @ joint
    return joint[0, 1:], maps[-1].mean(0)[0, 1:]


@pytest.mark.slow
def test_evaluate_scores_a_generated_set_and_its_pointing_matches_a_hand_rollout(tmp_path, capsys):
    from vit_explorer import load_model
    from vit_explorer.core.capture import StackingSink, capture
    from vit_explorer.core.images import load_image, to_pixels

    assert main(["make-shapes", str(tmp_path / "set"), "--count", "6", "--seed", "11"]) in (0, None)
    out = tmp_path / "scores"
    capsys.readouterr()
    main(["evaluate", str(tmp_path / "set" / "images"), "--model", "builtin:shapes", "--methods", "rollout,cls",
          "--steps", "4", "--out", str(out)])
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "builtin:shapes: trained weights, 6 images"
    assert printed[1] == ("method | deletion | insertion | deletion_relative | insertion_relative | perturbation | pointing | "
                          "energy | class_pointing")
    assert [line.split(" | ")[0] for line in printed[3:]] == ["rollout", "cls", "random"]
    report = json.loads((out / "evaluation.json").read_text())
    assert report["images"] == 6 and report["skipped"] == [] and report["weights"] == "trained"

    model = load_model("builtin:shapes")
    paths = sorted((tmp_path / "set" / "images").glob("*/*.png"))
    hits = {"rollout": [], "cls": []}
    correct = []
    for path in paths:
        mask = np.asarray(Image.open(tmp_path / "set" / "masks" / path.relative_to(tmp_path / "set" / "images"))) > 127
        pixels = to_pixels(load_image(path), model.preprocess)
        captured = capture(model, pixels, StackingSink(model.map_shape[0]))
        correct.append(float(model.labels[int(captured.logits[0].argmax())] == path.parent.name))
        rows, cols = model.layout.grid_hw
        cell_h, cell_w = mask.shape[0] // rows, mask.shape[1] // cols
        for method, row in zip(("rollout", "cls"), hand_rollout_and_last_layer(captured.kept[0].numpy()), strict=True):
            peak = int(np.argmax(row))
            row_index, col_index = divmod(peak, cols)
            near = mask[max(row_index - 1, 0) * cell_h : (row_index + 2) * cell_h,
                        max(col_index - 1, 0) * cell_w : (col_index + 2) * cell_w]
            hits[method].append(float(near.any()))
    assert report["accuracy"] == pytest.approx(np.mean(correct))
    for row in report["table"]:
        for score in ("deletion", "insertion", "perturbation"):
            low, high = row[score]["ci95"]
            assert 0.0 <= low <= row[score]["mean"] <= high <= 1.0 and row[score]["images"] == 6
        if row["method"] in hits:
            assert report["per_image"][f"{row['method']}/pointing"] == hits[row["method"]]
            assert row["pointing"]["mean"] == pytest.approx(np.mean(hits[row["method"]]))


def run_in_terminal(argv: list[str], cwd: Path) -> str:
    """``python -m vit_explorer.cli ARGV`` with stdout and stderr on a pseudo-terminal; everything it wrote."""
    import os
    import pty

    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "vit_explorer.cli", *argv], stdout=follower, stderr=follower, cwd=cwd,
                               env={**os.environ, "COLUMNS": "100"})
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(timeout=300)
    os.close(leader)
    assert process.returncode == 0, b"".join(chunks).decode(errors="replace")[-2000:]
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_evaluate_shows_a_progress_bar_on_a_terminal_and_none_in_a_pipe(tmp_path):
    assert main(["make-shapes", str(tmp_path / "set"), "--count", "3", "--seed", "4"]) in (0, None)
    argv = ["evaluate", str(tmp_path / "set" / "images"), "--methods", "rollout", "--steps", "2"]
    on_terminal = run_in_terminal([*argv, "--out", str(tmp_path / "a")], tmp_path)
    # tqdm's bar, "evaluate:  33%|…| 1/3 [00:00<00:00, 6.89img/s]"; which counts it draws depends on the speed
    assert re.search(r"evaluate:\s+\d+%\|.*\| [0-3]/3 \[.*img/s\]", on_terminal), on_terminal
    piped = subprocess.run([sys.executable, "-m", "vit_explorer.cli", *argv, "--out", str(tmp_path / "b")], capture_output=True,
                           text=True, timeout=300, cwd=tmp_path)
    assert piped.returncode == 0 and "3/3" not in piped.stderr and "evaluate:" not in piped.stderr
    assert "method | deletion" in piped.stdout  # the table, without the bar


@pytest.mark.slow
def test_evaluate_on_two_shape_images_scores_class_sensitive_pointing(tmp_path):
    """Each class's map is checked against the public ``explain`` for that class; a class-agnostic map cannot score."""
    from vit_explorer import explain, load_model
    from vit_explorer.core.images import load_image, model_view
    from vit_explorer.methods.evaluation import patch_mask

    assert main(["make-shapes", str(tmp_path / "pairs"), "--count", "4", "--seed", "31", "--objects", "2"]) == 0
    assert main(["evaluate", str(tmp_path / "pairs" / "images"), "--model", "builtin:shapes", "--methods", "relevance,rollout",
                 "--steps", "2", "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "evaluation.json").read_text())
    scores = report["per_image"]
    assert scores["rollout/class_pointing"] == [0.0] * 4  # one map for both classes peaks on at most one shape
    model = load_model("builtin:shapes")
    for index, path in enumerate(sorted((tmp_path / "pairs" / "images").rglob("*.png"))):
        hits = []
        for name in path.parent.name.split("+"):
            explanation = explain(path, model, method="relevance", target=name)
            mask_file = tmp_path / "pairs" / "masks" / path.parent.name / path.stem / f"{name}.png"
            mask = model_view(load_image(mask_file), model.preprocess, "stretch").mean(axis=-1) > 127
            hits.append(bool(patch_mask(mask, model.layout.grid_hw, dilate=0).flatten()[explanation.map.argmax()]))
        assert scores["relevance/class_pointing"][index] == float(all(hits))
    assert {row["method"] for row in report["table"]} == {"relevance", "rollout", "random"}


def test_analyze_scoreboard_writes_the_ranking_and_prints_it(tmp_path, capsys, image_file):
    checkpoint = write_checkpoint(tmp_path / "model.safetensors", CLI_MODEL)
    out = tmp_path / "out"
    assert main(["analyze", str(image_file), "--model", str(checkpoint), "--out", str(out), "--no-faithfulness", "--scoreboard",
                 "--baseline", "mean"]) == 0
    record = json.loads((out / "scoreboard.json").read_text())
    assert record["baseline"] == "mean" and record["curves"] == {"deletion": "deletion", "insertion": "insertion"}
    scores = [row["score"] for row in record["ranking"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == 6
    printed = capsys.readouterr().out
    assert f"1. {record['ranking'][0]['method']}: score {scores[0]:.3f}" in printed and "chance (random orders)" in printed


def test_decompose_writes_every_part_and_the_lens_for_the_target(tmp_path, capsys, cli_checkpoint, image_file):
    """``--decompose``: the JSON's parts add up to its score, which is the target's logit as the model gives it; its heads
    are ``vit_explorer.decompose``'s for the same image and target; the pictures are written."""
    from vit_explorer import decompose, load_model
    from vit_explorer.core.images import load_image, model_view, to_pixels

    out = tmp_path / "out"
    assert main(["analyze", str(image_file), "--model", str(cli_checkpoint), "--out", str(out), "--no-faithfulness",
                 "--decompose", "--target", "thing 1"]) == 0
    record = json.loads((out / "decomposition.json").read_text())
    model = load_model(str(cli_checkpoint))
    logits = model.logits(to_pixels(model_view(load_image(str(image_file)), model.preprocess, "stretch"), model.preprocess))[0]
    assert record["target"] == 1 and record["target_label"] == "thing 1"
    assert record["score"] == pytest.approx(float(logits[1]), abs=1e-5)
    parts = np.sum(record["heads"]) + np.sum(record["mlps"]) + sum(record["rest"].values())
    assert parts == pytest.approx(record["score"], abs=1e-4 * max(1.0, np.abs(record["heads"]).max()))
    assert record["lens"][-1] == pytest.approx(record["score"], abs=1e-5) and len(record["lens"]) == CLI_MODEL["depth"]
    assert len(record["lens_top"][-1]) == 4 and record["lens_top"][-1][0]["class"] == model.labels[int(logits.argmax())]
    np.testing.assert_allclose(record["heads"], decompose(str(image_file), model, "thing 1").heads.numpy(), atol=1e-6)
    for name in ("contributions.png", "contributions_chart.png", "lens.png"):
        assert Image.open(out / name).size[0] > 300
    assert "decomposition of 'thing 1'" in capsys.readouterr().out


def test_analyze_explains_text_prompts_on_a_clip_model(tmp_path, capsys):
    """``--target text:A|*B|C`` on a CLIP model: the zero-shot prediction over the prompts, the marked prompt's map, its
    decomposition and the report's table of prompts; on a model without a text tower, a refusal before any pass."""
    transformers = pytest.importorskip("transformers")
    from test_clip_families import TEXT, VISION

    transformers.CLIPConfig(vision_config=VISION, text_config=TEXT, projection_dim=16).save_pretrained(tmp_path / "clip")
    photo((40, 40)).save(tmp_path / "image.png")
    prompts = ["a red star", "a blue circle", "a cat"]
    assert main(["analyze", str(tmp_path / "image.png"), "--model", f"hf:{tmp_path / 'clip'}@random", "--out",
                 str(tmp_path / "out"),
                 "--method", "attnlrp", "--target", f"text:{prompts[0]}|*{prompts[1]}|{prompts[2]}", "--decompose", "--html",
                 "--no-faithfulness"]) == 0
    err = capsys.readouterr().err
    assert "best-matching prompt:" in err and "among 3 prompts" in err
    decomposition = json.loads((tmp_path / "out" / "decomposition.json").read_text())
    assert decomposition["target_label"] == prompts[1] and decomposition["target"] == 1  # the marked prompt is explained
    report = (tmp_path / "out" / "report.html").read_text()
    assert "<h2>Zero-shot prediction</h2>" in report and all(prompt in report for prompt in prompts)
    assert main(["analyze", str(tmp_path / "image.png"), "--out", str(tmp_path / "refused"), "--target", "text:a dog"]) == 1
    assert "no text tower" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["--model", "timm:vit_base_patch16_224"], ["--port", "7861", "--no-browser"],
                                  ["--model", "builtin:shapes-clip", "--host", "127.0.0.1", "--input-size", "224"]])
def test_every_serve_option_works_without_the_word_serve(monkeypatch, argv):
    import vit_explorer.web.app as app

    served = []
    monkeypatch.setattr(app, "serve", lambda **options: served.append(options))
    assert main(argv) == 0
    assert main(["serve", *argv]) == 0
    assert served[0] == served[1]  # the same call as with the word
    if "--model" in argv:
        assert served[0]["model_spec"] == argv[argv.index("--model") + 1]
    if "--port" in argv:
        assert served[0]["port"] == 7861 and served[0]["open_browser"] is False


def test_a_bad_choice_is_one_line_with_the_valid_choices(tmp_path, capsys, image_file):
    with pytest.raises(SystemExit) as exit_code:
        main(["analyze", str(image_file), "--out", str(tmp_path / "out"), "--method", "nonsense"])
    error = capsys.readouterr().err.strip().splitlines()
    assert exit_code.value.code == 2 and len(error) == 1
    assert "invalid choice: 'nonsense'" in error[0] and "attnlrp" in error[0] and "legrad" in error[0]
    assert error[0].startswith("vit-explorer analyze: error:")


def test_a_folder_as_the_image_is_one_line_saying_so(tmp_path, capsys):
    folder = tmp_path / "photos"
    folder.mkdir()
    assert main(["analyze", str(folder), "--out", str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "is a folder" in error[0] and "no such file" not in error[0]


def test_text_prompts_explain_the_best_match_and_say_what_the_model_did_not_read(tmp_path, capsys):
    """On the shipped shapes-CLIP, ``text:a zebra|a square`` on the square example: the best match ("a square") is explained
    and scored, not the first prompt; "zebra" is named as a word the model does not know; rollout's line says that the map
    is the same for every target (only its score is measured against one)."""
    from vit_explorer.models.builtin import EXAMPLES

    assert main(["analyze", str(EXAMPLES / "05-square.png"), "--model", "builtin:shapes-clip", "--out", str(tmp_path / "out"),
                 "--target", "text:a zebra|a square", "--steps", "4", "--random-orders", "1"]) == 0
    captured = capsys.readouterr()
    assert "best-matching prompt: a square" in captured.err
    assert "“zebra”" in captured.err and "not known to it" in captured.err
    score_line = next(line for line in captured.out.splitlines() if line.startswith("rollout map"))
    assert "scored for 'a square'" in score_line and "the same for every target" in score_line
    assert json.loads((tmp_path / "out" / "faithfulness.json").read_text())["target_label"] == "a square"
