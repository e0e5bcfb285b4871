"""The words the app shows beside its pictures: the model summary, names of queries and heads, the choices of
its dropdowns, captions that say what a view shows and what is selected, the predictions, the top-heads
table and the faithfulness verdict. Plain text and numbers from ``maps``; no Gradio, so the CLI or a
notebook can reuse them."""

from __future__ import annotations

import html
import math

from vit_explorer.core import maps, token_norms
from vit_explorer.core.analysis import Analysis, Prediction
from vit_explorer.core.comparison import Comparison, Side, same_classes
from vit_explorer.core.curves import (
    DEFAULT_RANDOM_ORDERS,
    DEFAULT_STEPS,
    PROBABILITY,
    FaithfulnessCurves,
    SanityCurves,
    forward_passes,
)
from vit_explorer.core.decomposition import Decomposition
from vit_explorer.core.interventions import HeadAblation, Patching
from vit_explorer.core.query_key_embedding import JointEmbedding
from vit_explorer.core.ranking import Scoreboard
from vit_explorer.core.register_neurons import REGISTER, RegisterNeurons
from vit_explorer.core.statistics import DatasetStatistics
from vit_explorer.core.targets import shown_prompt
from vit_explorer.core.token_norms import TokenNorms
from vit_explorer.draw.pictures import signed
from vit_explorer.draw.words import RANDOM_WEIGHTS, ablation_cost, completeness, passes, sentence
from vit_explorer.web.session import Controls, Session

BACKBONE_NOTE = ("Backbone: no classifier head, so no predictions; attention, rollout and head statistics work, and the target "
                 "menu offers similarities for the class maps, their faithfulness score and the head ablation to explain.")
TEXT_NOTE = ("This model reads text, and the **Text prompts** box above is empty, so there is nothing to predict: type prompts, "
             "one per line, and press Explain to explain a sentence.")
NO_CLASSIFIER = ("This model has no classifier head, so it has no class to explain: the class-specific maps (relevance, AttnLRP, "
                 "LeGrad, gradient-weighted rollout) wait for a target. Choose one in the target menu above: the similarity of "
                 "the image's embedding to its own, or to the query patch's. Rollout and last-layer class attention show "
                 "meanwhile; scoring waits for the target too.")

# a dear classifier's upload shows the maps of its forward pass before its top class's evidence (``shared.analysis_answers``)
EVIDENCE_PENDING = ("The top class's gradients are being taken (one forward and backward pass): the class-specific maps, "
                    "their scores, the head ablation and the decomposition follow in a moment. Rollout and last-layer class "
                    "attention show meanwhile.")


def without_target(session: Session, backbone_text: str) -> str:
    """What a view that needs a target says before it has one: a classifier's is on its way; a backbone's
    (``backbone_text``) is to be chosen."""
    return EVIDENCE_PENDING if session.analysis.num_classes and not session.analysis.similarity else backbone_text


def model_summary(analysis: Analysis) -> str:
    """The lines above the views: the prediction, and what this image and these prompts did (a flagged image, random
    weights, a backbone, how the image was fitted, the words the prompts lost); then the model, its input and token
    layout and what loading it said, folded under one line, so that the tabs start high on the first screen."""
    layout = analysis.layout
    layers, heads = analysis.map_shape
    prefix = ", ".join(layout.prefix_names) or "none (rollout and grid use the mean over patch queries)"
    details = (
        f"input {layout.input_hw[0]}×{layout.input_hw[1]} px · {layout.num_tokens} tokens = {layout.grid_hw[0]}×"
        f"{layout.grid_hw[1]} patches of {layout.patch_hw[0]}×{layout.patch_hw[1]} px + prefix: {prefix} · held: "
        f"{analysis.nbytes / 2**20:.1f} MiB ({analysis.storage})"
    )
    lines = []
    if analysis.num_classes:  # on the first screen, whatever the height of the window; the top-5 is beside the tabs
        top = analysis.top_k(1)[0]
        # the notice of a flagged image (above) says it already
        stated = analysis.ood is not None and analysis.ood.known and not analysis.ood.flagged
        domain = f" · *{analysis.ood.domain(analysis.model_name)}*" if stated else ""
        if analysis.prompted:  # a softmax over the prompts given, not over everything the image could be
            among = (f"zero-shot among the {analysis.num_classes} prompts" if analysis.num_classes > 1
                     else "one prompt, so 100% whatever the image: give two or more to compare")
            lines.append(f"Best-matching prompt: **{shown_prompt(top.label)}** {top.prob:.1%} ({among})")
        else:
            lines.append(f"Prediction: **{top.label}** {top.prob:.1%}{domain}")
    if analysis.random_weights:
        lines.append(f"**{sentence(RANDOM_WEIGHTS)}**")
    if analysis.num_classes == 0:
        lines.append(BACKBONE_NOTE + (f" {TEXT_NOTE}" if analysis.reads_text else ""))
    lines += [note[0].upper() + note[1:] for note in (analysis.view_note, *analysis.prompt_notes) if note]
    # e.g. a resampled position embedding: the maps are not the model's own grid
    about = "<br>".join([details, *(note[0].upper() + note[1:] for note in analysis.model_notes)])
    lines.append(f"<details><summary><b>{html.escape(analysis.model_name)}</b> · {layers} layers × {heads} heads"
                 f"{f' · {len(analysis.model_notes)} notes' if analysis.model_notes else ''}</summary>{about}</details>")
    summary = "  \n".join(lines[:-1]) + "\n\n" + lines[-1]
    if analysis.ood is not None and analysis.ood.flagged:
        summary = f"> ⚠️ **Outside what this model knows.** {analysis.ood.notice(analysis.model_name)}\n\n{summary}"
    return summary


