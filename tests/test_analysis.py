import numpy as np
import pytest
import torch

from conftest import photo
from vit_explorer import analyze, load_model, record_attention
from vit_explorer.images import model_view, to_pixels


def test_analyze_captures_once_and_returns_cpu_arrays(tiny_checkpoint, image_file):
    model = load_model(str(tiny_checkpoint))
    result = analyze(model, image_file)
    assert result.image.shape == (64, 64, 3) and result.image.dtype == np.uint8
    assert result.attentions.shape == (3, 4, 17, 17) and result.attentions.dtype == np.float32
    assert result.grid == (4, 4) and result.num_prefix_tokens == 1
    np.testing.assert_allclose(result.probs.sum(), 1.0, rtol=1e-6)
    top = result.top_k(5)
    assert [p.prob for p in top] == sorted((p.prob for p in top), reverse=True)
    assert top[0].label == f"thing {int(np.argmax(result.logits))}"
    pixels = to_pixels(model_view(photo().convert("RGB"), model.preprocess), model.preprocess)
    logits, attentions = record_attention(model, pixels)
    np.testing.assert_allclose(result.attentions, attentions[0].numpy())
    np.testing.assert_allclose(result.logits, logits[0].numpy())


def test_analyze_accepts_pil_images_and_bytes(tiny_checkpoint, image_file):
    model = load_model(str(tiny_checkpoint))
    from_path = analyze(model, image_file)
    from_bytes = analyze(model, image_file.read_bytes())
    from_pil = analyze(model, photo())
    np.testing.assert_array_equal(from_path.attentions, from_bytes.attentions)
    np.testing.assert_allclose(from_path.attentions, from_pil.attentions, atol=1e-6)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()  # capture left no global mode behind
