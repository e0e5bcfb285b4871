"""What the app keeps between events: the shared model cache, one browser tab's session (its analysis,
its selection and what its screen shows), the view controls, the curated model list, and the folder of
export zips."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from vit_explorer.core import maps
from vit_explorer.core.analysis import DEFAULT_MEMORY_BUDGET, Analysis, ClassEvidence
from vit_explorer.core.comparison import Comparison
from vit_explorer.core.register_neurons import RegisterNeurons
from vit_explorer.models import STAGE_MARK, LoadedModel, load_model, stage_view
from vit_explorer.models.builtin import builtin_names
from vit_explorer.run import registered

EXPORT_DIR_NAME = "vit-explorer-exports"
CACHE_TTL_S = 3600  # seconds generated images, uploads and export zips stay on disk


class ModelCache:
    """The last ``capacity`` loaded models, shared by all sessions (loading is serialised), and the
    memory budget their analyses keep to."""

    def __init__(self, capacity: int = 2, memory_budget: int = DEFAULT_MEMORY_BUDGET,
                 input_hw: tuple[int, int] | None = None, registers: RegisterNeurons | None = None) -> None:
        self.capacity = capacity
        self.memory_budget = memory_budget  # bytes of maps per analysis, see ``analyze``
        self.input_hw = input_hw  # every model's input (None: each model's own), for models that allow another
        self.registers = registers  # ``serve --registers``: the Test-time register tab's neurons, for their model
        self._models: OrderedDict[str, LoadedModel] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, spec: str, model: LoadedModel) -> None:
        """Make an already built model available under ``spec`` (for models built in code)."""
        with self._lock:
            self._models[spec] = model
            while len(self._models) > self.capacity:
                self._models.popitem(last=False)

    def get(self, spec: str) -> LoadedModel:
        base, marked, stage = spec.partition(STAGE_MARK)
        with self._lock:
            if spec in self._models:
                self._models.move_to_end(spec)
                return self._models[spec]
            # another stage of a loaded model shares its module
            model = (stage_view(self._models[base], int(stage)) if marked and base in self._models and stage.isdigit()
                     else load_model(spec, input_hw=self.input_hw))
        self.put(spec, model)
        return model

    def with_register(self, model: LoadedModel) -> LoadedModel | None:
        """``model`` with the test-time register of ``registers`` (made once, then kept beside the other models), or None
        where there is no file, it is for another model, or it changes nothing."""
        registers = self.registers
        if registers is None or registers.model != model.name or registers.changes_nothing:
            return None
        spec = f"{model.name} + test-time register"
        with self._lock:
            kept = self._models.get(spec)
        if kept is None:
            kept = registered(model, registers)
            self.put(spec, kept)
        return kept


@dataclass(frozen=True)
class ModelInputs:
    """The controls whose change runs the model: the fit of an image to the model's input (``images.FITS``),
    which analyses the image again, and the Compare tab's second side (its own gr.State, set by its own
    events: one more analysis)."""

    fit: str = "stretch"
    comparison: Comparison | None = None
    prompts: str = ""  # a CLIP-like model's text prompts, one per line: they become its classes (``core.targets``)


@dataclass(frozen=True)
class Controls:
    """The values of the controls: view settings, whose change only re-renders from the cached maps, and the
    ``inputs`` whose change runs the model. The app wires each control component by its name
    (``CONTROL_NAMES``: the view settings, then the inputs), and ``from_values`` matches the values back by name."""

    cmap: str = "inferno"
    overlay: bool = True
    normalisation: str = "per tile"
    order_by: str = "none"
    # the rollout options' defaults are ``maps.RolloutOptions``'s
    head_fusion: str = maps.RolloutOptions.head_fusion
    discard_ratio: float = maps.RolloutOptions.discard_ratio
    start_layer: int = maps.RolloutOptions.start_layer
    residual_weight: float = maps.RolloutOptions.residual_weight
    method: str = "relevance"  # the class-maps tab's map
    colour_scale: str = "linear"  # what the colormap's ends stand for (``render.COLOUR_SCALES``)
    ablation_mode: str = "zero"  # how the head ablation tab removes a head (``interventions.ABLATION_MODES``)
    stats_folder: str = ""  # a ``vit-explorer stats`` output folder whose dataset the head statistics are shown against
    # the Compare tab's view, A's layer (B's is at the same relative depth), the head ("h3"; None or "mean of heads":
    # the mean) and the head statistic it overlays
    compare_view: str = "rollout"
    compare_layer: int = 0
    compare_head: str | None = None
    compare_statistic: str = "distance"
    inputs: ModelInputs = field(default_factory=ModelInputs)

    @classmethod
    def named(cls, **values: object) -> Controls:
        """The controls from values by name, view settings and inputs alike (``Controls.named(cmap="gray", fit="pad")``)."""
        inputs = {name: values.pop(name) for name in INPUT_NAMES if name in values}
        return cls(**values, inputs=ModelInputs(**inputs))

    @classmethod
    def from_values(cls, values: Sequence) -> Controls:
        """The controls from the values Gradio passes for the ``CONTROL_NAMES`` components, matched by name; a count
        that differs from the names (a component wired without its name, or one too many) raises."""
        return cls.named(**dict(zip(CONTROL_NAMES, values, strict=True)))

    def values(self) -> tuple:
        """The values in ``CONTROL_NAMES`` order, as the app passes them (for API clients and tests)."""
        return tuple(getattr(self.inputs if name in INPUT_NAMES else self, name) for name in CONTROL_NAMES)

    def with_inputs(self, **changes: object) -> Controls:
        return replace(self, inputs=replace(self.inputs, **changes))

    @property
    def fit(self) -> str:
        return self.inputs.fit

    @property
    def comparison(self) -> Comparison | None:
        return self.inputs.comparison

    @property
    def prompts(self) -> str:
        return self.inputs.prompts

    @property
    def rollout(self) -> maps.RolloutOptions:
        return maps.RolloutOptions(self.head_fusion, float(self.discard_ratio), int(self.start_layer),
                                   float(self.residual_weight))


VIEW_NAMES = tuple(field.name for field in fields(Controls) if field.name != "inputs")
INPUT_NAMES = tuple(field.name for field in fields(ModelInputs))
CONTROL_NAMES = VIEW_NAMES + INPUT_NAMES


@dataclass
class Screen:
    """What the browser shows of one analysis: what each tab last drew and from what, each tab's own view state (a
    clicked head, a slider's layer, the last score), and the tab open; kept on the session and updated in place like
    the rest of it, and made anew for a new analysis or target."""

    shown: dict[str, Hashable] = field(default_factory=dict)  # per app tab: what its views were last drawn from
    tabs: dict[str, Any] = field(default_factory=dict)  # per app tab: its own view state (``Tab.state``)
    # the tab last drawn (the open one) and the controls it was drawn with: what a quick answer draws
    open_tab: str | None = None
    controls: Controls | None = None
    # per tab: the views it last drew (pictures as files) and what they were drawn from (``tabs.base.drawn``): a quick
    # answer draws a click's or an upload's views ahead of its Gradio event (``web.quick_answer``), which sends the same
    # files instead of drawing them again
    drawn: dict[str, tuple[Hashable, dict]] = field(default_factory=dict)
    drawing: threading.Lock = field(default_factory=threading.Lock, repr=False)


@dataclass(eq=False)
class Session:
    """What one browser tab holds: its analysis, what is selected in it, and what its screen shows.

    Plainly mutable: the browser tab's events change its selection in place and hand the same object back to
    Gradio's state (a new upload makes a new session), so no event can write back an older copy over a newer one.
    ``evidence`` is the gradient evidence of the target class (None for a model without a classifier); changing
    the target is the one control besides an upload that runs the model.
    """

    analysis: Analysis
    model_spec: str
    query: int | None
    layer: int
    head: int | None  # None: the mean of heads
    evidence: ClassEvidence | None = None
    screen: Screen = field(default_factory=Screen, compare=False)
    # the model the target is scored with where it is not the spec's: a backbone's similarity model once a similarity
    # target is chosen (its one "class" is the similarity score), or a CLIP model's prompt model once prompts are given
    # (its classes are the prompts, ``core.targets``); ``analysis`` is then its analysis
    target_model: LoadedModel | None = None
    similarity_choice: str | None = None  # which one: a key of ``SIMILARITY_TARGETS``
    similarity_patch: tuple[int, int] | None = None  # the query patch of the "patch" similarity
    # held while a target is being chosen: the target menu's events for one session run one at a time
    choosing: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # the app's shared model cache, for the explicit model work a tab asks for before it draws (``Tab.prepare``)
    models: ModelCache | None = field(default=None, repr=False, compare=False)

    @property
    def target(self) -> int | None:
        """The target class, None for a model without a classifier (and a backbone before a similarity is chosen)."""
        return None if self.evidence is None else self.evidence.target

    def model(self, models: ModelCache | None = None) -> LoadedModel:
        """The model the session's target is scored with: the similarity or prompt model where there is one, else its
        spec's (from ``models``, by default the cache the session was made with)."""
        return self.target_model if self.target_model is not None else (models or self.models).get(self.model_spec)