MEAN_HEADS = "mean of heads"
MEAN_PATCHES = "mean of patch queries"


def query_choices(analysis: Analysis, query: int | None = None) -> list[str]:
    """The query dropdown's entries: the prefix tokens, the mean of patch queries, and the clicked patch while it
    is the query (so the dropdown can show it rather than go blank)."""
    choices = [*analysis.layout.prefix_names, MEAN_PATCHES]
    if query is not None and query >= analysis.num_prefix_tokens:
        choices.append(maps.query_name(analysis, query))
    return choices


def query_label(session: Session) -> str:
    """The current query's name: a prefix token, "mean of patch queries" or "patch at row 9, col 4"."""
    return maps.query_name(session.analysis, session.query)


def head_choices(analysis: Analysis) -> list[str]:
    """The head dropdown's entries: the mean of heads, then h0, h1, …"""
    return [MEAN_HEADS] + [f"h{head}" for head in range(analysis.map_shape[1])]


def head_label(head: int | None) -> str:
    """A head as the grid's column labels name it, or the mean of heads for None."""
    return MEAN_HEADS if head is None else f"h{head}"


def predictions(top: list[Prediction]) -> dict[str, float]:
    """Predictions as the predictions label shows them."""
    return {prediction.label: prediction.prob for prediction in top}


def top_predictions(analysis: Analysis) -> dict[str, float]:
    """The five most probable classes and their probabilities, for the predictions label."""
    return predictions(analysis.top_k(5))


def target_choices(analysis: Analysis) -> list[tuple[str, int]]:
    """(shown, class index): the top five with their probabilities, then every class by index."""
    top = analysis.top_k(5)
    first = {prediction.index for prediction in top}
    return [(f"{p.label} ({p.prob:.1%})", p.index) for p in top] + [
        (analysis.label(index), index) for index in range(analysis.num_classes) if index not in first
    ]


def query_caption(session: Session) -> str:
    """The line under the query image: which token is the query."""
    is_patch = session.query is not None and session.analysis.layout.token_patch(session.query) is not None
    return f"Query: **{query_label(session)}**" + (" (outlined)" if is_patch else "")


def selection_name(session: Session) -> str:
    """The selected layer and head as the grid labels them: "layer 2, head h1", "layer 5, mean of heads"."""
    return f"layer {session.layer}, {head_label(session.head) if session.head is None else f'head h{session.head}'}"


def grid_caption(session: Session, controls: Controls) -> str:
    """What the grid shows, for which query, on which scale, and which tile (or row) is selected."""
    scale = "one scale for all tiles" if controls.normalisation == "shared" else "each tile on its own scale"
    ranking = controls.order_by
    order = "" if ranking == "none" else f", heads of each layer ordered by {ranking} ({maps.RANKINGS[ranking]})"
    outlined = "its row is outlined" if session.head is None else "its tile is outlined"
    return (f"Where **{query_label(session)}** looks in every layer (rows) and head (columns), {scale}{order}. "
            f"Selected: **{selection_name(session)}** — {outlined} and shown large on the right. Click a tile to select it.")


def statistic_title(session: Session, name: str) -> str:
    """The title of a head statistic's plot (``maps.RANKINGS``): what it measures, and its reference value."""
    analysis = session.analysis
    layout = analysis.layout
    if name == "distance":
        return "How far each head looks: mean attention distance in pixels (ViT paper, Fig. 7)"
    if name == "entropy":
        uniform = math.log(layout.num_tokens)
        return f"Attention entropy in nats; uniform over all {layout.num_tokens} tokens: log n = {uniform:.2f}"
    if name == "prefix share":
        if layout.num_prefix_tokens == 0:
            return "Attention sent to prefix tokens: this model has none"
        return (f"Share of patch queries' attention sent to prefix tokens ({', '.join(layout.prefix_names)}); "
                f"uniform: {layout.num_prefix_tokens / layout.num_tokens:.3g}")
    if name == maps.GRADIENT_IMPORTANCE:
        return f"Gradient importance Σ|∇A ⊙ A| of each head for {analysis.label(session.target)}"
    raise ValueError(f"no title for head statistic {name!r}")


