"""A run in words for a terminal: what ``vit-explorer analyze`` says on stderr (how the image met the model, warnings,
the prediction) and prints on stdout (the score, the scoreboard, the sanity check, the norms, the ablation, the
decomposition), from the run's values alone; and what ``vit-explorer evaluate`` prints of its report."""

from __future__ import annotations

import math

from vit_explorer.core.analysis import Analysis
from vit_explorer.core.curves import PROBABILITY, Protocol
from vit_explorer.core.head_atlas import TOP_HEADS, Atlas
from vit_explorer.core.maps import CLASS_SPECIFIC
from vit_explorer.core.ranking import Scoreboard
from vit_explorer.core.request import Run
from vit_explorer.draw.words import RANDOM_WEIGHTS, completeness


def run_lines(run: Run) -> tuple[list[str], list[str]]:
    """The run's notes (for stderr: ``analysis_notes``, then what its results warn of) and its result lines (for
    stdout: ``result_lines``)."""
    analysis, notes = run.analysis, analysis_notes(run.analysis)
    if analysis.prompted and run.evidence is not None and run.evidence.target != analysis.top_k(1)[0].index:
        notes.append(f"explained: the prompt {analysis.label(run.evidence.target)!r}, marked with * (not the best match)")
    if run.curves is not None and run.curves.warning:
        notes.append(f"vit-explorer: warning: the {run.request.method} map's score {run.curves.verdict}: {run.curves.warning}")
    if analysis.num_classes == 0:
        prompts = ", --target text:PROMPT a prompt" if analysis.reads_text else ""
        notes.append("no classifier head, so the map was not scored: a class-specific --method, --target patch:ROW,COL or "
                     f"--target image:PATH scores a similarity instead{prompts}")
    return notes, result_lines(run)


def analysis_notes(analysis: Analysis) -> list[str]:
    """What is said about an analysis before its results: how the image met the model, random weights, the domain, the
    prediction."""
    lines = [analysis.view_note] if analysis.view_note else []
    if analysis.random_weights:
        lines.append(f"{analysis.model_name}: {RANDOM_WEIGHTS}")
    if analysis.ood is not None and analysis.ood.flagged:
        lines.append(f"vit-explorer: warning: {analysis.ood.notice(analysis.model_name)}")
    if analysis.similarity:
        score = float(analysis.logits[0])
        lines.append(f"{analysis.label(0)}: {score:.3f} (a projection on a unit direction, not a probability)")
    elif analysis.num_classes:
        top = analysis.top_k(1)[0]
        if analysis.prompted:
            lines.append(f"best-matching prompt: {top.label} ({top.prob:.1%} among {analysis.num_classes} prompts; its logit "
                         f"{float(analysis.logits[top.index]):.3f})")
        else:
            lines.append(f"top prediction: {top.label} ({top.prob:.1%})")
        if analysis.ood is not None and analysis.ood.known and not analysis.ood.flagged:  # the warning above says it already
            lines.append(analysis.ood.domain(analysis.model_name))
    return lines


def result_lines(run: Run) -> list[str]:
    """The results of a run, a line each: the score, the scoreboard, the sanity check, the norms, the ablation, the
    decomposition."""
    analysis, lines = run.analysis, []
    curves = run.curves
    if curves is not None:
        aucs, (first, second) = curves.aucs, curves.curve_names
        measure = "" if curves.measure == PROBABILITY else f" (curves of the {curves.measure})"
        # a class-agnostic map (rollout, cls) is the same for every target: only its score is measured against one
        named = ("map for" if run.request.method in CLASS_SPECIFIC else "map (the same for every target) scored for")
        lines.append(f"{run.request.method} {named} {analysis.label(curves.target)!r}{measure}: {first} AUC "
                     f"{aucs['deletion']:.3f} (random {aucs['random_deletion']:.3f}, lower is better), {second} AUC "
                     f"{aucs['insertion']:.3f} (random {aucs['random_insertion']:.3f}, higher is better): {curves.verdict}")
    if run.scoreboard is not None:
        lines += scoreboard_lines(run.scoreboard)
    if run.sanity is not None:
        lines.append(run.sanity.summary())
    if run.norms is not None:
        lines.append(run.norms.summary())
    ablation = run.ablation
    if ablation is not None:
        layer, head, drop = ablation.ranked(1)[0]
        before = ablation.original_logit if ablation.single_score else ablation.original_probability
        shown = "{:.3f}" if ablation.single_score else "{:.1%}"
        lines.append(f"head ablation ({ablation.mode}): removing L{layer} h{head} lowers the {ablation.measure} of "
                     f"{analysis.label(ablation.target)!r} most, {shown.format(before)} → {shown.format(before - drop)}")
    decomposition = run.decomposition
    if decomposition is not None:
        parts = ", ".join(f"{name} {value:+.3g}" for name, value in decomposition.top_parts(3))
        lines.append(f"decomposition of {decomposition.label!r} ({decomposition.score:.3g}): largest direct contributions "
                     f"{parts}; the parts add up to {decomposition.total:.6g}")
    return lines


