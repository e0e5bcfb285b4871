"""``vit-explorer train-default``: train the embedded shapes ViT on the generator, reproducibly and resumably.

Two things make the domain-randomised task fit 2 CPU cores:
- windows: most steps see a 128-px window of a 256-px image that holds the object (an 8×8 grid, 65
  tokens, about ten times cheaper per image than 257), at the pixel scale of the final model, with the
  8×8 block of the 16×16 position embedding where the window lies; the last stage sees whole images;
- a locality-biased start: 2-D sine-cosine position embeddings, so that near patches start similar, and
  mimetic attention weights (Trockman & Kolter 2023: W_q·W_kᵀ ≈ αZ + βI, W_v·W_o ≈ αZ − βI), so that
  each head starts out attending to similar, hence nearby, patches as trained ViTs do.
Everything stays trainable. A checkpoint is written every ``CHECKPOINT_EVERY`` steps beside the
output; ``--resume`` continues from it.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from vit_explorer.core.images import to_pixels
from vit_explorer.methods.evaluation import FaithfulnessFigures, GroundTruthFigures, evaluate_on_shapes, faithfulness_on_shapes
from vit_explorer.models.base import LoadedModel, Preprocess
from vit_explorer.models.checkpoint import CONFIG_KEY
from vit_explorer.models.vit import ViT
from vit_explorer.shapes.generator import CLASSES, IMAGE_SIZE, MAX_SIZE, MIN_SIZE, generate, generate_set, write_examples

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
PREPROCESS = Preprocess(input_hw=(IMAGE_SIZE, IMAGE_SIZE), mean=MEAN, std=STD)
HELDOUT_SEED = 1_000_003  # never used for training: the held-out set of the README figures and tests
CHECKPOINT_EVERY = 250
PATCH_LOSS_WEIGHT = 0.5
# most patches are background: weigh them less, so that the object's few patches drive the dense loss
PATCH_CLASS_WEIGHTS = torch.tensor([0.2] + [1.0] * len(CLASSES))
KNOWN = "six synthetic shapes (" + ", ".join(CLASSES) + "), one per image"
CHUNK = 500  # images per generator seed, so that the pool is the same however many processes draw it


@dataclass(frozen=True)
class Stage:
    """One part of the schedule: the window side it trains on (``IMAGE_SIZE``: whole images), its steps,
    batch, peak learning rate and pool sizes.

    With an easy pool, the stage starts on easy images (``shapes.generate(easy=True)``: filled shapes at
    high contrast on plain backgrounds) and hands over to the full generator linearly, the last easy
    image at ``easy_until`` of its steps: a ViT from scratch on 2 cores stays at chance for a long time
    if it meets every randomisation at once."""

    name: str
    window: int
    steps: int
    batch_size: int
    lr: float
    pool_size: int
    easy_pool_size: int = 0
    easy_until: float = 0.0  # share of the steps by which every image comes from the full generator
    stop: int | None = None  # end the stage here, before its schedule ends (None: at ``steps``)

    @property
    def last_step(self) -> int:
        return self.steps if self.stop is None else min(self.stop, self.steps)


def default_stages(scale: float = 1.0) -> tuple[Stage, ...]:
    """The documented schedule; ``scale`` shortens every stage (for tests and trials)."""
    return (
        Stage("windows", IMAGE_SIZE // 2, max(1, int(17000 * scale)), 64, 1e-3, max(CHUNK, int(56_000 * scale)),
              easy_pool_size=max(CHUNK, int(8_000 * scale)), easy_until=0.35),
        Stage("whole", IMAGE_SIZE, max(1, int(2000 * scale)), 32, 3e-4, max(CHUNK, int(16_000 * scale))),
    )


def to_batch(images: np.ndarray) -> torch.Tensor:
    """``[b, H, W, 3]`` uint8 → normalised ``[b, 3, H, W]``, with the same pixels as ``images.to_pixels``."""
    return torch.cat([to_pixels(image, PREPROCESS) for image in images])


@dataclass(frozen=True)
class Pool:
    """Generated training windows ``[b, H, W, 3]`` uint8, labels ``[b]``, each patch's object class
    ``[b, rows, cols]`` (0 background, 1 + label on the object) and where each window lies in the whole
    image's patch grid, its top-left patch ``[b, 2]`` (row, column)."""

    images: np.ndarray
    labels: np.ndarray
    patch_classes: np.ndarray
    offsets: np.ndarray