TOP_HEADS = 5


def top_heads_table(session: Session, ablation: HeadAblation | None = None) -> dict:
    """One row per rank, one column per ranking, cells "L<layer> h<head> · value"; with the target's head
    ``ablation``, its ranking too: the drop in target probability when the head alone is removed."""
    tops = maps.top_heads(session.analysis, session.evidence, TOP_HEADS)
    headers = ["#", *(f"{name} ({maps.RANKINGS[name]})" for name in tops)]
    if ablation is not None:
        tops = {**tops, ABLATION_EFFECT: ablation.ranked(TOP_HEADS)}
        headers.append(f"{ABLATION_EFFECT}, {ABLATION_NAMES[ablation.mode]} (drop in target probability, highest first; "
                       f"{spearman_text(ablation, session)})")
    rows = [[rank + 1, *(f"L{layer} h{head} · {value:.3g}" for layer, head, value in (heads[rank] for heads in tops.values()))]
            for rank in range(min(TOP_HEADS, *(len(heads) for heads in tops.values())))]
    return {"headers": headers, "data": rows}


def class_note(session: Session, method: str) -> str:
    """The class-maps tab's line before a score: the target, and what scoring costs; for a map that takes no target
    (rollout, class attention), that it is the same for every target, which only its score is measured against."""
    if session.evidence is None:
        return without_target(session, NO_CLASSIFIER)
    # the method is named first: the radio above can name another while a slow map is being computed
    named = f"The map of **{maps.CLASS_METHODS[method]}**. " if method in maps.CLASS_SPECIFIC else (
        f"**{maps.CLASS_METHODS[method]}** takes no target: its map is the same whatever the target, and only its score is "
        "measured against it. ")
    if session.analysis.similarity:
        return (f"{named}Target: **{session.analysis.label(0)}** = {float(session.analysis.logits[0]):.3f}, its projection "
                "on its own direction on the unchanged image (there: its length): a score, not a probability. *Score "
                "faithfulness* follows it as a share of the whole image's score (1 on the unchanged image, −1 if that score is "
                f"negative) while patches are deleted and inserted in the map's order and in {DEFAULT_RANDOM_ORDERS} random "
                f"orders ({forward_passes()} forward passes).")
    return (f"{named}Target: **{session.analysis.label(session.evidence.target)}**. *Score faithfulness* deletes and "
            f"inserts patches in the map's order and against {DEFAULT_RANDOM_ORDERS} random orders ({forward_passes()} forward "
            "passes).")


def negligible_text(strength: float | None) -> str:
    """The warning above a class map that carries a negligible share of its score (``maps.map_strength``), or ""."""
    if strength is None or strength >= maps.NEGLIGIBLE:
        return ""
    return (f"⚠️ **Negligible map:** it carries {strength:.1e} of the target's score (below {maps.NEGLIGIBLE:.0%}), so its "
            "pattern is noise drawn at full contrast; nothing here is explained by it.\n\n")


def score_text(analysis: Analysis, method: str, curves: FaithfulnessCurves) -> str:
    """A faithfulness score in words: the verdict, and each AUC against random orders with its margin."""
    aucs, margins = curves.aucs, curves.margins
    first, second = curves.curve_names
    road = (f" ROAD's combined score {curves.protocol.score_formula}: **{curves.road_combined:.3f}**."
            if curves.protocol.imputes else "")
    measure = "" if curves.measure == PROBABILITY else f" (curves of the {curves.measure})"
    if curves.warning:
        return (f"**{maps.CLASS_METHODS[method]}** for **{analysis.label(curves.target)}**{measure} ⚠️ {curves.verdict}: "
                f"{curves.warning}.")
    return (f"**{maps.CLASS_METHODS[method]}** for **{analysis.label(curves.target)}**{measure} {curves.verdict}: "
            f"{first} AUC **{aucs['deletion']:.3f}** against {aucs['random_deletion']:.3f} (lower is better, margin "
            f"{margins['deletion']:+.3f}), {second} AUC **{aucs['insertion']:.3f}** against {aucs['random_insertion']:.3f} "
            f"(higher is better, margin {margins['insertion']:+.3f})."
            + road)