def scoreboard_lines(board: Scoreboard) -> list[str]:
    """The scoreboard, a line each: one per method, best first (or in method order, with why, where it is not ranked),
    then chance and the notes."""
    first, second = board.curve_names
    order = "NOT RANKED" if board.unranked else "best first"
    lines = [f"scoreboard for {board.target_label!r} (curves of the {board.measure}), {order} (score: {second} AUC − {first} AUC"
             + (", halved" if board.protocol.imputes else "") + "; randomised ρ ≥ 0.5: the map barely depends on the weights):"]
    if board.unranked:
        lines.append(f"not ranked: {board.unranked}")
    for rank, entry in enumerate(board.entries, start=1):
        badge = "" if entry.depends_on_weights else "  [does not depend on the weights]"
        chance = "" if math.isnan(entry.over_chance) else f" ({entry.over_chance:+.1f} sd from chance)"
        lines.append(f"{'·' if board.unranked else f'{rank}.'} {entry.method}: score {entry.score:.3f}{chance}, {first} "
                     f"{entry.deletion:.3f}, {second} {entry.insertion:.3f}, randomised ρ {entry.randomised_rho:.2f}{badge}")
    lines.append(f"chance (random orders): score {board.chance_mean:.3f} ± {board.chance_sd:.3f}")
    lines += [f"note: {note}" for note in board.notes]
    return lines


def evaluation_lines(report: dict) -> tuple[list[str], list[str]]:
    """What ``vit-explorer evaluate`` says of its report (``run.evaluate``): notes for stderr (how to read the columns,
    what was skipped) and, for stdout, the model and its weights, then a table of every method's mean score with its
    95% interval."""
    said = (f"{RANDOM_WEIGHTS} (every figure below is a control, not a finding)" if report["weights"] == "random"
            else f"{report['weights']} weights")
    scores = report["scores"]
    table = [f"{report['model']}: {said}, {report['images']} images", "method | " + " | ".join(scores),
             " | ".join(["---"] * (len(scores) + 1))]
    for row in report["table"]:
        cells = ["—" if row[score] is None else f"{row[score]['mean']:.3f} [{row[score]['ci95'][0]:.3f}, "
                                                f"{row[score]['ci95'][1]:.3f}]"
                 for score in scores]
        table.append(f"{row['method']} | " + " | ".join(cells))
    notes = []
    if Protocol(report["baseline"]).imputes:
        notes.append("with --baseline road, the deletion columns are ROAD's MoRF curve (most relevant patches imputed first) "
                     "and the insertion columns its LeRF curve (least relevant first); ROAD's combined score is "
                     "(LeRF − MoRF) / 2")
    notes.append("deletion and perturbation: lower is better; insertion, pointing, energy, class_pointing: higher is better; "
                 "*_relative: the AUC over the unperturbed image's probability of the target (1: as sure as on the whole "
                 "image)" + (f"; skipped {len(report['skipped'])} unreadable files" if report["skipped"] else ""))
    return notes, table


def atlas_lines(atlas: Atlas) -> list[str]:
    """What ``vit-explorer atlas`` prints: the images and the completeness figures, then the heads that write most into
    the answers, a line each, with their descriptions (a text model) or the answers they push up."""
    layers, heads = atlas.shape
    lines = [f"{atlas.model}: {len(atlas.paths)} images, {layers} layers × {heads} heads"
             + (f", {len(atlas.skipped)} unreadable files skipped" if atlas.skipped else "")]
    if atlas.completeness is not None:
        lines.append(f"completeness: {completeness(atlas.completeness)}")
    mean_abs, share, pushes = atlas.mean_abs(), atlas.top_share(), atlas.pushes_up()
    for index in mean_abs.flatten().argsort(descending=True)[:10].tolist():
        layer, head = divmod(index, heads)
        said = ("; ".join(atlas.texts[layer][head][:3]) if atlas.texts is not None
                else ", ".join(name for name, _ in pushes[layer][head]) or "no answer raised")
        lines.append(f"L{layer} h{head}: mean |share| {float(mean_abs[layer, head]):.3g}, among the top {TOP_HEADS} heads on "
                     f"{float(share[layer, head]):.0%} of the images: {said}")
    return lines
