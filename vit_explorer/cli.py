"""``vit-explorer``: analyze an image to files, serve the app, reduce head statistics over a dataset, or train the embedded
model."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import NoReturn

from vit_explorer.core.images import FITS
from vit_explorer.errors import VitExplorerError
from vit_explorer.methods.dataset import SHARD_SIZE
from vit_explorer.models import DEFAULT_MODEL


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def progress_bar(description: str, total: int, unit: str = "step", shown: bool = True) -> Iterator[Callable[[], None]]:
    """A progress bar on stderr for long work (tqdm), advanced by calling what this yields; none when stderr is
    not a terminal, so that logs and pipes get only the lines ``progress`` prints (nor where ``shown`` is False:
    the other processes of a torchrun)."""
    from tqdm import tqdm

    # a terminal that reports no size (a new pseudo-terminal) would get no bar from tqdm, which hides bars below the
    # screen's last row: take shutil's size, which falls back to COLUMNS and LINES, or 80 × 24
    size = shutil.get_terminal_size()
    with tqdm(total=total, desc=description, unit=unit, file=sys.stderr, ncols=size.columns, nrows=size.lines, leave=False,
              disable=not (shown and sys.stderr.isatty())) as bar:
        yield lambda: bar.update(1)


class ProgressLines:
    """The CLI's side of ``run.Progress``: each stage's line on stderr, then its progress bar (``progress_bar``) until the
    next stage starts or the run ends."""

    def __init__(self) -> None:
        self.bars = ExitStack()

    def __call__(self, description: str, total: int, unit: str) -> Callable[[], None]:
        self.bars.close()
        progress(description)
        if not total:
            return lambda: None
        return self.bars.enter_context(progress_bar(description.split(":")[0], total, unit=unit))

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bars.close()


def run_analyze(args: argparse.Namespace) -> None:
    from vit_explorer.core.curves import Protocol
    from vit_explorer.core.images import load_image
    from vit_explorer.core.request import Request
    from vit_explorer.core.targets import Target
    from vit_explorer.draw import files, terminal
    from vit_explorer.models import load_model
    from vit_explorer.run import registered, run

    image = load_image(args.image)  # fail on a bad file before anything is written or loaded
    atlas = files.read_atlas(args.atlas) if args.atlas else None
    report = args.html or atlas is not None
    request = Request(method=args.method, target=Target.parse(args.target), every_map=report, score=not args.no_faithfulness,
                      protocol=Protocol(args.baseline), steps=args.steps, random_orders=args.random_orders,
                      scoreboard=args.scoreboard,
                      sanity=args.sanity, ablation=args.ablation_mode if args.ablation else None, norms=args.norms,
                      decompose=args.decompose, options=rollout_options(args), overview=True, full_maps=args.full_maps,
                      memory_budget=memory_budget(args), fit=args.fit)
    progress(f"loading {args.model}")
    model = load_model(args.model, input_hw=args.input_size, device=args.device)
    if args.registers:
        model = registered(model, args.registers)
    for note in model.notes:
        progress(f"{args.model}: {note}")
    with ProgressLines() as lines:
        result = run(model, image, request, name=str(args.image), progress=lines)
    notes, results = terminal.run_lines(result)
    for note in result.analysis.prompt_notes:
        progress(f"{args.model}: {note}")
    for line in notes:
        progress(line)
    settings = {"image": str(args.image), "steps": args.steps, "random_orders": args.random_orders, "baseline": args.baseline}
    written, npz_note = files.write_analysis(result, args.out, cmap=args.cmap, scale=args.scale,
                                             html=report, settings=settings, atlas=atlas)
    for line in results:
        print(line, flush=True)
    progress(npz_note)
    progress(f"wrote {', '.join(path.name for path in written)} to {args.out}")


def rollout_options(args: argparse.Namespace):
    from vit_explorer.core.maps import RolloutOptions

    return RolloutOptions(args.head_fusion, args.discard_ratio, args.start_layer, args.residual_weight)


def memory_budget(args: argparse.Namespace) -> int:
    return int(args.memory_budget_mb * 2**20)


def run_serve(args: argparse.Namespace) -> None:
    from vit_explorer.web.app import serve

    serve(model_spec=args.model, host=args.host, port=args.port, share=args.share, open_browser=not args.no_browser,
          memory_budget=int(args.memory_budget_mb * 2**20), cache_ttl_s=args.cache_ttl_s, input_hw=args.input_size,
          registers=args.registers)


def run_train_default(args: argparse.Namespace) -> None:
    from vit_explorer.models.builtin import ASSETS
    from vit_explorer.shapes.train import train_default
    from vit_explorer.shapes.train_clip import train_clip

    shipped = ASSETS / ("shapes-clip.safetensors" if args.clip else "shapes.safetensors")
    out = shipped if args.replace_shipped else Path(args.out or shipped.name).expanduser()
    if out.resolve() == shipped.resolve() and not args.replace_shipped:
        raise VitExplorerError(f"--out {out} is the shipped model; add --replace-shipped to write over it, or choose another "
                               "path")
    if args.clip:
        figures = train_clip(out, seed=args.seed, scale=args.scale, resume=args.resume)
        progress(f"wrote {out}: held-out zero-shot accuracy {figures['heldout_zero_shot_accuracy']:.1%}")
        return
    figures = train_default(out, seed=args.seed, scale=args.scale, resume=args.resume)
    progress(f"wrote {out}: held-out accuracy {figures['heldout_accuracy']:.1%}")


def run_stats(args: argparse.Namespace) -> None:
    from vit_explorer.draw.files import write_dataset_outputs
    from vit_explorer.methods.dataset import collect, dataset_tables, list_images, process_group
    from vit_explorer.models import load_model

    with process_group(args.device) as (device, rank, world):
        images = list_images(args.source)
        model = load_model(args.model, input_hw=args.input_size, device=device)
        if rank == 0:
            processes = f" in {world} processes" if world > 1 else ""
            progress(f"{len(images.paths)} images from {args.source} through {model.name}{processes}")
        out = Path(args.out)
        totals, run = collect(model, images, out / ".shards", batch_size=args.batch_size, workers=args.workers, fit=args.fit,
                              shard_size=args.shard_size, resume=args.resume, show_progress=sys.stderr.isatty())
        if rank == 0:
            written = write_dataset_outputs(out, *dataset_tables(totals, run, model, str(args.source), images))
            if totals.skipped:
                progress(f"skipped {len(totals.skipped)} unreadable files (listed in summary.json)")
            if run["resumed_shards"]:
                progress(f"resumed {run['resumed_shards']} of {run['shards']} shards")
            progress(f"wrote {', '.join(path.name for path in written)} to {out}")


def run_evaluate(args: argparse.Namespace) -> None:
    from vit_explorer.core.curves import Protocol
    from vit_explorer.draw import files, terminal
    from vit_explorer.run import evaluate

    methods = tuple(method.strip() for method in args.methods.split(","))
    with ProgressLines() as lines:
        report = evaluate(args.model, args.source, methods, protocol=Protocol(args.baseline), steps=args.steps,
                          random_orders=args.random_orders, limit=args.limit, masks=args.masks, fit=args.fit,
                          input_hw=args.input_size, device=args.device, progress=lines)
    if report is None:  # another process of a torchrun: the first one writes and says it
        return
    written = files.write_evaluation(report, Path(args.out))
    notes, table = terminal.evaluation_lines(report)
    for line in table:
        print(line)
    for note in notes:
        progress(note)
    progress(f"wrote {written}")


def run_atlas(args: argparse.Namespace) -> None:
    from vit_explorer.draw import files, terminal
    from vit_explorer.methods.text_bank import read_bank
    from vit_explorer.run import atlas

    bank = read_bank(args.text_bank) if args.text_bank else None
    prompts = [prompt.strip() for prompt in args.prompts.split(",") if prompt.strip()] if args.prompts else None
    with ProgressLines() as lines:
        found = atlas(args.model, args.source, prompts=prompts, bank=bank, texts_per_head=args.texts_per_head,
                      late_layers=args.late_layers, batch_size=args.batch_size, limit=args.limit, fit=args.fit,
                      shard_folder=Path(args.out) / ".shards", shard_size=args.shard_size, resume=args.resume,
                      input_hw=args.input_size,
                      device=args.device, progress=lines)
    if found is None:  # another process of a torchrun: the first one writes and says it
        return
    written = files.write_atlas(found, Path(args.out))
    for line in terminal.atlas_lines(found):
        print(line)
    progress(f"wrote {', '.join(path.name for path in written)} to {args.out}")


def run_registers(args: argparse.Namespace) -> None:
    from vit_explorer.run import registers

    out = Path(args.out).expanduser()
    with ProgressLines() as lines:
        found = registers(args.model, args.source, top_k=args.top_k, highest_layer=args.highest_layer,
                          detect_layer=args.detect_layer, batch_size=args.batch_size, fit=args.fit,
                          input_hw=args.input_size, device=args.device, progress=lines)
    out.write_text(found.to_json())
    progress(f"{found.model}: {found.summary()} ({found.settings})")
    progress(f"wrote {out}")


def run_make_shapes(args: argparse.Namespace) -> None:
    from vit_explorer.shapes.generator import write_set

    write_set(Path(args.folder), args.count, args.seed, objects=args.objects)
    kind = " of two different shapes each" if args.objects == 2 else ""
    folder = Path(args.folder)
    progress(f"wrote {args.count} images{kind} to {folder / 'images'} and their masks to {folder / 'masks'}")


def add_input_options(command: argparse.ArgumentParser) -> None:
    """The options of the dataset commands (``stats``, ``evaluate``, ``registers``) that say how images meet the model."""
    command.add_argument("--input-size", type=input_size, default=None, help="model input, 518 or HxW (default: the model's own)")
    command.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: the GPU when there is one; under "
                                                        "torchrun: each process's local GPU)")
    command.add_argument("--fit", default="stretch", choices=FITS, help="how an image of other proportions meets the input")


def input_size(text: str) -> tuple[int, int]:
    """``518`` or ``448x640`` (height × width) → (height, width)."""
    try:
        parts = [int(part) for part in text.lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"input size must look like 518 or 448x640, not {text!r}") from None
    if len(parts) not in (1, 2) or min(parts) <= 0:
        raise argparse.ArgumentTypeError(f"input size must look like 518 or 448x640, not {text!r}")
    return (parts[0], parts[-1])


def port(text: str) -> int:
    """A TCP port, 1…65535."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port is a whole number from 1 to 65535, not {text!r}") from None
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a whole number from 1 to 65535, not {number}")
    return number