# a backbone's targets, by the target dropdown's value
SIMILARITY_TARGETS = {"own": "similarity to its own embedding", "patch": "the query patch: its own output token"}


def query_place(analysis: Analysis, query: int | None) -> tuple[float, float] | None:
    """Where the query patch's centre is on the image, as fractions of its height and width; None for a prefix token or
    the default query. On another grid, ``pictures.token_at`` of it in a picture of 1 × 1 is the patch that covers it."""
    patch = None if query is None else analysis.layout.token_patch(query)
    if patch is None:
        return None
    rows, cols = analysis.grid
    return (patch[0] + 0.5) / rows, (patch[1] + 0.5) / cols


def new_session(analysis: Analysis, model_spec: str, evidence: ClassEvidence | None, models: ModelCache | None = None) -> Session:
    return Session(analysis=analysis, model_spec=model_spec, query=maps.default_query(analysis),
                   layer=analysis.map_shape[0] - 1, models=models, head=None, evidence=evidence)


def export_dir(ttl_s: float = CACHE_TTL_S) -> Path:
    """The folder of what the app writes for a user (export zips, report folders, atlases computed in the page); what is
    older than ``ttl_s`` is removed each time it is used."""
    folder = Path(tempfile.gettempdir()) / EXPORT_DIR_NAME
    folder.mkdir(exist_ok=True)
    cutoff = time.time() - ttl_s
    for old in folder.iterdir():
        try:
            stale = old.stat().st_mtime < cutoff
        except FileNotFoundError:  # another session's export moved or removed it since the listing
            continue
        if stale:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
    return folder


