"""vit_explorer: see what a Vision Transformer looks at.

Public API: ``explain`` (an image to one map, shown in a notebook), ``load_model``, ``analyze``, ``record_attention``,
``attention_rollout``, and the one exception type ``VitExplorerError``. Importing this package does not import gradio
or build models.
"""

from pathlib import Path

from vit_explorer.core.analysis import Analysis, analyze
from vit_explorer.core.capture import AttentionRecorder, record_attention
from vit_explorer.core.rollout import attention_rollout
from vit_explorer.draw import report
from vit_explorer.errors import VitExplorerError
from vit_explorer.explain import Explanation, explain
from vit_explorer.models import load_model
from vit_explorer.models.layout import TokenLayout


def _analysis_html(analysis: Analysis) -> str:
    return report.analysis_html(analysis)


def _save_analysis_html(analysis: Analysis, path: str | Path) -> Path:
    """The analysis's notebook display as a self-contained HTML file (pictures embedded, nothing fetched)."""
    path = Path(path)
    path.write_text(report.page(f"vit_explorer: {analysis.model_name}", report.analysis_html(analysis)), encoding="utf-8")
    return path


# An Analysis lives in ``core``, below the drawing it needs for its display: the public API, which sits above every
# layer, gives it its notebook display (Jupyter calls ``_repr_html_``) and ``save_html``.
Analysis._repr_html_ = _analysis_html
Analysis.save_html = _save_analysis_html

__all__ = [
    "Analysis",
    "AttentionRecorder",
    "Explanation",
    "TokenLayout",
    "VitExplorerError",
    "analyze",
    "attention_rollout",
    "explain",
    "load_model",
    "record_attention",
]
