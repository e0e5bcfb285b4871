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
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Subset

from vit_explorer.core.embedding_parts import embedding_parts, embedding_readout, score_readout
from vit_explorer.core.head_atlas import Atlas
from vit_explorer.core.statistics import HEAD_STATISTICS, head_statistics
from vit_explorer.errors import VitExplorerError
from vit_explorer.methods import dataset
from vit_explorer.methods.dataset import SHARD_SIZE, ImageDataset, ImageList
from vit_explorer.methods.text_span import text_span
from vit_explorer.models.base import LoadedModel

TEXTS_PER_HEAD = 5  # TextSpan descriptions per head (the authors take 10 for ViT-H's; the shipped models are small)
SPAN_RANK = 80  # the rank of a head's output span TextSpan projects the bank onto (the authors' ``w_ov_rank``)


def answers_of(model: LoadedModel, images: ImageList,
               prompts: Sequence[str] | None) -> tuple[list[str], torch.Tensor | None, list[int] | None]:
    """What the model answers among (its classes; for a model with a text tower ``prompts``, by default "a CLASS" per
    class folder), their unit text embeddings for a text model ``[answers, dim]``, and each class folder's answer
    (-1: none; None without class folders)."""
    if model.text is None:
        names, unit_prompts = list(model.labels or []), None
    else:
        names = list(prompts) if prompts else [f"a {name}" for name in images.classes or []]
        if not names:
            raise VitExplorerError("a model that reads text needs prompts to answer with: give --prompts, or a folder "
                                   "with one sub-folder per class")
        unit_prompts = model.text.embed(names).double()
    folder_names = [f"a {name}" if unit_prompts is not None else name for name in images.classes or []]
    return names, unit_prompts, ([names.index(name) if name in names else -1 for name in folder_names]
                                 if images.classes else None)


