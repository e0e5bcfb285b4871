"""A head atlas: what each head of a model does across a folder of images, not one.

For every head of every layer, over the images: where it looks (the attention statistics ``stats`` computes: entropy,
distance, prefix share, with their spread), how much it writes directly into each image's own answer (its share of the
top class's logit, of the best prompt's for a model that reads text, of a backbone's projection on its own embedding:
``core.embedding_parts``), how often it is among the five heads that write most, its sign, the classes it pushes up
most, and the images where it writes most. For a model with a text tower, each head's outputs in the joint space are
described by TextSpan (``methods.text_span``) over a text bank (``methods.text_bank``), and the authors' completeness
check measures what the descriptions keep: zero-shot accuracy with the early layers' heads mean-ablated and each late
head replaced by its TextSpan reconstruction, beside the model's own.

One pass per batch (the split of the answer rides on it: one backward pass per layer and read dimension); no map
outlives its batch. What is kept per image is small: the statistics and contributions ``[layers, heads]`` and, for a
text model, each head's output vector ``[layers, heads, dim]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch.utils.data import DataLoader

from vit_explorer.core.embedding_parts import embedding_parts, embedding_readout, score_readout
from vit_explorer.core.head_atlas import Atlas
from vit_explorer.core.statistics import HEAD_STATISTICS, head_statistics
from vit_explorer.errors import VitExplorerError
from vit_explorer.methods.dataset import ImageDataset, ImageList
from vit_explorer.methods.text_span import text_span
from vit_explorer.models.base import LoadedModel

TEXTS_PER_HEAD = 5  # TextSpan descriptions per head (the authors take 10 of ViT-H's heads; the shipped model is small)
SPAN_RANK = 80  # the rank of a head's output span TextSpan projects the bank onto (the authors' ``w_ov_rank``)


def collect(model: LoadedModel, images: ImageList, *, prompts: Sequence[str] | None = None, batch_size: int = 16,
            fit: str = "stretch", step: Callable[[], None] | None = None) -> Atlas:
    """Stream ``images`` through ``model`` in batches and keep what the atlas needs per image (module doc). For a model
    with a text tower, ``prompts`` (default: "a CLASS" for each class folder) are what its answer is chosen among; a
    model without one answers with its top class (or, a backbone, its own embedding). ``step`` after each batch."""
    layers, heads = model.map_shape
    reads_text = model.text is not None
    names = list(model.labels or [])
    texts = None
    if reads_text:
        texts = list(prompts) if prompts else [f"a {name}" for name in images.classes or []]
        if not texts:
            raise VitExplorerError("a model that reads text needs prompts to answer with: give --prompts, or a folder "
                                   "with one sub-folder per class")
        names = texts
        unit_prompts = model.text.embed(texts).double()  # [prompts, dim], unit rows
    class_of_folder = ([names.index(f"a {name}" if reads_text else name) if (f"a {name}" if reads_text else name) in names
                        else -1 for name in images.classes] if images.classes else None)
    statistics: dict[str, list[torch.Tensor]] = {name: [] for name in HEAD_STATISTICS}
    contributions, answers, labels, vectors, rests, kept, skipped = [], [], [], [], [], [], []
    loader = DataLoader(ImageDataset(images, model.preprocess, fit), batch_size=batch_size)
    for indices, pixels, folder_labels, errors in loader:
        good = torch.tensor([error == "" for error in errors])
        skipped += [{"path": str(images.paths[int(index)]), "reason": error}
                    for index, error in zip(indices, errors, strict=True) if error]
        if good.any():
            parts = embedding_parts(model, pixels[good].to(model.device), embedding_readout if reads_text else score_readout)
            for name, values in head_statistics(parts.maps, model.layout).items():
                statistics[name].append(values.double().cpu())
            if reads_text:
                unit = torch.nn.functional.normalize(parts.embedding, dim=-1)  # [b, dim]
                chosen = (unit @ unit_prompts.T).argmax(dim=1)  # [b]
                length = parts.embedding.norm(dim=-1)[:, None, None]
                shares = model.text.logit_scale * (parts.heads @ unit_prompts[chosen][:, None, :, None])[..., 0] / length
                contributions.append(shares.cpu())
                answers.append(chosen.cpu())
                vectors.append(parts.heads.float().cpu())
                rests.append(parts.rest.cpu())
            else:
                contributions.append(parts.heads[..., 0].cpu())
                answers.append(parts.targets.cpu() if parts.targets is not None else torch.full((int(good.sum()),), -1))
            labels.append(torch.tensor([class_of_folder[int(label)] if class_of_folder is not None and label >= 0 else -1
                                        for label in folder_labels[good]]))
            kept += [str(images.paths[int(index)]) for index in indices[good]]
        if step is not None:
            step()
    if not kept:
        raise VitExplorerError("no image of the folder could be read: " + "; ".join(entry["reason"] for entry in skipped[:3]))
    atlas = Atlas(model=model.name, paths=kept, answer_names=names,
                  statistics={name: torch.cat(values) for name, values in statistics.items()},
                  contributions=torch.cat(contributions), answers=torch.cat(answers), labels=torch.cat(labels),
                  skipped=skipped)
    if reads_text:
        atlas.vectors, atlas.rest = torch.cat(vectors), torch.cat(rests)
        atlas.prompts, atlas.scale = unit_prompts, float(model.text.logit_scale)
    if atlas.contributions.shape[1:] != (layers, heads):
        raise VitExplorerError(f"the atlas has {atlas.contributions.shape[1:]} heads; the model {layers} × {heads}")
    return atlas


def describe(atlas: Atlas, bank: Sequence[str], bank_features: torch.Tensor, *, texts_per_head: int = TEXTS_PER_HEAD,
             rank: int = SPAN_RANK, late_layers: int | None = None, step: Callable[[], None] | None = None) -> None:
    """TextSpan for every head of a text model's atlas over ``bank`` (its embeddings ``bank_features`` ``[texts, dim]``),
    each head's descriptions and the share of its variance they explain; then the authors' completeness check over the
    last ``late_layers`` layers (default: the last third), kept on ``atlas``. ``step`` after each layer."""
    if atlas.vectors is None:
        raise VitExplorerError("TextSpan describes the heads of a model with a text tower; this atlas has no head vectors")
    images, layers, heads, dim = atlas.vectors.shape
    late = late_layers if late_layers is not None else max(1, math.ceil(layers / 3))
    if not 0 < late <= layers:
        raise VitExplorerError(f"the late layers must be 1..{layers}, not {late}")
    features = bank_features.float().numpy()
    rank = min(rank, images, dim)
    texts, explained = [], torch.zeros(layers, heads, dtype=torch.float64)
    replaced = atlas.vectors.double().clone()
    for layer in range(layers):
        row = []
        for head in range(heads):
            data = atlas.vectors[:, layer, head].float().numpy()
            reconstruction, chosen = text_span(data, features, list(bank), min(texts_per_head, len(bank)), rank)
            row.append(chosen)
            centred = data - data.mean(axis=0, keepdims=True)
            total = float((centred**2).sum())
            explained[layer, head] = 1.0 - float(((data - reconstruction) ** 2).sum()) / total if total > 0 else 0.0
            if layer >= layers - late:
                replaced[:, layer, head] = torch.from_numpy(reconstruction).double()
            else:  # the early layers' heads mean-ablated, as the authors do
                replaced[:, layer, head] = atlas.vectors[:, layer, head].double().mean(dim=0)
        texts.append(row)
        if step is not None:
            step()
    atlas.texts, atlas.explained = texts, explained
    atlas.completeness = completeness(atlas, replaced, late)


def completeness(atlas: Atlas, replaced: torch.Tensor, late: int) -> dict | None:
    """Zero-shot accuracy over the images whose folder names one of the prompts: with every head as it is, and with the
    heads ``replaced`` (early ones mean-ablated, late ones by their descriptions); None without such labels."""
    labelled = atlas.labels >= 0
    if not labelled.any():
        return None

    def accuracy(heads: torch.Tensor) -> float:
        embedding = heads.double().sum(dim=(1, 2)) + atlas.rest  # [images, dim]
        chosen = (embedding @ atlas.prompts.T).argmax(dim=1)
        return float((chosen[labelled] == atlas.labels[labelled]).double().mean())

    return {"accuracy": accuracy(atlas.vectors), "replaced_accuracy": accuracy(replaced), "late_layers": late,
            "images": int(labelled.sum())}
