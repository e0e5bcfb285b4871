"""The served app: loopback only by default, and no file from outside its own folders."""

import urllib.error
import urllib.request

import pytest

from conftest import CLI_MODEL, write_checkpoint
from serving import running_app
from vit_explorer.cli import parser

pytestmark = pytest.mark.slow


def fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_serve_defaults_are_loopback_and_no_share():
    arguments = parser().parse_args(["serve"])
    assert arguments.host == "127.0.0.1" and arguments.share is False


def test_file_routes_do_not_serve_files_outside_the_app(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret contents")
    checkpoint = write_checkpoint(tmp_path / "served.safetensors", CLI_MODEL)
    with running_app(str(checkpoint), tmp_path / "server.log") as url:
        for path in (f"gradio_api/file={secret}", f"file={secret}", "gradio_api/file=/etc/passwd",
                     "gradio_api/file=../../../../etc/passwd", f"gradio_api/file={checkpoint}"):
            status, body = fetch(url + path)
            assert b"top secret" not in body and b"root:" not in body, path
            assert status >= 400, (path, status)