def _window_offset(rng: np.random.Generator, bbox: tuple[int, int, int, int], window: int) -> tuple[int, int]:
    """A patch-aligned top-left corner (row, column) in pixels for a ``window`` that holds ``bbox`` where it can."""
    patch = SHAPES_VIT["patch_size"]
    corner = []
    for low, high in ((bbox[1], bbox[3]), (bbox[0], bbox[2])):
        first = max(0, -(-(high - window) // patch))  # the lowest aligned start that still reaches ``high``
        last = max(first, min(low, IMAGE_SIZE - window) // patch)
        corner.append(int(rng.integers(first, last + 1)) * patch)
    return corner[0], corner[1]


def _draw_chunk(job: tuple[int, int, int, bool]) -> Pool:
    seed, count, window, easy = job
    rng = np.random.default_rng(seed)
    patch = SHAPES_VIT["patch_size"]
    images, labels, patch_classes, offsets = [], [], [], []
    for _ in range(count):
        sample = generate(rng, IMAGE_SIZE, MIN_SIZE, MAX_SIZE, easy=easy)
        top, left = _window_offset(rng, sample.bbox, window) if window < IMAGE_SIZE else (0, 0)
        mask = sample.mask[top : top + window, left : left + window]
        rows = window // patch
        covered = mask.reshape(rows, patch, rows, patch).mean(axis=(1, 3))
        # a patch counts as the object's when a quarter of it is covered
        patch_classes.append(np.where(covered >= 0.25, sample.label + 1, 0))
        images.append(sample.image[top : top + window, left : left + window])
        labels.append(sample.label)
        offsets.append((top // patch, left // patch))
    return Pool(np.stack(images), np.array(labels), np.stack(patch_classes).astype(np.int64), np.array(offsets, dtype=np.int64))


def draw_pool(seed: int, count: int, window: int, processes: int = 2, easy: bool = False) -> Pool:
    """``count`` generated ``window``-px windows of whole images (the same for the same seed, however many processes)."""
    jobs = [(seed * 1_000_000 + start // CHUNK, min(CHUNK, count - start), window, easy) for start in range(0, count, CHUNK)]
    with multiprocessing.get_context("spawn").Pool(processes) as workers:
        parts = workers.map(_draw_chunk, jobs)
    return Pool(*(np.concatenate([getattr(part, name) for part in parts])
                  for name in ("images", "labels", "patch_classes", "offsets")))


def augment(images: torch.Tensor, patch_classes: torch.Tensor, offsets: torch.Tensor,
            rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random flip/quarter-turn and channel order per batch, and per image a random polarity: each
    shape class is closed under all three, and (with mean 0.5 in ``PREPROCESS``) inverting an image is
    negating its normalised pixels. The patch classes ``[b, rows, cols]`` turn with the images, and each
    window's offset ``[b, 2]`` moves to where the turn of the whole image takes it."""
    grid, rows = IMAGE_SIZE // SHAPES_VIT["patch_size"], patch_classes.shape[1]
    turns, flip = int(rng.integers(4)), rng.random() < 0.5
    images, patch_classes = torch.rot90(images, turns, dims=(2, 3)), torch.rot90(patch_classes, turns, dims=(1, 2))
    for _ in range(turns):  # torch.rot90 takes the patch at (r, c) of a grid×grid image to (grid - 1 - c, r)
        offsets = torch.stack([grid - rows - offsets[:, 1], offsets[:, 0]], dim=1)
    if flip:
        images, patch_classes = images.flip(3), patch_classes.flip(2)
        offsets = torch.stack([offsets[:, 0], grid - rows - offsets[:, 1]], dim=1)
    images = images[:, torch.from_numpy(rng.permutation(3))]
    signs = torch.from_numpy(np.where(rng.random(len(images)) < 0.5, -1.0, 1.0).astype(np.float32))
    return images * signs.view(-1, 1, 1, 1), patch_classes, offsets


def tokens_and_logits(model: ViT, images: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The seed ViT's forward on windows ``[b, 3, h, w]`` whose top-left patches sit at ``offsets`` ``[b, 2]`` of
    the model's grid, also returning the final patch tokens ``[b, patches, dim]``. On whole images (offsets 0)
    it is ``model.forward``."""
    rows, cols = images.shape[2] // model.patch_size[0], images.shape[3] // model.patch_size[1]
    grid_cols = model.grid_size[1]
    window = torch.arange(rows).view(rows, 1) * grid_cols + torch.arange(cols).view(1, cols)  # [rows, cols]
    index = (offsets[:, :1] * grid_cols + offsets[:, 1:]).view(-1, 1, 1) + window  # [b, rows, cols]
    position = model.pos_embedding[1:][index.flatten(1)]  # [b, patches, dim]
    x = model.to_patch_embedding(images) + position
    x = torch.cat((model.cls_token.expand(len(images), -1, -1) + model.pos_embedding[:1], x), dim=1)
    x = model.transformer(model.dropout(x))
    return x[:, 1:], model.mlp_head(x[:, 0])


def sincos_positions(rows: int, cols: int, dim: int) -> torch.Tensor:
    """2-D sine-cosine position embedding ``[rows * cols, dim]`` (half the channels for rows, half for columns)."""
    quarter = dim // 4
    frequencies = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float32) / quarter)
    ys, xs = torch.meshgrid(torch.arange(rows, dtype=torch.float32), torch.arange(cols, dtype=torch.float32), indexing="ij")
    parts = [fn(coordinate.flatten()[:, None] * frequencies) for coordinate in (ys, xs) for fn in (torch.sin, torch.cos)]
    return torch.cat(parts, dim=1)


def _factor(target: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``left [d, rank]`` and ``right [rank, d]`` whose product is the best rank-``rank`` approximation of ``target``."""
    u, s, vh = torch.linalg.svd(target)
    root = s[:rank].sqrt()
    return u[:, :rank] * root, root[:, None] * vh[:rank]


def locality_init(model: ViT, generator: torch.Generator, alpha_qk: float = 0.7, beta_qk: float = 0.7,
                  alpha_vo: float = 0.4, beta_vo: float = 0.4) -> None:
    """Sine-cosine patch positions and mimetic attention weights (Trockman & Kolter 2023), in place."""
    with torch.no_grad():
        dim = model.pos_embedding.shape[1]
        model.pos_embedding[1:] = sincos_positions(*model.grid_size, dim)
        model.pos_embedding[:1].normal_(0, 0.02, generator=generator)
        identity = torch.eye(dim)
        for attention, _ in model.transformer.layers:
            inner, heads = attention.to_qkv.out_features // 3, attention.heads
            dim_head = inner // heads
            w_q, w_k, w_v = attention.to_qkv.weight.view(3, heads, dim_head, dim).unbind(0)  # each [heads, dim_head, dim]
            w_out = attention.to_out[0].weight.view(dim, heads, dim_head)
            for head in range(heads):
                z_qk = torch.randn(dim, dim, generator=generator) / dim**0.5
                left, right = _factor(alpha_qk * z_qk + beta_qk * identity, dim_head)  # q·k = x (W_qᵀ W_k) xᵀ
                w_q[head], w_k[head] = left.T, right
                z_vo = torch.randn(dim, dim, generator=generator) / dim**0.5
                left, right = _factor((alpha_vo * z_vo - beta_vo * identity).T, dim_head)  # token → W_o W_v token
                w_out[:, head], w_v[head] = left, right


def logits_of(model: ViT, images: np.ndarray, batch_size: int = 100) -> torch.Tensor:
    """The logits ``[b, classes]`` of ``model`` (in eval mode) on uint8 ``images`` ``[b, H, W, 3]``."""
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        logits = torch.cat([model(to_batch(images[start : start + batch_size])) for start in range(0, len(images), batch_size)])
    model.train(was_training)
    return logits


def _schedule(stage: Stage) -> Callable[[int], float]:
    warmup = max(1, stage.steps // 20)
    return lambda step: min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, stage.steps) / stage.steps))


def train_default(out: Path, seed: int = 0, scale: float = 1.0, resume: bool = False) -> dict:
    """Train the shapes ViT and write ``out`` (safetensors with its config, labels and out-of-distribution
    calibration embedded). Returns the figures written beside the weights."""
    torch.manual_seed(seed)
    stages = default_stages(scale)
    state_path = out.with_suffix(".training.pt")
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    model = ViT(**SHAPES_VIT)
    locality_init(model, torch.Generator().manual_seed(seed))
    # trained beside the ViT and not shipped: the ViT itself stays the seed architecture
    patch_head = torch.nn.Linear(SHAPES_VIT["dim"], len(CLASSES) + 1)
    stage_index, step, elapsed_before, rng_state = 0, 0, 0.0, None
    saved = None
    if resume and state_path.is_file():
        saved = torch.load(state_path, map_location="cpu", weights_only=False)
        stage_index, step, elapsed_before, rng_state = saved["stage"], saved["step"], saved["elapsed_s"], saved["rng"]
        model.load_state_dict(saved["model"])
        patch_head.load_state_dict(saved["patch_head"])
        torch.set_rng_state(saved["torch_rng"])
        print(f"resuming at stage {stages[stage_index].name}, step {step}", file=sys.stderr)
    figures: dict = {"seed": seed, "stages": [stage.__dict__ for stage in stages]}
    for index in range(stage_index, len(stages)):
        stage = stages[index]
        if saved is not None and index == stage_index and step >= stage.last_step:
            saved = None  # resumed at the end of a finished stage
            continue
        print(f"{stage.name}: drawing {stage.pool_size} {stage.window}-px windows…", file=sys.stderr)
        pool = draw_pool(seed * 10 + index, stage.pool_size, stage.window)
        easy = draw_pool(seed * 10 + 5 + index, stage.easy_pool_size, stage.window, easy=True) if stage.easy_pool_size else None
        optimizer = torch.optim.AdamW([*model.parameters(), *patch_head.parameters()], lr=stage.lr, weight_decay=0.05)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(stage))
        rng = np.random.default_rng([seed, index])
        if saved is not None and index == stage_index:
            optimizer.load_state_dict(saved["optimizer"])
            schedule.load_state_dict(saved["schedule"])
            rng.bit_generator.state = rng_state
        else:
            step = 0
        model.train()
        progress = tqdm(range(step, stage.last_step), desc=stage.name, file=sys.stderr, dynamic_ncols=True, initial=step,
                        total=stage.last_step)
        running_loss, running_acc = None, None
        for step in progress:
            images, patch_classes, offsets, target = draw_batch(stage, pool, easy, step, rng)
            batch, patch_target, offsets = augment(to_batch(images), patch_classes, offsets, rng)
            tokens, logits = tokens_and_logits(model, batch, offsets)
            loss = torch.nn.functional.cross_entropy(logits, target, label_smoothing=0.1)
            # dense supervision: each final patch token names the class of the object it covers (or none)
            loss = loss + PATCH_LOSS_WEIGHT * torch.nn.functional.cross_entropy(patch_head(tokens).flatten(0, 1),
                                                                                patch_target.flatten(),
                                                                                weight=PATCH_CLASS_WEIGHTS)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([*model.parameters(), *patch_head.parameters()], 1.0)
            optimizer.step()
            schedule.step()
            batch_acc = float((logits.argmax(-1) == target).float().mean())
            running_loss = loss.item() if running_loss is None else 0.98 * running_loss + 0.02 * loss.item()
            running_acc = batch_acc if running_acc is None else 0.98 * running_acc + 0.02 * batch_acc
            progress.set_postfix(loss=f"{running_loss:.3f}", acc=f"{running_acc:.3f}")
            if (step + 1) % CHECKPOINT_EVERY == 0 or step + 1 == stage.last_step:
                _save_state(state_path, model, patch_head, optimizer, schedule, index, step + 1, rng,
                            elapsed_before + time.perf_counter() - started)
        saved = None
        figures[f"{stage.name}_train_accuracy_last"] = running_acc
        del pool, easy
    figures["train_minutes"] = round((elapsed_before + time.perf_counter() - started) / 60, 1)
    write_trained(model, out, figures)
    return figures


def draw_batch(stage: Stage, pool: Pool, easy: Pool | None, step: int,
               rng: np.random.Generator) -> tuple[np.ndarray, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One training batch of ``stage`` at ``step``: images, patch classes, window offsets and labels, drawn from ``pool``
    and, while the stage eases in, partly from the ``easy`` pool."""
    hard = stage.batch_size if easy is None else min(stage.batch_size,
                                                     round(stage.batch_size * step / (stage.easy_until * stage.steps)))
    picks = [(pool, rng.integers(0, len(pool.labels), hard))]
    if hard < stage.batch_size:
        picks.append((easy, rng.integers(0, len(easy.labels), stage.batch_size - hard)))
    images = np.concatenate([source.images[chosen] for source, chosen in picks])
    patch_classes, offsets, target = (
        torch.from_numpy(np.concatenate([getattr(source, name)[chosen] for source, chosen in picks]))
        for name in ("patch_classes", "offsets", "labels"))
    return images, patch_classes, offsets, target


def write_trained(model: ViT, out: Path, figures: dict) -> None:
    """The trained model's held-out accuracy and out-of-distribution calibration added to ``figures``, then ``out``
    written whole (or not at all) with them embedded, and the examples the model gets right beside it."""
    from vit_explorer.models.ood import calibrate

    model.eval()
    print("held-out accuracy and out-of-distribution calibration…", file=sys.stderr)
    heldout = draw_pool(HELDOUT_SEED, 1000, IMAGE_SIZE)
    heldout_logits = logits_of(model, heldout.images)
    figures["heldout_accuracy"] = float((heldout_logits.argmax(-1).numpy() == heldout.labels).mean())
    ood = calibrate(heldout_logits, KNOWN)
    print(f"held-out accuracy {figures['heldout_accuracy']:.3f} on 1000 images; {figures['train_minutes']} min", file=sys.stderr)
    config = {"vit": SHAPES_VIT, "labels": list(CLASSES), "mean": list(MEAN), "std": list(STD), "training": figures, "ood": ood}
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    partial = out.with_suffix(".partial")
    save_file(state, str(partial), metadata={CONFIG_KEY: json.dumps(config)})
    partial.replace(out)
    write_examples(out.parent / "examples", predict=classifier(model))


def classifier(model: ViT) -> Callable[[np.ndarray], str]:
    """One uint8 image ``[H, W, 3]`` → the class ``model`` predicts for it (how the examples are checked)."""
    return lambda image: CLASSES[int(logits_of(model, image[None]).argmax())]


def _save_state(path: Path, model: ViT, patch_head: torch.nn.Module, optimizer, schedule, stage: int, step: int,
                rng: np.random.Generator, elapsed_s: float) -> None:
    partial = path.with_suffix(".partial")
    torch.save({"model": model.state_dict(), "patch_head": patch_head.state_dict(), "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict(), "stage": stage,
                "step": step, "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(), "elapsed_s": elapsed_s},
               partial)
    partial.replace(path)


def heldout_figures(model: LoadedModel, count: int = 200) -> GroundTruthFigures:
    """Accuracy, pointing and energy on the first ``count`` images of the fixed held-out set (never trained on)."""
    return evaluate_on_shapes(model, generate_set(HELDOUT_SEED, count))


def heldout_faithfulness(model: LoadedModel, count: int = 40, **options) -> FaithfulnessFigures:
    """Deletion / insertion figures on the first ``count`` images of the fixed held-out set."""
    return faithfulness_on_shapes(model, generate_set(HELDOUT_SEED, count), **options)
