"""Matplotlib charts for the files the CLI and the export write, rendered to RGB arrays (figures are closed at
once). The app's interactive plots are tables (``plots``) that the browser draws. Values from the analysis
layer come as tensors and are turned into numpy here (``render.to_numpy``)."""

from __future__ import annotations

import itertools
import textwrap

import numpy as np
import torch

from vit_explorer.core.curves import FaithfulnessCurves, SanityCurves
from vit_explorer.core.decomposition import Decomposition
from vit_explorer.core.maps import CLASS_METHODS
from vit_explorer.core.statistics import DatasetStatistics
from vit_explorer.core.token_norms import TokenNorms
from vit_explorer.draw.render import to_numpy

# at the charts' 100 dpi, 9 pt is 12.5 px: legends and small labels no smaller than the app's body text less a little
CHART_TEXT_PT = 9


TITLE_CHARACTERS = 60  # a chart title's longest line: what fits over the axes of the widest chart at 9 pt


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


def curve_limits(curves: FaithfulnessCurves) -> tuple[float, float]:
    """The y range of faithfulness curves: 0 to just above 1, widened to hold a share of a score that leaves it."""
    values = [float(value) for curve in (curves.deletion, curves.insertion, curves.random_deletion, curves.random_insertion)
              for value in curve]
    return min(0.0, min(values) - 0.02), max(1.02, max(values) + 0.02)