def board_text(analysis: Analysis, board: Scoreboard) -> str:
    """What the scoreboard ranked by, and chance."""
    first, second = board.curve_names
    protocol = board.protocol.description
    unweighted = [maps.CLASS_METHODS[entry.method] for entry in board.entries if not entry.depends_on_weights]
    badge = (f" ⚠️ {', '.join(unweighted)}: the map barely changes when the whole model is randomised (ρ ≥ 0.5), so it shows the "
             "image more than the model." if unweighted else "")
    measure = "" if board.measure == PROBABILITY else f" (curves of the {board.measure})"
    order = f"⚠️ **not ranked**: {board.unranked}." if board.unranked else "best first."
    notes = "".join(f" ⚠️ {note}." for note in board.notes)
    return (f"**Scoreboard** for **{analysis.label(board.target)}**{measure}, by {protocol}, {order} Score = {second} AUC − "
            f"{first} AUC{' halved' if board.protocol.imputes else ''} (*del.* and *ins.* are the {first} and {second} AUCs, "
            f"over {board.steps} steps: coarser than *Score faithfulness*'s {DEFAULT_STEPS}, so its AUCs differ a little); "
            f"chance (random orders) scores {board.chance_mean:.3f} ± {board.chance_sd:.3f}, and *vs chance* counts its standard "
            "deviations; *random-model ρ* is the map's rank correlation with the same map from the fully randomised "
            f"model.{notes}{badge}")


def over_chance_text(entry) -> str:
    """A scoreboard entry's distance from chance in standard deviations, or a dash where chance has no spread."""
    return "—" if math.isnan(entry.over_chance) else f"{entry.over_chance:+.1f} sd"


SHORT_NAMES = {"relevance": "relevance", "attnlrp": "AttnLRP", "legrad": "LeGrad", "grad-rollout": "grad-rollout",
               "rollout": "rollout", "cls": "class attention"}


def board_rows(board: Scoreboard) -> list[list]:
    """The scoreboard as table rows: rank, method, score, vs chance, the two AUCs, randomised ρ, badge."""
    return [["—" if board.unranked else rank, SHORT_NAMES.get(entry.method, entry.method), round(entry.score, 3),
             over_chance_text(entry),
             round(entry.deletion, 3), round(entry.insertion, 3), round(entry.randomised_rho, 2),
             "yes" if entry.depends_on_weights else "no ⚠️"]
            for rank, entry in enumerate(board.entries, start=1)]


def dataset_note(session: Session, dataset: DatasetStatistics) -> str:
    """What the dataset overlay shows, and this image's heads outside the dataset's 5–95% range per statistic."""
    lines = [f"Below: each head against its range and mean over the {dataset.images} images of `{dataset.source}` "
             f"({dataset.model}, from `{dataset.folder}`)."]
    if dataset.model != session.analysis.model_name:
        lines.append(f"⚠️ Those statistics are of `{dataset.model}`; this is `{session.analysis.model_name}` (same shape).")
    for name in dataset.mean:
        outside = dataset.outside(name, maps.ranking_values(session.analysis, name, session.evidence))
        if not outside:
            lines.append(f"- {name}: every head within the dataset's 5–95% range")
            continue
        shown = ", ".join(f"L{layer} h{head} {value:.3g} (dataset {low:.3g}–{high:.3g})" for layer, head, value, low,
                          high in outside[:4])
        more = f" and {len(outside) - 4} more" if len(outside) > 4 else ""
        heads = "1 head" if len(outside) == 1 else f"{len(outside)} heads"
        lines.append(f"- {name}: {heads} outside the dataset's 5–95% range: {shown}{more}")
    return "\n".join(lines)


ABLATION_EFFECT = "ablation effect"
ABLATION_NAMES = {"zero": "zero output", "mean": "uniform attention"}  # ``interventions.ABLATION_MODES`` as the app names them
# what each mode does, as the app runs it (no reference set: "mean" is uniform attention)
ABLATION_MEANS = {"zero": "the head's output set to zero", "mean": "the head attends equally to every token"}
NO_CLASS_SCORE = "This model has no classifier head: there is no class score to measure the removal of a head against."


def ablation_passes(session: Session) -> str:
    """What running the ablation costs, in multiples of one forward pass."""
    return ablation_cost(*session.analysis.map_shape)


def spearman_text(ablation: HeadAblation, session: Session) -> str:
    """Spearman's ρ of |Δ target probability| with the gradient importance of the same target."""
    rho = ablation.spearman(session.evidence.importance)
    return f"Spearman ρ with gradient importance {'undefined (a constant ranking)' if math.isnan(rho) else f'{rho:.2f}'}"


