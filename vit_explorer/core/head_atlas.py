"""A head atlas: what each head of a model does across a folder of images (``methods.atlas`` computes it). Plain data
with the arithmetic that reads it: each head's mean |contribution|, how often it is among the heads that write most,
its sign, the images where it writes most, the answers it pushes up."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

TOP_HEADS = 5  # a head "matters" for an image when it is among this many heads of largest |contribution|
TOP_IMAGES = 4  # images kept per head, by |contribution|
TOP_CLASSES = 3  # classes (or prompts) each head pushes up most


@dataclass
class Atlas:
    """What a folder says about each head (module doc). Per image: ``statistics`` ``{name: [images, layers, heads]}``,
    ``contributions`` ``[images, layers, heads]`` (each head's direct share of the image's answer), ``answers`` (each
    image's answer: a class or prompt index, -1 for a backbone), ``labels`` (its folder's class where the folders name
    the answers, else -1), and for a text model ``vectors`` ``[images, layers, heads, dim]`` and ``rest`` ``[images,
    dim]`` (everything that is no head), with ``prompts`` ``[answers, dim]`` (unit rows) and ``scale``. Per head, once
    described: ``texts`` ``[layers][heads]`` and their share of the head's variance ``explained`` ``[layers, heads]``;
    and ``completeness`` ``{"accuracy", "replaced_accuracy", "late_layers"}``."""

    model: str
    paths: list[str]
    answer_names: list[str]
    statistics: dict[str, torch.Tensor]
    contributions: torch.Tensor
    answers: torch.Tensor
    labels: torch.Tensor
    skipped: list[dict[str, str]]
    vectors: torch.Tensor | None = None
    rest: torch.Tensor | None = None
    prompts: torch.Tensor | None = None
    scale: float = 1.0
    texts: list[list[list[str]]] | None = None
    explained: torch.Tensor | None = None
    completeness: dict | None = None
    spec: str | None = None  # what loads the model again (``load_model``), where it is known

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, heads)."""
        return tuple(self.contributions.shape[1:])

    def mean_abs(self) -> torch.Tensor:
        """Each head's mean |contribution| over the images ``[layers, heads]``."""
        return self.contributions.abs().mean(dim=0)

    def top_share(self) -> torch.Tensor:
        """The share of images for which each head is among the ``TOP_HEADS`` of largest |contribution| ``[layers, heads]``."""
        flat = self.contributions.abs().flatten(1)  # [images, layers · heads]
        ranked = torch.zeros_like(flat).scatter_(1, flat.topk(min(TOP_HEADS, flat.shape[1]), dim=1).indices, 1.0)
        return ranked.mean(dim=0).view(self.shape)

    def positive_share(self) -> torch.Tensor:
        """The share of images on which each head's contribution is positive ``[layers, heads]``: its sign."""
        return (self.contributions > 0).double().mean(dim=0)

    def top_images(self, count: int = TOP_IMAGES) -> torch.Tensor:
        """The images where each head writes most, by |contribution| ``[layers, heads, count]`` (indices into ``paths``)."""
        return self.contributions.abs().topk(min(count, len(self.paths)), dim=0).indices.permute(1, 2, 0)

    def pushes_up(self, count: int = TOP_CLASSES) -> list[list[list[tuple[str, float]]]]:
        """Per head, the answers (classes or prompts) it raises most: its mean contribution over the images with that
        answer, largest first, positive ones only."""
        layers, heads = self.shape
        by_answer = {int(answer): self.contributions[self.answers == answer].mean(dim=0) for answer in self.answers.unique()
                     if int(answer) >= 0}
        found = []
        for layer in range(layers):
            row = []
            for head in range(heads):
                means = [(self.answer_names[answer], float(values[layer, head])) for answer, values in by_answer.items()]
                row.append(heapq.nlargest(count, [pair for pair in means if pair[1] > 0], key=lambda pair: pair[1]))
            found.append(row)
        return found
