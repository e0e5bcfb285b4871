"""Hub downloads that never hang: the local cache first, the network only when it answers.

timm and transformers fetch weights through ``huggingface_hub``, which retries an unreachable host
for about a minute, printing a line per retry. Here a hub load is first tried with the hub switched
offline (the cache only, no request at all); if the files are not cached, one short HTTP probe of the
hub decides between a real download and an immediate, actionable error.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar
from urllib.parse import urlparse

from vit_explorer.errors import VitExplorerError

T = TypeVar("T")
PROBE_TIMEOUT_S = 3.0
_offline_lock = threading.Lock()


@contextmanager
def hub_offline() -> Iterator[None]:
    """``huggingface_hub`` in offline mode (every request refused at once) while active."""
    from huggingface_hub import constants

    with _offline_lock:
        saved = constants.HF_HUB_OFFLINE
        constants.HF_HUB_OFFLINE = True
        try:
            yield
        finally:
            constants.HF_HUB_OFFLINE = saved


def hub_reachable(timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the hub answers one HTTP request (any status) within ``timeout_s``, name lookup included.

    An HTTP answer, not an open TCP connection, is the test: behind a transparent proxy every
    connection opens, whether or not anything answers at the other end.
    """
    from huggingface_hub import constants

    answer: list[bool] = []

    def probe() -> None:
        request = urllib.request.Request(constants.ENDPOINT, method="HEAD")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s):
                answer.append(True)
        except urllib.error.HTTPError:  # an error status is still an answer
            answer.append(True)
        except (OSError, ValueError):
            answer.append(False)

    # a name lookup ignores socket timeouts, so the probe runs where it can be abandoned
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(answer and answer[0])


def cache_miss(error: BaseException) -> bool:
    """Whether ``error`` is what a hub load raises offline when its files are not cached."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    return isinstance(error, (LocalEntryNotFoundError, OfflineModeIsEnabled, OSError))


def load_cached_or_fetch(load: Callable[[], T], what: str, hint: str) -> T:
    """``load()`` from the local cache; if ``what`` is not cached, from the hub when it can be reached,
    else a ``VitExplorerError`` at once (``hint``: how to load it without network)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:  # the user asked for offline: the library's own error says it all
        return load()
    try:
        with hub_offline():
            return load()
    except Exception as error:  # anything but a cache miss is the loader's own error, raised as it is
        if not cache_miss(error):
            raise
    if not hub_reachable():
        host = urlparse(constants.ENDPOINT).hostname
        raise VitExplorerError(f"{what} is not in the local cache and {host} cannot be reached from here. {hint}")
    return load()
