"""The captured maps of one image, kept one of two ways, behind one interface.

Full: every head's map ``[layers, heads, n, n]`` (float32, or float16 above the memory budget). Compact (above
twice the budget): per layer the head-mean matrix ``[layers, n, n]``, every head's rows of the prefix tokens
``[layers, heads, prefix, n]`` and of the mean patch query ``[layers, heads, n]`` (float16), and the head
statistics ``{name: [layers, heads]}``, reduced by ``compact_layer`` as each layer arrived. A compact store
keeps no patch query's rows; those are recomputed with the model (``analysis.recompute_query_rows``) and handed
to the store, which then answers them like any other. Readers ask the store for what they need (query rows, a
head statistic, the head-mean maps, the compact form); none asks which kind it is.
"""

from __future__ import annotations

from typing import Any

import torch

from vit_explorer.core import statistics
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.layout import TokenLayout


def compact_layer(maps: torch.Tensor, layout: TokenLayout) -> dict[str, Any]:
    """One layer's maps ``[heads, n, n]`` reduced to the compact form (module doc), on the CPU: ``head_mean`` ``[n, n]``,
    ``prefix_rows`` ``[heads, prefix, n]``, ``patch_mean_rows`` ``[heads, n]`` (float16), ``statistics`` ``{name: [heads]}``."""
    maps = maps.to(torch.float32).cpu()
    prefix = layout.num_prefix_tokens
    return {
        "head_mean": maps.mean(dim=0).half(),  # [n, n]
        "prefix_rows": maps[:, :prefix, :].half(),  # [heads, prefix, n]
        "patch_mean_rows": maps[:, prefix:, :].mean(dim=1).half(),  # [heads, n]
        # {name: [heads]}
        "statistics": {name: values[0] for name, values in statistics.head_statistics(maps[None], layout).items()},
    }


def stack_compact(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-layer ``compact_layer`` results stacked along a leading layer axis: the compact form of every layer."""
    return {
        "head_mean": torch.stack([layer["head_mean"] for layer in layers]),
        "prefix_rows": torch.stack([layer["prefix_rows"] for layer in layers]),
        "patch_mean_rows": torch.stack([layer["patch_mean_rows"] for layer in layers]),
        "statistics": {name: torch.stack([layer["statistics"][name] for layer in layers]) for name in layers[0]["statistics"]},
    }


class MapStore:
    """The maps of one analysis: ``full`` ``[layers, heads, n, n]`` or ``compact`` (module doc), never both."""

    def __init__(self, layout: TokenLayout, full: torch.Tensor | None = None, compact: dict[str, Any] | None = None) -> None:
        if (full is None) == (compact is None):
            raise ValueError("a map store keeps either the full maps or the compact form")
        kept_tokens = (full if full is not None else compact["head_mean"]).shape[-1]
        # maps that do not fit the layout are a bug in a model family's adapter: fail before any view reads them
        assert kept_tokens == layout.num_tokens, (f"captured {kept_tokens} tokens but the layout has {layout.num_tokens} "
                                                  f"({layout.prefix_names}, grid {layout.grid_hw})")
        self.layout = layout
        # (layers, heads)
        self.shape: tuple[int, int] = tuple((full if full is not None else compact["patch_mean_rows"]).shape[:2])
        self.full = full
        self.compact = compact
        self.patch_rows: dict[int, torch.Tensor] = {}  # recomputed patch queries' rows ``[layers, heads, n]``, compact only
        self.reduced: dict[str, Any] | None = None  # the compact form of full maps, once asked for

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
            self.reduced = stack_compact([compact_layer(layer, self.layout) for layer in self.full])
        return self.reduced