def output_folder(text: str) -> Path:
    """``--out`` of ``analyze``: a folder that exists, or one that can be made; checked before any pass runs, so that a
    long analysis is never thrown away at the end for a path it could not write."""
    out = Path(text).expanduser()
    if out.exists() and not out.is_dir():
        raise argparse.ArgumentTypeError(f"{out} is a file, not a folder: give a folder to write into")
    parent = out if out.is_dir() else next((folder for folder in out.parents if folder.exists()), Path("."))
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write to {out}: {parent} is not a folder this user can write into")
    try:  # the checks above cannot see every file system (/proc, read-only mounts): try what the writer will do
        tempfile.TemporaryDirectory(dir=parent, prefix=".vit-explorer-check-").cleanup()
    except OSError as error:
        raise argparse.ArgumentTypeError(f"cannot write to {out}: {error.strerror or error}") from None
    return out


MEMORY_BUDGET_MB = 1024


class Parser(argparse.ArgumentParser):
    """Argparse with a mistake told in one line: the option, what was wrong and the valid choices (argparse's message),
    without the usage block that hides it (``--help`` prints that)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default; options that default to nothing say nothing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        # ``is``: 0 and 0.0 equal False, yet they are defaults a user needs to see
        stated = "(default" in (action.help or "")
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS or stated:
            return action.help or ""
        return super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("vit-explorer")
    except PackageNotFoundError:
        installed = "unknown (not installed)"
    main = Parser(prog="vit-explorer", formatter_class=HelpFormatter,
                  description="See what a Vision Transformer looks at. Without a command: serve the app.")
    main.add_argument("--version", action="version", version=f"%(prog)s {installed}")
    commands = main.add_subparsers(dest="command")
    spec_help = f"model spec: {DEFAULT_MODEL}, timm:NAME[@FILE|@random], hf:REPO_OR_FOLDER[@random], or a checkpoint file"
    add_analyze(commands, spec_help)
    add_serve(commands, spec_help)
    add_train(commands)
    add_stats(commands, spec_help)
    add_evaluate(commands, spec_help)
    add_atlas(commands, spec_help)
    add_registers(commands, spec_help)
    add_make_shapes(commands)
    return main


def add_analyze(commands: argparse._SubParsersAction, spec_help: str) -> None:
    """The command analyze IMAGE: the maps of one image, their scores and report, to files."""
    from vit_explorer.core.curves import DEFAULT_RANDOM_ORDERS, DEFAULT_STEPS, PROTOCOLS
    from vit_explorer.core.interventions import ABLATION_MODES
    from vit_explorer.core.maps import CLASS_METHODS
    from vit_explorer.draw.render import COLORMAPS, COLOUR_SCALES

    analyze = commands.add_parser(
        "analyze", formatter_class=HelpFormatter,
        help="write rollout.png, heads.png, attention.npz (compact maps), the --method map and its faithfulness.json for "
             "one image",
        description="Runs IMAGE through the model once and writes to --out: the class token's rollout (rollout.png), every "
                    "layer's and head's attention (heads.png), the maps themselves (attention.npz), the --method map with its "
                    "faithfulness score, and whatever --scoreboard, --sanity, --norms, --ablation and --html add. Example: "
                    "vit-explorer analyze cat.png --model timm:vit_small_patch16_224 --method attnlrp --html --out cat-maps")
    analyze.add_argument("image", help="image file")
    analyze.add_argument("--model", default=DEFAULT_MODEL, help=spec_help)
    analyze.add_argument("--out", required=True, type=output_folder, help="output folder (required; made if it does not exist)")
    analyze.add_argument("--method", default="rollout", choices=list(CLASS_METHODS),
                         help="the map to write as METHOD.png and score: "
                              + "; ".join(f"{key}: {name}" for key, name in CLASS_METHODS.items()))
    analyze.add_argument("--target", default=None, help="class to explain, by index or name (default: the top prediction); for a "
                         "backbone, patch:ROW,COL: what that patch's own output token is made of, or image:PATH: why the image's "
                         "embedding matches that second image's (default: the image's own embedding); for a CLIP or SigLIP "
                         "model, text:PROMPT or text:PROMPT|PROMPT|…: the prompts' zero-shot prediction, the best match "
                         "explained (or the one marked '*', text:a dog|*a cat)")
    analyze.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="deletion / insertion steps")
    analyze.add_argument("--random-orders", type=int, default=DEFAULT_RANDOM_ORDERS,
                         help="random patch orders for the chance baseline")
    analyze.add_argument("--baseline", default="blur", choices=list(PROTOCOLS),
                         help="what deleted patches show: blurred, the mean colour, or ROAD's noisy linear imputation (then the "
                              "curves are ROAD's MoRF and LeRF)")
    analyze.add_argument("--no-faithfulness", action="store_true", help="skip the deletion / insertion score")
    analyze.add_argument("--scoreboard", action="store_true",
                         help="write scoreboard.json: every map method for the target, ranked by --baseline's protocol, each "
                              "with its distance from chance and its rank correlation with the fully randomised model's map")
    analyze.add_argument("--sanity", action="store_true",
                         help="write sanity.json and sanity.png: how each map's correlation with the trained model's falls "
                              "as layers are randomised from the top (one pass per layer)")
    analyze.add_argument("--norms", action="store_true",
                         help="write norms.json, norms.png, norms_chart.png and norm_outliers.png: each token's norm after "
                              "each layer, the high-norm outlier patches and the attention they draw (Darcet et al. 2023; no "
                              "extra pass)")
    analyze.add_argument("--ablation", action="store_true",
                         help="write ablation.json and ablation.png: the change in the target's logit and probability when "
                              "each head is removed (one pass per layer)")
    analyze.add_argument("--decompose", action="store_true", help="write decomposition.json, contributions.png, "
                         "contributions_chart.png and lens.png: the target's score split exactly over each head, MLP, the "
                         "embeddings and biases (direct contributions), and the score read after every layer (logit lens)")
    analyze.add_argument("--ablation-mode", default="zero", choices=list(ABLATION_MODES),
                         help="zero: the head's output set to 0; mean: its map replaced by uniform attention")
    add_rollout_options(analyze)
    analyze.add_argument("--cmap", default="inferno", choices=list(COLORMAPS), help="colour map of the pictures")
    analyze.add_argument("--scale", default="linear", choices=list(COLOUR_SCALES),
                         help="what the colour map's ends stand for: "
                              + "; ".join(f"{key}: {name}" for key, name in COLOUR_SCALES.items())
                         + " (for heavy-tailed maps such as relevance; values beyond are clipped)")
    analyze.add_argument("--input-size", type=input_size, default=None,
                         help="e.g. 518 or 448x640, for timm/hf models that allow it (default: the model's own size)")
    analyze.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: the GPU when there is one)")
    analyze.add_argument("--registers", default=None,
                         help="a file of `vit-explorer registers`: add a test-time register to the model (it is edited: "
                              "its logits change; the register is the prefix token tt-reg)")
    analyze.add_argument("--fit", default="stretch", choices=FITS,
                         help="for images of other proportions: stretch to the model's input, or pad to its proportions "
                              "(letterbox)")
    analyze.add_argument("--memory-budget-mb", type=float, default=MEMORY_BUDGET_MB,
                         help="above this, maps are kept in float16 or compactly")
    analyze.add_argument("--html", action="store_true", help="also write report.html: one self-contained page (pictures "
                         "embedded, opens offline) of everything written, with the model and its provenance at the top")
    analyze.add_argument("--atlas", default=None, metavar="DIR",
                         help="add the head atlas in DIR (written by vit-explorer atlas for this model) to report.html, which "
                              "it implies")
    analyze.add_argument("--full-maps", action="store_true", help="also write every head's full [layers, heads, n, n] map to "
                         "attention.npz (by default it holds the compact form: head means, prefix rows, statistics)")
    analyze.set_defaults(run=run_analyze)


def add_rollout_options(command: argparse.ArgumentParser) -> None:
    """The rollout's options, their defaults ``RolloutOptions``'s."""
    from vit_explorer.core.maps import RolloutOptions
    from vit_explorer.core.rollout import HEAD_FUSIONS

    rollout = RolloutOptions()  # the defaults, stated once there
    command.add_argument("--head-fusion", default=rollout.head_fusion, choices=list(HEAD_FUSIONS),
                         help="how rollout combines the heads of a layer")
    command.add_argument("--discard-ratio", type=float, default=rollout.discard_ratio,
                         help="share of the weakest attention links rollout drops per layer")
    command.add_argument("--start-layer", type=int, default=rollout.start_layer, help="first layer rollout multiplies in")
    command.add_argument("--residual-weight", type=float, default=rollout.residual_weight,
                         help="weight of the identity (the skip connection) in rollout")


def add_serve(commands: argparse._SubParsersAction, spec_help: str) -> None:
    """The command serve: the app."""
    serve = commands.add_parser("serve", formatter_class=HelpFormatter, help="start the web app on this machine",
                                description="Starts the app on http://HOST:PORT (this machine only, by default) and opens it in "
                                            "a browser tab: upload an image and click through layers, heads and patches.")
    serve.add_argument("--model", default=DEFAULT_MODEL, help=spec_help)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind; 127.0.0.1 is this machine only")
    serve.add_argument("--port", type=port, default=7860, help="port to listen on, 1…65535")
    serve.add_argument("--share", action="store_true", help="also open a public Gradio share link (off by default)")
    serve.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    serve.add_argument("--memory-budget-mb", type=float, default=MEMORY_BUDGET_MB,
                       help="above this, maps are kept in float16 or compactly")
    serve.add_argument("--cache-ttl-s", type=int, default=3600, help="seconds rendered views, uploads and exports stay on disk")
    serve.add_argument("--input-size", type=input_size, default=None,
                       help="every model's input, 518 or HxW, for timm/hf models that allow it (default: each model's own)")
    serve.add_argument("--registers", default=None,
                       help="a file of `vit-explorer registers`: the Test-time register tab shows the model with and "
                            "without one, side by side")
    serve.set_defaults(run=run_serve)


def add_train(commands: argparse._SubParsersAction) -> None:
    """The command train-default: retrain a shipped model."""
    from vit_explorer.models.builtin import ASSETS

    train = commands.add_parser("train-default", formatter_class=HelpFormatter,
                                help="train the embedded shapes model (about an hour on 2 CPU cores)",
                                description="Trains the shapes ViT on images the generator draws and writes it with its "
                                            "out-of-distribution calibration; the shipped copy stays unless --replace-shipped.")
    train.add_argument("--clip", action="store_true",
                       help="train the shapes-CLIP instead (builtin:shapes-clip): the shipped ViT as image tower and a "
                            "word-level text tower, on captioned images of one and two shapes (about an hour)")
    train.add_argument("--out", help="where to write the weights (default: shapes.safetensors, or shapes-clip.safetensors with "
                                     "--clip); the shipped model is never overwritten unless --replace-shipped is given")
    train.add_argument("--replace-shipped", action="store_true",
                       help=f"write over the shipped model in {ASSETS} (for maintainers who retrain it)")
    train.add_argument("--seed", type=int, default=0, help="seed of the training images and initial weights")
    train.add_argument("--scale", type=float, default=1.0, help="share of the documented steps and pool sizes, for trials")
    train.add_argument("--resume", action="store_true", help="continue from the checkpoint beside --out")
    train.set_defaults(run=run_train_default)


def add_stats(commands: argparse._SubParsersAction, spec_help: str) -> None:
    """The command stats SOURCE: per-head attention statistics over a folder."""
    stats = commands.add_parser(
        "stats", formatter_class=HelpFormatter,
        help="per-head attention statistics over a folder of images (run under torchrun for many processes)",
        description="Streams SOURCE through the model and writes heads.csv, summary.json and one chart per statistic to "
                    "--out. Run `torchrun --nproc-per-node N -m vit_explorer stats …` to shard the images over N processes "
                    "(gloo on CPU, NCCL on GPU); add torchrun's --nnodes and --rdzv-endpoint for many machines.")
    stats.add_argument("source", help="a folder (one sub-folder per class gives labels), a text file of image paths, or a glob")
    stats.add_argument("--model", default=DEFAULT_MODEL, help=spec_help)
    stats.add_argument("--out", required=True, help="output folder (also holds the per-shard totals that --resume reads)")
    stats.add_argument("--batch-size", type=int, default=32, help="images per forward pass")
    stats.add_argument("--workers", type=int, default=2, help="processes decoding images beside each model process")
    stats.add_argument("--shard-size", type=int, default=SHARD_SIZE, help="images per resumable shard")
    stats.add_argument("--resume", action="store_true", help="load the finished shards in --out instead of recomputing them")
    add_input_options(stats)
    stats.set_defaults(run=run_stats)


def add_evaluate(commands: argparse._SubParsersAction, spec_help: str) -> None:
    """The command evaluate SOURCE: every map method scored over a folder."""
    from vit_explorer.core.curves import PROTOCOLS
    from vit_explorer.core.maps import CLASS_METHODS

    evaluate = commands.add_parser(
        "evaluate", formatter_class=HelpFormatter,
        help="how faithful each map method is over a folder of images, with 95%% intervals",
        description="Deletion and insertion AUC of each method's map for each image's class (its folder, when the folders name "
                    "the model's classes, else its top prediction) against random orders; the positive-perturbation accuracy AUC "
                    "of Chefer et al.; and, where a masks folder holds a mask of the same name, the pointing game and energy.")
    evaluate.add_argument("source", help="a folder (one sub-folder per class), a text file of image paths, or a glob")
    evaluate.add_argument("--model", default=DEFAULT_MODEL, help=spec_help)
    evaluate.add_argument("--out", required=True, help="folder for evaluation.json")
    evaluate.add_argument("--methods", default=",".join(CLASS_METHODS), help="comma-separated map methods (default: all of them)")
    evaluate.add_argument("--masks", default=None, help="masks folder mirroring SOURCE (default: a masks/ folder beside SOURCE)")
    evaluate.add_argument("--limit", type=int, default=None, help="only the first N images")
    evaluate.add_argument("--steps", type=int, default=10, help="deletion / insertion steps per curve")
    evaluate.add_argument("--random-orders", type=int, default=1, help="random orders per image for the chance level")
    evaluate.add_argument("--baseline", default="blur", choices=list(PROTOCOLS),
                          help="what a removed patch shows: blurred, the mean colour, or ROAD's noisy linear imputation (then "
                               "deletion is ROAD's MoRF and insertion its LeRF)")
    add_input_options(evaluate)
    evaluate.set_defaults(run=run_evaluate)


def add_atlas(commands: argparse._SubParsersAction, spec_help: str) -> None:
    """The command atlas SOURCE: what each head does across a folder."""
    from vit_explorer.methods.atlas import TEXTS_PER_HEAD

    atlas = commands.add_parser(
        "atlas", formatter_class=HelpFormatter,
        help="what each head does across a folder of images: its statistics, its share of each answer, its top images, "
             "and for a model that reads text its descriptions (TextSpan)",
        description="Streams SOURCE through the model and writes atlas.json (one entry per head) and heads.npz (the "
                    "per-image arrays) to --out; `torchrun --nproc-per-node N -m vit_explorer atlas …` shares the images "
                    "over N processes (the same atlas as one process makes). For a CLIP-like model each head is "
                    "described by the texts its outputs vary along (TextSpan, Gandelsman et al. 2024) over the project's "
                    "text bank or --text-bank, with the completeness check (zero-shot accuracy with the early heads "
                    "mean-ablated and the late ones replaced by their descriptions).")
    atlas.add_argument("source", help="a folder (one sub-folder per class gives labels), a text file of image paths, or a glob")
    atlas.add_argument("--model", default=DEFAULT_MODEL, help=spec_help)
    atlas.add_argument("--out", required=True, help="output folder")
    atlas.add_argument("--prompts", default=None,
                       help="a model that reads text: comma-separated prompts it answers among (default: 'a CLASS' per "
                            "class folder)")
    atlas.add_argument("--text-bank", default=None, help="a file of descriptions, one per line (default: the project's own)")
    atlas.add_argument("--texts-per-head", type=int, default=TEXTS_PER_HEAD, help="TextSpan descriptions per head")
    atlas.add_argument("--late-layers", type=int, default=None,
                       help="layers whose heads the completeness check replaces by their descriptions (default: the last "
                            "third; the others are mean-ablated)")
    atlas.add_argument("--batch-size", type=int, default=16, help="images per pass")
    atlas.add_argument("--limit", type=int, default=None, help="only the first N images")
    atlas.add_argument("--shard-size", type=int, default=SHARD_SIZE, help="images per resumable shard")
    atlas.add_argument("--resume", action="store_true", help="load the finished shards in --out/.shards instead of computing "
                                                             "them again")
    add_input_options(atlas)
    atlas.set_defaults(run=run_atlas)


def add_registers(commands: argparse._SubParsersAction, spec_help: str) -> None:
    """The command registers SOURCE: a model's register neurons, for a test-time register."""
    registers = commands.add_parser(
        "registers", formatter_class=HelpFormatter,
        help="find a model's register neurons over a folder, for a test-time register (Jiang et al. 2025)",
        description="Finds the high-norm outlier tokens of each image (the Token norms rule), the MLP neurons most active "
                    "at them, and writes the chosen ones to --out; `analyze --registers` and `serve --registers` then add "
                    "one token that takes their activation. Where no image has an outlier token, nothing is chosen and "
                    "the file changes nothing.")
    registers.add_argument("source", help="a folder of images, a text file of image paths, or a glob")
    registers.add_argument("--model", default=DEFAULT_MODEL, help=spec_help)
    registers.add_argument("--out", default="registers.json", help="the file to write")
    registers.add_argument("--top-k", type=int, default=None,
                           help="register neurons to choose (default: the authors' for the model's family, else 10)")
    registers.add_argument("--highest-layer", type=int, default=None,
                           help="the last layer a neuron may come from (default: the authors', else 5/12 of the depth)")
    registers.add_argument("--detect-layer", type=int, default=None,
                           help="the layer whose outputs' norms find the outliers, negative from the end (default: -1, "
                                "or the authors' for the model's family)")
    registers.add_argument("--batch-size", type=int, default=8, help="images per forward pass")
    add_input_options(registers)
    registers.set_defaults(run=run_registers)


