"""The captured maps of one image, kept one of four ways, behind one interface.

- ``DerivedMaps``: each layer's queries and keys ``[layers, heads, n, head_dim]`` and any additive term of its logits,
  recorded on the model's fused forward (``models.attention_inputs``). Every map is derived from them when asked, exactly,
  in blocks of query rows (``head_blocks``): no layer's ``[heads, n, n]`` is ever held, so that memory grows with n, not n²
  (the lesson of FlashAttention). What every family the tool loads keeps.
- ``FullMaps``: every head's map ``[layers, heads, n, n]`` (float32, or float16 above the memory budget), for a family
  whose attention is not softmax(q·kᵀ + bias) of inputs it can record, and for maps made elsewhere (a dataset's batch).
- ``WindowMaps``: a stage of a windowed ViT (a Swin), each layer's maps by window, placed on the grid when asked.
- ``CompactMaps`` (such a family above twice the budget): per layer the head-mean matrix ``[layers, n, n]``, every head's
  rows of the prefix tokens and of the mean patch query (float16) and the head statistics, reduced by ``compact_layer`` as
  each layer arrived. It keeps no patch query's rows; those are recomputed with the model
  (``analysis.recompute_query_rows``) and handed to the store, which then answers them like any other.

Readers ask the store for what they need (query rows, a head statistic, each layer's maps in blocks of rows, the
attention each token receives, the compact form); none asks which kind it is. What the store derives from every map
(``Survey``: statistics, the mean patch query's and the prefix tokens' rows, the attention received) is made in one pass
over the blocks, once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from vit_explorer.core import statistics
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.attention_inputs import AttentionInputs
from vit_explorer.models.base import softmax_in_place
from vit_explorer.models.layout import TokenLayout
from vit_explorer.models.window_layout import WindowGeometry

# the bytes of one block of derived rows ``[heads, rows, n]`` float32: small enough to stay in cache while a block's
# statistics pass over it, large enough that a block's product q·Kᵀ is one efficient matrix product
BLOCK_BYTES = 2 << 20


def attention_rows(queries: torch.Tensor, keys: torch.Tensor, bias: torch.Tensor | None, first: int) -> torch.Tensor:
    """The map rows ``first …`` of the scaled ``queries`` ``[..., r, d]`` against the ``keys`` transposed and widened to
    float32 ``[..., d, n]``, with the rows' part of the additive ``bias`` (broadcastable to ``[..., n, n]``): softmax of the
    logits, ``[..., r, n]`` float32."""
    scores = queries.float() @ keys
    if bias is not None:
        scores += bias[..., first : first + scores.shape[-2], :]
    return softmax_in_place(scores)


def input_statistics(inputs: AttentionInputs, layout: TokenLayout) -> dict[str, torch.Tensor]:
    """Every statistic of ``statistics.HEAD_STATISTICS`` ``{name: [b, heads]}`` of one layer's maps for a batch, derived
    from its attention inputs ``[b, heads, n, d]`` in blocks of rows: no image's n × n map is held whole."""
    images, heads, n, _ = inputs.queries.shape
    keys = inputs.keys.float().transpose(-2, -1)  # [b, heads, d, n]
    distances = statistics.patch_distances(layout, keys.device)
    step = max(1, BLOCK_BYTES // (images * heads * n * 4))
    sums = torch.zeros(3, images * heads, device=keys.device)
    for first in range(0, n, step):
        rows = attention_rows(inputs.queries[:, :, first : first + step], keys, inputs.bias, first)  # [b, heads, r, n]
        sums += statistics.block_sums(rows.reshape(images * heads, -1, n), first, layout, distances)
    means = sums / statistics.statistic_rows(layout).to(keys.device)[:, None]
    return dict(zip(statistics.HEAD_STATISTICS, means.view(3, images, heads), strict=True))


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


@dataclass(frozen=True)
class QueriesKeys:
    """Every layer's attention inputs for one image, what ``DerivedMaps`` keeps: the map of layer l, head h is
    ``softmax(queries[l, h] @ keys[l, h]ᵀ + biases[l][h])``.

    Attributes:
        queries: ``[layers, heads, n, head_dim]``, scaled (``AttentionInputs``); float32, or float16 above the budget.
        keys: ``[layers, heads, n, head_dim]``, in the queries' dtype.
        biases: per layer, an additive term broadcastable to ``[heads, n, n]`` (float32), or None.
    """

    queries: torch.Tensor
    keys: torch.Tensor
    biases: tuple[torch.Tensor | None, ...]

    @property
    def nbytes(self) -> int:
        return self.queries.nbytes + self.keys.nbytes + sum(bias.nbytes for bias in self.biases if bias is not None)


@dataclass(frozen=True)
class Survey:
    """What is read from every row of every map, in one pass.

    Attributes:
        statistics: ``{name: [layers, heads]}`` (``statistics.HEAD_STATISTICS``).
        patch_mean_rows: where the mean patch query looks ``[layers, heads, n]``.
        prefix_rows: where each prefix token looks ``[layers, heads, prefix, n]``.
        received: the mean attention each token receives over heads and queries ``[layers, n]``.
    """

    statistics: dict[str, torch.Tensor]
    patch_mean_rows: torch.Tensor
    prefix_rows: torch.Tensor
    received: torch.Tensor


class MapStore(ABC):
    """The maps of one analysis (module doc). ``shape`` is (layers, heads)."""

    def __init__(self, layout: TokenLayout, shape: tuple[int, int], num_tokens: int) -> None:
        # maps that do not fit the layout are a bug in a model family's adapter: fail before any view reads them
        assert num_tokens == layout.num_tokens, (f"captured {num_tokens} tokens but the layout has {layout.num_tokens} "
                                                 f"({layout.prefix_names}, grid {layout.grid_hw})")
        self.layout = layout
        self.shape = shape
        self.surveyed: Survey | None = None

    @property
    @abstractmethod
    def storage(self) -> str:
        """How the maps are kept, in words."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes the store keeps (what it derives and memoises aside)."""

    @property
    def full_bytes(self) -> int:
        """Bytes of every head's full map in float32 as ``full_maps`` gives it; 0 where the store cannot give them."""
        layers, heads = self.shape
        return layers * heads * self.layout.num_tokens**2 * 4

    @abstractmethod
    def head_blocks(self, layer: int) -> Iterator[tuple[int, torch.Tensor]]:
        """Every head's map of ``layer`` in blocks of query rows: (first query, rows ``[heads, r, n]`` float32), the blocks
        in order and covering every query once. A block is the caller's until the next is asked for."""

    @abstractmethod
    def token_rows(self, token: int) -> torch.Tensor:
        """Where query ``token`` looks in every layer and head ``[layers, heads, n]`` float32."""

    # whether ``head_blocks`` gives every head (a compact store gives their mean, as one head)
    keeps_every_head = True

    def keeps_rows_of(self, token: int) -> bool:
        """Whether ``query_rows`` can answer for ``token`` without the model."""
        return True

    def query_rows(self, token: int | None) -> torch.Tensor:
        """Where ``token`` (None: the mean of the patch queries) looks in every layer and head ``[layers, heads, n]`` float32."""
        return self.survey().patch_mean_rows if token is None else self.token_rows(token)

    def head_statistic(self, name: str) -> torch.Tensor:
        """One of ``statistics.HEAD_STATISTICS`` ``[layers, heads]``."""
        if name not in statistics.HEAD_STATISTICS:
            raise VitExplorerError(f"unknown head statistic {name!r}; use one of {', '.join(statistics.HEAD_STATISTICS)}")
        return self.survey().statistics[name]

    def received_attention(self) -> torch.Tensor:
        """The mean attention each token receives over heads and queries ``[layers, n]`` float32."""
        return self.survey().received

    def survey(self) -> Survey:
        """The ``Survey``, made in one pass over every block the first time it is asked for."""
        if self.surveyed is None:
            self.surveyed = self.make_survey()
        return self.surveyed

    def make_survey(self) -> Survey:
        layout, (layers, heads), n = self.layout, self.shape, self.layout.num_tokens
        prefix, distances = layout.num_prefix_tokens, statistics.patch_distances(layout)
        sums = torch.zeros(layers, 3, heads)
        patch_rows = torch.zeros(layers, heads, n)
        prefix_rows = torch.zeros(layers, heads, prefix, n)
        received = torch.zeros(layers, n)
        for layer in range(layers):
            for first, rows in self.head_blocks(layer):
                sums[layer] += statistics.block_sums(rows, first, layout, distances)
                received[layer] += rows.sum(dim=(0, 1))
                patch_rows[layer] += rows[:, max(prefix - first, 0):].sum(dim=1)
                if first < prefix:  # a block may hold some of the prefix rows, or some of them and patch rows
                    count = min(prefix - first, rows.shape[1])
                    prefix_rows[layer, :, first : first + count] = rows[:, :count]
        means = (sums / statistics.statistic_rows(layout)[:, None]).unbind(dim=1)  # each [layers, heads]
        return Survey(statistics=dict(zip(statistics.HEAD_STATISTICS, means, strict=True)),
                      patch_mean_rows=patch_rows / layout.num_patches, prefix_rows=prefix_rows, received=received / (heads * n))

    def head_means(self) -> torch.Tensor:
        """Each layer's map averaged over heads ``[layers, n, n]`` float32 (n² per layer: for a file, not for a view)."""
        return torch.stack([torch.cat([rows.mean(dim=0) for _, rows in self.head_blocks(layer)])
                            for layer in range(self.shape[0])])

    def full_maps(self) -> torch.Tensor:
        """Every head's map ``[layers, heads, n, n]`` float32 (n² per head: for a file or a test, not for a view)."""
        return torch.stack([torch.cat([rows.clone() for _, rows in self.head_blocks(layer)], dim=1)
                            for layer in range(self.shape[0])])

    def compact_form(self) -> dict[str, Any]:
        """The compact reduction (module doc): ``head_mean`` float16, the survey's rows float16, its statistics."""
        survey = self.survey()
        return {"head_mean": self.head_means().half(), "prefix_rows": survey.prefix_rows.half(),
                "patch_mean_rows": survey.patch_mean_rows.half(), "statistics": survey.statistics}


class FullMaps(MapStore):
    """Every head's map ``[layers, heads, n, n]`` as captured."""

    def __init__(self, layout: TokenLayout, full: torch.Tensor) -> None:
        super().__init__(layout, tuple(full.shape[:2]), full.shape[-1])
        self.full = full

    @property
    def storage(self) -> str:
        return str(self.full.dtype).removeprefix("torch.")

    @property
    def nbytes(self) -> int:
        return self.full.nbytes

    def head_blocks(self, layer: int) -> Iterator[tuple[int, torch.Tensor]]:
        yield 0, self.full[layer].float()

    def token_rows(self, token: int) -> torch.Tensor:
        return self.full[:, :, token, :].float().contiguous()

    def full_maps(self) -> torch.Tensor:
        return self.full.float()


class DerivedMaps(MapStore):
    """Every map derived when asked from each layer's queries and keys (module doc)."""

    def __init__(self, layout: TokenLayout, inputs: QueriesKeys) -> None:
        super().__init__(layout, tuple(inputs.queries.shape[:2]), inputs.queries.shape[2])
        self.inputs = inputs
        layers, heads = self.shape
        self.block_rows = max(1, BLOCK_BYTES // (heads * layout.num_tokens * 4))

    @property
    def storage(self) -> str:
        return f"derived from queries and keys ({str(self.inputs.queries.dtype).removeprefix('torch.')})"

    @property
    def nbytes(self) -> int:
        return self.inputs.nbytes

    def rows(self, layer: int, first: int, count: int, keys: torch.Tensor) -> torch.Tensor:
        """Every head's map rows ``first … first + count - 1`` of ``layer`` ``[heads, count, n]`` float32, given the layer's
        keys transposed in float32 ``[heads, d, n]`` (widened once per layer, not once per block)."""
        return attention_rows(self.inputs.queries[layer, :, first : first + count], keys, self.inputs.biases[layer], first)

    def widened_keys(self, layer: int) -> torch.Tensor:
        return self.inputs.keys[layer].float().transpose(-2, -1)  # [heads, d, n]

    def head_blocks(self, layer: int) -> Iterator[tuple[int, torch.Tensor]]:
        keys = self.widened_keys(layer)
        for first in range(0, self.layout.num_tokens, self.block_rows):
            yield first, self.rows(layer, first, self.block_rows, keys)

    def token_rows(self, token: int) -> torch.Tensor:
        return torch.stack([self.rows(layer, token, 1, self.widened_keys(layer))[:, 0] for layer in range(self.shape[0])])


class WindowMaps(MapStore):
    """A stage of a windowed ViT (a Swin): each layer's maps by window ``[heads, windows, area, area]``, placed on the
    stage's grid when asked (a row holds its window's weights and zero elsewhere), so that the grid's n × n is never
    held: memory linear in the tokens."""

    def __init__(self, layout: TokenLayout, windows: list[torch.Tensor], geometries: list[WindowGeometry]) -> None:
        super().__init__(layout, (len(windows), windows[0].shape[0]), geometries[0].grid_hw[0] * geometries[0].grid_hw[1])
        self.windows = windows
        self.placements = [geometry.placement() for geometry in geometries]
        self.block_rows = max(1, BLOCK_BYTES // (self.shape[1] * layout.num_tokens * 4))

    @property
    def storage(self) -> str:
        return "window maps, placed on the grid when asked (float32)"

    @property
    def nbytes(self) -> int:
        return sum(maps.nbytes for maps in self.windows)

    def rows(self, layer: int, first: int, count: int) -> torch.Tensor:
        """Every head's rows ``first … first + count - 1`` of ``layer`` on the grid ``[heads, count, n]`` float32."""
        order, window, inside = self.placements[layer]
        tokens = torch.arange(first, min(first + count, self.layout.num_tokens))
        values = self.windows[layer][:, window[tokens], inside[tokens]]  # [heads, count, area]
        columns = order[window[tokens]].expand(values.shape[0], -1, -1)  # the grid index of each of their keys
        placed = values.new_zeros(values.shape[0], tokens.numel(), self.layout.num_tokens)
        return placed.scatter_(2, columns, values)

    def head_blocks(self, layer: int) -> Iterator[tuple[int, torch.Tensor]]:
        for first in range(0, self.layout.num_tokens, self.block_rows):
            yield first, self.rows(layer, first, self.block_rows)

    def token_rows(self, token: int) -> torch.Tensor:
        return torch.stack([self.rows(layer, token, 1)[:, 0] for layer in range(self.shape[0])])


class CompactMaps(MapStore):
    """The compact form only (module doc): head means, prefix and mean-patch rows, statistics; a patch query's rows once
    the model recomputed them."""

    keeps_every_head = False

    def __init__(self, layout: TokenLayout, compact: dict[str, Any]) -> None:
        super().__init__(layout, tuple(compact["patch_mean_rows"].shape[:2]), compact["head_mean"].shape[-1])
        self.compact = compact
        self.patch_rows: dict[int, torch.Tensor] = {}  # recomputed patch queries' rows ``[layers, heads, n]``

    @property
    def storage(self) -> str:
        return "compact float16 (head means, prefix rows, statistics)"

    @property
    def nbytes(self) -> int:
        return (sum(value.nbytes for value in self.compact.values() if isinstance(value, torch.Tensor))
                + sum(value.nbytes for value in self.compact["statistics"].values()))

    @property
    def full_bytes(self) -> int:
        return 0

    def keeps_rows_of(self, token: int) -> bool:
        return token < self.layout.num_prefix_tokens or token in self.patch_rows

    def add_patch_rows(self, token: int, rows: torch.Tensor) -> None:
        """A patch query's rows ``[layers, heads, n]``, recomputed with the model."""
        self.patch_rows[token] = rows

    def token_rows(self, token: int) -> torch.Tensor:
        if token < self.layout.num_prefix_tokens:
            return self.compact["prefix_rows"][:, :, token, :].float()
        if token in self.patch_rows:
            return self.patch_rows[token]
        raise VitExplorerError(f"this analysis kept its maps compactly, so the rows of patch query {token} must be recomputed "
                               "with the model first: analysis.recompute_query_rows(model, analysis, query)")

    def survey(self) -> Survey:
        compact = self.compact
        return Survey(statistics=compact["statistics"], patch_mean_rows=compact["patch_mean_rows"].float(),
                      prefix_rows=compact["prefix_rows"].float(), received=compact["head_mean"].float().mean(dim=1))

    def head_blocks(self, layer: int) -> Iterator[tuple[int, torch.Tensor]]:
        yield 0, self.compact["head_mean"][layer, None].float()  # the mean of the heads, as one head ``[1, n, n]``

    def compact_form(self) -> dict[str, Any]:
        return self.compact


def map_store(layout: TokenLayout, full: torch.Tensor | None = None, compact: dict[str, Any] | None = None,
              inputs: QueriesKeys | None = None,
              windows: tuple[list[torch.Tensor], list[WindowGeometry]] | None = None) -> MapStore:
    """The store of whichever one of the four forms is given (``windows``: a stage's window maps and geometry)."""
    given = [form for form in (full, compact, inputs, windows) if form is not None]
    if len(given) != 1:
        raise ValueError("a map store keeps exactly one of the full maps, the compact form, the queries and keys or the "
                         "window maps")
    if inputs is not None:
        return DerivedMaps(layout, inputs)
    if windows is not None:
        return WindowMaps(layout, *windows)
    return FullMaps(layout, full) if full is not None else CompactMaps(layout, compact)
