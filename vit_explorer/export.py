"""Files a user takes away: ``attention.npz`` with the raw maps, PNGs of the views."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import render, views
from .analysis import Analysis


def write_npz(analysis: Analysis, path: Path) -> None:
    """Raw maps: ``attentions`` [layers, heads, n, n] (for a compact analysis ``head_mean``,
    ``prefix_rows``, ``patch_mean_rows`` and ``statistic_*`` instead), ``grid``, ``num_prefix_tokens``, ``prefix_names``,
    ``image``, ``logits``, ``probs``, and ``labels`` when the model has them."""
    arrays = {
        "grid": np.array(analysis.grid),
        "num_prefix_tokens": np.array(analysis.num_prefix_tokens),
        "prefix_names": np.array(analysis.layout.prefix_names, dtype=str),
        "image": analysis.image,
        "logits": analysis.logits,
        "probs": analysis.probs,
        "model": np.array(analysis.model_name),
    }
    if analysis.attentions is not None:
        arrays["attentions"] = analysis.attentions
    else:  # compact analysis: what was kept instead of the full stack
        arrays.update({key: value for key, value in analysis.compact.items() if isinstance(value, np.ndarray)})
        arrays.update({f"statistic_{name.replace(' ', '_')}": value for name, value in analysis.compact["statistics"].items()})
    if analysis.labels is not None:
        arrays["labels"] = np.array(analysis.labels, dtype=str)
    np.savez_compressed(path, **arrays)


def write_views(
    analysis: Analysis,
    out_dir: Path,
    *,
    query: int | None = None,
    options: views.RolloutOptions = views.RolloutOptions(),
    cmap: str = "inferno",
    order_by: str = "none",
    shared: bool = False,
) -> list[Path]:
    """``rollout.png``, ``heads.png`` (the layers × heads grid of the query) and ``attention.npz`` in ``out_dir``."""
    query = views.default_query(analysis) if query is None else query
    rollout = views.rollout_map(analysis, query, options)
    written = [out_dir / "rollout.png", out_dir / "heads.png", out_dir / "attention.npz"]
    render.save_png(views.map_picture(analysis, rollout, cmap=cmap, overlay=True, query=query, label="rollout"), str(written[0]))
    grid, _, _ = views.grid_picture(analysis, query, cmap=cmap, overlay=True, shared=shared, order_by=order_by)
    render.save_png(grid, str(written[1]))
    write_npz(analysis, written[2])
    return written
