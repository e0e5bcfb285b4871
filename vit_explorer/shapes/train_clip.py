"""``vit-explorer train-default --clip``: train the shipped shapes-CLIP, reproducibly and resumably.

The image tower is the shipped shapes ViT without its classifier head (it already finds the shapes); the text tower is
a small word-level transformer (``models.word_text``). Both are trained together on generated images, half with one
shape and half with two, each paired with one caption drawn from the captions true of it (``shapes.captions``). The
loss is SigLIP's (Zhai et al., 2023): a sigmoid on every image–caption pair of the batch, the label being whether the
caption is true of that image, computed from the caption's claim, so "a star" is not a negative for the other star
images of the batch. A checkpoint is written every ``CHECKPOINT_EVERY`` steps beside the output; ``resume`` continues.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from vit_explorer.models.builtin import ASSETS
from vit_explorer.models.checkpoint import CONFIG_KEY, DOMAIN_KEY, read_state_dict
from vit_explorer.models.vit import ViT
from vit_explorer.models.word_text import TEXT_KEY, WordTextEncoder, tokenize
from vit_explorer.shapes.captions import VOCABULARY, Caption, Thing, draw_caption
from vit_explorer.shapes.generator import CLASSES, generate, generate_pair
from vit_explorer.shapes.train import CHUNK, HELDOUT_SEED, MEAN, SHAPES_VIT, STD, to_batch

TEXT_CONFIG = {"length": 8, "dim": 64, "depth": 2, "heads": 4, "dim_head": 16, "mlp_dim": 128, "embed_dim": SHAPES_VIT["dim"]}
CHECKPOINT_EVERY = 100
STEPS, BATCH, POOL = 2000, 64, 16_000  # half the pool and of each batch one shape per image, half two
IMAGE_LR, TEXT_LR = 2e-4, 1e-3  # the image tower starts trained, the text tower from nothing
DOMAIN = ("trained on images of six synthetic shapes (" + ", ".join(CLASSES) + "), one or two per image, and captions "
          "about them: on a photo its matches mean nothing")


def zero_shot_prompt(label: int) -> str:
    """The prompt of class ``label`` in the zero-shot figures."""
    return f"a {CLASSES[label]}"


def _draw_chunk(job: tuple[int, int, int]) -> tuple[np.ndarray, list[tuple[Thing, ...]]]:
    seed, count, objects = job
    rng = np.random.default_rng(seed)
    images, things = [], []
    for _ in range(count):
        if objects == 1:
            sample = generate(rng)
            images.append(sample.image)
            things.append((Thing.from_mask(sample.label, sample.mask),))
        else:
            pair = generate_pair(rng)
            images.append(pair.image)
            things.append(tuple(Thing.from_mask(label, mask) for label, mask in zip(pair.labels, pair.masks, strict=True)))
    return np.stack(images), things


def draw_pool(seed: int, count: int, objects: int, processes: int = 2) -> tuple[np.ndarray, list[tuple[Thing, ...]]]:
    """``count`` generated images of ``objects`` shapes each and their objects (the same for the same seed)."""
    jobs = [(seed * 1_000_000 + start // CHUNK, min(CHUNK, count - start), objects) for start in range(0, count, CHUNK)]
    with multiprocessing.get_context("spawn").Pool(processes) as workers:
        parts = workers.map(_draw_chunk, jobs)
    return np.concatenate([images for images, _ in parts]), [thing for _, things in parts for thing in things]


def image_tower() -> ViT:
    """The shipped shapes ViT without its classifier head."""
    tensors, _ = read_state_dict(ASSETS / "shapes.safetensors")
    model = ViT(**{**SHAPES_VIT, "num_classes": 0})
    model.load_state_dict({key: value for key, value in tensors.items() if not key.startswith("mlp_head.")}, strict=True)
    return model


def similarity(image: ViT, text: WordTextEncoder, pixels: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Logits ``[images, captions]``: exp(scale) · cosine + bias, as the app scores prompts."""
    tokens = image.transformer(image.dropout(torch.cat([image.cls_token.expand(len(pixels), -1, -1),
                                                        image.to_patch_embedding(pixels)], dim=1) + image.pos_embedding))
    embeddings = torch.nn.functional.normalize(tokens[:, 0], dim=-1)
    texts = torch.nn.functional.normalize(text(ids), dim=-1)
    return text.logit_scale.exp() * embeddings @ texts.T + text.logit_bias


