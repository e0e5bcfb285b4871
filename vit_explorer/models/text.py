"""A model's text tower: prompts become embeddings in the image embedding's space, and a score says how well they match.

CLIP scores a prompt by ``logit_scale`` × cos(image, text); SigLIP adds its learned ``logit_bias`` to the same product and
reads it through a sigmoid. ``TextTower`` holds each family's encoder behind one call, so that a prompt target
(``core.targets.prompt_model``) treats every family alike. The image side is the adapter's ``pool``: the embedding a
family hands on, projected into the shared space where the model has a projection.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from vit_explorer.errors import VitExplorerError


@dataclass(frozen=True)
class Reading:
    """What a text tower reads of one prompt: ``tokens``, the prompt as it reads it (an unknown word as its unknown
    token), the words it has no token for (``unknown``), and ``cut``, the end of the prompt past its text length, which it
    never sees."""

    tokens: tuple[str, ...]
    unknown: tuple[str, ...] = ()
    cut: str = ""


@dataclass(frozen=True)
class TextTower:
    """Prompts → embeddings ``[p, dim]`` (not yet unit length) through ``encode``; prompt i scores
    ``logit_scale`` · cos(image, text_i) + ``logit_bias``, the logit the model itself uses. ``notes``: what a user should
    know about this tower (a tokenizer without the model's vocabulary); ``module``: the module holding its weights, moved
    with the image tower to the model's device; ``read``: what it reads of a prompt (``Reading``)."""

    encode: Callable[[list[str]], torch.Tensor]
    logit_scale: float
    read: Callable[[str], Reading]
    logit_bias: float = 0.0
    notes: tuple[str, ...] = ()
    module: nn.Module | None = None
    # each prompt's unit embedding ([dim]) by (prompt, weights' stamp): a redraw, a target change or Compare asks for the
    # same prompts again, and a weight changed in place (a notebook's fine-tuning) gives another stamp
    known: dict[tuple, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    def stamp(self) -> tuple:
        """What changes when the tower's weights do: each parameter's storage and in-place version."""
        return () if self.module is None else tuple((p.data_ptr(), p._version) for p in self.module.parameters())

    def embed(self, prompts: Sequence[str]) -> torch.Tensor:
        """Unit-length embeddings of ``prompts`` ``[p, dim]`` (float32, CPU, no graph): one pass of the text tower for the
        prompts not embedded before with these weights."""
        texts = [str(prompt).strip() for prompt in prompts]
        if not texts or any(not text for text in texts):
            raise VitExplorerError("a text target needs at least one prompt, and no prompt may be empty")
        stamp = self.stamp()
        new = list(dict.fromkeys(text for text in texts if (text, stamp) not in self.known))
        if new:
            with torch.inference_mode():
                embeddings = nn.functional.normalize(self.encode(new).float().cpu(), dim=-1)  # [new, dim]
            self.known.update(((text, stamp), embedding.clone()) for text, embedding in zip(new, embeddings, strict=True))
        return torch.stack([self.known[text, stamp] for text in texts])


class UnitNorm(nn.Module):
    """x / ‖x‖ over the last dimension: the normalisation CLIP and SigLIP apply before the cosine.

    Like a LayerNorm's standard deviation, its length can be held at its value on the image (``held``), so that AttnLRP
    and the decomposition see an affine read-out."""

    def __init__(self, eps: float = 1e-12) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=-1, keepdim=True).clamp_min(self.eps)

    def held(self, x: torch.Tensor) -> torch.Tensor:
        """The same output with the length out of the graph (a constant scale)."""
        return x / x.norm(dim=-1, keepdim=True).clamp_min(self.eps).detach()


def byte_reading(length: int, start: int | None, end: int | None) -> Callable[[str], Reading]:
    """What ``byte_tokens`` reads of a prompt: its UTF-8 bytes up to the room its text length leaves."""
    room = length - (start is not None) - (end is not None)

    def read(prompt: str) -> Reading:
        data = prompt.encode()
        return Reading(tokens=tuple(data[:room].decode(errors="ignore")), cut=data[room:].decode(errors="ignore"))

    return read


def tokenizer_reading(tokenizer, length: int) -> Callable[[str], Reading]:
    """What a Hugging Face tokenizer (``tokenizer``, with its special tokens) reads of a prompt in ``length`` tokens: its
    tokens, those it maps to its unknown token, and the text past ``length``."""

    def read(prompt: str) -> Reading:
        ids = tokenizer(prompt, truncation=False)["input_ids"]
        unknown_id = getattr(tokenizer, "unk_token_id", None)
        specials = set(getattr(tokenizer, "all_special_ids", ()))
        kept = [index for index in ids[:length] if index not in specials or index == unknown_id]
        tokens = tuple(tokenizer.convert_ids_to_tokens(kept))
        words = prompt.split()
        unknown = tuple(word for word in words if unknown_id is not None
                        and unknown_id in tokenizer(word, add_special_tokens=False)["input_ids"])
        past = [index for index in ids[length:] if index not in specials]
        return Reading(tokens=tokens, unknown=unknown, cut=tokenizer.decode(past).strip() if past else "")

    return read


def byte_tokens(prompts: list[str], length: int, vocab_size: int, start: int | None, end: int | None,
                pad: int = 0) -> torch.Tensor:
    """Token ids ``[p, length]`` for a model built with random weights and no tokenizer files: each UTF-8 byte b as id
    b + 1 (below ``vocab_size``), between the model's start and end ids where it has them, padded with ``pad``. A random
    model has learned no words, so any fixed tokenization serves; a trained one needs its own tokenizer."""
    rows = []
    room = length - (start is not None) - (end is not None)
    for prompt in prompts:
        ids = [1 + byte % (vocab_size - 1) for byte in prompt.encode()][:room]
        ids = ([start] if start is not None else []) + ids + ([end] if end is not None else [])
        rows.append(ids + [pad] * (length - len(ids)))
    return torch.tensor(rows, dtype=torch.long)


RANDOM_TOKENIZER = ("random weights, no tokenizer files: prompts are tokenized byte by byte, which a random text tower "
                    "treats like any other tokenization; nothing here is learned")
