"""Targets beyond classes: what a backbone's class-specific maps explain, and text prompts for a model that reads text.

A backbone has no class scores, so relevance, AttnLRP, LeGrad, gradient-weighted rollout, head ablation and the sanity
check have nothing to differentiate. ``similarity_model`` gives them one score instead, a projection on a unit
reference direction r̂ computed once from the unchanged image and held fixed (a perturbed or randomised model is
scored against the same direction):

- *the image*: s(x) = ⟨embed(x), r̂⟩, embed the backbone's own pooling of its final tokens (the class token, or the mean
  patch for a model without one) and r̂ the image's own embedding: on the image itself, the embedding's length;
- *this patch*: s(x) = ⟨token_p(x), r̂⟩, token_p the clicked patch's own output token and r̂ its direction on the
  image: which parts of the image that patch's representation is made of. It replaced the image's embedding
  projected on the patch's token, a quantity no user asks about, whose AttnLRP map on a real photo (DINOv2, the
  astronaut's eye) ranked the clicked eye the least relevant patch of the image; on this target it ranks it first or
  second (``tests/test_real_weights.py``);
- *another image*: s(x) = ⟨embed(x), r̂⟩ with r̂ the direction of a second image's embedding: the retrieval question,
  why these two images match, asked of each image in turn (``OtherImage``).

The score is served through an adapter that wraps the model's own (``SimilarityAdapter``) and reports it as a
model with one "class", so every method reaches it through the same interface as a class logit. It is a score,
not a probability (a softmax over one class is 1 whatever the image), so faithfulness follows it as a share of the
unchanged image's score (``methods.faithfulness``).

A model with a text tower (CLIP, SigLIP, the shipped shapes-CLIP: ``LoadedModel.text``) is asked in words instead:
``prompt_model`` makes its ``Prompts`` its classes, each scored by the model's own image–text logit,
scale · cos(embed(x), text) + bias (``PromptAdapter``), so the softmax over them is a zero-shot prediction and every
method explains the prompt chosen as it explains a class. The cosine's length is a norm like a LayerNorm's standard
deviation: AttnLRP and the decomposition hold it at its value on the image (``models.text.UnitNorm``).
"""

from __future__ import annotations

import abc
import dataclasses
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from vit_explorer.core.capture import capture_lock
from vit_explorer.core.images import ImageSource
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.attention_inputs import AttentionInputs
from vit_explorer.models.base import CaptureAdapter, LoadedModel
from vit_explorer.models.text import Reading, UnitNorm

SIMILARITY = "similarity"  # how a similarity target's label begins: what captions and files name


@dataclass(frozen=True)
class OtherImage:
    """A second image, whose embedding a backbone's target compares the image's with: ``source`` a path, bytes or a PIL
    image, fitted to the model as the first one is; ``name`` how captions call it."""

    source: ImageSource = field(compare=False)
    name: str


@dataclass(frozen=True)
class Prompts:
    """Text prompts for a model with a text tower (``LoadedModel.text``): they become its classes, so the image gets a
    zero-shot prediction over them (a softmax over their logits), and ``chosen`` (an index into ``texts``; None: the
    best match) is the one explained. A prompt given twice counts once (``repeated`` names it)."""

    texts: tuple[str, ...]
    chosen: int | None = None
    repeated: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        given = [text.strip() for text in self.texts if text.strip()]
        if not given:
            raise VitExplorerError("a text target needs a prompt, e.g. \"a photo of a dog\"")
        texts = tuple(dict.fromkeys(given))
        if self.chosen is not None and not 0 <= self.chosen < len(texts):
            raise VitExplorerError(f"prompt {self.chosen} is outside the {len(texts)} prompts given")
        object.__setattr__(self, "texts", texts)
        object.__setattr__(self, "repeated", tuple(text for text in texts if given.count(text) > 1))

    @classmethod
    def parse(cls, text: str) -> Prompts:
        """``a photo of a dog|a photo of a cat``: prompts split at ``|``, the best match explained, or the one marked
        with a leading ``*`` (``a dog|*a cat``)."""
        parts = [part.strip() for part in text.split("|") if part.strip()]
        marked = [index for index, part in enumerate(parts) if part.startswith("*")]
        if len(marked) > 1:
            raise VitExplorerError(f"--target {text!r}: mark at most one prompt with * to explain it")
        texts = tuple(part.removeprefix("*").strip() for part in parts)
        chosen = None if not marked else list(dict.fromkeys(texts)).index(texts[marked[0]])
        return cls(texts, chosen)


