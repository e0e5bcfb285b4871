"""The data of the app's interactive plots: tidy tables, one row per point, that Gradio's native plots draw
in the browser (values on hover, axes fitted to the data). Numbers come from ``maps`` (tensors, turned into
numpy here by ``render.to_numpy``) and ``faithfulness``; no Gradio here, and no pictures (``charts`` draws those)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from vit_explorer.core.curves import FaithfulnessCurves
from vit_explorer.draw.render import to_numpy

VALUE = "value"


def layer_names(layers: int) -> list[str]:
    """The layers as the grid's rows name them, in order: a plot's axis lists its categories this way."""
    return [f"L{layer}" for layer in range(layers)]


def head_table(values: torch.Tensor) -> pd.DataFrame:
    """One row per head of a ``[layers, heads]`` statistic: ``layer`` ("L0", …), ``head`` ("h0", …) and
    ``value``, head by head, so that a plot's colour legend lists the heads in order."""
    layers, heads = values.shape
    return pd.DataFrame({
        "layer": np.tile(layer_names(layers), heads),
        "head": np.repeat([f"h{head}" for head in range(heads)], layers),
        VALUE: to_numpy(values, np.float64).T.reshape(-1),
    })


def padded_limits(values: torch.Tensor) -> list[float]:
    """The y limits of a plot of ``values`` that hold every whole marker: 6% of their range beyond each extreme (a plot
    fitted to the data exactly cuts the highest and lowest points in half)."""
    low, high = float(values.min()), float(values.max())
    margin = 0.06 * (high - low) if high > low else max(abs(high), 1.0) * 0.06
    return [low - margin, high + margin]


SIDE_COLOURS = ("#1f77b4", "#d62728")  # the Compare tab's sides A and B


def sides_table(values: dict[str, torch.Tensor], depths: dict[str, torch.Tensor]) -> pd.DataFrame:
    """Both sides' statistic of every head in one table: ``head_table`` of each side's ``[layers, heads]``
    values, with its ``side`` and each layer's relative ``depth`` (``depths[side]`` ``[layers]``), so that
    models of different depths share one axis."""
    frames = []
    for side, side_values in values.items():
        table = head_table(side_values)
        table["depth"] = np.tile(to_numpy(depths[side], np.float64), side_values.shape[1])
        table["side"] = side
        frames.append(table)
    return pd.concat(frames, ignore_index=True)


# the four faithfulness curves: the map's own in strong colours, random orders in light ones of the same hue
CURVE_COLOURS = {"deletion": "#d62728", "random deletion": "#f2a09f", "insertion": "#1f77b4", "random insertion": "#9cc7e6"}


def curve_name(curve: str, auc: float) -> str:
    """A curve's legend entry: its name and its area under the curve."""
    return f"{curve} (AUC {auc:.3f})"


def shown_curve(curves: FaithfulnessCurves, curve: str) -> str:
    """A ``CURVE_COLOURS`` curve in the protocol's words: ROAD's deletion and insertion are its MoRF and LeRF."""
    first, second = curves.curve_names
    return curve.replace("deletion", first).replace("insertion", second)


def faithfulness_table(curves: FaithfulnessCurves) -> pd.DataFrame:
    """One row per step of each curve: ``share`` of patches deleted or inserted, the target ``probability``,
    and the ``curve`` named with its AUC (``curve_name``) in the protocol's words (``shown_curve``)."""
    aucs = curves.aucs
    frames = []
    for curve in CURVE_COLOURS:
        key = curve.replace(" ", "_")
        frames.append(pd.DataFrame({"share": curves.fractions.double().numpy(),
                                    "probability": getattr(curves, key).double().numpy(),
                                    "curve": curve_name(shown_curve(curves, curve), aucs[key])}))
    return pd.concat(frames, ignore_index=True)


def curve_colours(curves: FaithfulnessCurves) -> dict[str, str]:
    """Each curve's legend entry → its colour, for the plot's colour map."""
    aucs = curves.aucs
    return {curve_name(shown_curve(curves, curve), aucs[curve.replace(" ", "_")]): colour for curve,
            colour in CURVE_COLOURS.items()}