def augment(pixels: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """A channel order per batch and a polarity per image: neither changes a caption (no caption names a colour, and
    every side, size and shape survives an inversion)."""
    pixels = pixels[:, torch.from_numpy(rng.permutation(3))]
    signs = torch.from_numpy(np.where(rng.random(len(pixels)) < 0.5, -1.0, 1.0).astype(np.float32))
    return pixels * signs.view(-1, 1, 1, 1)


def truth(captions: list[Caption], things: list[tuple[Thing, ...]]) -> torch.Tensor:
    """``[images, captions]`` 1 where the caption is true of the image."""
    return torch.tensor([[float(caption.true_of(objects)) for caption in captions] for objects in things])


def zero_shot_accuracy(image: ViT, text: WordTextEncoder, images: np.ndarray, labels: np.ndarray) -> float:
    """The share of one-shape ``images`` whose best prompt among ``zero_shot_prompt`` of every class is their own."""
    image.eval()
    text.eval()
    ids = tokenize([zero_shot_prompt(label) for label in range(len(CLASSES))], VOCABULARY, TEXT_CONFIG["length"])
    with torch.inference_mode():
        predictions = torch.cat([similarity(image, text, to_batch(images[start : start + 100]), ids).argmax(-1)
                                 for start in range(0, len(images), 100)])
    image.train()
    text.train()
    return float((predictions.numpy() == labels).mean())


def train_clip(out: Path, seed: int = 0, scale: float = 1.0, resume: bool = False) -> dict:
    """Train the shapes-CLIP and write ``out`` (safetensors: the image tower's tensors, the text tower's under
    ``text.``, the config with the vocabulary). Returns the figures written into it."""
    torch.manual_seed(seed)
    steps, pool_size = max(1, int(STEPS * scale)), max(2 * CHUNK, int(POOL * scale))
    state_path = out.with_suffix(".training.pt")
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    image = image_tower()
    text = WordTextEncoder(vocab_size=len(VOCABULARY), **TEXT_CONFIG)
    optimizer = torch.optim.AdamW([{"params": image.parameters(), "lr": IMAGE_LR}, {"params": text.parameters(), "lr": TEXT_LR}],
                                  weight_decay=0.05)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps)))
    rng = np.random.default_rng([seed, 7])
    step, elapsed_before = 0, 0.0
    if resume and state_path.is_file():
        saved = torch.load(state_path, map_location="cpu", weights_only=False)
        image.load_state_dict(saved["image"])
        text.load_state_dict(saved["text"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        rng.bit_generator.state = saved["rng"]
        torch.set_rng_state(saved["torch_rng"])
        step, elapsed_before = saved["step"], saved["elapsed_s"]
        print(f"resuming at step {step}", file=sys.stderr)
    print(f"drawing {pool_size // 2} images of one shape and {pool_size // 2} of two…", file=sys.stderr)
    pools = [draw_pool(seed * 10 + 1, pool_size // 2, 1), draw_pool(seed * 10 + 2, pool_size // 2, 2)]
    image.train()
    text.train()
    progress = tqdm(range(step, steps), desc="shapes-clip", file=sys.stderr, dynamic_ncols=True, initial=step, total=steps)
    running = None
    for step in progress:
        images, things = [], []
        for pool_images, pool_things in pools:
            chosen = rng.integers(0, len(pool_things), BATCH // 2)
            images.append(pool_images[chosen])
            things += [pool_things[index] for index in chosen]
        captions = [draw_caption(objects, rng) for objects in things]
        pixels = augment(to_batch(np.concatenate(images)), rng)
        ids = tokenize([caption.text for caption in captions], VOCABULARY, TEXT_CONFIG["length"])
        logits = similarity(image, text, pixels, ids)
        labels = truth(captions, things)  # [images, captions]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum") / len(captions)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([*image.parameters(), *text.parameters()], 1.0)
        optimizer.step()
        schedule.step()
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        progress.set_postfix(loss=f"{running:.3f}", scale=f"{float(text.logit_scale.detach().exp()):.1f}")
        if (step + 1) % CHECKPOINT_EVERY == 0 or step + 1 == steps:
            partial = state_path.with_suffix(".partial")
            torch.save({"image": image.state_dict(), "text": text.state_dict(), "optimizer": optimizer.state_dict(),
                        "schedule": schedule.state_dict(), "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                        "step": step + 1, "elapsed_s": elapsed_before + time.perf_counter() - started}, partial)
            partial.replace(state_path)
    del pools
    print("held-out zero-shot accuracy…", file=sys.stderr)
    heldout_images, heldout_things = draw_pool(HELDOUT_SEED, 500, 1)
    labels = np.array([objects[0].label for objects in heldout_things])
    figures = {"seed": seed, "steps": steps, "batch": BATCH, "pool": pool_size, "loss_last": running,
               "heldout_zero_shot_accuracy": zero_shot_accuracy(image, text, heldout_images, labels),
               "train_minutes": round((elapsed_before + time.perf_counter() - started) / 60, 1)}
    print(f"held-out zero-shot accuracy {figures['heldout_zero_shot_accuracy']:.3f}; {figures['train_minutes']} min",
          file=sys.stderr)
    config = {"vit": {**SHAPES_VIT, "num_classes": 0}, TEXT_KEY: {**TEXT_CONFIG, "vocabulary": list(VOCABULARY)},
              "mean": list(MEAN), "std": list(STD), "training": figures, DOMAIN_KEY: DOMAIN}
    state = {name: tensor.contiguous() for name, tensor in image.state_dict().items()}
    state.update({f"{TEXT_KEY}.{name}": tensor.contiguous() for name, tensor in text.state_dict().items()})
    partial = out.with_suffix(".partial")
    save_file(state, str(partial), metadata={CONFIG_KEY: json.dumps(config)})
    partial.replace(out)
    return figures