def faithfulness_chart(curves: FaithfulnessCurves, title: str) -> np.ndarray:
    """Deletion and insertion curves of a map (solid) against random orders (dashed), AUCs in the legend; ROAD's are
    called MoRF and LeRF (``curves.curve_names``)."""
    figure = _figure(7.0, 3.2)
    axes = figure.add_subplot()
    aucs = curves.aucs
    for name, shown, colour in zip(("deletion", "insertion"), curves.curve_names, ("tab:red", "tab:blue"), strict=True):
        fractions = curves.fractions.numpy()
        axes.plot(fractions, getattr(curves, name).numpy(), color=colour, linewidth=2, label=f"{shown} (AUC {aucs[name]:.3f})")
        axes.plot(fractions, getattr(curves, f"random_{name}").numpy(), color=colour, linewidth=1, linestyle="--",
                  label=f"random {shown} ({aucs[f'random_{name}']:.3f})")
    axes.set_xlim(0, 1)
    axes.set_ylim(*curve_limits(curves))
    axes.set_xlabel(curves.protocol.axis_title)
    axes.set_ylabel(curves.measure)
    axes.set_title(title, fontsize=9)
    axes.legend(fontsize=CHART_TEXT_PT, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the curves, never over them
    return _figure_to_array(figure)


def dataset_statistic_chart(mean: np.ndarray, std: np.ndarray, name: str, unit: str, images: int) -> np.ndarray:
    """Each head's mean of one statistic over a dataset against layer, with ±1 standard deviation across
    images as error bars ``[layers, heads]`` (over a dataset, the distance chart is Fig. 7 of the ViT paper)."""
    figure = _figure(6.4, 4.0)
    axes = figure.add_subplot()
    layers, heads = mean.shape
    # heads spread a little around their layer, so that overlapping error bars stay apart
    offsets = (np.arange(heads) - (heads - 1) / 2) * min(0.6 / max(heads, 1), 0.08)
    colours = itertools.cycle(("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
                               "tab:gray", "tab:olive", "tab:cyan"))
    for head, colour in zip(range(heads), colours, strict=False):  # the colours cycle
        axes.errorbar(np.arange(layers) + offsets[head], mean[:, head], yerr=std[:, head], fmt="o", markersize=3.5,
                      elinewidth=0.8, capsize=0, alpha=0.8, color=colour, label=f"h{head}")
    if heads <= 16:  # a legend of more would cover the chart; the axis label still says the order
        axes.legend(fontsize=CHART_TEXT_PT, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="head",
                    title_fontsize=CHART_TEXT_PT)
    axes.set_xlabel(f"layer (heads h0…h{heads - 1} left to right)")
    axes.set_ylabel(f"{name} ({unit})")
    axes.set_xticks(np.arange(layers))
    axes.set_title(f"{name} per head over {images:,} images (mean ± 1 sd)")
    axes.grid(alpha=0.3)
    return _figure_to_array(figure)


def against_dataset_chart(values: dict[str, torch.Tensor], dataset: DatasetStatistics) -> np.ndarray:
    """This image's head statistics (``values``: name → ``[layers, heads]``) against a dataset's: per head, the
    dataset's 5–95% range as a grey bar with its mean as a tick, and this image's value as a dot, red where it
    falls outside the range. One panel per statistic the dataset has."""
    names = [name for name in values if name in dataset.mean]
    figure = _figure(8.4, 2.4 * len(names))
    for index, name in enumerate(names):
        axes = figure.add_subplot(len(names), 1, index + 1)
        layers, heads = values[name].shape
        offsets = (np.arange(heads) - (heads - 1) / 2) * min(0.7 / max(heads, 1), 0.1)
        x = np.arange(layers)[:, None] + offsets[None, :]  # [layers, heads]
        low, high, mean, value = (to_numpy(array)
                                  for array in (dataset.low[name], dataset.high[name], dataset.mean[name], values[name]))
        axes.vlines(x.ravel(), low.ravel(), high.ravel(), color="#b0b0b0", linewidth=3, label="dataset 5–95%")
        axes.plot(x.ravel(), mean.ravel(), "_", color="#606060", markersize=7, label="dataset mean")
        outside = (value < low) | (value > high)
        axes.plot(x[~outside], value[~outside], "o", color="tab:blue", markersize=3.5, label="this image")
        axes.plot(x[outside], value[outside], "o", color="tab:red", markersize=4, label="this image, outside the range")
        axes.set_xticks(np.arange(layers), [f"L{layer}" for layer in range(layers)])
        axes.set_ylabel(name, fontsize=CHART_TEXT_PT)
        axes.grid(alpha=0.3)
        if index == 0:
            axes.set_title(f"This image against {dataset.images:,} images of {dataset.source}", fontsize=9)
            axes.legend(fontsize=CHART_TEXT_PT, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    heads = next(iter(values.values())).shape[1]
    figure.axes[-1].set_xlabel(f"layer (heads h0…h{heads - 1} left to right)")
    return _figure_to_array(figure)


def sanity_chart(curves: SanityCurves) -> np.ndarray:
    """Each map's Spearman correlation with the trained model's against the number of layers randomised
    from the top (Adebayo et al. 2018): a map that depends on the weights falls towards 0."""
    figure = _figure(6.8, 3.6)
    axes = figure.add_subplot()
    steps = np.asarray(curves.randomised_layers)
    # methods often coincide (relevance and gradient-weighted rollout do), so each has its own dash and marker
    styles = [("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ((0, (5, 1)), "v")]
    for index, (name, values) in enumerate(curves.correlations.items()):
        dash, marker = styles[index % len(styles)]
        axes.plot(steps, values, linestyle=dash, marker=marker, markersize=4, linewidth=1.6, label=CLASS_METHODS.get(name, name))
    axes.axhline(0.0, color="gray", linewidth=0.8)
    lowest = min([-0.2, *(value - 0.05 for values in curves.correlations.values() for value in values if np.isfinite(value))])
    axes.set_ylim(max(lowest, -1.05), 1.05)
    axes.set_xlim(steps[0] - 0.3, steps[-1] + 0.3)
    axes.set_xticks(steps)
    axes.set_xlabel("layers randomised, from the top (0 = trained model)")
    axes.set_ylabel("Spearman correlation with trained map")
    target = f"target: {curves.target_label}" if curves.target_label is not None else ""
    # a long target (a similarity to a patch, an ImageNet name) goes on lines of its own: centred over the axes, one long
    # line ran off the figure's left edge
    lines = ["Sanity check: cascading randomisation", *textwrap.wrap(target, TITLE_CHARACTERS)]
    axes.set_title("\n".join(lines), fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=CHART_TEXT_PT, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _figure_to_array(figure)


def log_scale_if_wide(axes) -> None:
    """A log y axis with plain tick labels when the plotted values span more than a decade, else linear."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    values = np.concatenate([line.get_ydata() for line in axes.get_lines()])
    values = values[values > 0]
    if values.size and values.max() > 10 * values.min():
        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:g}"))
        axes.yaxis.set_minor_formatter(NullFormatter())


PREFIX_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")


def token_norm_chart(result: TokenNorms) -> np.ndarray:
    """Per layer, on log scales: the patches' median and largest norm, the outlier threshold and each prefix
    token's norm (top); the attention share of the flagged patches together, of each prefix token and of the
    median patch (bottom) (``norms.TokenNorms``)."""
    figure = _figure(6.6, 5.4)
    norm_axes, share_axes = figure.subplots(2, 1, sharex=True)
    layers = np.arange(result.num_layers)
    patches = to_numpy(result.norms[:, result.layout.num_prefix_tokens:])
    norm_axes.plot(layers, to_numpy(result.patch_median), color="black", linewidth=1.5, label="median patch")
    norm_axes.plot(layers, to_numpy(result.threshold), color="gray", linestyle="--", linewidth=1,
                   label=f"outlier threshold (k = {result.k:g})")
    norm_axes.plot(layers, patches.max(axis=1), color="tab:red", marker="o", markersize=3, linewidth=1, label="largest patch")
    share_axes.plot(layers, 100 * to_numpy(result.patch_median_share), color="black", linewidth=1.5, label="median patch")
    flagged = to_numpy(result.flagged.any(dim=1))
    share_axes.plot(layers[flagged], 100 * to_numpy(result.flagged_attention_share)[flagged], color="tab:red", marker="o",
                    markersize=5, linestyle="none", label="flagged patches together")
    for (name, token), colour in zip(result.prefix.items(), itertools.cycle(PREFIX_COLOURS)):
        norm_axes.plot(layers, to_numpy(token["norm"]), marker=".", linewidth=1, color=colour, label=name)
        share_axes.plot(layers, 100 * to_numpy(token["attention_share"]), marker=".", linewidth=1, color=colour, label=name)
    # norms grow by orders of magnitude with depth, and one token's share is far below a class token's
    for axes in (norm_axes, share_axes):
        log_scale_if_wide(axes)
    norm_axes.set_ylabel("token norm (L2)")
    norm_axes.set_title("Token norms and the attention they draw", fontsize=10)
    share_axes.set_ylabel("attention share (%)")
    share_axes.set_xlabel("layer")
    share_axes.set_xticks(layers)
    for axes in (norm_axes, share_axes):
        axes.grid(alpha=0.3, which="major")
        # beside the axes, never over the lines: inside, "best" still covered them wherever every corner held data
        axes.legend(fontsize=CHART_TEXT_PT, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _figure_to_array(figure)


def contributions_chart(decomposition: Decomposition, count: int = 12) -> np.ndarray:
    """The ``count`` heads and MLPs that write most into the target's score, then the rest (embeddings and biases) and
    the score itself, as signed horizontal bars: red adds to the score, blue takes from it."""
    parts = decomposition.top_parts(count) + list(decomposition.rest.items())
    others = decomposition.score - sum(value for _, value in parts)
    parts += [("every other head and MLP", others), ("score", decomposition.score)]
    figure = _figure(6.4, 0.8 + 0.24 * len(parts))
    axes = figure.add_subplot()
    names, values = [name for name, _ in parts], np.array([value for _, value in parts])
    colours = ["black" if name == "score" else ("tab:red" if value >= 0 else "tab:blue") for name, value in parts]
    axes.barh(np.arange(len(parts)), values, color=colours)
    axes.set_yticks(np.arange(len(parts)), names, fontsize=CHART_TEXT_PT)
    axes.invert_yaxis()
    axes.axvline(0, color="gray", linewidth=0.8)
    axes.axhline(count - 0.5, color="gray", linewidth=0.5, linestyle=":")
    axes.set_xlabel("direct contribution to the score (final norm's scale held)")
    title = f"What writes the score of {decomposition.label!r}: {decomposition.score:.3g}"
    axes.set_title(textwrap.shorten(title, TITLE_CHARACTERS), fontsize=10)
    axes.grid(alpha=0.3, axis="x")
    return _figure_to_array(figure)


LENS_LABEL_PT = 10  # the logit lens's names of the top class: as large as the axis labels (7 pt read as a smudge)


def lens_chart(decomposition: Decomposition, labels: list[str] | None) -> np.ndarray:
    """The logit lens: the target's score read from the stream after every layer through the final norm, pooling and
    head, with the top class there named where it is not the target."""
    figure = _figure(6.4, 3.0)
    axes = figure.add_subplot()
    layers = np.arange(len(decomposition.lens))
    axes.plot(layers, to_numpy(decomposition.lens), color="black", marker="o", markersize=4, linewidth=1.5,
              label=f"score of {textwrap.shorten(decomposition.label, 40)!r}")
    tops = to_numpy(decomposition.lens_top[:, 0])
    if len(to_numpy(decomposition.lens_top[0])) > 1:
        axes.plot(layers, to_numpy(decomposition.lens_top_scores[:, 0]), color="tab:orange", linewidth=1, linestyle="--",
                  label="top class's score there")
        for layer, top in zip(layers, tops, strict=True):
            if int(top) != decomposition.target:
                name = labels[int(top)] if labels and int(top) < len(labels) else str(int(top))
                # as large as the axis labels, level, on a white box: read at a glance over the grid and the line
                axes.annotate(textwrap.shorten(name, 14, placeholder="…"),
                              (layer, float(decomposition.lens_top_scores[layer, 0])),
                              fontsize=LENS_LABEL_PT, xytext=(0, 6), textcoords="offset points", ha="center", color="#b35900",
                              fontweight="bold", bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none",
                                                       "alpha": 0.8})
    axes.set_xticks(layers)
    axes.set_xlabel("read after layer")
    axes.set_ylabel("score")
    axes.set_title("Logit lens: the score read out after every layer", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=CHART_TEXT_PT, loc="upper left")
    return _figure_to_array(figure)
