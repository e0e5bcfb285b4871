"""The words the app, the terminal, the report and the command line share, said one way in all of them: what a
model's weights are, and what the work that runs the model again costs."""

from vit_explorer.core.interventions import forward_equivalents

# a model built with ``@random``: its figures are controls, not findings
RANDOM_WEIGHTS = "random weights: the token layout is the real one, but nothing is learned, so the maps show no learned attention"


def sentence(words: str) -> str:
    """``words`` as a sentence of its own: a capital first, a full stop last."""
    return f"{words[0].upper()}{words[1:]}."


def passes(forward_passes: float) -> str:
    """A cost in words a user can compare: about N× one forward pass."""
    return f"about {forward_passes:.0f}× the cost of one forward pass"


def ablation_cost(layers: int, heads: int) -> str:
    """A head ablation's cost, and why (``interventions.forward_equivalents``)."""
    return (f"{passes(forward_equivalents(layers, heads))} (1 + {layers} passes; the pass for layer l runs {heads} copies, "
            "one per head, of the layers from l up)")


def completeness(done: dict) -> str:
    """The atlas's completeness check (``methods.atlas.completeness``) in words: the zero-shot accuracy with every head,
    and with the early layers' heads mean-ablated and the late layers' replaced by their descriptions."""
    return (f"zero-shot accuracy {done['accuracy']:.1%} with every head, {done['replaced_accuracy']:.1%} with the early "
            f"layers' heads mean-ablated and the last {done['late_layers']} layers' heads replaced by their descriptions "
            f"({done['images']} labelled images)")
