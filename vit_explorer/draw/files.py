"""Files a user takes away: ``attention.npz`` with the raw maps, PNGs of the views."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import struct
import tempfile
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit_explorer.core.analysis import Analysis
from vit_explorer.core.curves import FaithfulnessCurves, SanityCurves
from vit_explorer.core.decomposition import Decomposition
from vit_explorer.core.head_atlas import Atlas
from vit_explorer.core.interventions import HeadAblation
from vit_explorer.core.maps import CLASS_METHODS, HeadsView
from vit_explorer.core.request import Run
from vit_explorer.core.statistics import HEAD_STATISTICS, STATISTIC_UNITS
from vit_explorer.core.token_norms import TokenNorms
from vit_explorer.draw import charts, pictures
from vit_explorer.draw.report import atlas_html, report_html
from vit_explorer.errors import VitExplorerError


def save_png(picture: np.ndarray, path: str) -> None:
    """A picture ``[H, W, 3]`` uint8 as a PNG file."""
    Image.fromarray(picture).save(path)


# Stored, not deflated (zlib level 0), rows unfiltered. The pictures go to a browser on this machine, so time is what
# counts, not size; our maps over photos barely compress (timings: docs/figures.md, "Encoding the pictures").
SCREEN_COMPRESSION = 0


def png_bytes(picture: np.ndarray, level: int = SCREEN_COMPRESSION) -> bytes:
    """A picture ``[H, W, 3]`` uint8 as the bytes of a PNG file: 8-bit RGB, every row unfiltered, deflated at ``level``."""
    height, width, channels = picture.shape
    if channels != 3 or picture.dtype != np.uint8:
        raise ValueError(f"a picture is [H, W, 3] uint8, not {list(picture.shape)} {picture.dtype}")
    rows = np.zeros((height, 1 + width * 3), dtype=np.uint8)  # each row: filter type 0, then its pixels
    rows[:, 1:] = picture.reshape(height, -1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8 bits, RGB, deflate, adaptive filtering, no interlace
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows.tobytes(), level))
            + chunk(b"IEND", b""))


def screen_png(picture: np.ndarray, folder: str) -> str:
    """A picture ``[H, W, 3]`` uint8 shown on screen, as a PNG file under ``folder`` named by its content
    (``folder/<digest>/image.png``, written once, its time renewed each time it is asked for again): the path. Encoded
    for speed (``png_bytes``)."""
    array = np.ascontiguousarray(picture)
    digest = hashlib.blake2b(array.tobytes(), digest_size=16)
    digest.update(repr(array.shape).encode())
    path = Path(folder) / digest.hexdigest() / "image.png"
    try:
        os.utime(path)  # shown again: a cache that ages files by their change time keeps it as long as a new one
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{os.getpid()}-{threading.get_ident()}.png")  # renamed into place: never seen half written
        staging.write_bytes(png_bytes(array))
        os.replace(staging, path)
    return str(path)


def numpy_of(values: torch.Tensor) -> np.ndarray:
    """A CPU tensor of an analysis as the numpy array a file stores."""
    return values.detach().numpy()


def write_npz(analysis: Analysis, path: Path, full_maps: bool = False) -> int:
    """Raw maps, and return the bytes written.

    Always: the compact form (``MapStore.compact_form``): ``head_mean`` [layers, n, n], ``prefix_rows``
    [layers, heads, prefix, n], ``patch_mean_rows`` [layers, heads, n] (float16) and ``statistic_*`` [layers, heads];
    with ``full_maps``, also ``attentions`` [layers, heads, n, n], every head's full map as analysed (float32, or
    float16 above the memory budget); beside them ``grid``, ``num_prefix_tokens``, ``prefix_names``, ``image``,
    ``logits``, ``probs``, ``weights`` ("trained" or "random"), ``ood_score`` and ``ood_threshold`` for a model
    calibrated for out-of-distribution inputs, ``labels`` when the model has them, and ``token_norms`` [layers, n]
    (each token's norm after each layer) when the analysis has them.

    Not compressed: attention maps barely compress, and deflating hundreds of MB was most of a large run's time.
    """
    if full_maps and not analysis.store.full_bytes:
        raise VitExplorerError("this analysis kept its maps compactly (they were above the memory budget), so there is no "
                               "full stack to write; raise the memory budget (--memory-budget-mb) or leave out --full-maps")
    compact = analysis.store.compact_form()
    arrays = {
        "grid": np.array(analysis.grid),
        "num_prefix_tokens": np.array(analysis.num_prefix_tokens),
        "prefix_names": np.array(analysis.layout.prefix_names, dtype=str),
        "image": analysis.image,
        "logits": numpy_of(analysis.logits),
        "probs": numpy_of(analysis.probs),
        "model": np.array(analysis.model_name),
        "weights": np.array("random" if analysis.random_weights else "trained"),
        **{key: numpy_of(value) for key, value in compact.items() if isinstance(value, torch.Tensor)},
        **{f"statistic_{name.replace(' ', '_')}": numpy_of(value) for name, value in compact["statistics"].items()},
    }
    if analysis.ood is not None:
        arrays.update(ood_score=np.array(analysis.ood.score), ood_threshold=np.array(analysis.ood.threshold))
    if full_maps:
        arrays["attentions"] = numpy_of(analysis.store.full_maps())
    if analysis.labels is not None:
        arrays["labels"] = np.array(analysis.labels, dtype=str)
    if analysis.token_norms is not None:
        arrays["token_norms"] = numpy_of(analysis.token_norms)
    np.savez(path, **arrays)
    return path.stat().st_size


def npz_note(analysis: Analysis, written_bytes: int, full_maps: bool) -> str:
    """What ``attention.npz`` holds and its size, and what the other choice would have added."""
    if full_maps:
        return f"attention.npz: {megabytes(written_bytes)}, every head's full map and the compact form"
    if not analysis.store.full_bytes:
        return f"attention.npz: {megabytes(written_bytes)}, the compact form (the full maps were above the memory budget)"
    return (f"attention.npz: {megabytes(written_bytes)}, the compact form (head means, prefix rows, statistics); every head's "
            f"full map would add {megabytes(analysis.store.full_bytes)}")


def megabytes(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


def write_views(analysis: Analysis, rollout: torch.Tensor, heads: HeadsView, out_dir: Path, *, cmap: str = "inferno",
                shared: bool = False, scale: str = "linear", full_maps: bool = False) -> tuple[list[Path], str]:
    """``rollout.png`` (the query's ``rollout`` ``[grid_h, grid_w]``), ``heads.png`` (the layers × heads grid of ``heads``,
    whose query is the rollout's) and ``attention.npz`` (``write_npz``) in ``out_dir``; returns the paths and ``npz_note``'s
    words on the npz. ``scale`` is the colour scale (``render.COLOUR_SCALES``)."""
    written = [out_dir / "rollout.png", out_dir / "heads.png", out_dir / "attention.npz"]
    save_png(pictures.map_picture(analysis, rollout, cmap=cmap, overlay=True, query=heads.query, unit=pictures.ROLLOUT,
                                  scale=scale), str(written[0]))
    save_png(pictures.grid_picture(analysis, heads, cmap=cmap, overlay=True, shared=shared, scale=scale)[0], str(written[1]))
    return written, npz_note(analysis, write_npz(analysis, written[2], full_maps), full_maps)


def write_faithfulness(analysis: Analysis, curves: FaithfulnessCurves, method: str, out_dir: Path, **settings) -> list[Path]:
    """``faithfulness.json`` (AUCs, curves, target, ``settings``) and ``faithfulness.png`` (the curves) in ``out_dir``."""
    record = {"model": analysis.model_name, "method": method, "target_label": analysis.label(curves.target), **settings,
              **curves.as_dict()}
    written = [out_dir / "faithfulness.json", out_dir / "faithfulness.png"]
    written[0].write_text(json.dumps(record, indent=2) + "\n")
    title = f"{CLASS_METHODS[method]} · target {analysis.label(curves.target)}"
    save_png(charts.faithfulness_chart(curves, title), str(written[1]))
    return written


def write_sanity(curves: SanityCurves, out_dir: Path) -> list[Path]:
    """``sanity.json`` (``SanityCurves.as_dict``) and ``sanity.png`` (the chart) in ``out_dir``."""
    written = [out_dir / "sanity.json", out_dir / "sanity.png"]
    written[0].write_text(curves.to_json())
    save_png(charts.sanity_chart(curves), str(written[1]))
    return written


def write_norms(analysis: Analysis, result: TokenNorms, out_dir: Path, cmap: str = "inferno") -> list[Path]:
    """``norms.json`` (``TokenNorms.as_dict``), ``norms.png`` (the layers × tokens norm map), ``norms_chart.png``
    (norms and attention shares per layer) and ``norm_outliers.png`` (the outliers on the image, in the layer
    with the most of them) in ``out_dir``."""
    written = [out_dir / "norms.json", out_dir / "norms.png", out_dir / "norms_chart.png", out_dir / "norm_outliers.png"]
    written[0].write_text(result.to_json(), encoding="utf-8")
    save_png(pictures.norm_map_picture(result, cmap), str(written[1]))
    save_png(charts.token_norm_chart(result), str(written[2]))
    save_png(pictures.outlier_picture(analysis, result, result.peak_layer, cmap), str(written[3]))
    return written


def write_ablation(analysis: Analysis, ablation: HeadAblation, importance: torch.Tensor, out_dir: Path) -> list[Path]:
    """``ablation.json`` (``HeadAblation.as_dict`` with the Spearman correlation of |Δ probability| with the gradient
    ``importance`` ``[layers, heads]``) and ``ablation.png`` (the layers × heads heat map) in ``out_dir``."""
    record = {"model": analysis.model_name, "target_label": analysis.label(ablation.target), **ablation.as_dict(importance)}
    written = [out_dir / "ablation.json", out_dir / "ablation.png"]
    written[0].write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    save_png(pictures.ablation_picture(ablation)[0], str(written[1]))
    return written


def write_decomposition(analysis: Analysis, decomposition: Decomposition, out_dir: Path) -> list[Path]:
    """``decomposition.json`` (``Decomposition.as_dict``), ``contributions.png`` (each head's direct contribution, layers ×
    heads), ``contributions_chart.png`` (the largest parts, the rest and the score) and ``lens.png`` (the logit lens) in
    ``out_dir``."""
    written = [out_dir / name for name in ("decomposition.json", "contributions.png", "contributions_chart.png", "lens.png")]
    record = {"model": analysis.model_name, **decomposition.as_dict(analysis.labels)}
    written[0].write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    save_png(pictures.contribution_picture(decomposition)[0], str(written[1]))
    save_png(charts.contributions_chart(decomposition), str(written[2]))
    save_png(charts.lens_chart(decomposition, analysis.labels), str(written[3]))
    return written


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A temporary folder beside ``out`` to write into. When the block ends without an error, its files move into ``out``
    one by one (an atomic rename each), so a failure leaves no partial output and no reader sees half a file; the
    folder goes either way."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".vit-explorer-", dir=out.parent))
    try:
        yield staging
        out.mkdir(exist_ok=True)
        for path in sorted(staging.iterdir()):
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_analysis(run: Run, out: Path, *, cmap: str = "inferno", scale: str = "linear", html: bool = False,
                   settings: dict | None = None, atlas: dict | None = None) -> tuple[list[Path], str]:
    """Every file of one ``analyze`` run, in ``out`` (``staged``): the run's overview and ``attention.npz`` (``write_views``,
    every head's full map in it with ``Request.full_maps``); the map asked for unless it is the rollout; and the results
    that ran: faithfulness (with ``settings``, e.g. image, steps, random orders, baseline), sanity, ``scoreboard.json``,
    norms, ablation (beside its target's gradient importance), the decomposition and, with ``html``, the report of them
    all. Returns the paths in ``out``, in that order, and ``npz_note``'s words."""
    analysis, method, overview = run.analysis, run.request.method, run.overview
    if overview is None:
        raise VitExplorerError("this run has no overview to write: ask for it (Request(overview=True))")
    with staged(out) as staging:
        written, note = write_views(analysis, overview.rollout, overview.heads, staging, cmap=cmap, scale=scale,
                                    full_maps=run.request.full_maps)
        if method != "rollout":
            written.append(staging / f"{method}.png")
            save_png(pictures.run_map_picture(run, method, cmap, scale), str(written[-1]))
        if run.curves is not None:
            written += write_faithfulness(analysis, run.curves, method, staging, **(settings or {}))
        if run.sanity is not None:
            written += write_sanity(run.sanity, staging)
        if run.scoreboard is not None:
            written.append(staging / "scoreboard.json")
            written[-1].write_text(json.dumps(run.scoreboard.as_dict(), indent=2, default=float) + "\n")
        if run.norms is not None:
            written += write_norms(analysis, run.norms, staging, cmap=cmap)
        if run.ablation is not None:
            written += write_ablation(analysis, run.ablation, run.ablation_importance, staging)
        if run.decomposition is not None:
            written += write_decomposition(analysis, run.decomposition, staging)
        if html:
            written.append(write_report(run, staging, cmap, atlas))
    return [out / path.name for path in written], note


def write_dataset_outputs(out: Path, rows: list[dict], summary: dict) -> list[Path]:
    """``heads.csv`` (``rows``), ``summary.json`` (``summary``; both from ``dataset.dataset_tables``) and one chart per
    statistic, in ``out`` (``staged``)."""
    names = ["heads.csv", "summary.json"] + [f"{name.replace(' ', '_')}.png" for name in HEAD_STATISTICS]
    with staged(out) as staging:
        with open(staging / names[0], "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["group"], extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        (staging / names[1]).write_text(json.dumps(summary, indent=2))
        for name, file_name in zip(HEAD_STATISTICS, names[2:], strict=True):
            mean = np.asarray(summary["statistics"][name]["mean"])
            std = [row["std"] for row in rows if row["group"] == "all" and row["statistic"] == name]
            chart = charts.dataset_statistic_chart(mean, np.asarray(std).reshape(mean.shape), name, STATISTIC_UNITS[name],
                                                   summary["analysed"])
            save_png(chart, str(staging / file_name))
    return sorted(out / name for name in names)


def atlas_record(atlas: Atlas) -> dict:
    """``atlas.json``'s content: the model, the images, the completeness figures, and one entry per head in layer-major
    order (its descriptions, mean |contribution|, top-5 share, sign, the answers it pushes up, its top images and its
    attention statistics' mean and spread)."""
    layers, heads = atlas.shape
    mean_abs, top_share, positive, top_images = (atlas.mean_abs(), atlas.top_share(), atlas.positive_share(),
                                                 atlas.top_images())
    pushes = atlas.pushes_up()
    entries = []
    for layer in range(layers):
        for head in range(heads):
            entries.append({
                "layer": layer, "head": head, "texts": None if atlas.texts is None else atlas.texts[layer][head],
                "variance_explained": None if atlas.explained is None else float(atlas.explained[layer, head]),
                "mean_abs_contribution": float(mean_abs[layer, head]), "top_share": float(top_share[layer, head]),
                "positive_share": float(positive[layer, head]),
                "pushes_up": [{"answer": name, "mean_contribution": value} for name, value in pushes[layer][head]],
                "top_images": [atlas.paths[int(index)] for index in top_images[layer, head]],
                "statistics": {name: {"mean": float(values[:, layer, head].mean()), "std": float(values[:, layer, head].std())}
                               for name, values in atlas.statistics.items()}})
    return {"model": atlas.model, "spec": atlas.spec, "images": len(atlas.paths), "layers": layers, "heads_per_layer": heads,
            "answers": atlas.answer_names, "completeness": atlas.completeness, "skipped": atlas.skipped, "heads": entries}


def write_atlas(atlas: Atlas, out: Path) -> list[Path]:
    """``atlas.json`` (``atlas_record``), ``atlas.html`` (``report.atlas_html``) and ``heads.npz`` (the per-image
    arrays: each statistic and the contributions ``[images, layers, heads]``, the answers and labels ``[images]``, and for
    a text model the head vectors ``[images, layers, heads, dim]``), in ``out`` (``staged``)."""
    arrays = {f"statistic_{name.replace(' ', '_')}": values.float().numpy() for name, values in atlas.statistics.items()}
    arrays.update(contributions=atlas.contributions.float().numpy(), answers=atlas.answers.numpy(),
                  labels=atlas.labels.numpy(), paths=np.array(atlas.paths))
    if atlas.vectors is not None:
        arrays["vectors"] = atlas.vectors.numpy()
    record = atlas_record(atlas)
    with staged(out) as staging:
        (staging / "atlas.json").write_text(json.dumps(record, indent=2, ensure_ascii=False))
        np.savez_compressed(staging / "heads.npz", **arrays)
        (staging / "atlas.html").write_text(atlas_html(record), encoding="utf-8")
    return [out / "atlas.json", out / "heads.npz", out / "atlas.html"]


def read_atlas(folder: str | Path) -> dict:
    """The ``atlas.json`` record ``vit-explorer atlas`` wrote into ``folder`` (``atlas_record``)."""
    path = Path(folder).expanduser() / "atlas.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise VitExplorerError(f"no atlas in {folder}: {error}; write one with vit-explorer atlas FOLDER --out DIR") from None
    if not {"model", "layers", "heads_per_layer", "heads"} <= set(record) or \
            len(record["heads"]) != record["layers"] * record["heads_per_layer"]:
        raise VitExplorerError(f"{path} is not an atlas written by vit-explorer atlas")
    return record


def write_evaluation(report: dict, out: Path) -> Path:
    """``evaluation.json`` in ``out`` (made if needed), written beside and moved in place, so that no reader sees half of it."""
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "evaluation.json.partial"
    partial.write_text(json.dumps(report, indent=2, default=float))
    return partial.replace(out / "evaluation.json")


def write_report(run: Run, out_dir: Path, cmap: str = "inferno", atlas: dict | None = None) -> Path:
    """``report.html`` in ``out_dir`` (``report.report_html``, with the head ``atlas`` where one is given): one
    self-contained page."""
    path = out_dir / "report.html"
    path.write_text(report_html(run, cmap, atlas), encoding="utf-8")
    return path
