"""Matplotlib charts of head statistics, rendered to RGB arrays (figures are closed at once)."""

from __future__ import annotations

import numpy as np

from .faithfulness import FaithfulnessCurves
from .layout import TokenLayout


def _figure_to_array(figure) -> np.ndarray:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    picture = np.asarray(canvas.buffer_rgba())[..., :3].copy()
    figure.clear()
    return picture


def _figure(width: float = 5.0, height: float = 3.4):
    from matplotlib.figure import Figure

    # a bare Figure, not pyplot: nothing is registered globally, so nothing leaks between renders
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def distance_chart(distance: np.ndarray) -> np.ndarray:
    """Mean attention distance of every head against layer ``[layers, heads]`` (ViT paper, Fig. 7)."""
    figure = _figure()
    axes = figure.add_subplot()
    layers, heads = distance.shape
    for head in range(heads):
        axes.scatter(np.arange(layers), distance[:, head], s=14, alpha=0.75, label=f"h{head}" if heads <= 12 else None)
    axes.plot(np.arange(layers), distance.mean(axis=1), color="black", linewidth=1, label="mean")
    axes.set_xlabel("layer")
    axes.set_ylabel("mean attention distance (pixels)")
    axes.set_title("How far each head looks")
    axes.set_xticks(np.arange(layers))
    if heads <= 12:
        axes.legend(fontsize=7, ncol=2, loc="best")
    return _figure_to_array(figure)


def entropy_heatmap(entropy: np.ndarray, num_tokens: int) -> np.ndarray:
    """Attention entropy as a layers × heads heat map, against its maximum log(n)."""
    figure = _figure()
    axes = figure.add_subplot()
    image = axes.imshow(entropy, cmap="viridis", vmin=0.0, vmax=float(np.log(num_tokens)), aspect="auto")
    axes.set_xlabel("head")
    axes.set_ylabel("layer")
    axes.set_title("Attention entropy (nats; uniform = log n)")
    axes.set_xticks(np.arange(entropy.shape[1]))
    axes.set_yticks(np.arange(entropy.shape[0]))
    figure.colorbar(image, ax=axes)
    return _figure_to_array(figure)


def prefix_share_chart(share: np.ndarray, layout: TokenLayout) -> np.ndarray:
    """Share of attention from patch queries sent to prefix tokens, per layer (mean and range over heads)."""
    figure = _figure()
    axes = figure.add_subplot()
    layers = np.arange(share.shape[0])
    if layout.num_prefix_tokens == 0:
        axes.text(0.5, 0.5, "this model has no prefix tokens", ha="center", va="center", transform=axes.transAxes)
    else:
        axes.bar(layers, share.mean(axis=1), color="tab:orange", label="mean over heads")
        axes.vlines(layers, share.min(axis=1), share.max(axis=1), color="black", linewidth=1, label="min–max over heads")
        axes.axhline(layout.num_prefix_tokens / layout.num_tokens, color="gray", linestyle="--", linewidth=1, label="uniform share")
        axes.set_ylim(0, 1)
        axes.legend(fontsize=7)
    axes.set_xlabel("layer")
    axes.set_ylabel("share of attention")
    axes.set_title(f"Attention sent to prefix tokens ({', '.join(layout.prefix_names) or 'none'})")
    axes.set_xticks(layers)
    return _figure_to_array(figure)


def faithfulness_chart(curves: FaithfulnessCurves, title: str) -> np.ndarray:
    """Deletion and insertion curves of a map (solid) against random orders (dashed), AUCs in the legend."""
    figure = _figure(5.0, 3.2)
    axes = figure.add_subplot()
    aucs = curves.aucs
    for name, colour in (("deletion", "tab:red"), ("insertion", "tab:blue")):
        axes.plot(curves.fractions, getattr(curves, name), color=colour, linewidth=2, label=f"{name} (AUC {aucs[name]:.3f})")
        axes.plot(curves.fractions, getattr(curves, f"random_{name}"), color=colour, linewidth=1, linestyle="--",
                  label=f"random {name} ({aucs[f'random_{name}']:.3f})")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1.02)
    axes.set_xlabel("share of patches deleted / inserted, most important first")
    axes.set_ylabel("target probability")
    axes.set_title(title, fontsize=9)
    axes.legend(fontsize=7, loc="center right")
    return _figure_to_array(figure)


def dataset_statistic_chart(mean: np.ndarray, std: np.ndarray, name: str, unit: str, images: int) -> np.ndarray:
    """Each head's mean of one statistic over a dataset against layer, with ±1 standard deviation across
    images as error bars ``[layers, heads]`` (over a dataset, the distance chart is Fig. 7 of the ViT paper)."""
    figure = _figure(6.4, 4.0)
    axes = figure.add_subplot()
    layers, heads = mean.shape
    # heads spread a little around their layer, so that overlapping error bars stay apart
    offsets = (np.arange(heads) - (heads - 1) / 2) * min(0.6 / max(heads, 1), 0.08)
    for head in range(heads):
        axes.errorbar(np.arange(layers) + offsets[head], mean[:, head], yerr=std[:, head], fmt="o", markersize=3.5,
                      elinewidth=0.8, capsize=0, alpha=0.8, color="tab:blue")
    axes.set_xlabel("layer")
    axes.set_ylabel(f"{name} ({unit})")
    axes.set_xticks(np.arange(layers))
    axes.set_title(f"{name} per head over {images:,} images (mean ± 1 sd)")
    axes.grid(alpha=0.3)
    return _figure_to_array(figure)
