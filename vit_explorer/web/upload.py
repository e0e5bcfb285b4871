"""The app's image input: Gradio's image component, handing the uploaded file over unopened."""

from __future__ import annotations

from typing import Any

import gradio as gr


def image_upload(**options: Any) -> gr.Image:
    """An image input that gives the callback the uploaded file's path, unopened.

    Gradio's own image preprocessing opens the file with Pillow before the callback runs, which turns a
    hostile or broken file into a bare "Error"; vit_explorer's decoder gives a message instead. The
    instance's ``preprocess`` is replaced rather than subclassed: Gradio writes a ``.pyi`` stub beside the
    source of every component subclass, into site-packages too.
    """
    component = gr.Image(type="filepath", **options)
    component.preprocess = lambda payload: None if payload is None else payload.path  # type: ignore[method-assign]
    return component
