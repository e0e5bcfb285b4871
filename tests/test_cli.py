import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import CLI_MODEL, photo, write_checkpoint
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
    assert result.stdout.startswith("rollout map for 'thing ") and "deletion AUC" in result.stdout and "insertion AUC" in result.stdout
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr, result.stderr
    assert sorted(path.name for path in out.iterdir()) == ["attention.npz", "faithfulness.json", "faithfulness.png", "heads.png", "rollout.png"]
    saved = np.load(out / "attention.npz")
    assert saved["attentions"].shape == (6, 4, 257, 257)
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
            if action.default not in (None, False):
                assert f"(default: {action.default})" in text or "(default" in action.help, (name, action.dest)


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
