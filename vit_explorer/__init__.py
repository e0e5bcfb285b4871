"""vit_explorer: see what a Vision Transformer looks at.

Public API: ``load_model``, ``analyze``, ``record_attention``, ``attention_rollout``, and the one
exception type ``VitExplorerError``. Importing this package does not import gradio or build models.
"""

from .analysis import Analysis, analyze
from .capture import AttentionRecorder, record_attention
from .errors import VitExplorerError
from .layout import TokenLayout
from .models import load_model
from .rollout import attention_rollout

__all__ = [
    "Analysis",
    "AttentionRecorder",
    "TokenLayout",
    "VitExplorerError",
    "analyze",
    "attention_rollout",
    "load_model",
    "record_attention",
]