def ablation_note(session: Session, mode: str) -> str:
    """The head ablation tab's words before a run: what it measures and what it costs."""
    if session.evidence is None:
        return without_target(session, NO_CLASS_SCORE)
    measure = "score" if session.analysis.similarity else "probability"
    return (f"Which heads does the {measure} of **{session.analysis.label(session.target)}** need? *Run ablation* removes each "
            f"head alone (**{ABLATION_NAMES[mode]}**: {ABLATION_MEANS[mode]}) and runs the model again: "
            f"{ablation_passes(session)}. Unlike attention weights and gradients, this is causal.")


NO_TARGET_TO_DECOMPOSE = ("This model has no classifier head: choose a similarity target (the image's own embedding or a patch) "
                          "to split its score over the heads.")


def contributions_text(decomposition: Decomposition, ablation: HeadAblation | None, similarity: bool = False) -> str:
    """What the contributions tab shows: the score (a logit, before the softmax that gives the probability beside it; a
    backbone's ``similarity`` score as it is) and its largest parts, every MLP's part, what a direct contribution is and is
    not, and how to read the ablation beside it."""
    largest = ", ".join(f"**{name}** {signed(value, 3)}" for name, value in decomposition.top_parts(4))
    rest = ", ".join(f"{name} {signed(value, 3)}" for name, value in decomposition.rest.items())
    mlps = ", ".join(f"L{layer} {signed(value, 3)}" for layer, value in enumerate(decomposition.mlps.tolist()))
    beside = ("Below, head ablation (zero) of the same target, on the same colours: red there means removing the head lowers "
              f"the {ablation.measure}. A head red in both writes the answer itself; red only in the ablation acts through later "
              "layers." if ablation is not None else
              "Run the head ablation (zero) for this target and its heat map shows below, to tell heads that write the answer "
              "from heads that act through later layers.")
    score = ("its similarity score" if similarity
             else "its **logit**, the score before the softmax that gives the probability beside it")
    return (f"Score of **{decomposition.label}** ({score}): {decomposition.score:.4g}, split exactly into what each part writes "
            f"into the stream it is read from (the parts add up to {decomposition.total:.4g}). Largest: {largest}. MLPs by "
            f"layer: {mlps}; the rest: {rest}. "
            "A **direct** contribution is what a head writes that the read-out sees unchanged, with the final norm's scale "
            "held at this image's (Gandelsman et al. 2024); what later layers make of a head's write is counted in theirs. "
            f"{beside}")


def ablation_text(session: Session, ablation: HeadAblation) -> str:
    """What the ablation heat map shows, the heads the target needs most, and how that agrees with gradient importance."""
    label = session.analysis.label(ablation.target)
    if ablation.single_score:  # a similarity: its score, not a softmax over one "class"
        needed = ", ".join(f"**L{layer} h{head}** {signed(-drop, 3)}" for layer, head, drop in ablation.ranked(3))
        before, delta, tiles = f"{ablation.original_logit:.3f}", "|Δ score|", ""
    else:
        needed = ", ".join(f"**L{layer} h{head}** {signed(-drop * 100, 1)} pp" for layer, head, drop in ablation.ranked(3))
        before, delta = f"{ablation.original_probability:.1%}", "|Δp|"
        tiles = "Click a tile to see the top-5 predictions without that head."
    return (f"Change of the {ablation.measure} of **{label}** ({before} with every head) when each head alone "
            f"is removed ({ABLATION_NAMES[ablation.mode]}: {ABLATION_MEANS[ablation.mode]}); red: removing it lowers the "
            f"{ablation.measure}, blue: raises it. Most needed: {needed}. {spearman_text(ablation, session)} "
            f"({delta} against Σ|∇A ⊙ A|, {ablation.delta.numel()} heads). "
            f"Took {ablation_cost(*ablation.delta_logit.shape)}. {tiles}")


def norms_text(result: TokenNorms) -> str:
    """The token norms tab's caption: the outliers over all layers, and the rule that flags them."""
    return (f"**Token norms** after each layer (high-norm tokens, Darcet et al. 2023): {result.summary()}.\n\n"
            f"Rule (k = {result.k:g}): {token_norms.RULE}; median and MAD are not moved by the outliers they look for. "
            f"Attention share: {token_norms.SHARE}.")


def norms_layer_text(result: TokenNorms, layer: int) -> str:
    """One layer's flagged patches and the attention they draw, and each prefix token (class token, registers)
    beside the median patch."""
    layout = result.layout
    flagged = result.flagged_tokens(layer)
    relative = result.relative[layer]  # [n]
    listed = ", ".join(f"row {row}, col {col} ({relative[token]:.1f}×)" for token in flagged[:6].tolist()
                       for row, col in [layout.token_patch(token)])
    more = f" and {len(flagged) - 6} more" if len(flagged) > 6 else ""
    text = (f"**Layer {layer}**: {len(flagged)} flagged patch{'' if len(flagged) == 1 else 'es'}"
            + (f" ({listed}{more}), drawing {result.flagged_attention_share[layer]:.1%} of the attention" if len(flagged) else "")
            + f"; a median patch draws {result.patch_median_share[layer]:.2%}.")
    prefix = [f"- **{name}**: norm {relative[token]:.1f}× the median patch, {result.received[layer, token]:.1%} of the attention"
              for token, name in enumerate(layout.prefix_names)]
    return "\n\n".join([text, "\n".join(prefix)]) if prefix else text