@dataclass(frozen=True)
class Target:
    """What the class-specific methods explain: a class of a classifier (``value`` its index or name; None: the top
    prediction); for a model with a text tower, ``Prompts``; or for a backbone the similarity of the image's embedding to
    its own (``value`` None), of the output token of the patch at (row, column) ``value`` to its own, or of the
    embedding to that of an ``OtherImage``."""

    value: int | str | tuple[int, int] | OtherImage | Prompts | None = None

    @property
    def patch(self) -> tuple[int, int] | None:
        return self.value if isinstance(self.value, tuple) else None

    @property
    def other(self) -> OtherImage | None:
        return self.value if isinstance(self.value, OtherImage) else None

    @property
    def prompts(self) -> Prompts | None:
        return self.value if isinstance(self.value, Prompts) else None

    @property
    def given(self) -> bool:
        """Whether one was asked for (else: the top class, or a backbone's own embedding)."""
        return self.value is not None

    @classmethod
    def of(cls, value, model: LoadedModel) -> Target:
        """What a notebook or script passes as ``target``, for ``model``: on a model with a text tower and no classes, a
        string is a prompt and a list of strings are prompts (the best match explained); anything else as it is."""
        if model.text is not None and not model.num_classes:
            if isinstance(value, str):
                return cls(Prompts((value,)))
            if isinstance(value, (list, tuple)) and value and all(isinstance(text, str) for text in value):
                return cls(Prompts(tuple(value)))
        return cls(value)

    @classmethod
    def parse(cls, text: str | None) -> Target:
        """A command line's ``--target``: a class index or name, ``patch:ROW,COL``, ``image:PATH``, ``text:PROMPT|PROMPT…``
        or None."""
        if text is not None and text.startswith("text:"):
            return cls(Prompts.parse(text.removeprefix("text:")))
        if text is not None and text.startswith("image:"):
            path = Path(text.removeprefix("image:"))
            if not path.is_file():
                raise VitExplorerError(f"--target {text!r}: no image file at {path}")
            return cls(OtherImage(path, path.name))
        if text is None or not text.startswith("patch:"):
            return cls(text)
        try:
            row, col = (int(part) for part in text.removeprefix("patch:").split(","))
        except ValueError:
            raise VitExplorerError(f"--target {text!r}: a patch is patch:ROW,COL, e.g. patch:3,6") from None
        return cls((row, col))

    def check(self, model: LoadedModel) -> None:
        """Refuse, before any pass, a target ``model`` cannot have: a class on a backbone, a patch or another image on a
        classifier, text prompts on a model without a text tower."""
        if self.prompts is not None and model.text is None:
            raise VitExplorerError(f"{model.name} has no text tower, so it cannot score a prompt: text targets are for CLIP and "
                                   "SigLIP models (open_clip:ARCH@WEIGHTS, hf:FOLDER of a CLIPModel or SiglipModel)")
        if self.prompts is not None:
            return
        if model.num_classes and self.patch is not None:
            raise VitExplorerError(f"a patch target {self.patch} is for a backbone; {model.name} has classes: name one")
        if model.num_classes and self.other is not None:
            raise VitExplorerError(f"a second image as the target is for a backbone's embedding; {model.name} has classes: "
                                   "name one")
        if not model.num_classes and self.given and self.patch is None and self.other is None:
            raise VitExplorerError(f"{model.name} has no classifier head, so it has no class {self.value!r}: give no target (the "
                                   "similarity to the image's own embedding), a patch as (row, column), patch:ROW,COL on the "
                                   "command line, or a second image, image:PATH"
                                   + (", or text prompts, text:PROMPT|PROMPT" if model.text is not None else ""))


def prompted(model: LoadedModel, lines: str) -> LoadedModel:
    """``model`` as a zero-shot classifier over the prompts in ``lines`` (one per line; the app's text box) where it has a
    text tower and ``lines`` holds any; else ``model`` as it is."""
    return prompt_model(model, Prompts(tuple(lines.splitlines()))) if model.text is not None and lines.strip() else model


def prompt_model(model: LoadedModel, prompts: Prompts) -> LoadedModel:
    """``model`` (with a text tower) as a zero-shot classifier over ``prompts``: one logit per prompt, the model's own
    image–text logit (``PromptAdapter``), the prompts as labels; the text tower embeds each prompt once
    (``TextTower.embed``)."""
    if model.text is None:
        Target(prompts).check(model)
    base = model.adapter.base if isinstance(model.adapter, PromptAdapter) else model.adapter
    adapter = PromptAdapter(base, model.text.embed(prompts.texts), model.text.logit_scale, model.text.logit_bias)
    readings = [model.text.read(text) for text in prompts.texts]
    return dataclasses.replace(model, adapter=adapter, labels=list(prompts.texts), ood=None,
                               prompt_notes=reading_notes(prompts, readings))


