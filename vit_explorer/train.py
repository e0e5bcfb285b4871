"""``vit-explorer train-default``: train the embedded shapes ViT on the generator, reproducibly."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from .models.checkpoint import CONFIG_KEY
from .shapes import CLASSES, IMAGE_SIZE, generate_set, write_examples
from .vit import ViT

SHAPES_VIT = {
    "image_size": IMAGE_SIZE,
    "patch_size": 16,
    "num_classes": len(CLASSES),
    "dim": 96,
    "depth": 6,
    "heads": 4,
    "dim_head": 24,
    "mlp_dim": 192,
}
MEAN = (0.5, 0.5, 0.5)
STD = (0.25, 0.25, 0.25)
CURRICULUM = 0.2
LARGE_OBJECT_PX = 48
HELDOUT_SEED = 1_000_003  # never used for training: the held-out set of the README figures and tests


def to_batch(images: np.ndarray) -> torch.Tensor:
    """``[b, H, W, 3]`` uint8 → normalised ``[b, 3, H, W]``."""
    pixels = torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255.0)
    return (pixels - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


def dihedral(images: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """One random flip/quarter-turn per batch: every shape class is closed under them."""
    images = torch.rot90(images, int(rng.integers(4)), dims=(2, 3))
    return images.flip(3) if rng.random() < 0.5 else images


def accuracy(model: ViT, images: np.ndarray, labels: np.ndarray, batch_size: int = 100) -> float:
    model.eval()
    correct = 0
    with torch.inference_mode():
        for start in range(0, len(images), batch_size):
            logits = model(to_batch(images[start : start + batch_size]))
            correct += int((logits.argmax(-1).numpy() == labels[start : start + batch_size]).sum())
    model.train()
    return correct / len(images)


def train_default(out: Path, seed: int = 0, steps: int = 3000, batch_size: int = 32, pool_size: int = 8000, lr: float = 1e-3) -> dict:
    """Train the shapes ViT and write ``out`` (safetensors with its config and labels embedded).

    Training images come from a pool of ``pool_size`` generated images (seed ``seed``), each batch
    seen under a random flip or quarter-turn. For the first ``CURRICULUM`` share of the steps only
    the larger objects are drawn: at first the class token attends almost uniformly, so a shape
    of one or two patches is a 1/256 share of what it sees, too faint a signal to start learning from.
    Returns the figures written beside the weights.
    """
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    print(f"generating {pool_size} training and 500 held-out images…", file=sys.stderr)
    pool = generate_set(seed, pool_size)
    pool_images = np.stack([sample.image for sample in pool])
    pool_labels = np.array([sample.label for sample in pool])
    large = np.array([i for i, sample in enumerate(pool) if sample.bbox[2] - sample.bbox[0] >= LARGE_OBJECT_PX])
    heldout = generate_set(HELDOUT_SEED, 500)
    heldout_images = np.stack([sample.image for sample in heldout])
    heldout_labels = np.array([sample.label for sample in heldout])

    model = ViT(**SHAPES_VIT)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))
    )
    model.train()
    progress = tqdm(range(steps), desc="train-default", file=sys.stderr, dynamic_ncols=True)
    running_loss, running_acc = None, None
    for step in progress:
        index = large[rng.integers(0, len(large), batch_size)] if step < CURRICULUM * steps else rng.integers(0, pool_size, batch_size)
        images = dihedral(to_batch(pool_images[index]), rng)
        labels = torch.from_numpy(pool_labels[index])
        logits = model(images)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        batch_acc = float((logits.argmax(-1) == labels).float().mean())
        loss_value = loss.item()
        running_loss = loss_value if running_loss is None else 0.95 * running_loss + 0.05 * loss_value
        running_acc = batch_acc if running_acc is None else 0.95 * running_acc + 0.05 * batch_acc
        progress.set_postfix(loss=f"{running_loss:.3f}", acc=f"{running_acc:.3f}")
    model.eval()
    figures = {
        "seed": seed,
        "steps": steps,
        "batch_size": batch_size,
        "pool_size": pool_size,
        "train_accuracy_last": running_acc,
        "heldout_accuracy": accuracy(model, heldout_images, heldout_labels),
    }
    print(f"held-out accuracy {figures['heldout_accuracy']:.3f} on 500 images", file=sys.stderr)
    config = {"vit": SHAPES_VIT, "labels": list(CLASSES), "mean": list(MEAN), "std": list(STD), "training": figures}
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, str(out), metadata={CONFIG_KEY: json.dumps(config)})
    write_examples(out.parent / "examples")
    return figures
