"""Install like a user: the built wheel carries both shipped models and runs from any folder."""

import site
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPOSITORY), "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(dist)],
                   check=True, capture_output=True, timeout=600)
    (built,) = dist.glob("vit_explorer-*.whl")
    return built


def test_the_wheel_holds_the_model_and_the_examples(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    # both shipped models
    assert {"vit_explorer/assets/shapes.safetensors", "vit_explorer/assets/shapes-clip.safetensors"} <= names
    assert wheel.stat().st_size < 20 * 2**20
    # every layer, and the page's script
    assert {"vit_explorer/web/app.py", "vit_explorer/web/tabs/__init__.py", "vit_explorer/web/tabs/shared.py",
            "vit_explorer/core/capture.py", "vit_explorer/methods/sanity.py", "vit_explorer/draw/render.py",
            "vit_explorer/shapes/train.py", "vit_explorer/web/quick_answer.js"} <= names
    assert len([name for name in names if name.startswith("vit_explorer/assets/examples/")
                and name.endswith(".png")]) == len(list((REPOSITORY / "assets" / "examples").glob("*.png"))) == 7
    assert not any(name.startswith("vit_explorer/assets/screenshot") for name in names)  # the README's pictures stay out


def environment_beside_this_one(environment: Path) -> Path:
    """A new venv that sees this interpreter's packages (torch and the rest) but not its editable checkout.

    ``system_site_packages`` would give the base interpreter's packages, which lack torch when this one is
    itself a venv; a ``.pth`` naming this one's site folders adds them after the new venv's own, and the
    ``.pth`` files inside them (the editable install's finder) are not run, so the wheel is what imports."""
    venv.EnvBuilder(with_pip=False).create(environment)
    python = environment / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()])
    Path(own, "outer-site-packages.pth").write_text("\n".join(ours) + "\n")
    return python


def test_an_installed_wheel_analyses_an_example_from_an_unrelated_folder(wheel, tmp_path):
    environment = tmp_path / "venv"
    python = environment_beside_this_one(environment)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--ignore-installed", "-q",
                    str(wheel)],
                   check=True, capture_output=True, timeout=600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    located = subprocess.run([str(python), "-c", "import vit_explorer; print(vit_explorer.__file__)"], cwd=elsewhere,
                             capture_output=True, text=True, check=True)
    assert located.stdout.startswith(str(environment)), located.stdout  # the wheel's copy, not the checkout
    example = next((REPOSITORY / "assets" / "examples").glob("*.png"))
    result = subprocess.run([str(environment / "bin" / "vit-explorer"), "analyze", str(example), "--out", "out",
                             "--no-faithfulness"],
                            cwd=elsewhere, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert {"rollout.png", "heads.png", "attention.npz"} <= {path.name for path in (elsewhere / "out").iterdir()}
    assert "loading builtin:shapes" in result.stderr
    prompted = subprocess.run([str(environment / "bin" / "vit-explorer"), "analyze", str(example), "--out", "prompted", "--model",
                               "builtin:shapes-clip", "--target", "text:a star|a circle", "--no-faithfulness"],
                              cwd=elsewhere, capture_output=True, text=True, timeout=600)
    assert prompted.returncode == 0 and "best-matching prompt:" in prompted.stderr, prompted.stderr
