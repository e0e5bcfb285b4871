"""The one sentence with which the loader refuses a model it cannot read: the family by name, why its attention is not
the patch-to-patch map the tool shows (or not yet read), and what the loader reads instead.

Families are recognised by their class's name, the same for timm's and Hugging Face's implementations (``Swin`` in
``SwinTransformer`` and ``SwinForImageClassification``), so that a refusal never depends on a module's attributes: it
comes before any of them is read, and before any pass."""

from __future__ import annotations

import re

# (pattern on the lower-cased class name, the family's name, why it is not read); the first match wins, so a name that
# holds another's (MultiScaleVit and MobileViT hold LeViT) comes first
FAMILY_REASONS: tuple[tuple[str, str, str], ...] = (
    (r"swin", "Swin", "in a variant whose blocks are not the ones read (timm's SwinTransformer and SwinTransformerV2, "
                      "Hugging Face's Swin and Swin V2)"),
    (r"xcit", "XCiT", "whose attention is over channels, not tokens: there is no patch-to-patch map to show"),
    (r"mobilevit|byob", "MobileViT", "which attends over unfolded convolutional features, not image patches"),
    (r"multiscale|mvit", "MViT", "which pools its queries and keys, so that a map runs between grids of different sizes"),
    (r"levit", "LeViT", "which starts from a convolutional stem and attends, with a learned bias, on grids that shrink from "
                        "stage to stage"),
    (r"hiera", "Hiera", "which attends within mask units on grids that shrink from stage to stage"),
    (r"pooling|^pit", "PiT", "which pools its tokens between stages, so that the grid shrinks from stage to stage"),
    (r"pyramid|pvt", "PVT", "which attends from each patch to a spatially reduced grid of keys, on grids that shrink from "
                            "stage to stage"),
    (r"twins", "Twins", "which alternates attention within windows with attention to a subsampled grid"),
    (r"crossvit", "CrossViT", "which runs two token streams of different patch sizes, joined by their class tokens"),
    (r"tnt", "TNT", "which attends inside each patch (over its pixels) and between patches, two streams at once"),
    (r"convit", "ConViT", "whose gated positional self-attention mixes a softmax over content with a positional one"),
    (r"volo", "VOLO", "whose outlook attention folds local windows of values instead of comparing queries with keys"),
    (r"sam", "SAM encoder", "which attends within windows in most blocks and has no class token or head"),
    (r"naflex", "NaFlexViT", "which packs patches of variable-sized images into one sequence"),
    (r"davit|focal|gcvit|globalcontext|maxxvit|maxvit|coat|nest|tinyvit|tiny_vit|efficientformer|efficientvit|fastvit|"
     r"visformer|nextvit|cvt", "hybrid and hierarchical ViT",
     "which mixes convolutions, windows or pooled grids with its attention, so that no single patch grid runs through it"),
)


def family_reason(architecture: str) -> tuple[str, str] | None:
    """``(family, why)`` for a class name the loader knows it cannot read, or None."""
    lowered = architecture.lower()
    for pattern, family, why in FAMILY_REASONS:
        if re.search(pattern, lowered):
            return family, why
    return None


def unreadable(name: str, architecture: str, readable: str, known: tuple[str, str] | None = None) -> str:
    """The one sentence for a model vit_explorer cannot read: the model, its family and why (``known``, else from its
    class name where the family is known), and what the loader reads (``readable``)."""
    known = known or family_reason(architecture)
    what = (f"{architecture}, the {known[0]} family, {known[1]}" if known is not None
            else f"{architecture}, which is not one of the families this loader reads")
    return f"{name}: vit_explorer cannot read {what}; it reads {readable}"
