"""vit_explorer: see what a Vision Transformer looks at.

Public API: ``load_model``, ``analyze``, ``record_attention``, ``attention_rollout``, and the one
exception type ``VitExplorerError``. Importing this package does not import gradio or build models.
"""

from vit_explorer.core.analysis import Analysis, analyze
from vit_explorer.core.capture import AttentionRecorder, record_attention
from vit_explorer.core.rollout import attention_rollout
from vit_explorer.errors import VitExplorerError
from vit_explorer.models import load_model
from vit_explorer.models.layout import TokenLayout

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
