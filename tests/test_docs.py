"""The README stays a newcomer's page, its links lead somewhere, and its figures are what the code does today."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_short_enough_to_read_to_the_end():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, len(lines)
    text = "\n".join(lines)
    for words in ("## Quick start", "## Set up", "python -m pytest", "pip install . && vit-explorer", "## Commands",
                  "## Documentation"):
        assert words in text, words


def test_the_readme_says_what_to_do_when_the_cpu_index_is_unreachable_and_its_check_runs():
    """A CPU torch with a CUDA torchvision fails to import; the README gives one command for a matching pair and a
    check, and the check is a command that runs and prints both versions."""
    import subprocess
    import sys

    import torch
    import torchvision

    text = (ROOT / "README.md").read_text()
    fallback = text[text.index("If that index cannot be reached"):]
    block = fallback[fallback.index("```bash") + len("```bash"):fallback.index("```", fallback.index("```bash") + 3)]
    install, check = [line.strip() for line in block.strip().splitlines()]
    assert install.split()[:3] == ["pip", "install", "--force-reinstall"] and install.split()[3:] == ["torch", "torchvision"]
    code = re.fullmatch(r'python -c "(.+)"', check).group(1)
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert printed == [torch.__version__, torchvision.__version__]


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.name)
def test_every_relative_link_and_picture_exists(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


@pytest.mark.slow
def test_the_report_size_the_readme_states_is_todays(tmp_path):
    """The README says how large report.html is for the shipped model with every option; that figure drifted
    (1.4 MB said, 1.7 MB written): it is checked against a run."""
    from vit_explorer.cli import main
    from vit_explorer.models.builtin import EXAMPLES

    stated = float(re.search(r"\(([\d.]+) MB for the shipped model with every option", (ROOT / "README.md").read_text()).group(1))
    out = tmp_path / "out"
    assert main(["analyze", str(EXAMPLES / "05-square.png"), "--out", str(out), "--html", "--sanity", "--norms", "--ablation",
                 "--scoreboard", "--method", "attnlrp"]) == 0
    written = (out / "report.html").stat().st_size / 1e6
    assert abs(written - stated) <= 0.1 * stated, (written, stated)