CURATED_TIMM = (
    "vit_small_patch16_224.augreg_in21k_ft_in1k",
    "deit_small_patch16_224.fb_in1k",
    "vit_small_patch16_224.dino",
    "vit_small_patch14_reg4_dinov2.lvd142m",
)
CURATED_HF = ("google/vit-base-patch16-224", "facebook/dinov2-with-registers-small", "openai/clip-vit-base-patch32")
CURATED_OPEN_CLIP = ("ViT-B-32@laion2b_s34b_b79k",)  # with its text tower: prompts
# architectures to try with no download: the real token layout (class, distillation, register tokens), random weights
CURATED_TIMM_RANDOM = ("vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224", "vit_small_patch14_reg4_dinov2")


def model_choices(initial: str, stages: list[str] | None = None) -> list[str]:
    """The built-in models, then well-known hub models for the families whose package is installed; a model with stages
    (a Swin) is offered at each of them (``stages``: ``models.stage_specs``), after the model chosen."""
    from importlib.util import find_spec

    names = [f"builtin:{name}" for name in builtin_names()]
    if find_spec("timm") is not None:
        names += [f"timm:{name}" for name in CURATED_TIMM]
        names += [f"timm:{name}@random" for name in CURATED_TIMM_RANDOM]
    if find_spec("transformers") is not None:
        names += [f"hf:{name}" for name in CURATED_HF]
    if find_spec("open_clip") is not None:
        names += [f"open_clip:{name}" for name in CURATED_OPEN_CLIP]
    chosen = [name for name in dict.fromkeys([initial, *(stages or [])]) if name not in names]
    return chosen + names


