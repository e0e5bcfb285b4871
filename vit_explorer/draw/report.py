"""Self-contained HTML: a notebook's rich display of an analysis or an explanation, and the report of an ``analyze``
run. Every picture is embedded as a PNG data URI and the style is inline: nothing is fetched from anywhere, so a
file opens anywhere, offline, and can be mailed to a colleague as it is."""

from __future__ import annotations

import base64
import html
import io
import math
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
from PIL import Image

from vit_explorer.core.analysis import Analysis, Prediction
from vit_explorer.core.decomposition import Decomposition
from vit_explorer.core.maps import CLASS_METHODS, Overview
from vit_explorer.core.ranking import Scoreboard
from vit_explorer.core.request import Run
from vit_explorer.draw import charts, pictures
from vit_explorer.draw.words import RANDOM_WEIGHTS, completeness
from vit_explorer.errors import VitExplorerError

STYLE = """body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;color:#282828;max-width:1100px;margin:24px auto;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555;font-size:14px;margin:2px 0}.row{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
figure{margin:0}figcaption{font-size:14px;color:#444;max-width:520px;margin-top:4px}img{max-width:100%;height:auto}
.note{background:#fff6e0;border-left:4px solid #e0a000;padding:6px 10px;font-size:14px;max-width:900px}
table{border-collapse:collapse;font-size:14px}td,th{padding:2px 10px;text-align:left;border-bottom:1px solid #eee}"""