PROMPT_SHOWN = 60  # characters of a prompt repeated in a note; a longer one is cut there (the model's reading says the rest)
READINGS_LISTED = 8  # prompts whose reading is stated one by one; the rest are counted


def shown_prompt(text: str) -> str:
    """A prompt as a note quotes it: at most ``PROMPT_SHOWN`` characters."""
    return f"“{text}”" if len(text) <= PROMPT_SHOWN else f"“{text[: PROMPT_SHOWN - 1]}…” ({len(text):,} characters)"


def reading_notes(prompts: Prompts, readings: list[Reading]) -> list[str]:
    """What the text tower read of each prompt, a line each where it missed anything (words it has no token for, words past
    its text length), prompts it reads as the same text, and prompts given twice; one line when it read every word."""
    same: dict[tuple[str, ...], list[str]] = {}
    for text, reading in zip(prompts.texts, readings, strict=True):
        same.setdefault(reading.tokens, []).append(text)
    lines = [f"{len(texts)} prompts read as the same text, so they score alike: "
             + ", ".join(shown_prompt(text) for text in texts[:3]) + (" …" if len(texts) > 3 else "")
             for texts in same.values() if len(texts) > 1]
    missing = []
    for text, reading in zip(prompts.texts, readings, strict=True):
        missed = []
        if reading.unknown:
            missed.append("not known to it: " + ", ".join(shown_prompt(word) for word in reading.unknown))
        if reading.cut:
            missed.append(f"past its text length, never read: {shown_prompt(reading.cut)}")
        if missed:
            read = " ".join(reading.tokens)
            missing.append(f"prompt {shown_prompt(text)}: the model read {shown_prompt(read) if read else 'nothing'}; "
                           + "; ".join(missed))
    lines += missing[:READINGS_LISTED]
    if len(missing) > READINGS_LISTED:
        lines.append(f"… and {len(missing) - READINGS_LISTED} more prompts with words the model did not read")
    if prompts.repeated:
        lines.append("given more than once, counted once: " + ", ".join(shown_prompt(text) for text in prompts.repeated))
    return lines or [f"the model read every word of the {len(prompts.texts)} prompt{'s' if len(prompts.texts) > 1 else ''}"]