def sanity_note(session: Session) -> str:
    """The class maps tab's words on the sanity check before it runs: what it does and what it costs."""
    layers = session.analysis.map_shape[0]
    return (f"*Sanity check* (Adebayo et al. 2018) re-draws the layers of a copy of the model at random, from the top down, and "
            f"compares each map with the trained model's: a map that explains the model should fall towards 0 after few "
            f"layers (cost: {layers + 1} forward{' and backward' if session.evidence is not None else ''} passes).")


def sanity_text(curves: SanityCurves) -> str:
    """A sanity check's result in words."""
    return f"**Cascading randomisation** (Adebayo et al. 2018) — {curves.summary()}."


COMPARE_NOTE = ("Upload a second image or choose a second model (or both) to compare with the main one: the other side stays the "
                "main image or model. It is analysed once (one forward and one backward pass); every view here then redraws from "
                "the two analyses. For a backbone and two images, *Why they match* explains each image's embedding on the "
                "other's direction, the score a retrieval ranks by.")


NO_TARGET_TO_PATCH = ("This model has no classifier head: choose a similarity target (the image's own embedding or a patch) "
                      "first; patching then measures how A's score moves.")


def patching_text(patching: Patching) -> str:
    """What the patching views show: A's and B's scores, the heads and tokens that move A's score most, and that a patch
    counts everything downstream of it."""
    layers, heads = patching.heads.shape
    order = patching.heads.abs().flatten().argsort(descending=True)[:3].tolist()
    strongest = ", ".join(f"**L{index // heads} h{index % heads}** {signed(float(patching.heads.flatten()[index]), 3)}"
                          for index in order)
    tokens = ("" if patching.tokens is None else
              " Right: the residual stream after each layer at each patch taken from B in turn; all of a layer's tokens at "
              "once give B's score exactly.")
    return (f"**B patched into A** for **{patching.label}**: A's score {patching.score_a:.4g}, B's {patching.score_b:.4g}. Left: "
            f"A's score with one head's output (of {layers} × {heads}) taken from B, minus A's; red raises it. Largest: "
            f"{strongest}. A patch counts everything that follows from it, later layers included (causal, unlike the direct "
            f"contributions).{tokens} Took {passes(patching.forward_passes)}.")


def side_names(session: Session, comparison: Comparison) -> tuple[str, str]:
    """Short names of the two sides, for their headings and the plot's legend: the image, and the model where
    the models differ."""
    a, b = "A · main image", f"B · {comparison.image_name or 'main image'}"
    if comparison.second_model:
        a, b = f"{a} · {session.analysis.model_name}", f"{b} · {comparison.analysis.model_name}"
    return a, b


def side_view_name(side: Side, view: str, method: str) -> str:
    """What one side's picture shows (``view`` as the Compare tab names its views): the map, its query, layer, head."""
    analysis = side.analysis
    if view == "class map":
        target = "" if method not in maps.CLASS_SPECIFIC or side.target is None else f" for {analysis.label(side.target)}"
        return f"{maps.CLASS_METHODS[method]}{target}"
    query = maps.query_name(analysis, side.query)
    if view == "rollout":
        start = f" from layer {side.start_layer}" if side.start_layer else ""
        return f"rollout of {query}{start}"
    return f"{query} in layer {side.layer} of {analysis.map_shape[0]}, {head_label(side.head)}"


def depth_note(a: Side, b: Side, what: str) -> str:
    """How ``what`` (a layer) of A meets B's: the same index at equal depth, else the relative-depth rule."""
    layers_a, layers_b = a.analysis.map_shape[0], b.analysis.map_shape[0]
    if layers_a == layers_b:
        return f"Both have {layers_a} layers: the same {what} on each side."
    return (f"Layers aligned by relative depth: A has {layers_a}, B {layers_b}, so A's layer l ↔ B's layer round(l · "
            f"{layers_b - 1}/{layers_a - 1}): the {what} is A's L{a.layer if what == 'layer' else a.start_layer} ↔ B's "
            f"L{b.layer if what == 'layer' else b.start_layer}.")


OUTDATED = {"image": "the main image (or its model) changed", "model": "the main model changed", "fit": "the fit changed"}