def png_data_uri(picture: np.ndarray) -> str:
    """An RGB picture ``[H, W, 3]`` uint8 as a ``data:image/png;base64,…`` URI."""
    buffer = io.BytesIO()
    Image.fromarray(picture).save(buffer, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def figure(picture: np.ndarray, caption: str) -> str:
    caption = html.escape(caption)
    return f'<figure><img src="{png_data_uri(picture)}" alt="{caption}"><figcaption>{caption}</figcaption></figure>'


def tool_version() -> str:
    try:
        return version("vit-explorer")
    except PackageNotFoundError:
        return "unknown (not installed)"


def top_five(analysis: Analysis) -> str:
    """The top-5 as a table, or a line saying a backbone has none."""
    if not analysis.num_classes:
        return "<p>Backbone: no classifier head, no predictions.</p>"
    if analysis.similarity:
        return (f"<p>{html.escape(analysis.label(0))}: <b>{float(analysis.logits[0]):.3f}</b> (a projection on a unit direction, "
                "not a probability)</p>")
    if analysis.prompted:  # a softmax over the prompts given
        return predictions_table(analysis.top_k(5), "prompt", f"probability among the {analysis.num_classes} prompts")
    return predictions_table(analysis.top_k(5))


def predictions_table(top: list[Prediction], kind: str = "class", measure: str = "probability") -> str:
    rows = "".join(f"<tr><td>{html.escape(p.label)}</td><td>{p.prob:.1%}</td></tr>" for p in top)
    return f"<table><tr><th>{kind}</th><th>{measure}</th></tr>{rows}</table>"


def provenance(analysis: Analysis) -> str:
    """The model's spec (a file, a hub name or ``@random``), whether its weights are random, what loading it said, and
    what it knows where its calibration says so."""
    lines = [f'<p class="meta">Model: <b>{html.escape(analysis.model_name)}</b>'
             + (f" · <b>{html.escape(RANDOM_WEIGHTS)}</b>" if analysis.random_weights else "")
             + f" · {analysis.map_shape[0]} layers × {analysis.map_shape[1]} heads · grid {analysis.grid[0]}×{analysis.grid[1]}"
             f" · vit_explorer {html.escape(tool_version())}</p>"]
    notes = (analysis.view_note, *analysis.model_notes, *analysis.prompt_notes)
    lines += [f'<p class="meta">{html.escape(note)}</p>' for note in notes if note]
    if analysis.ood is not None and analysis.ood.flagged:
        lines.append(f'<p class="note">{html.escape(analysis.ood.notice(analysis.model_name))}</p>')
    elif analysis.ood is not None and analysis.ood.known and analysis.num_classes:
        lines.append(f'<p class="note">{html.escape(analysis.ood.domain(analysis.model_name))}</p>')
    return "".join(lines)


def page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


def explanation_html(analysis: Analysis, grid_map, method: str, target: str | None, probability: float | None,
                     cmap: str = "inferno", strength: float | None = None, conserved: float | None = None) -> str:
    """The rich display of one explanation: the image, its map overlaid with a colour bar, the method, the target and
    the top-5 predictions (a fragment, as Jupyter embeds it)."""
    title = f"{CLASS_METHODS[method]}" + (f" · target {target}" + (f" ({probability:.1%})" if probability is not None else "")
                                         if target is not None else "")
    map_view = pictures.method_picture(analysis, grid_map, method, cmap, strength=strength, conserved=conserved)
    return (f'<div><h3 style="margin:4px 0">{html.escape(title)}</h3>{provenance(analysis)}<div class="row">'
            f"{figure(pictures.image_picture(analysis, None), 'the image as the model saw it')}"
            f"{figure(map_view, CLASS_METHODS[method])}<div>{top_five(analysis)}</div></div></div>")


def overview_html(analysis: Analysis, overview: Overview, cmap: str = "inferno") -> str:
    """The image, and its ``overview``'s rollout and last-layer attention, in a row."""
    rollout = pictures.map_picture(analysis, overview.rollout, cmap=cmap, overlay=True, query=None, unit=pictures.ROLLOUT)
    last = pictures.map_picture(analysis, overview.last_layer, cmap=cmap, overlay=True, query=None, unit=pictures.ATTENTION)
    return (f'<div class="row">{figure(pictures.image_picture(analysis, None), "the image as the model saw it")}'
            f"{figure(rollout, 'attention rollout of the class token')}{figure(last, 'last layer, mean over heads')}</div>")


def report_html(run: Run, cmap: str = "inferno", atlas: dict | None = None) -> str:
    """The whole report of one image: provenance at the top, then the overview, the layers × heads grid, the class maps
    (the scored one with its deletion and insertion curves), and the scoreboard, sanity check, token norms, head ablation
    and decomposition where they ran, and a head atlas of the model where one is given (``files.read_atlas``). Every
    result carries its own target, and each section is named by it."""
    analysis, evidence, overview = run.analysis, run.evidence, run.overview
    if overview is None:
        raise VitExplorerError("this run has no overview to report: ask for it (Request(overview=True))")
    sections = [f"<h1>vit_explorer report: {html.escape(analysis.model_name)}</h1>{provenance(analysis)}"]
    if analysis.num_classes:
        heading = "Target score" if analysis.similarity else "Zero-shot prediction" if analysis.prompted else "Predictions"
        sections.append(f"<h2>{heading}</h2>{top_five(analysis)}")
    sections.append(f"<h2>Overview</h2>{overview_html(analysis, overview, cmap)}")
    grid, _ = pictures.grid_picture(analysis, overview.heads, cmap=cmap)
    grid_words = "where the class token looks in every layer (rows) and head (columns), each tile on its own scale"
    sections.append(f"<h2>Layers × heads</h2>{figure(grid, grid_words)}")
    target = "" if evidence is None else f" for {analysis.label(evidence.target)}"
    maps = "".join(figure(pictures.run_map_picture(run, method, cmap), CLASS_METHODS[method]) for method in run.maps)
    sections.append(f"<h2>Class maps{html.escape(target)}</h2><div class=\"row\">{maps}</div>")
    if run.curves is not None:
        curves, scored_method = run.curves, run.request.method
        aucs, (first, second) = curves.aucs, curves.curve_names
        for_target = f" for {analysis.label(curves.target)}"  # the curves' own target, whatever the maps above explain
        words = (f"{CLASS_METHODS[scored_method]}{for_target} {curves.verdict}: {first} AUC {aucs['deletion']:.3f} against "
                 f"{aucs['random_deletion']:.3f} for random orders (lower is better), {second} AUC {aucs['insertion']:.3f} "
                 f"against {aucs['random_insertion']:.3f} (higher is better)" + (f". Warning: {curves.warning}" if curves.warning
                                                                         else ""))
        chart = charts.faithfulness_chart(curves, f"{CLASS_METHODS[scored_method]}{for_target}")
        sections.append(f"<h2>Faithfulness{html.escape(for_target)}</h2>{figure(chart, words)}")
    if run.scoreboard is not None:
        sections.append(scoreboard_section(run.scoreboard))
    if run.sanity is not None:
        checked = "" if run.sanity.target_label is None else f" for {run.sanity.target_label}"
        chart = figure(charts.sanity_chart(run.sanity), run.sanity.summary())
        sections.append(f"<h2>Sanity check{html.escape(checked)}</h2>{chart}")
    if run.norms is not None:
        norm_map = figure(pictures.norm_map_picture(run.norms, cmap), run.norms.summary())
        norm_chart = figure(charts.token_norm_chart(run.norms), "norms and the attention they draw, per layer")
        sections.append(f'<h2>Token norms</h2><div class="row">{norm_map}{norm_chart}</div>')
    if run.ablation is not None:
        ablation = run.ablation
        layer, head, drop = ablation.ranked(1)[0]
        label = analysis.label(ablation.target)
        if ablation.single_score:  # a similarity score: its own units, never a probability
            effect = f"by {drop:.3f} ({ablation.original_logit:.3f} → {ablation.original_logit - drop:.3f})"
        else:
            before = ablation.original_probability
            effect = f"by {100 * drop:.1f} percentage points ({before:.1%} → {before - drop:.1%})"
        words = (f"change of the {ablation.measure} of {label} when each head alone is removed ({ablation.mode}); removing "
                 f"L{layer} h{head} lowers it most, {effect}")
        sections.append(f"<h2>Head ablation for {html.escape(label)}</h2>{figure(pictures.ablation_picture(ablation)[0], words)}")
    if run.decomposition is not None:
        sections.append(decomposition_section(run.decomposition, analysis.labels))
    if atlas is not None:
        sections.append(atlas_section(atlas))
    return page(f"vit_explorer: {analysis.model_name}", "".join(sections))


ATLAS_ROWS = 12  # heads listed in an atlas's table, those that write most into the answers first


def atlas_section(record: dict) -> str:
    """A head atlas (``files.atlas_record``): the layers × heads grid named by each head's first description, and the
    heads that write most into the answers in a table with their descriptions, figures and top images."""
    done = record.get("completeness")
    words = (f"{record['model']} over {record['images']} images: each head's mean |direct contribution| to the images' "
             "answers (colour) and its first description or the answer it pushes up most")
    if done:
        words += f"; completeness: {completeness(done)}"
    strongest = sorted(record["heads"], key=lambda entry: -entry["mean_abs_contribution"])[:ATLAS_ROWS]
    rows = "".join(
        f"<tr><td>L{entry['layer']} h{entry['head']}</td><td>{entry['mean_abs_contribution']:.3g}</td>"
        f"<td>{entry['top_share']:.0%}</td>"
        f"<td>{html.escape('; '.join(entry['texts'] or []) or ', '.join(push['answer'] for push in entry['pushes_up']))}</td>"
        f"<td>{html.escape(', '.join(Path(path).name for path in entry['top_images']))}</td></tr>" for entry in strongest)
    described = "descriptions (TextSpan)" if any(entry["texts"] for entry in record["heads"]) else "answers it pushes up"
    return (f"<h2>Head atlas: {html.escape(record['model'])}</h2>{figure(pictures.atlas_picture(record)[0], words)}"
            f"<table><tr><th>head</th><th>mean |share|</th><th>top-5 share</th><th>{described}</th><th>top images</th></tr>"
            f"{rows}</table><p>The descriptions are the text bank's nearest directions to what a head writes directly, not "
            "what it means (docs/atlas.md).</p>")


def atlas_html(record: dict) -> str:
    """``atlas.html``: the atlas on a page of its own, self-contained."""
    return page(f"vit_explorer atlas: {record['model']}", atlas_section(record))


def decomposition_section(decomposition: Decomposition, labels: list[str] | None) -> str:
    """The score split over every head (the layers × heads picture), each layer's MLP and the rest (the chart), the largest
    parts in a table, and the logit lens."""
    parts = "".join(f"<tr><td>{html.escape(name)}</td><td>{value:+.4g}</td></tr>" for name, value in decomposition.top_parts(8))
    words = (f"the score of {decomposition.label} ({decomposition.score:.4g}, before any softmax) split into the direct "
             "contribution of every head (red adds to it, blue takes from it), every MLP, the embeddings and the biases; the "
             f"parts add up to {decomposition.total:.6g}")
    return (f"<h2>Decomposition of {html.escape(decomposition.label)}</h2><div class=\"row\">"
            f"{figure(pictures.contribution_picture(decomposition)[0], words)}"
            + figure(charts.contributions_chart(decomposition),
                     "the largest heads and MLPs, then the embeddings, the biases and every other part together")
            + f"<div><table><tr><th>largest parts</th><th>contribution</th></tr>{parts}</table></div>"
            + figure(charts.lens_chart(decomposition, labels), "logit lens: the score read from the stream after every layer")
            + "</div>")


def scoreboard_section(board: Scoreboard) -> str:
    """The scoreboard as a table: rank (a dash where it is not ranked), method, score, distance from chance, the two
    AUCs in the protocol's words, the randomised model's ρ; then chance and every note."""
    first, second = board.curve_names
    rows = "".join(
        f"<tr><td>{'—' if board.unranked else rank}</td><td>{html.escape(CLASS_METHODS[entry.method])}</td>"
        f"<td>{entry.score:.3f}</td>"
        f"<td>{'—' if math.isnan(entry.over_chance) else f'{entry.over_chance:+.1f} sd'}</td><td>{entry.deletion:.3f}</td>"
        f"<td>{entry.insertion:.3f}</td><td>{entry.randomised_rho:.2f}{'' if entry.depends_on_weights else ' ⚠'}</td></tr>"
        for rank, entry in enumerate(board.entries, start=1))
    score = f"{second} AUC − {first} AUC" + (", halved" if board.protocol.imputes else "")
    notes = [f"Not ranked: {board.unranked}."] if board.unranked else []
    notes += [f"{note}." for note in board.notes]
    notes.append(f"Curves of the {board.measure} over {board.steps} steps (coarser than one map's score, so its AUCs differ a "
                 f"little); chance (random orders) scores {board.chance_mean:.3f} ± {board.chance_sd:.3f}. ⚠: the map barely "
                 f"changes when the whole model is randomised (ρ ≥ 0.5).")
    return (f"<h2>Scoreboard for {html.escape(board.target_label)}</h2>"
            f"<table><tr><th>rank</th><th>method</th><th>score ({html.escape(score)})</th><th>vs chance</th><th>{first} AUC</th>"
            f"<th>{second} AUC</th><th>randomised ρ</th></tr>{rows}</table>"
            + "".join(f'<p class="meta">{html.escape(note)}</p>' for note in notes))