def add_make_shapes(commands: argparse._SubParsersAction) -> None:
    """The command make-shapes DIR: a labelled set of generated shapes with masks."""
    make_shapes = commands.add_parser("make-shapes", formatter_class=HelpFormatter,
                                      help="write generated shapes with their masks: DIR/images/CLASS/*.png, "
                                           "DIR/masks/CLASS/*.png",
                                      description="Draws a labelled set of shapes with a mask per image, for `evaluate`.")
    make_shapes.add_argument("folder", help="where to write")
    make_shapes.add_argument("--count", type=int, default=600, help="how many images")
    make_shapes.add_argument("--seed", type=int, default=1, help="seed of the images")
    make_shapes.add_argument("--objects", type=int, default=1, choices=(1, 2),
                             help="shapes per image; 2: two different shapes apart, in DIR/images/A+B/, one mask per shape in "
                                  "DIR/masks/A+B/NNNNNN/A.png (evaluate then scores class-sensitive pointing)")
    make_shapes.set_defaults(run=run_make_shapes)


def with_command(argv: list[str]) -> list[str]:
    """``argv`` with ``serve`` put first where it names no command: a bare ``vit-explorer`` and ``vit-explorer --model SPEC
    --port N`` serve the app (the program's own ``--help`` and ``--version`` stay the program's)."""
    if argv and (not argv[0].startswith("-") or argv[0] in ("-h", "--help", "--version")):
        return argv
    return ["serve", *argv]


def main(argv: list[str] | None = None) -> int:
    arguments = parser().parse_args(with_command(sys.argv[1:] if argv is None else argv))
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