def comparison_caption(session: Session, a: Side, b: Side, view: str, method: str, outdated: str | None) -> str:
    """The Compare tab's words above its pictures: a stale comparison, the query the sides show, how their layers
    line up, and the class each side's map is for."""
    lines = []
    if outdated is not None:
        lines.append(f"⚠️ Since B was analysed, {OUTDATED[outdated]}: B still shows the earlier one. Press **Compare** to "
                     f"analyse B again.")
    if a.query != session.query:
        lines.append(f"The main query ({query_label(session)}) has no counterpart in B, so each side shows its default query.")
    if view == "layer and head":
        lines.append(depth_note(a, b, "layer"))
        if session.analysis.map_shape[1] != b.analysis.map_shape[1]:
            lines.append(f"A has {session.analysis.map_shape[1]} heads, B {b.analysis.map_shape[1]}: where B lacks the head, it "
                         "shows its mean of heads.")
    elif view == "rollout" and a.start_layer:
        lines.append(depth_note(a, b, "start layer"))
    elif view == "class map" and method in maps.CLASS_SPECIFIC:
        lines += [f"{name}'s model has no classifier head: {maps.CLASS_METHODS[method]} needs class scores."
                  for name, side in (("A", a), ("B", b)) if side.target is None]
        if b.target is not None and b.evidence is None:
            lines.append(f"B's evidence for {b.analysis.label(b.target)} is not computed yet: press **Compare** to compute it.")
        elif a.analysis.similarity and b.analysis.similarity:
            lines.append(f"Why they match: A's map explains **{a.analysis.label(a.target)}**, B's "
                         f"**{b.analysis.label(b.target)}** (each embedding projected on the other's direction, the score a "
                         "retrieval ranks by).")
        elif a.target is not None and b.target is not None:
            lines.append(f"Both maps are for **{a.analysis.label(a.target)}**." if same_classes(a.analysis, b.analysis) else
                         f"The models' classes differ: B's map is for its top prediction, **{b.analysis.label(b.target)}**.")
    return "  \n".join(lines)


def difference_note(mismatch: str | None, missing: bool) -> str:
    """The words above the difference map, or why there is none (``mismatch``: the grids differ; ``missing``: a side
    has no such map)."""
    if mismatch is not None:
        return f"No difference map: {mismatch}."
    if missing:
        return "No difference map: one side has no such map (see above)."
    return ("**A − B** of the two maps above, patch by patch, on a scale symmetric about 0: red where A is higher, blue where B "
            "is, white where they agree.")


# each head ranking (``maps.RANKINGS``) in words, with its unit
STATISTIC_NAMES = {"distance": "mean attention distance (px)", "entropy": "attention entropy (nats)",
                   "prefix share": "share of patch attention sent to prefix tokens",
                   maps.GRADIENT_IMPORTANCE: "gradient importance Σ|∇A ⊙ A| for the target class"}


def statistic_note(statistic: str, a: Side, b: Side, shown: tuple[str, ...]) -> str:
    """The words above the Compare tab's plot of a head statistic: what it plots, where each side's layers lie on its
    relative-depth axis, and a side left out for want of a classifier."""
    layers_a, layers_b = a.analysis.map_shape[0], b.analysis.map_shape[0]
    name = STATISTIC_NAMES[statistic]
    text = (f"**{name[0].upper()}{name[1:]}** of every head of {' and '.join(shown) or 'neither side'}, each layer at "
            f"its relative depth (A: {layers_a} layers, B: {layers_b}); hover a point for its layer and head.")
    missing = [name for name in ("A", "B") if name not in shown]
    return text + (f" {' and '.join(missing)}: no classifier head, so no gradient importance." if missing else "")


def atlas_summary(record: dict) -> str:
    """What an atlas is of, and what its completeness check found."""
    text = (f"**{record['model']}** over **{record['images']} images**: each head's mean |direct contribution| to the "
            "images' answers (the tile's colour) and its first description or the answer it pushes up most (its name). "
            "Click a head.")
    done = record.get("completeness")
    if done:
        text += f" Completeness: {completeness(done)}."
    return text


