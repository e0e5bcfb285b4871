"""The words the app shows beside its pictures: names of queries and heads, the choices of its dropdowns, captions
that say what a view shows and what is selected, the predictions and the top-heads table. Plain text and
numbers from ``maps``; no Gradio, so the CLI or a notebook can reuse them."""

from __future__ import annotations

from . import maps
from .analysis import Analysis
from .session import Controls, Session

MEAN_HEADS = "mean of heads"
MEAN_PATCHES = "mean of patch queries"


def query_choices(analysis: Analysis, query: int | None = None) -> list[str]:
    """The query dropdown's entries: the prefix tokens, the mean of patch queries, and the clicked patch while it
    is the query (so the dropdown can show it rather than go blank)."""
    choices = [*analysis.layout.prefix_names, MEAN_PATCHES]
    if query is not None and query >= analysis.num_prefix_tokens:
        choices.append(maps.query_name(analysis, query))
    return choices


def query_label(session: Session) -> str:
    """The current query's name: a prefix token, "mean of patch queries" or "patch at row 9, col 4"."""
    return maps.query_name(session.analysis, session.query)


def head_choices(analysis: Analysis) -> list[str]:
    """The head dropdown's entries: the mean of heads, then h0, h1, …"""
    return [MEAN_HEADS] + [f"h{head}" for head in range(analysis.map_shape[1])]


def head_label(head: int | None) -> str:
    """A head as the grid's column labels name it, or the mean of heads for None."""
    return MEAN_HEADS if head is None else f"h{head}"


def top_predictions(analysis: Analysis) -> dict[str, float]:
    """The five most probable classes and their probabilities, for the predictions label."""
    return {prediction.label: prediction.prob for prediction in analysis.top_k(5)}


def target_choices(analysis: Analysis) -> list[tuple[str, int]]:
    """(shown, class index): the top five with their probabilities, then every class by index."""
    top = analysis.top_k(5)
    first = {prediction.index for prediction in top}
    return [(f"{p.label} ({p.prob:.1%})", p.index) for p in top] + [
        (analysis.label(index), index) for index in range(analysis.num_classes) if index not in first
    ]


def query_caption(session: Session) -> str:
    """The line under the query image: which token is the query."""
    is_patch = session.query is not None and session.analysis.layout.token_patch(session.query) is not None
    return f"Query: **{query_label(session)}**" + (" (outlined)" if is_patch else "")


def selection_name(session: Session) -> str:
    """The selected layer and head as the grid labels them: "layer 2, head h1", "layer 5, mean of heads"."""
    return f"layer {session.layer}, {head_label(session.head) if session.head is None else f'head h{session.head}'}"


def grid_caption(session: Session, controls: Controls) -> str:
    """What the grid shows, for which query, on which scale, and which tile (or row) is selected."""
    scale = "one scale for all tiles" if controls.normalisation == "shared" else "each tile on its own scale"
    order = "" if controls.order_by == "none" else f", heads of each layer ordered by {controls.order_by} ({maps.RANKINGS[controls.order_by]})"
    outlined = "its row is outlined" if session.head is None else "its tile is outlined"
    return (f"Where **{query_label(session)}** looks in every layer (rows) and head (columns), {scale}{order}. "
            f"Selected: **{selection_name(session)}** — {outlined} and shown large on the right. Click a tile to select it.")


TOP_HEADS = 5


def top_heads_table(session: Session) -> dict:
    """One row per rank, one column per ranking, cells "L<layer> h<head> · value"."""
    tops = maps.top_heads(session.analysis, session.evidence, TOP_HEADS)
    headers = ["#", *(f"{name} ({maps.RANKINGS[name]})" for name in tops)]
    rows = [[rank + 1, *(f"L{layer} h{head} · {value:.3g}" for layer, head, value in (heads[rank] for heads in tops.values()))]
            for rank in range(min(TOP_HEADS, *(len(heads) for heads in tops.values())))]
    return {"headers": headers, "data": rows}
