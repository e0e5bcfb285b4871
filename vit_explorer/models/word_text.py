"""A small word-level text tower: the one the shipped shapes-CLIP is trained with (``shapes.train_clip``).

Words are looked up in a fixed vocabulary stored with the weights (any other word is ``[unk]``, and the app lists the
words it knows), a ``[cls]`` token leads, and the seed ViT's transformer encodes them; the ``[cls]`` token's output,
projected, is the text's embedding in the image tower's space.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.text import Reading, TextTower
from vit_explorer.models.vit import Transformer

TEXT_KEY = "text"  # the checkpoint's config section, and the prefix of the text tower's tensors
PAD, CLS, UNK = "[pad]", "[cls]", "[unk]"


class WordTextEncoder(nn.Module):
    """Token ids ``[b, length]`` → text embeddings ``[b, embed_dim]``, with the learned logit scale and bias of the
    sigmoid loss it was trained with (the score is ``exp(logit_scale)`` · cosine + ``logit_bias``)."""

    def __init__(self, *, vocab_size: int, length: int, dim: int, depth: int, heads: int, dim_head: int, mlp_dim: int,
                 embed_dim: int) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, dim)
        self.pos_embedding = nn.Parameter(torch.randn(length, dim) * 0.02)
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim)
        self.projection = nn.Linear(dim, embed_dim, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(10.0)))
        self.logit_bias = nn.Parameter(torch.tensor(-5.0))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.token_embedding(ids) + self.pos_embedding[: ids.shape[1]]
        return self.projection(self.transformer(x)[:, 0])


def words_of(prompt: str) -> list[str]:
    """The words of ``prompt``, lower case, split at anything but letters and digits: a number or an accented word is a
    word (unknown to a vocabulary without it), never dropped."""
    return re.findall(r"[^\W_]+", prompt.lower())


def tokenize(prompts: list[str], vocabulary: tuple[str, ...], length: int) -> torch.Tensor:
    """Token ids ``[p, length]``: ``[cls]``, each word's index (``[unk]`` if unknown), ``[pad]`` to ``length``."""
    index = {word: position for position, word in enumerate(vocabulary)}
    rows = []
    for prompt in prompts:
        ids = [index[CLS]] + [index.get(word, index[UNK]) for word in words_of(prompt)][: length - 1]
        rows.append(ids + [index[PAD]] * (length - len(ids)))
    return torch.tensor(rows, dtype=torch.long)


def reading(vocabulary: tuple[str, ...], length: int) -> Callable[[str], Reading]:
    """What ``tokenize`` reads of a prompt: its words up to ``length`` − 1 (after ``[cls]``), an unknown one as ``[unk]``."""
    known = set(vocabulary)

    def read(prompt: str) -> Reading:
        words = words_of(prompt)
        kept, past = words[: length - 1], words[length - 1 :]
        return Reading(tokens=tuple(word if word in known else UNK for word in kept),
                       unknown=tuple(dict.fromkeys(word for word in kept if word not in known)), cut=" ".join(past))

    return read


def text_encoder(config: dict[str, Any], source: str) -> WordTextEncoder:
    """The (untrained) text tower a checkpoint's ``text`` config section describes."""
    try:
        return WordTextEncoder(vocab_size=len(config["vocabulary"]), **{key: config[key] for key in (
            "length", "dim", "depth", "heads", "dim_head", "mlp_dim", "embed_dim")})
    except (KeyError, TypeError) as error:
        raise VitExplorerError(f"{source}: the text tower's config lacks {error}") from None


def text_tower(config: dict[str, Any], encoder: WordTextEncoder) -> TextTower:
    """The ``TextTower`` of a checkpoint's ``text`` config section and its loaded ``encoder``."""
    vocabulary = tuple(config["vocabulary"])
    encoder.eval()

    def encode(prompts: list[str]) -> torch.Tensor:
        device = encoder.projection.weight.device
        return encoder(tokenize(prompts, vocabulary, config["length"]).to(device))

    known = [word for word in vocabulary if not word.startswith("[")]
    return TextTower(encode=encode, read=reading(vocabulary, config["length"]),
                     logit_scale=float(encoder.logit_scale.detach().exp()),
                     logit_bias=float(encoder.logit_bias.detach()),
                     notes=(f"its text tower knows {len(known)} words ({', '.join(known)}); any other word is unknown to it",),
                     module=encoder)
