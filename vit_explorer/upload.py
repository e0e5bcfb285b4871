"""The app's image input: Gradio's image component, handing the uploaded file over unopened."""

from __future__ import annotations

import gradio as gr


class ImageUpload(gr.Image):
    """An image input (upload, paste, webcam off) that hands the uploaded file over unopened.

    Gradio's own image preprocessing opens the file with Pillow before the callback runs, which
    turns a hostile or broken file into a bare "Error"; vit_explorer's decoder gives a message instead.
    """

    is_template = True  # rendered by the frontend's ordinary image component

    def preprocess(self, payload):  # type: ignore[override]
        return None if payload is None else payload.path
