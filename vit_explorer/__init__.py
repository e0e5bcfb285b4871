"""vit_explorer: see what a Vision Transformer looks at.

Public API: ``explain`` (an image to one map, shown in a notebook), ``decompose`` (a score split over heads, MLPs and
the rest, with the logit lens), ``Request`` and ``Run`` (everything asked about one
image, answered by ``vit_explorer.run.run``), ``load_model``, ``analyze``, ``record_attention``, ``attention_rollout``,
``OtherImage`` (a second image as a backbone's target), ``atlas`` (what each head does across a folder) and ``text_span``
(TextSpan: the texts a head's outputs vary along over many images), and the one exception type ``VitExplorerError``.
Importing this package does not import gradio or build models, and assigns nothing onto the types of the modules below
it.
"""

from vit_explorer.core.analysis import Analysis, analyze
from vit_explorer.core.capture import AttentionRecorder, record_attention
from vit_explorer.core.decomposition import Decomposition
from vit_explorer.core.request import Request, Run
from vit_explorer.core.rollout import attention_rollout
from vit_explorer.core.targets import OtherImage
from vit_explorer.errors import VitExplorerError
from vit_explorer.explain import Explanation, atlas, decompose, explain
from vit_explorer.methods.text_span import text_span
from vit_explorer.models import load_model
from vit_explorer.models.layout import TokenLayout

__all__ = [
    "Analysis",
    "AttentionRecorder",
    "Decomposition",
    "Explanation",
    "OtherImage",
    "Request",
    "Run",
    "TokenLayout",
    "VitExplorerError",
    "analyze",
    "atlas",
    "attention_rollout",
    "decompose",
    "explain",
    "load_model",
    "record_attention",
    "text_span",
]
