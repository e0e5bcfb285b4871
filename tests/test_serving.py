"""The served app: loopback only by default, and no file from outside its own folders."""

import time
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
        line = f"serving {checkpoint} at {url.rstrip('/')} (this machine only); press Ctrl+C to stop"
        for _ in range(100):  # the app answers HTTP a moment before `serve` prints its line
            log = (tmp_path / "server.log").read_text()
            if line in log:
                break
            time.sleep(0.1)
        assert line in log, log
        assert "share=True" not in log, log
        for path in (f"gradio_api/file={secret}", f"file={secret}", "gradio_api/file=/etc/passwd",
                     "gradio_api/file=../../../../etc/passwd", f"gradio_api/file={checkpoint}"):
            status, body = fetch(url + path)
            assert b"top secret" not in body and b"root:" not in body, path
            assert status >= 400, (path, status)


def test_share_is_off_by_default_and_warns_when_on(monkeypatch, capsys, tmp_path):
    from vit_explorer.web import app

    launches = []

    def launch(self, **options):
        launches.append(options)
        self.server_port, self.share_url = 7860, "https://example.gradio.live" if options["share"] else None

    monkeypatch.setattr(app.gr.Blocks, "launch", launch)
    monkeypatch.setattr(app.gr.Blocks, "block_thread", lambda self: None)
    routed = []  # the quick answers' routes go on the launched server's app
    monkeypatch.setattr(app.quick_answer, "add_routes", routed.append)
    checkpoint = str(write_checkpoint(tmp_path / "m.safetensors", CLI_MODEL))
    app.serve(checkpoint, open_browser=False)
    assert launches[-1]["share"] is False and launches[-1]["server_name"] == "127.0.0.1"
    assert "warning" not in capsys.readouterr().err
    app.serve(checkpoint, open_browser=False, share=True)
    assert launches[-1]["share"] is True
    assert app.SHARE_WARNING in capsys.readouterr().err
    assert launches[-1]["max_file_size"] == app.MAX_UPLOAD
    assert len(routed) == 2 and launches[-1]["head"] == app.quick_answer.SCRIPT


def test_uploads_over_the_size_limit_are_refused(tmp_path):
    import httpx

    checkpoint = write_checkpoint(tmp_path / "served.safetensors", CLI_MODEL)
    with running_app(str(checkpoint), tmp_path / "server.log") as url:
        small = httpx.post(url + "gradio_api/upload", files={"files": ("small.png", b"\x89PNG" + b"0" * 1000)}, timeout=30)
        assert small.status_code == 200
        big = httpx.post(url + "gradio_api/upload", files={"files": ("big.png", b"\x89PNG" + b"0" * (21 * 2**20))}, timeout=60)
        assert big.status_code == 413, (big.status_code, big.text[:200])


def files_under(folder):
    return [path for path in folder.rglob("*") if path.is_file()]


def test_rendered_views_and_uploads_are_deleted_after_their_time_to_live(tmp_path):
    gradio_client = pytest.importorskip("gradio_client")
    from conftest import photo
    from serving import running_server

    from vit_explorer.web import app

    cache = tmp_path / "gradio-cache"
    image = tmp_path / "image.png"
    photo((256, 256)).save(image)
    checkpoint = write_checkpoint(tmp_path / "served.safetensors", CLI_MODEL)
    controls = ("inferno", True, "per tile", "none", "mean", 0.0, 0, 0.5, "relevance")
    with running_server(str(checkpoint), tmp_path / "server.log", "--cache-ttl-s", "4",
                        env={"GRADIO_TEMP_DIR": str(cache)}) as (url, _):
        client = gradio_client.Client(url, verbose=False, download_files=str(tmp_path / "downloads"))
        for _ in range(3):
            client.predict(gradio_client.handle_file(str(image)), *controls, api_name="/analyze")
            client.predict("viridis", *controls[1:], api_name="/set_colormap")
        written = files_under(cache)
        assert len(written) > 10  # every view is a PNG in the cache
        # what stays is Gradio's copy of the seven example images: fixed, however long the app runs
        examples = {path.name for path in app.EXAMPLES.glob("*.png")}
        deadline = time.monotonic() + 12  # older than 4 s, swept every 2 s: gone within about 6 s
        while True:
            outlived = [path for path in files_under(cache) if path.name not in examples]
            if not outlived or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert outlived == [], f"{len(outlived)} of {len(written)} files outlived their time to live"


def test_old_export_zips_are_removed(tmp_path, monkeypatch):
    import os

    from vit_explorer.web import session

    monkeypatch.setattr(session.tempfile, "gettempdir", lambda: str(tmp_path))
    folder = session.export_dir(ttl_s=60)
    old, new = folder / "old.zip", folder / "new.zip"
    old.write_bytes(b"old")
    new.write_bytes(b"new")
    os.utime(old, (time.time() - 120, time.time() - 120))
    session.export_dir(ttl_s=60)
    assert not old.exists() and new.exists()


def test_a_busy_port_is_one_line_naming_a_free_one(capsys):
    import socket

    from vit_explorer.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port), "--no-browser"]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"vit-explorer: error: port {port} is in use on 127.0.0.1; try --port ")
    suggested = int(error[0].rsplit(" ", 1)[1])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", suggested))  # the port it names is free


def test_an_export_that_another_session_removes_mid_cleanup_is_skipped(tmp_path, monkeypatch):
    """Sessions export at once into one folder: an entry listed by one cleanup can be gone (another session's report
    folder, moved into its zip) before it is looked at. That failed an export with FileNotFoundError in CI."""
    import os

    from vit_explorer.web import session

    monkeypatch.setattr(session.tempfile, "gettempdir", lambda: str(tmp_path))
    folder = session.export_dir(ttl_s=60)
    old = folder / "old.zip"
    old.write_bytes(b"old")
    os.utime(old, (time.time() - 120, time.time() - 120))
    listed = [folder / "vit-explorer-report-gone", old]  # the first vanished between the listing and its stat
    monkeypatch.setattr(type(folder), "iterdir", lambda self: iter(listed))
    assert session.export_dir(ttl_s=60) == folder
    assert not old.exists()  # the cleanup went on past it