def batch_record(model: LoadedModel, pixels: torch.Tensor, unit_prompts: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """One batch's per-image values ``[b, ...]``: each statistic, each head's share of the answer, the answer, and for a
    text model each head's output vector and the rest of the embedding."""
    parts = embedding_parts(model, pixels, embedding_readout if unit_prompts is not None else score_readout)
    by_layer = [head_statistics(attention, model.layout) for attention in parts.maps]  # each {name: [b, heads]}
    record = {f"statistic {name}": torch.stack([values[name] for values in by_layer], dim=1).double().cpu()
              for name in HEAD_STATISTICS}
    if unit_prompts is None:
        record["contributions"] = parts.heads[..., 0].cpu()
        record["answers"] = parts.targets.cpu() if parts.targets is not None else torch.full((pixels.shape[0],), -1)
        return record
    chosen = (torch.nn.functional.normalize(parts.embedding, dim=-1) @ unit_prompts.T).argmax(dim=1)  # [b]
    length = parts.embedding.norm(dim=-1)[:, None, None]
    record["contributions"] = (model.text.logit_scale * (parts.heads @ unit_prompts[chosen][:, None, :, None])[..., 0]
                               / length).cpu()
    record.update(answers=chosen.cpu(), vectors=parts.heads.float().cpu(), rest=parts.rest.cpu())
    return record


def shard_record(model: LoadedModel, images: ImageList, indices: range, unit_prompts: torch.Tensor | None,
                 class_of_folder: list[int] | None, batch_size: int, fit: str, step: Callable[[], None] | None) -> dict:
    """The per-image values of the images ``indices`` of ``images``, in order, batch by batch (``batch_record``), with
    their paths, folder labels and the files that could not be read."""
    batches, paths, skipped, labels = [], [], [], []
    loader = DataLoader(Subset(ImageDataset(images, model.preprocess, fit), list(indices)), batch_size=batch_size)
    for numbers, pixels, folder_labels, errors in loader:
        good = torch.tensor([error == "" for error in errors])
        skipped += [{"path": str(images.paths[int(number)]), "reason": error}
                    for number, error in zip(numbers, errors, strict=True) if error]
        if good.any():
            batches.append(batch_record(model, pixels[good].to(model.device), unit_prompts))
            paths += [str(images.paths[int(number)]) for number in numbers[good]]
            labels += [class_of_folder[int(label)] if class_of_folder is not None and label >= 0 else -1
                       for label in folder_labels[good]]
        if step is not None:
            step()
    record = {key: torch.cat([batch[key] for batch in batches]) for key in (batches[0] if batches else {})}
    return {**record, "labels": torch.tensor(labels, dtype=torch.long), "paths": paths, "skipped": skipped}


def collect(model: LoadedModel, images: ImageList, *, prompts: Sequence[str] | None = None, batch_size: int = 16,
            fit: str = "stretch", shard_folder: Path | None = None, shard_size: int = SHARD_SIZE, resume: bool = False,
            step: Callable[[], None] | None = None) -> Atlas:
    """Stream ``images`` through ``model`` in batches and keep what the atlas needs per image (module doc). For a model
    with a text tower, ``prompts`` (default: "a CLASS" for each class folder) are what its answer is chosen among; a
    model without one answers with its top class (or, a backbone, its own embedding). ``step`` after each batch.

    The images go in shards of ``shard_size``, under torchrun shared out over the processes (each process's share in
    turn, gathered in shard order: the same atlas, number for number, as one process makes); with ``shard_folder``
    each finished shard is saved there, and with ``resume`` a saved shard is loaded instead of computed again."""
    names, unit_prompts, class_of_folder = answers_of(model, images, prompts)
    rank, world = dataset.process_rank()
    count = len(images.paths)
    manifest = {"model": model.name, "images": count, "shard_size": shard_size, "answers": names,
                "first": str(images.paths[0]) if count else "", "last": str(images.paths[-1]) if count else ""}
    if shard_folder is not None:
        dataset.check_manifest(shard_folder / "atlas-manifest.json", manifest, resume, rank)
    mine = {}
    for shard in range(rank, math.ceil(count / shard_size), world):
        path = None if shard_folder is None else shard_folder / f"atlas-{shard:06d}.pt"
        if resume and path is not None and path.is_file():
            mine[shard] = torch.load(path, weights_only=False)
            continue
        indices = range(shard * shard_size, min(count, (shard + 1) * shard_size))
        mine[shard] = shard_record(model, images, indices, unit_prompts, class_of_folder, batch_size, fit, step)
        if path is not None:
            torch.save(mine[shard], path)
    shards = [record for _, record in sorted(dataset.gather_in_rank_order(list(mine.items())), key=lambda pair: pair[0])]
    return assembled(model, names, unit_prompts, shards)


def assembled(model: LoadedModel, names: list[str], unit_prompts: torch.Tensor | None, shards: list[dict]) -> Atlas:
    """The atlas of the shards' per-image values, in shard order."""
    filled = [shard for shard in shards if shard["paths"]]
    skipped = [entry for shard in shards for entry in shard["skipped"]]
    if not filled:
        raise VitExplorerError("no image of the folder could be read: " + "; ".join(entry["reason"] for entry in skipped[:3]))

    def joined(key: str) -> torch.Tensor:
        return torch.cat([shard[key] for shard in filled])

    atlas = Atlas(model=model.name, paths=[path for shard in filled for path in shard["paths"]], answer_names=names,
                  statistics={name: joined(f"statistic {name}") for name in HEAD_STATISTICS},
                  contributions=joined("contributions"), answers=joined("answers"), labels=joined("labels"), skipped=skipped)
    if unit_prompts is not None:
        atlas.vectors, atlas.rest = joined("vectors"), joined("rest")
        atlas.prompts, atlas.scale = unit_prompts, float(model.text.logit_scale)
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
            data = atlas.vectors[:, layer, head].float()  # [images, dim]
            # text_span's interface is the authors' (numpy arrays), so that it reads line by line against theirs
            rebuilt, chosen = text_span(data.numpy(), features, list(bank), min(texts_per_head, len(bank)), rank)
            reconstruction = torch.from_numpy(rebuilt)
            row.append(chosen)
            total = float((data - data.mean(dim=0, keepdim=True)).pow(2).sum())
            explained[layer, head] = 1.0 - float((data - reconstruction).pow(2).sum()) / total if total > 0 else 0.0
            if layer >= layers - late:
                replaced[:, layer, head] = reconstruction.double()
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
