"""The captured maps of one image, kept one of two ways, behind one interface.

Full: every head's map ``[layers, heads, n, n]`` (float32, or float16 above the memory budget). Compact (above
twice the budget): per layer the head-mean matrix ``[layers, n, n]``, every head's rows of the prefix tokens
``[layers, heads, prefix, n]`` and of the mean patch query ``[layers, heads, n]`` (float16), and the head
statistics ``{name: [layers, heads]}``, reduced as each layer arrived (``capture.CompactSink``). A compact store
keeps no patch query's rows; those are recomputed with the model (``analysis.recompute_query_rows``) and handed
to the store, which then answers them like any other. Readers ask the store for what they need (query rows, a
head statistic, the head-mean maps, the compact form); none asks which kind it is.
"""

from __future__ import annotations

from typing import Any

import torch

from vit_explorer.core import statistics
from vit_explorer.core.capture import compact_layer, stack_compact
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.layout import TokenLayout


class MapStore:
    """The maps of one analysis: ``full`` ``[layers, heads, n, n]`` or ``compact`` (module doc), never both."""

    def __init__(self, layout: TokenLayout, full: torch.Tensor | None = None, compact: dict[str, Any] | None = None) -> None:
        if (full is None) == (compact is None):
            raise ValueError("a map store keeps either the full maps or the compact form")
        self.layout = layout
        self.full = full
        self.compact = compact
        self.patch_rows: dict[int, torch.Tensor] = {}  # recomputed patch queries' rows ``[layers, heads, n]``, compact only
        self.reduced: dict[str, Any] | None = None  # the compact form of full maps, once asked for

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, heads)."""
        return tuple((self.full if self.full is not None else self.compact["patch_mean_rows"]).shape[:2])

    @property
    def storage(self) -> str:
        if self.full is None:
            return "compact float16 (head means, prefix rows, statistics)"
        return str(self.full.dtype).removeprefix("torch.")

    @property
    def nbytes(self) -> int:
        if self.full is not None:
            return self.full.nbytes
        return (sum(value.nbytes for value in self.compact.values() if isinstance(value, torch.Tensor))
                + sum(value.nbytes for value in self.compact["statistics"].values()))

    @property
    def full_bytes(self) -> int:
        """Bytes of every head's full map as kept; 0 where only the compact form was kept."""
        return 0 if self.full is None else self.full.nbytes

    def keeps_rows_of(self, token: int) -> bool:
        """Whether ``query_rows`` can answer for ``token`` without the model."""
        return self.full is not None or token < self.layout.num_prefix_tokens or token in self.patch_rows

    def add_patch_rows(self, token: int, rows: torch.Tensor) -> None:
        """A patch query's rows ``[layers, heads, n]``, recomputed with the model, for a compact store."""
        self.patch_rows[token] = rows

    def query_rows(self, token: int | None) -> torch.Tensor:
        """Where ``token`` (None: the mean of the patch queries) looks in every layer and head ``[layers, heads, n]`` float32."""
        prefix = self.layout.num_prefix_tokens
        if self.full is not None:
            if token is None:
                return self.full[:, :, prefix:, :].mean(dim=2, dtype=torch.float32)
            return self.full[:, :, token, :].float().contiguous()
        if token is None:
            return self.compact["patch_mean_rows"].float()
        if token < prefix:
            return self.compact["prefix_rows"][:, :, token, :].float()
        if token in self.patch_rows:
            return self.patch_rows[token]
        raise VitExplorerError(f"this analysis kept its maps compactly, so the rows of patch query {token} must be recomputed "
                               "with the model first: analysis.recompute_query_rows(model, analysis, query)")

    def head_statistic(self, name: str) -> torch.Tensor:
        """One of ``statistics.HEAD_STATISTICS`` ``[layers, heads]``."""
        if name not in statistics.HEAD_STATISTICS:
            raise VitExplorerError(f"unknown head statistic {name!r}; use one of {', '.join(statistics.HEAD_STATISTICS)}")
        if self.full is None:
            return self.compact["statistics"][name]
        return statistics.HEAD_STATISTICS[name](self.full, self.layout)

    def head_maps(self, head_fusion: str = "mean") -> torch.Tensor:
        """The maps rollout multiplies ``[layers, heads, n, n]``; a compact store has the head means only, as one head."""
        if self.full is not None:
            return self.full
        if head_fusion != "mean":
            raise VitExplorerError("this analysis kept only head-mean maps to stay within its memory budget, so rollout can fuse "
                                   "heads by mean only; raise the memory budget for max or min")
        return self.compact["head_mean"][:, None]

    def head_means(self) -> torch.Tensor:
        """Each layer's map averaged over heads ``[layers, n, n]``."""
        return self.full.mean(dim=1) if self.full is not None else self.compact["head_mean"]

    def compact_form(self) -> dict[str, Any]:
        """The compact reduction (module doc): kept as it is, or reduced from the full maps."""
        if self.compact is not None:
            return self.compact
        if self.reduced is None:
            self.reduced = stack_compact([compact_layer(layer, self.layout, statistics.head_statistics) for layer in self.full])
        return self.reduced
