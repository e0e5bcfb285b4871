"""The matplotlib charts as a reader sees them: nothing cut at the figure's edges, no legend over the data."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import TINY, photo, write_checkpoint

from vit_explorer import analyze, load_model
from vit_explorer.draw import charts
from vit_explorer.methods import norms
from vit_explorer.methods.sanity import sanity_check


@pytest.fixture
def drawn(monkeypatch):
    """The matplotlib figures the charts draw, kept before they become pixels (and are cleared)."""
    figures = []
    original = charts._figure_to_array

    def keep(figure):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        canvas = FigureCanvasAgg(figure)
        canvas.draw()
        renderer = canvas.get_renderer()
        figures.append({
            "figure": figure.bbox,
            "titles": [axes.title.get_window_extent(renderer) for axes in figure.axes if axes.get_title()],
            "axes": [axes.get_window_extent(renderer) for axes in figure.axes],
            "legends": [axes.get_legend().get_window_extent(renderer) for axes in figure.axes if axes.get_legend() is not None],
        })
        return original(figure)

    monkeypatch.setattr(charts, "_figure_to_array", keep)
    return figures


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = load_model(str(write_checkpoint(tmp_path_factory.mktemp("charts") / "tiny.safetensors", TINY, seed=1)))
    return model, analyze(model, photo((64, 64), seed=1))


def inside(inner, outer) -> bool:
    return inner.x0 >= outer.x0 - 0.5 and inner.x1 <= outer.x1 + 0.5 and inner.y0 >= outer.y0 - 0.5 and inner.y1 <= outer.y1 + 0.5


def test_a_long_target_keeps_the_sanity_charts_title_inside_the_figure(tiny, drawn):
    model, analysis = tiny
    curves = sanity_check(model, analysis, 0)
    long = dataclasses.replace(curves,
                               target_label="similarity to patch (row 13, col 26) — " + "tabby, tabby cat, domestic cat " * 3)
    charts.sanity_chart(long)
    (chart,) = drawn
    assert chart["titles"] and all(inside(title, chart["figure"]) for title in chart["titles"]), chart["titles"]


def test_token_norm_legends_lie_beside_the_lines_not_over_them(tiny, drawn):
    _, analysis = tiny
    charts.token_norm_chart(norms.for_analysis(analysis))
    (chart,) = drawn
    assert len(chart["legends"]) == 2
    for legend in chart["legends"]:
        assert inside(legend, chart["figure"])
        assert not any(legend.overlaps(axes) for axes in chart["axes"]), (legend, chart["axes"])


def test_the_faithfulness_legend_lies_beside_the_curves(tiny, drawn):
    from vit_explorer.core.analysis import class_evidence
    from vit_explorer.core.maps import RolloutOptions, class_map
    from vit_explorer.methods.faithfulness import deletion_insertion

    model, analysis = tiny
    evidence = class_evidence(model, analysis)
    curves = deletion_insertion(model, analysis.image, class_map(analysis, "relevance", evidence, RolloutOptions()),
                                evidence.target,
                                steps=4, random_orders=1)
    charts.faithfulness_chart(curves, "relevance for a class with a long name " * 2)
    (chart,) = drawn
    (legend,) = chart["legends"]
    assert inside(legend, chart["figure"]) and not any(legend.overlaps(axes) for axes in chart["axes"])
    assert all(inside(title, chart["figure"]) for title in chart["titles"])


def test_the_logit_lens_names_the_top_class_in_letters_as_large_as_the_axis_labels():
    """Where another class leads the lens, its name is written level and large enough to read (7 pt at 30° read as a
    smudge): on the shipped model's square, "circle" leads after layer 0, and its word is at least 30 px wide and 8 px
    tall in the label colour."""
    import numpy as np
    from scipy import ndimage

    from vit_explorer.models.builtin import EXAMPLES
    from vit_explorer.run import Request, run

    result = run(load_model(), EXAMPLES / "05-square.png", Request(decompose=True, score=False))
    decomposition = result.decomposition
    assert int(decomposition.lens_top[0, 0]) != decomposition.target
    picture = charts.lens_chart(decomposition, result.analysis.labels).astype(int)
    letters = np.abs(picture - np.array([179, 89, 0])).sum(-1) < 60
    words, count = ndimage.label(ndimage.binary_dilation(letters, iterations=2))
    extents = [(np.ptp(ys) + 1, np.ptp(xs) + 1) for ys, xs in (np.nonzero(words == index) for index in range(1, count + 1))]
    assert any(height >= 8 and width >= 30 for height, width in extents), extents