def atlas_head_text(record: dict, entry: dict) -> str:
    """One head of an atlas in words: its descriptions (TextSpan: the bank's nearest directions to what it writes, not its
    meaning), its share of the answers, the answers it pushes up, and its attention statistics over the folder."""
    lines = [f"**Layer {entry['layer']}, head h{entry['head']}**: mean |direct contribution| "
             f"{entry['mean_abs_contribution']:.3g}, among the 5 heads that write most on {entry['top_share']:.0%} of the "
             f"images, positive on {entry['positive_share']:.0%}."]
    if entry.get("texts"):
        lines.append(f"Its outputs vary most along (TextSpan, {entry['variance_explained']:.0%} of their variance): "
                     + "; ".join(f"“{text}”" for text in entry["texts"]) + ". These are the bank's nearest directions to "
                     "what the head writes directly, not what it means.")
    if entry["pushes_up"]:
        lines.append("Pushes up most: " + ", ".join(f"{push['answer']} ({signed(push['mean_contribution'], 3)})"
                                                    for push in entry["pushes_up"]) + ".")
    lines.append("Attention over the folder: " + ", ".join(f"{name} {values['mean']:.3g} ± {values['std']:.2g}"
                                                            for name, values in entry["statistics"].items()) + ".")
    return "\n\n".join(lines)


def query_key_caption(embedding: JointEmbedding, layer: int, head: int, query_name: str | None, tokens: int) -> str:
    """The Queries and keys tab's caption: what the picture is, how it was made, and how far it can be trusted."""
    axes = ("" if embedding.explained is None else
            f"; its two axes hold {embedding.explained[0]:.0%} and {embedding.explained[1]:.0%} of the variance")
    chance = min(5, tokens) / tokens
    trust = (f"For {embedding.agreement:.0%} of the queries, the key they attend to most is among the 5 keys nearest them "
             f"in this picture ({chance:.0%} by chance)" if embedding.agreement is not None else "")
    bias = (" This layer also adds a term to the logits (a relative-position bias or a mask) that no point shows."
            if embedding.biased else "")
    query = f" The query ({query_name}) is ringed." if query_name else ""
    return (f"**Layer {layer}, head {head}: its queries (dots) and keys (rings) in one picture** (AttentionViz). "
            f"Queries ×{embedding.scale:.3g} and keys ÷{embedding.scale:.3g} to one mean norm, then the keys moved onto "
            f"the queries' centre: every attention weight is unchanged. Projected by {embedding.projection}{axes}. "
            f"{trust}; a 2-D projection distorts distances, t-SNE more than PCA.{bias}{query} Hover a point to name its "
            "token; click a query to make it the query.")


def query_key_sample_caption(embedding: JointEmbedding, layer: int, head: int, names: list[str], tokens: int) -> str:
    """The folder sample's words: which head over which images, and how far the picture can be read."""
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    bias = " The layer's additive term of the logits is in no point." if embedding.biased else ""
    return (f"**Layer {layer}, head {head} over {len(names)} images** ({shown}): every image's queries and keys moved by "
            f"one scale and one translation, which keep each image's attention weights, and projected together by "
            f"{embedding.projection}. For {embedding.agreement:.0%} of the queries (mean over the images) the key they "
            f"attend to most is among the 5 of their own image's keys nearest them ({min(5, tokens) / tokens:.0%} by "
            f"chance).{bias} Hover a point to name its image and token.")


NO_REGISTERS = ("**Test-time register** (Jiang et al. 2025): start the app with `--registers FILE`, a file that "
                "`vit-explorer registers FOLDER --model MODEL` writes, to see this model with and without one.")


def register_text(neurons: RegisterNeurons, without: Analysis, with_register: Analysis | None,
                  norms: tuple[TokenNorms, TokenNorms] | None) -> str:
    """The Test-time register tab's words: what the file chose, how the logits moved, and what the outliers did."""
    head = f"**Test-time register** (Jiang et al. 2025) of {neurons.model}: {neurons.summary()} ({neurons.settings})."
    if neurons.model != without.model_name:
        return f"{head} This image was analysed by {without.model_name}: choose {neurons.model} to compare."
    if with_register is None or norms is None:
        return head
    before, after = norms
    logits = f"max |Δ logit| {float((with_register.logits - without.logits).abs().max()):.3g}"
    if without.num_classes:
        top_before, top_after = without.top_k(1)[0], with_register.top_k(1)[0]
        logits = (f"top class {top_before.label} {top_before.prob:.1%} without, {top_after.label} "
                  f"{top_after.prob:.1%} with; {logits}")
    flagged_before, flagged_after = int(before.flagged.any(dim=0).sum()), int(after.flagged.any(dim=0).sum())
    register = after.prefix[REGISTER]
    last = after.num_layers - 1
    return (f"{head}\n\nThe edit changes the model: {logits}. High-norm patches in any layer (the Token norms rule): "
            f"{flagged_before} without, {flagged_after} with. In the last layer the register's norm is "
            f"{float(register['norm'][last] / after.patch_median[last]):.1f}× the median patch's and it draws "
            f"{float(register['attention_share'][last]):.1%} of the attention. Below: the last layer's attention of the "
            "class token (mean of heads; each picture on its own scale) and every token's norm after every layer, "
            "without and with the register.")
