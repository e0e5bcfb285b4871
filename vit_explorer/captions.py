"""The words the app shows beside its pictures: the model summary, names of queries and heads, the choices of
its dropdowns, captions that say what a view shows and what is selected, the predictions, the top-heads
table and the faithfulness verdict. Plain text and numbers from ``maps``; no Gradio, so the CLI or a
notebook can reuse them."""

from __future__ import annotations

import math

from . import maps
from .analysis import Analysis
from .faithfulness import DEFAULT_RANDOM_ORDERS, FaithfulnessCurves, forward_passes
from .session import Controls, Session

RANDOM_WEIGHTS_NOTE = "Random weights: the token layout is the real one, but nothing is learned, so the maps show no learned attention."
BACKBONE_NOTE = "Backbone: no classifier head, so no predictions, class maps or faithfulness scores; attention, rollout and head statistics work."
NO_CLASSIFIER = "This model has no classifier head: class-specific maps and faithfulness scores need class scores."


def model_summary(analysis: Analysis) -> str:
    """The lines above the views: the model, its input and token layout, what the analysis holds, and notices."""
    layout = analysis.layout
    layers, heads = analysis.map_shape
    prefix = ", ".join(layout.prefix_names) or "none (rollout and grid use the mean over patch queries)"
    summary = (
        f"**{analysis.model_name}** · input {layout.input_hw[0]}×{layout.input_hw[1]} px · {layers} layers × {heads} heads · "
        f"{layout.num_tokens} tokens = {layout.grid_hw[0]}×{layout.grid_hw[1]} patches of {layout.patch_hw[0]}×{layout.patch_hw[1]} px "
        f"+ prefix: {prefix} · held: {analysis.nbytes / 2**20:.1f} MiB ({analysis.storage})"
    )
    if analysis.random_weights:
        summary += f"  \n**{RANDOM_WEIGHTS_NOTE}**"
    if analysis.num_classes == 0:
        summary += f"  \n{BACKBONE_NOTE}"
    if analysis.view_note:
        summary += f"  \n{analysis.view_note}"
    if analysis.ood is not None and analysis.ood.flagged:
        summary = f"> ⚠️ **Outside what this model knows.** {analysis.ood.notice(analysis.model_name)}\n\n{summary}"
    return summary

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


def statistic_title(session: Session, name: str) -> str:
    """The title of a head statistic's plot (``maps.RANKINGS``): what it measures, and its reference value."""
    analysis = session.analysis
    layout = analysis.layout
    if name == "distance":
        return "How far each head looks: mean attention distance in pixels (ViT paper, Fig. 7)"
    if name == "entropy":
        return f"Attention entropy in nats; uniform over all {layout.num_tokens} tokens: log n = {math.log(layout.num_tokens):.2f}"
    if name == "prefix share":
        if layout.num_prefix_tokens == 0:
            return "Attention sent to prefix tokens: this model has none"
        return (f"Share of patch queries' attention sent to prefix tokens ({', '.join(layout.prefix_names)}); "
                f"uniform: {layout.num_prefix_tokens / layout.num_tokens:.3g}")
    if name == maps.GRADIENT_IMPORTANCE:
        return f"Gradient importance Σ|∇A ⊙ A| of each head for {analysis.label(session.target)}"
    raise ValueError(f"no title for head statistic {name!r}")


TOP_HEADS = 5


def top_heads_table(session: Session) -> dict:
    """One row per rank, one column per ranking, cells "L<layer> h<head> · value"."""
    tops = maps.top_heads(session.analysis, session.evidence, TOP_HEADS)
    headers = ["#", *(f"{name} ({maps.RANKINGS[name]})" for name in tops)]
    rows = [[rank + 1, *(f"L{layer} h{head} · {value:.3g}" for layer, head, value in (heads[rank] for heads in tops.values()))]
            for rank in range(min(TOP_HEADS, *(len(heads) for heads in tops.values())))]
    return {"headers": headers, "data": rows}


def class_note(session: Session) -> str:
    """The class-maps tab's line before a score: the target, and what scoring costs."""
    if session.evidence is None:
        return NO_CLASSIFIER
    return (f"Target: **{session.analysis.label(session.evidence.target)}**. *Score faithfulness* deletes and inserts patches in "
            f"the map's order and against {DEFAULT_RANDOM_ORDERS} random orders ({forward_passes()} forward passes).")


def score_text(analysis: Analysis, method: str, curves: FaithfulnessCurves) -> str:
    """A faithfulness score in words: the verdict, and each AUC against random orders with its margin."""
    aucs, margins = curves.aucs, curves.margins
    return (f"**{maps.CLASS_METHODS[method]}** for **{analysis.label(curves.target)}** {curves.verdict}: "
            f"deletion AUC **{aucs['deletion']:.3f}** against {aucs['random_deletion']:.3f} (lower is better, margin {margins['deletion']:+.3f}), "
            f"insertion AUC **{aucs['insertion']:.3f}** against {aucs['random_insertion']:.3f} (higher is better, margin {margins['insertion']:+.3f}).")
