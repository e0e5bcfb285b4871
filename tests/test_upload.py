"""The upload component hands over the file unopened, and no stub file is written beside the package."""

from pathlib import Path
from types import SimpleNamespace

import gradio as gr

import vit_explorer
from vit_explorer.web.upload import image_upload


def test_the_upload_hands_over_the_path_of_even_a_broken_file(tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with gr.Blocks():
        component = image_upload(sources=["upload"])
    assert component.preprocess(SimpleNamespace(path=str(broken))) == str(broken)
    assert component.preprocess(None) is None
    assert list(Path(vit_explorer.__file__).parent.glob("*.pyi")) == []
