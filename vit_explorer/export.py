"""Files a user takes away: ``attention.npz`` with the raw maps, PNGs of the views."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from . import charts, maps, norms, pictures, render
from .ablation import HeadAblation
from .analysis import Analysis, ClassEvidence
from .faithfulness import FaithfulnessCurves
from .sanity import SanityCurves


def write_npz(analysis: Analysis, path: Path) -> None:
    """Raw maps: ``attentions`` [layers, heads, n, n] (for a compact analysis ``head_mean``,
    ``prefix_rows``, ``patch_mean_rows`` and ``statistic_*`` instead), ``grid``, ``num_prefix_tokens``, ``prefix_names``,
    ``image``, ``logits``, ``probs``, ``weights`` ("trained" or "random"), ``ood_score`` and ``ood_threshold`` for a
    model calibrated for out-of-distribution inputs, ``labels`` when the model has them, and ``token_norms``
    [layers, n] (each token's norm after each layer) when the analysis has them."""
    arrays = {
        "grid": np.array(analysis.grid),
        "num_prefix_tokens": np.array(analysis.num_prefix_tokens),
        "prefix_names": np.array(analysis.layout.prefix_names, dtype=str),
        "image": analysis.image,
        "logits": render.to_numpy(analysis.logits),
        "probs": render.to_numpy(analysis.probs),
        "model": np.array(analysis.model_name),
        "weights": np.array("random" if analysis.random_weights else "trained"),
    }
    if analysis.ood is not None:
        arrays.update(ood_score=np.array(analysis.ood.score), ood_threshold=np.array(analysis.ood.threshold))
    if analysis.attentions is not None:
        arrays["attentions"] = render.to_numpy(analysis.attentions)
    else:  # compact analysis: what was kept instead of the full stack
        arrays.update({key: render.to_numpy(value) for key, value in analysis.compact.items() if isinstance(value, torch.Tensor)})
        arrays.update({f"statistic_{name.replace(' ', '_')}": render.to_numpy(value)
                       for name, value in analysis.compact["statistics"].items()})
    if analysis.labels is not None:
        arrays["labels"] = np.array(analysis.labels, dtype=str)
    if analysis.token_norms is not None:
        arrays["token_norms"] = render.to_numpy(analysis.token_norms)
    np.savez_compressed(path, **arrays)


def write_views(
    analysis: Analysis,
    out_dir: Path,
    *,
    query: int | None = None,
    options: maps.RolloutOptions = maps.RolloutOptions(),
    cmap: str = "inferno",
    order_by: str = "none",
    evidence: ClassEvidence | None = None,
    shared: bool = False,
    scale: str = "linear",
) -> list[Path]:
    """``rollout.png``, ``heads.png`` (the layers × heads grid of the query) and ``attention.npz`` in ``out_dir``.

    ``evidence`` (the target class's) is needed only to order heads by gradient importance; ``scale`` is the
    colour scale (``render.COLOUR_SCALES``).
    """
    query = maps.default_query(analysis) if query is None else query
    rollout = maps.rollout_map(analysis, query, options)
    written = [out_dir / "rollout.png", out_dir / "heads.png", out_dir / "attention.npz"]
    render.save_png(pictures.map_picture(analysis, rollout, cmap=cmap, overlay=True, query=query, unit=pictures.ROLLOUT,
                                         scale=scale), str(written[0]))
    grid, _, _ = pictures.grid_picture(analysis, query, cmap=cmap, overlay=True, shared=shared, order_by=order_by, evidence=evidence,
                                       scale=scale)
    render.save_png(grid, str(written[1]))
    write_npz(analysis, written[2])
    return written


def write_faithfulness(analysis: Analysis, curves: FaithfulnessCurves, method: str, out_dir: Path, **settings) -> list[Path]:
    """``faithfulness.json`` (AUCs, curves, target, ``settings``) and ``faithfulness.png`` (the curves) in ``out_dir``."""
    record = {"model": analysis.model_name, "method": method, "target_label": analysis.label(curves.target), **settings,
              **curves.as_dict()}
    written = [out_dir / "faithfulness.json", out_dir / "faithfulness.png"]
    written[0].write_text(json.dumps(record, indent=2) + "\n")
    title = f"{maps.CLASS_METHODS[method]} · target {analysis.label(curves.target)}"
    render.save_png(charts.faithfulness_chart(curves, title), str(written[1]))
    return written


def write_sanity(curves: SanityCurves, out_dir: Path) -> list[Path]:
    """``sanity.json`` (``SanityCurves.as_dict``) and ``sanity.png`` (the chart) in ``out_dir``."""
    written = [out_dir / "sanity.json", out_dir / "sanity.png"]
    written[0].write_text(curves.to_json())
    render.save_png(charts.sanity_chart(curves), str(written[1]))
    return written


def write_norms(analysis: Analysis, out_dir: Path, k: float = norms.K, cmap: str = "inferno") -> list[Path]:
    """``norms.json`` (``TokenNorms.as_dict``), ``norms.png`` (the layers × tokens norm map), ``norms_chart.png``
    (norms and attention shares per layer) and ``norm_outliers.png`` (the outliers on the image, in the layer
    with the most of them) in ``out_dir``."""
    result = norms.for_analysis(analysis, k)
    written = [out_dir / "norms.json", out_dir / "norms.png", out_dir / "norms_chart.png", out_dir / "norm_outliers.png"]
    written[0].write_text(result.to_json(), encoding="utf-8")
    render.save_png(pictures.norm_map_picture(result, cmap), str(written[1]))
    render.save_png(charts.token_norm_chart(result), str(written[2]))
    render.save_png(pictures.outlier_picture(analysis, result, result.peak_layer, cmap), str(written[3]))
    return written


def write_ablation(analysis: Analysis, ablation: HeadAblation, importance: torch.Tensor, out_dir: Path) -> list[Path]:
    """``ablation.json`` (``HeadAblation.as_dict`` with the Spearman correlation of |Δ probability| with the gradient
    ``importance`` ``[layers, heads]``) and ``ablation.png`` (the layers × heads heat map) in ``out_dir``."""
    record = {"model": analysis.model_name, "target_label": analysis.label(ablation.target), **ablation.as_dict(importance)}
    written = [out_dir / "ablation.json", out_dir / "ablation.png"]
    written[0].write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    render.save_png(pictures.ablation_picture(ablation)[0], str(written[1]))
    return written
