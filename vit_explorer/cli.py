"""``vit-explorer``: analyze an image to files, serve the app, or train the embedded model."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from .errors import VitExplorerError
from .models import DEFAULT_MODEL


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_analyze(args: argparse.Namespace) -> None:
    from . import export, render, views
    from .analysis import analyze, class_evidence
    from .faithfulness import deletion_insertion, forward_passes
    from .images import load_image
    from .models import load_model

    image = load_image(args.image)  # fail on a bad file before anything is written or loaded
    progress(f"loading {args.model}")
    model = load_model(args.model, input_hw=args.input_size, device=args.device)
    progress(f"analysing {args.image}")
    analysis = analyze(model, image, name=str(args.image), memory_budget=int(args.memory_budget_mb * 2**20))
    options = views.RolloutOptions(args.head_fusion, args.discard_ratio, args.start_layer, args.residual_weight)
    # the target class is needed for class-specific maps and for scoring any map; a backbone has none
    scored = analysis.num_classes > 0 and not args.no_faithfulness
    if args.method in views.CLASS_SPECIFIC or scored or args.target is not None:
        evidence = class_evidence(model, analysis, args.target)
    else:
        evidence = None
    curves = None
    if scored:
        progress(f"scoring the {args.method} map: deletion and insertion, {forward_passes(args.steps, args.random_orders)} forward passes")
        curves = deletion_insertion(model, analysis.image, views.class_map(analysis, args.method, evidence, options), evidence.target,
                                    steps=args.steps, random_orders=args.random_orders, baseline=args.baseline)
    out = Path(args.out)
    # write into a sibling temporary folder and move it in place, so a failure leaves no partial output
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".vit-explorer-", dir=out.parent))
    try:
        written = export.write_views(analysis, staging, options=options, cmap=args.cmap)
        if args.method != "rollout":
            written.append(staging / f"{args.method}.png")
            render.save_png(export.class_map_picture(analysis, args.method, evidence, options, args.cmap), str(written[-1]))
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
        verdict = "beats random orders" if curves.beats_chance() else "does not clearly beat random orders"
        print(f"{args.method} map for {analysis.label(curves.target)!r}: deletion AUC {aucs['deletion']:.3f} "
              f"(random {aucs['random_deletion']:.3f}, lower is better), insertion AUC {aucs['insertion']:.3f} "
              f"(random {aucs['random_insertion']:.3f}, higher is better): {verdict}", flush=True)
    elif analysis.num_classes == 0:
        progress("no classifier head: no class probabilities, so the map was not scored")
    progress(f"wrote {', '.join(path.name for path in written)} to {out}")


def run_serve(args: argparse.Namespace) -> None:
    from .app import serve

    serve(model_spec=args.model, host=args.host, port=args.port, share=args.share, open_browser=not args.no_browser,
          memory_budget=int(args.memory_budget_mb * 2**20), cache_ttl_s=args.cache_ttl_s)


def run_train_default(args: argparse.Namespace) -> None:
    from .train import train_default

    figures = train_default(Path(args.out), seed=args.seed, steps=args.steps)
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


def parser() -> argparse.ArgumentParser:
    from .faithfulness import BASELINES, DEFAULT_RANDOM_ORDERS, DEFAULT_STEPS
    from .models.builtin import ASSETS
    from .views import CLASS_METHODS

    main = argparse.ArgumentParser(prog="vit-explorer", description="See what a Vision Transformer looks at. Without a command: serve the app.")
    commands = main.add_subparsers(dest="command")

    analyze = commands.add_parser(
        "analyze", help="write rollout.png, heads.png, attention.npz, the --method map and its faithfulness.json for one image"
    )
    analyze.add_argument("image", help="image file")
    analyze.add_argument("--model", default=DEFAULT_MODEL, help=f"model spec (default {DEFAULT_MODEL})")
    analyze.add_argument("--out", required=True, help="output folder")
    analyze.add_argument("--method", default="rollout", choices=list(CLASS_METHODS),
                         help="the map to write as METHOD.png and score: " + "; ".join(f"{key}: {name}" for key, name in CLASS_METHODS.items()))
    analyze.add_argument("--target", default=None, help="class to explain, by index or name (default: the top prediction)")
    analyze.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="deletion / insertion steps")
    analyze.add_argument("--random-orders", type=int, default=DEFAULT_RANDOM_ORDERS, help="random patch orders for the chance baseline")
    analyze.add_argument("--baseline", default="blur", choices=list(BASELINES), help="what deleted patches show")
    analyze.add_argument("--no-faithfulness", action="store_true", help="skip the deletion / insertion score")
    analyze.add_argument("--head-fusion", default="mean", choices=["mean", "max", "min"])
    analyze.add_argument("--discard-ratio", type=float, default=0.0)
    analyze.add_argument("--start-layer", type=int, default=0)
    analyze.add_argument("--residual-weight", type=float, default=0.5)
    analyze.add_argument("--cmap", default="inferno")
    analyze.add_argument("--input-size", type=input_size, default=None, help="e.g. 518 or 448x640, for timm/hf models that allow it")
    analyze.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: the GPU when there is one)")
    analyze.add_argument("--memory-budget-mb", type=float, default=1024, help="above this, maps are kept in float16 or compactly")
    analyze.set_defaults(run=run_analyze)

    serve = commands.add_parser("serve", help="start the web app on this machine")
    serve.add_argument("--model", default=DEFAULT_MODEL, help=f"model spec (default {DEFAULT_MODEL})")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=7860)
    serve.add_argument("--share", action="store_true", help="also open a public Gradio share link (off by default)")
    serve.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    serve.add_argument("--memory-budget-mb", type=float, default=1024, help="above this, maps are kept in float16 or compactly")
    serve.add_argument("--cache-ttl-s", type=int, default=3600, help="seconds rendered views, uploads and exports stay on disk (default 3600)")
    serve.set_defaults(run=run_serve)

    train = commands.add_parser("train-default", help="train the embedded shapes model")
    train.add_argument("--out", default=str(ASSETS / "shapes.safetensors"))
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--steps", type=int, default=3000)
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
