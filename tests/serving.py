"""Start ``vit-explorer serve`` on a free loopback port for tests, and stop it afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def running_server(model: str, log: Path, *extra: str, env: dict | None = None,
                   timeout_s: float = 120.0) -> Iterator[tuple[str, subprocess.Popen]]:
    """The URL and process of a served app (``extra``: more ``serve`` arguments); its output goes to ``log``."""
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "w") as output:
        server = subprocess.Popen(
            [sys.executable, "-m", "vit_explorer.cli", "serve", "--model", model, "--port", str(port), "--no-browser", *extra],
            stdout=output, stderr=subprocess.STDOUT, env=env,
        )
        url = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"the app exited with {server.returncode}: {log.read_text()[-2000:]}")
                try:
                    with urllib.request.urlopen(url, timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the app did not answer within {timeout_s} s: {log.read_text()[-2000:]}")
                time.sleep(0.5)
            yield url, server
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()


@contextlib.contextmanager
def running_app(model: str, log: Path, timeout_s: float = 120.0) -> Iterator[str]:
    """The URL of a served app; the server's output goes to ``log``."""
    with running_server(model, log, timeout_s=timeout_s) as (url, _):
        yield url


def rss_mib(process: subprocess.Popen) -> float:
    """Resident memory of a running process, from /proc."""
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {process.pid}")


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"  # Debian's: Playwright's own browser download does not work here
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@contextlib.contextmanager
def chromium_page(width: int = 1280, height: int = 800) -> Iterator[tuple[object, list[str]]]:
    """A page of headless Chromium at ``width`` × ``height``, and the list its JavaScript errors go to."""
    from playwright import sync_api

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            yield page, errors
        finally:
            browser.close()


def open_and_upload(page, url: str, image: Path, timeout_ms: int = 90_000) -> None:
    """Open the app at ``url``, upload ``image`` and wait until the overview's rollout is on screen."""
    page.goto(url)
    page.wait_for_selector("#upload input[type=file]", state="attached", timeout=30_000)
    page.locator("#upload input[type=file]").set_input_files(str(image))
    page.wait_for_selector("#overview-rollout img", timeout=timeout_ms)


def wait_or_explain(page, selector: str, log: Path, timeout_ms: int = 90_000) -> None:
    """Wait until ``selector`` is in the page; if it never comes, fail with what the user would have seen instead (the
    toasts on screen) and the end of the server's output ``log``, so that a failure on a CI machine says why."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector(selector, state="attached", timeout=timeout_ms)
    except PlaywrightTimeout:
        toasts = [toast.inner_text() for toast in page.locator(".toast-body").all()]
        raise AssertionError(f"{selector} did not appear within {timeout_ms / 1000:.0f} s; toasts on screen: {toasts}; "
                             f"the server's output ends: {log.read_text()[-3000:]}") from None


def image_bytes(page, elem_id: str) -> bytes:
    """The bytes of the picture ``#elem_id`` shows: a file Gradio serves, or a quick answer's ``blob:`` URL, which is
    read in the page (and, revoked once Gradio's event shows the same file, read again from the new source)."""
    for _ in range(20):
        source = page.locator(f"#{elem_id} img").first.get_attribute("src")
        assert source, f"#{elem_id} shows no image"
        if not source.startswith("blob:"):
            return page.request.get(source).body()
        data = page.evaluate("""async (url) => {
            try { return Array.from(new Uint8Array(await (await fetch(url)).arrayBuffer())); } catch (error) { return null; }
        }""", source)
        if data is not None:
            return bytes(data)
        page.wait_for_timeout(100)
    raise AssertionError(f"#{elem_id} kept showing revoked blob: URLs")


def wait_for_change(page, elem_id: str, before: bytes, timeout_s: float = 30.0) -> bytes:
    for _ in range(int(timeout_s * 4)):
        page.wait_for_timeout(250)
        after = image_bytes(page, elem_id)
        if after != before:
            return after
    raise AssertionError(f"#{elem_id} did not change")


def click_natural(page, elem_id: str, x: float, y: float) -> None:
    """Click the pixel (x, y) of the image's natural size, wherever the page scaled it to."""
    image = page.locator(f"#{elem_id} img").first
    image.scroll_into_view_if_needed()  # a mouse click lands only inside the viewport
    natural_w, natural_h = image.evaluate("(img) => [img.naturalWidth, img.naturalHeight]")
    box = image.bounding_box()
    scale = min(1.0, box["width"] / natural_w, box["height"] / natural_h)  # object-fit: scale-down
    left = box["x"] + (box["width"] - natural_w * scale) / 2
    top = box["y"] + (box["height"] - natural_h * scale) / 2
    page.mouse.click(left + x * scale, top + y * scale)