class ReadoutAdapter(CaptureAdapter):
    """The adapter of ``base``'s model with other scores in place of its class logits: ``scores`` of the embedding (the
    base's pooling of its final tokens) or, with ``token``, of the output token at that sequence index, read from the
    last layer's stream. Every other method is ``base``'s (``forwarded``, below)."""

    def __init__(self, base: CaptureAdapter, token: int | None = None) -> None:
        self.base = base
        self.read_token = token

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        return False  # made by a target, never found by ``adapter_for``

    @abstractmethod
    def scores(self, read: torch.Tensor) -> torch.Tensor:
        """The scores ``[b, classes]`` of what is read ``[b, dim']``."""

    def classify(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        tokens = self.final_tokens(module, hidden)  # [b, n, dim]
        return self.scores(self.pool(module, tokens) if self.read_token is None else tokens[:, self.read_token])

    def layer_readout(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if self.read_token is not None:
            return self.classify(module, hidden)
        return self.scores(self.layer_embedding(module, hidden))

    def score_of(self, module: nn.Module,
                 forward: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
        """``forward`` (pixels → the base's outputs) made to return the scores, read from the last layer's stream."""

        def score(pixels: torch.Tensor) -> torch.Tensor:
            streams: dict[int, torch.Tensor] = {}
            with self.base.layer_outputs(module, streams.__setitem__):
                forward(pixels)
            return self.classify(module, streams[max(streams)])

        return score

    def logits(self, module: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        return self.score_of(module, lambda images: self.base.logits(module, images))(pixels)

    @contextmanager
    def attached(self, module: nn.Module,
                 sink: MutableMapping[int, torch.Tensor]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        with self.base.attached(module, sink) as forward:
            yield self.score_of(module, forward)

    @contextmanager
    def edited(self, module: nn.Module,
               edits: Mapping[int, Callable[[torch.Tensor], torch.Tensor]]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        with self.base.edited(module, edits) as forward:
            yield self.score_of(module, forward)

    @property
    def reads_attention_inputs(self) -> bool:
        return self.base.reads_attention_inputs

    @contextmanager
    def recorded_inputs(self, module: nn.Module,
                        record: Callable[[int, AttentionInputs], None]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        with self.base.recorded_inputs(module, record) as forward:
            yield self.score_of(module, forward)


def forwarded(name: str) -> Callable:
    """A method that is ``base``'s ``name``."""

    def method(self: ReadoutAdapter, *args, **kwargs):
        return getattr(self.base, name)(*args, **kwargs)

    method.__name__, method.__doc__ = name, f"``base``'s ``{name}``."
    return method


# every other method of a capture adapter is the base's own, overrides included: one added to CaptureAdapter with a
# default reaches the family's override, not the default
READOUT_OWN = ("num_classes",)  # what each kind of readout says for itself, as ``scores``
for _name, _method in vars(CaptureAdapter).items():
    if callable(_method) and not _name.startswith("_") and _name not in vars(ReadoutAdapter) and _name not in READOUT_OWN:
        setattr(ReadoutAdapter, _name, forwarded(_name))
abc.update_abstractmethods(ReadoutAdapter)


class SimilarityAdapter(ReadoutAdapter):
    """One score in place of class logits ``[b, 1]``: ⟨what is read, ``reference``⟩, ``reference`` ``[dim]`` a unit vector."""

    def __init__(self, base: CaptureAdapter, reference: torch.Tensor, token: int | None = None) -> None:
        super().__init__(base, token)
        self.reference = reference

    def num_classes(self, module: nn.Module) -> int:
        return 1

    def scores(self, read: torch.Tensor) -> torch.Tensor:
        return read @ self.reference.to(read.device, read.dtype)[:, None]


class PromptAdapter(ReadoutAdapter):
    """One score per prompt ``[b, prompts]``: ``scale`` · ⟨unit(embedding), ``texts``ᵀ⟩ + ``bias``, the logit a CLIP
    (``bias`` 0) or SigLIP model gives an image and a text; ``texts`` ``[prompts, dim]`` unit rows."""

    def __init__(self, base: CaptureAdapter, texts: torch.Tensor, scale: float, bias: float) -> None:
        super().__init__(base)
        self.texts, self.scale, self.bias = texts, scale, bias
        self.unit = UnitNorm()

    def num_classes(self, module: nn.Module) -> int:
        return self.texts.shape[0]

    def scores(self, read: torch.Tensor) -> torch.Tensor:
        return self.scale * self.unit(read) @ self.texts.to(read.device, read.dtype).T + self.bias

    def layer_norms(self, module: nn.Module) -> list[nn.Module]:
        # the cosine's normalisation is a norm like the others: AttnLRP and the decomposition hold its scale
        return [*self.base.layer_norms(module), self.unit]


def similarity_model(model: LoadedModel, pixels: torch.Tensor, patch: tuple[int, int] | None = None,
                     other: tuple[torch.Tensor, str] | None = None) -> LoadedModel:
    """``model`` scored, for ``patch`` and ``other`` None, by the projection of an image's embedding on the unit direction
    of the embedding of the image ``pixels`` ``[1, 3, H, W]`` (on that image: the embedding's length); for a ``patch``
    (row, column), by the projection of that patch's own output token on the direction of the same token of ``pixels``:
    which parts of the image the clicked patch's representation is made of, the question a user clicking a patch asks;
    for ``other`` (a second image's pixels ``[1, 3, H, W]``, its name), by the projection of the embedding on the
    direction of the second image's: why the two match."""
    module, layout = model.module, model.layout
    index = None
    if patch is not None:
        row, col = patch
        if not (0 <= row < layout.grid_hw[0] and 0 <= col < layout.grid_hw[1]):
            raise VitExplorerError(f"patch ({row}, {col}) is outside the {layout.grid_hw[0]}×{layout.grid_hw[1]} patch grid")
        index = layout.patch_token(row, col)
    tokens = forward_tokens(model, pixels if other is None else other[0])  # [1, n, dim]
    with torch.inference_mode():  # a pooling with weights (a CLIP tower's projection) reads inference tensors
        if other is not None:
            reference, label = model.adapter.pool(module, tokens)[0], f"{SIMILARITY} to {other[1]}'s embedding"
        elif patch is None:
            reference, label = model.adapter.pool(module, tokens)[0], f"{SIMILARITY} to the image's own embedding"
        else:
            reference, label = tokens[0, index], f"patch (row {patch[0]}, col {patch[1]}): its own output token"
    reference = reference.float().clone()
    norm = float(reference.norm())
    if norm == 0:
        raise VitExplorerError(f"{model.name} gives this reference an embedding of zero length: there is no direction to explain")
    return dataclasses.replace(model, adapter=SimilarityAdapter(model.adapter, reference / norm, index), labels=[label], ood=None)


def forward_tokens(model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
    """Every output token of the image ``pixels`` ``[1, 3, H, W]`` after the model's final norm ``[1, n, dim]``: one pass."""
    module = model.module
    streams: dict[int, torch.Tensor] = {}
    with capture_lock(module), torch.inference_mode(), model.adapter.layer_outputs(module, streams.__setitem__):
        model.adapter.logits(module, pixels.to(model.device))
        return model.adapter.final_tokens(module, streams[max(streams)])
