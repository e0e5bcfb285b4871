"""Two browser sessions at once on one served app: each keeps its own analysis."""

import zipfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import CLI_MODEL, photo, write_checkpoint
from serving import running_app

from vit_explorer import analyze, load_model
from vit_explorer.web.session import CONTROL_NAMES, Controls

pytestmark = pytest.mark.slow
gradio_client = pytest.importorskip("gradio_client")
CONTROLS = tuple(getattr(Controls(), name) for name in CONTROL_NAMES if name != "comparison")  # a State is no API input


def session_run(url: str, image_path: str) -> np.ndarray:
    """Analyse in a fresh client session, then export from that session's state."""
    client = gradio_client.Client(url, verbose=False)
    client.predict(gradio_client.handle_file(image_path), *CONTROLS, api_name="/analyze")
    archive = client.predict(True, *CONTROLS, api_name="/export")  # with every head's full map
    with zipfile.ZipFile(archive) as bundle, bundle.open("attention.npz") as handle:
        return np.load(handle)["attentions"]


def test_concurrent_sessions_keep_their_own_maps(tmp_path):
    checkpoint = write_checkpoint(tmp_path / "sessions.safetensors", CLI_MODEL)
    images = []
    for seed in range(4):
        path = tmp_path / f"image{seed}.png"
        photo((256, 256), seed=seed).save(path)
        images.append(str(path))
    model = load_model(str(checkpoint))
    expected = [analyze(model, path).attentions for path in images]
    with running_app(str(checkpoint), tmp_path / "server.log") as url, ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda path: session_run(url, path), images))
    for got, want in zip(results, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert not np.allclose(results[0], results[1])
