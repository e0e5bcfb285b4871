"""``vit-explorer``: analyze an image to files, serve the app, or train the embedded model."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from .errors import VitExplorerError
from .images import FITS
from .models import DEFAULT_MODEL


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_analyze(args: argparse.Namespace) -> None:
    from . import export, maps, pictures, render
    from .analysis import analyze, class_evidence
    from .faithfulness import deletion_insertion, forward_passes
    from .images import load_image
    from .models import load_model

    image = load_image(args.image)  # fail on a bad file before anything is written or loaded
    progress(f"loading {args.model}")
    model = load_model(args.model, input_hw=args.input_size, device=args.device)
    progress(f"analysing {args.image}")
    analysis = analyze(model, image, name=str(args.image), memory_budget=int(args.memory_budget_mb * 2**20), fit=args.fit)
    progress(analysis.view_note)
    if analysis.random_weights:
        progress(f"{args.model}: random weights: the token layout is real, but nothing is learned")
    if analysis.ood is not None and analysis.ood.flagged:
        progress(f"vit-explorer: warning: {analysis.ood.notice(analysis.model_name)}")
    options = maps.RolloutOptions(args.head_fusion, args.discard_ratio, args.start_layer, args.residual_weight)
    # the target class is needed for class-specific maps and for scoring any map; a backbone has none
    scored = analysis.num_classes > 0 and not args.no_faithfulness
    if args.method in maps.CLASS_SPECIFIC or scored or args.target is not None:
        evidence = class_evidence(model, analysis, args.target)
    else:
        evidence = None
    curves = None
    if scored:
        progress(f"scoring the {args.method} map: deletion and insertion, {forward_passes(args.steps, args.random_orders)} forward passes")
        curves = deletion_insertion(model, analysis.image, maps.class_map(analysis, args.method, evidence, options), evidence.target,
                                    steps=args.steps, random_orders=args.random_orders, baseline=args.baseline)
    out = Path(args.out)
    # write into a sibling temporary folder and move it in place, so a failure leaves no partial output
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".vit-explorer-", dir=out.parent))
    try:
        written = export.write_views(analysis, staging, options=options, cmap=args.cmap)
        if args.method != "rollout":
            written.append(staging / f"{args.method}.png")
            render.save_png(pictures.class_map_picture(analysis, args.method, evidence, options, args.cmap), str(written[-1]))
        if curves is not None:
            written += export.write_faithfulness(analysis, curves, args.method, staging, image=str(args.image),
                                                 steps=args.steps, random_orders=args.random_orders, baseline=args.baseline)
        out.mkdir(exist_ok=True)
        for path in staging.iterdir():
            path.replace(out / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if analysis.num_classes:
        top = analysis.top_k(1)[0]
        progress(f"top prediction: {top.label} ({top.prob:.1%})")
    if curves is not None:
        aucs = curves.aucs
        print(f"{args.method} map for {analysis.label(curves.target)!r}: deletion AUC {aucs['deletion']:.3f} "
              f"(random {aucs['random_deletion']:.3f}, lower is better), insertion AUC {aucs['insertion']:.3f} "
              f"(random {aucs['random_insertion']:.3f}, higher is better): {curves.verdict}", flush=True)
    elif analysis.num_classes == 0:
        progress("no classifier head: no class probabilities, so the map was not scored")
    progress(f"wrote {', '.join(path.name for path in written)} to {out}")


def run_serve(args: argparse.Namespace) -> None:
    from .app import serve

    serve(model_spec=args.model, host=args.host, port=args.port, share=args.share, open_browser=not args.no_browser,
          memory_budget=int(args.memory_budget_mb * 2**20), cache_ttl_s=args.cache_ttl_s)


def run_train_default(args: argparse.Namespace) -> None:
    from .train import train_default

    figures = train_default(Path(args.out), seed=args.seed, scale=args.scale, resume=args.resume)
    progress(f"wrote {args.out}: held-out accuracy {figures['heldout_accuracy']:.1%}")


def input_size(text: str) -> tuple[int, int]:
    """``518`` or ``448x640`` (height × width) → (height, width)."""
    try:
        parts = [int(part) for part in text.lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"input size must look like 518 or 448x640, not {text!r}") from None
    if len(parts) not in (1, 2) or min(parts) <= 0:
        raise argparse.ArgumentTypeError(f"input size must look like 518 or 448x640, not {text!r}")
    return (parts[0], parts[-1])


MEMORY_BUDGET_MB = 1024


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default; options that default to nothing say nothing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False, argparse.SUPPRESS) or "(default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    from .faithfulness import BASELINES, DEFAULT_RANDOM_ORDERS, DEFAULT_STEPS
    from .maps import CLASS_METHODS
    from .models.builtin import ASSETS
    from .render import COLORMAPS
    from .rollout import HEAD_FUSIONS

    try:
        installed = version("vit-explorer")
    except PackageNotFoundError:
        installed = "unknown (not installed)"
    main = argparse.ArgumentParser(prog="vit-explorer", formatter_class=HelpFormatter,
                                   description="See what a Vision Transformer looks at. Without a command: serve the app.")
    main.add_argument("--version", action="version", version=f"%(prog)s {installed}")
    commands = main.add_subparsers(dest="command")
    spec_help = f"model spec: {DEFAULT_MODEL}, timm:NAME[@FILE|@random], hf:REPO_OR_FOLDER[@random], or a checkpoint file"

    analyze = commands.add_parser(
        "analyze", formatter_class=HelpFormatter,
        help="write rollout.png, heads.png, attention.npz, the --method map and its faithfulness.json for one image"
    )
    analyze.add_argument("image", help="image file")
    analyze.add_argument("--model", default=DEFAULT_MODEL, help=spec_help)
    analyze.add_argument("--out", required=True, help="output folder (required)")
    analyze.add_argument("--method", default="rollout", choices=list(CLASS_METHODS),
                         help="the map to write as METHOD.png and score: " + "; ".join(f"{key}: {name}" for key, name in CLASS_METHODS.items()))
    analyze.add_argument("--target", default=None, help="class to explain, by index or name (default: the top prediction)")
    analyze.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="deletion / insertion steps")
    analyze.add_argument("--random-orders", type=int, default=DEFAULT_RANDOM_ORDERS, help="random patch orders for the chance baseline")
    analyze.add_argument("--baseline", default="blur", choices=list(BASELINES), help="what deleted patches show")
    analyze.add_argument("--no-faithfulness", action="store_true", help="skip the deletion / insertion score")
    analyze.add_argument("--head-fusion", default="mean", choices=list(HEAD_FUSIONS), help="how rollout combines the heads of a layer")
    analyze.add_argument("--discard-ratio", type=float, default=0.0, help="share of the weakest attention links rollout drops per layer")
    analyze.add_argument("--start-layer", type=int, default=0, help="first layer rollout multiplies in")
    analyze.add_argument("--residual-weight", type=float, default=0.5, help="weight of the identity (the skip connection) in rollout")
    analyze.add_argument("--cmap", default="inferno", choices=list(COLORMAPS), help="colour map of the pictures")
    analyze.add_argument("--input-size", type=input_size, default=None, help="e.g. 518 or 448x640, for timm/hf models that allow it "
                         "(default: the model's own size)")
    analyze.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: the GPU when there is one)")
    analyze.add_argument("--fit", default="stretch", choices=FITS,
                         help="for images of other proportions: stretch to the model's input, or pad to its proportions (letterbox)")
    analyze.add_argument("--memory-budget-mb", type=float, default=MEMORY_BUDGET_MB, help="above this, maps are kept in float16 or compactly")
    analyze.set_defaults(run=run_analyze)

    serve = commands.add_parser("serve", formatter_class=HelpFormatter, help="start the web app on this machine")
    serve.add_argument("--model", default=DEFAULT_MODEL, help=spec_help)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind; 127.0.0.1 is this machine only")
    serve.add_argument("--port", type=int, default=7860, help="port to listen on")
    serve.add_argument("--share", action="store_true", help="also open a public Gradio share link (off by default)")
    serve.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    serve.add_argument("--memory-budget-mb", type=float, default=MEMORY_BUDGET_MB, help="above this, maps are kept in float16 or compactly")
    serve.add_argument("--cache-ttl-s", type=int, default=3600, help="seconds rendered views, uploads and exports stay on disk")
    serve.set_defaults(run=run_serve)

    train = commands.add_parser("train-default", formatter_class=HelpFormatter,
                                help="train the embedded shapes model (about an hour on 2 CPU cores)")
    train.add_argument("--out", default=str(ASSETS / "shapes.safetensors"), help="where to write the weights")
    train.add_argument("--seed", type=int, default=0, help="seed of the training images and initial weights")
    train.add_argument("--scale", type=float, default=1.0, help="share of the documented steps and pool sizes, for trials")
    train.add_argument("--resume", action="store_true", help="continue from the checkpoint beside --out")
    train.set_defaults(run=run_train_default)
    return main


def main(argv: list[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    if arguments.command is None:
        arguments = parser().parse_args(["serve", *(argv or [])])
    try:
        arguments.run(arguments)
    except VitExplorerError as error:
        print(f"vit-explorer: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
