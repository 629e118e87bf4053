"""The one config: params.yaml (or defaults) plus CLI flags -> one validated, typed, frozen object.

Nothing else in the package reads params.yaml. Every knob is declared once here (buildllm/knob.py
says how a declaration is read and checked); the code reads the Config object and nothing else.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from buildllm import profiles
from buildllm.errors import ConfigError
from buildllm.knob import MODEL_COMMANDS, build, knob, leaf_knobs, set_dotted
from buildllm.shape import ACTIVATIONS
from buildllm.yaml_text import read_yaml

ARCHITECTURES = ("classic", "modern")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
COMPILE_CHOICES = ("false", "true", "auto")
CORPUS_SOURCES = ("wiki_vital", "shakespeare", "files")
RECIPES = ("classic", "muon")  # the profiles' recipes: buildllm/profiles/*.yaml, docs/recipes.md
OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd")
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|cuda:\d+|mps|xla)$")
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N, mps, xla"
# A knob that only matters to a training run (its checkpoints, logging, resume) offers its flag where
# a run is planned.
PLANNING_COMMANDS = ("dry-run", "train", "estimate", "preflight")
TRAIN_COMMANDS = ("train", "preflight")


@dataclass(frozen=True)
class CorpusConfig:
    source: str = knob("wiki_vital", choices=CORPUS_SOURCES, control=True, help="where the documents come from")
    files: list = knob([], help="globs of plain-text files, used when source is `files`")
    name: str | None = knob(None, help="names the corpus's output folders; default: the source")
    # Above 0: training needs validation documents to report a validation loss.
    validation_percent: float = knob(5.0, minimum=0.1, maximum=50.0, help="share of documents held out")


@dataclass(frozen=True)
class TokenizeConfig:
    vocab_size: int | None = knob(None, minimum=257, control=True, help="BPE vocabulary size; default: the profile's")
    min_frequency: int = knob(2, minimum=1, help="a pair must occur this often to be merged")
    encode_chunk: int = knob(1000, minimum=1, help="documents per encode_batch call")
    # The tokenize stage builds each (dvc.yaml foreach): every vocabulary an iteration or preset uses.
    vocabularies: list[int] = knob([4096, 16384], minimum=257, help="the vocabularies the pipeline builds")


@dataclass(frozen=True)
class ModelConfig:
    """Overrides of the profile's model shape; None keeps the profile's value."""

    architecture: str | None = knob(
        None, choices=ARCHITECTURES, flag=True, help="classic (GPT-2) or modern (RMSNorm, rotary, SwiGLU)"
    )
    n_layer: int | None = knob(None, minimum=1, help="transformer blocks")
    n_head: int | None = knob(None, minimum=1, help="attention heads")
    n_embd: int | None = knob(None, minimum=1, help="model width")
    sequence_length: int | None = knob(None, minimum=2, flag=True, metavar="TOKENS", help="context length in tokens")
    dropout: float | None = knob(None, minimum=0.0, maximum=1.0, help="dropout probability")
    # The architecture knobs (docs/pipeline.md, "Architecture knobs"), one change each to measure alone.
    activation: str | None = knob(
        None,
        choices=ACTIVATIONS,
        flag=True,
        help="the MLP's: gelu, gelu_tanh (GPT-2's approximation), relu2 (relu(x)**2), swiglu; default: the profile's",
    )
    qk_norm: bool | None = knob(None, flag=True, help="RMS-normalise queries and keys per head; default: the profile's")
    zero_init_projections: bool | None = knob(
        None, flag=True, help="residual projections start at zero; default: the profile's"
    )
    tied_output: bool | None = knob(None, help="output layer shares the token embedding; default: the profile's")


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int | None = knob(
        None,
        minimum=1,
        flag=True,
        control=True,
        help="sequences per micro-batch; default: the profile's for the device",
    )
    grad_accum: int = knob(
        1,
        minimum=1,
        flag=True,
        control=True,
        resume=True,
        help="micro-batches per optimizer step",
    )
    epochs: int = knob(1, minimum=1, flag=True, control=True, resume=True, help="passes over the training examples")
    training_examples: int | None = knob(
        8000,
        minimum=1,
        flag=True,
        control=True,
        help="training windows used; null: every window in the token file",
    )
    validation_examples: int | None = knob(
        100,
        minimum=1,
        flag=True,
        control=True,
        resume=True,
        help="validation windows used",
    )
    recipe: str | None = knob(
        None,
        choices=RECIPES,
        flag=True,
        control=True,
        help="optimizer, schedule and learning rates as one named set (classic: GPT-2 with AdamW, the "
        "course's baseline); default: the profile's for the device",
    )
    optimizer: str | None = knob(
        None,
        choices=OPTIMIZERS,
        flag=True,
        resume=True,
        help="adamw, or muon (Muon on the hidden 2-D weights, AdamW on the rest); default: the recipe's",
    )
    learning_rate: float | None = knob(
        None,
        minimum=0.0,
        flag=True,
        metavar="LR",
        resume=True,
        help="AdamW's peak learning rate (with muon: of embeddings, head, norms, biases); default: the recipe's",
    )
    muon_learning_rate: float | None = knob(
        None,
        minimum=0.0,
        flag=True,
        metavar="LR",
        resume=True,
        help="Muon's peak learning rate (AdamW-matched scale); default: the recipe's, else --learning-rate",
    )
    schedule: str | None = knob(
        None,
        choices=SCHEDULES,
        flag=True,
        resume=True,
        help="cosine (warm-up, cosine decay) or wsd (warm-up, stable, linear decay); default: the recipe's",
    )
    decay_fraction: float | None = knob(
        None,
        minimum=0.0,
        maximum=1.0,
        resume=True,
        help="wsd: the share of the steps spent decaying; default: the recipe's",
    )
    min_learning_rate_ratio: float = knob(
        0.1, minimum=0.0, maximum=1.0, resume=True, help="the schedule ends at this share of the peak"
    )
    warmup_steps: int | None = knob(
        None,
        minimum=0,
        flag=True,
        resume=True,
        help="linear warm-up steps; default: 5%% of the planned optimizer steps",
    )
    weight_decay: float = knob(0.1, minimum=0.0, resume=True, help="AdamW weight decay on matrices")
    grad_clip: float = knob(1.0, minimum=0.0, resume=True, help="gradient norm clip (0: off)")
    log_interval: int = knob(
        10, minimum=1, flag=True, metavar="STEPS", help="steps between log rows", commands=PLANNING_COMMANDS
    )
    eval_interval: int = knob(
        50,
        minimum=0,
        flag=True,
        metavar="STEPS",
        help="steps between validations (0: only at the end)",
        commands=PLANNING_COMMANDS,
    )
    checkpoint_interval: int = knob(
        100,
        minimum=0,
        flag=True,
        metavar="STEPS",
        help="steps between checkpoints (0: only at the end)",
        commands=PLANNING_COMMANDS,
    )
    keep_checkpoints: int = knob(
        2,
        minimum=1,
        flag=True,
        help="newest checkpoints kept on disk",
        commands=PLANNING_COMMANDS,
    )
    checkpoint_directory: str = knob(
        "checkpoints/run",
        flag=True,
        metavar="DIR",
        help="where this run's checkpoints live; one run per directory (generate: a run's directory or one "
        "checkpoint file)",
        commands=PLANNING_COMMANDS + ("generate",),
    )
    workers: int | None = knob(None, minimum=0, flag=True, help="data-loader worker processes; default: the profile's")
    threads: int | None = knob(
        None,
        minimum=1,
        flag=True,
        control=True,
        help="torch CPU threads; default: the count `buildllm tune` measured fastest here, else torch's",
    )
    compile: str = knob(
        "auto",
        choices=COMPILE_CHOICES,
        flag=True,
        help="torch.compile the model: true, false, or auto (only where `buildllm tune` measured "
        "a speed-up here that pays back its compile time within this run)",
    )
    gradient_checkpointing: bool = knob(False, flag=True, help="recompute activations in backward to save memory")
    train_tokens: str | None = knob(
        None,
        flag=True,
        metavar="PATH",
        control=True,
        help="training token file; default: the tokenize stage's",
    )
    validation_tokens: str | None = knob(
        None,
        flag=True,
        metavar="PATH",
        control=True,
        help="validation token file; default: the tokenize stage's",
    )
    tokenizer: str | None = knob(
        None, flag=True, metavar="PATH", control=True, help="tokenizer JSON; default: the tokenize stage's"
    )
    resume: bool = knob(False, flag=True, help="continue the checkpoint directory's run", commands=TRAIN_COMMANDS)
    force: bool = knob(False, flag=True, help="resume even where the run's settings changed", commands=TRAIN_COMMANDS)
    # Not --force: that one resumes past changed settings, and trying a larger batch must not also do that.
    force_memory: bool = knob(
        False,
        flag=True,
        commands=("dry-run", "train", "benchmark"),
        help="run a plan whose memory estimate exceeds the free memory (refused otherwise)",
    )


@dataclass(frozen=True)
class BenchmarkConfig:
    warmup_steps: int = knob(3, minimum=1, help="steps run before timing (compile lands here)")
    measured_steps: int = knob(20, minimum=2, control=True, help="timed steps")
    intervals: int = knob(4, minimum=1, help="the timed steps are split into this many intervals")
    memory_budget: str | None = knob(
        None,
        flag=True,
        metavar="SIZE",
        help="batch-size finder's budget, e.g. 4GiB; default: free memory",
        commands=("benchmark",),
        size=True,
    )
    safety_margin: float = knob(0.1, minimum=0.0, maximum=0.9, help="batch finder keeps this share free")
    max_batch_size: int = knob(1024, minimum=1, help="batch finder's ceiling")


@dataclass(frozen=True)
class EstimateConfig:
    startup_seconds: float | None = knob(
        None, minimum=0.0, help="seconds added once for process start; default: measured"
    )


@dataclass(frozen=True)
class TuneConfig:
    seconds: float = knob(
        120.0,
        minimum=5.0,
        flag=True,
        metavar="S",
        commands=("tune",),
        help="`buildllm tune`'s time budget; what does not fit is skipped and said",
    )
    loss_steps: int = knob(
        30, minimum=2, help="steps each of fp32 and bf16 train before their validation losses are compared"
    )
    loss_tolerance: float = knob(
        0.05,
        minimum=0.0,
        help="bf16's validation loss must be within this many nats of fp32's for `precision: auto` to pick bf16",
    )


@dataclass(frozen=True)
class Config:
    device: str = knob(
        "auto",
        flag=True,
        metavar=DEVICE_CHOICES.replace(", ", "|"),
        help=f"where to run; one of {DEVICE_CHOICES}",
        commands=MODEL_COMMANDS + ("generate",),
    )
    precision: str = knob("auto", choices=PRECISIONS, flag=True, help="compute precision")
    mps_fallback: bool = knob(
        False,
        flag=True,
        help="on Apple MPS, run operators MPS lacks on the CPU instead of failing "
        "(sets PYTORCH_ENABLE_MPS_FALLBACK=1 before torch is imported)",
    )
    iteration: int = knob(
        1,
        choices=tuple(profiles.iterations()),
        flag=True,
        control=True,
        help="the course's iteration: " + ", ".join(f"{n} {p}" for n, p in profiles.iterations().items()),
        commands=MODEL_COMMANDS + ("tokenize",),
    )
    preset: str | None = knob(
        None,
        choices=profiles.presets(),
        flag=True,
        control=True,
        help="a preset replaces the iteration's profile",
        commands=MODEL_COMMANDS + ("tokenize",),
    )
    seed: int = knob(
        1337, minimum=0, flag=True, resume=True, help="random seed", commands=MODEL_COMMANDS + ("generate",)
    )
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    tokenize: TokenizeConfig = field(default_factory=TokenizeConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    benchmark: BenchmarkConfig = field(default_factory=BenchmarkConfig)
    estimate: EstimateConfig = field(default_factory=EstimateConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)


def profile_for(config: Config) -> profiles.Profile:
    """The profile the config selects, its model shape overridden by the `model:` values and by
    tokenize.vocab_size: the tokenizer's vocabulary is the model's too."""
    profile = profiles.selected(config.iteration, config.preset)
    overrides = {k: v for k, v in vars(config.model).items() if v is not None}
    if config.tokenize.vocab_size is not None:
        overrides["vocab_size"] = config.tokenize.vocab_size
    return profile.with_model(**overrides)


def knobs() -> list[tuple[str, Any, Any]]:
    return leaf_knobs(Config)


def value_at(config: Config, dotted: str) -> Any:
    return functools.reduce(getattr, dotted.split("."), config)


def control_keys() -> tuple[str, ...]:
    return tuple(key for key, f, _ in knobs() if f.metadata.get("control"))


def load_config(path: str | Path | None = "params.yaml", overrides: Mapping[str, Any] | None = None) -> Config:
    """Read params.yaml (absent file: defaults), apply dotted overrides, validate everything."""
    data: dict = {}
    if path is not None and Path(path).exists():
        data = read_yaml(path) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping of keys to values, not {type(data).__name__}")
    elif path is not None and str(path) != "params.yaml":
        raise ConfigError(f"params file {path} does not exist; pass an existing file to --params")
    return _validated(data, overrides or {})


def with_overrides(config: Config, overrides: Mapping[str, Any]) -> Config:
    """A new validated Config with dotted keys replaced (used by sweeps over presets or threads)."""
    return _validated(asdict(config), overrides)


def _validated(data: dict, overrides: Mapping[str, Any]) -> Config:
    for dotted, value in overrides.items():
        set_dotted(data, dotted, value)
    config = build(Config, data)
    if not DEVICE_PATTERN.match(config.device):
        raise ConfigError(f"device={config.device!r} is not a device; allowed: {DEVICE_CHOICES}")
    return config


def config_to_dict(config: Config) -> dict:
    return asdict(config)


def defaults_dict() -> dict:
    """The defaults as params.yaml would hold them (tests check params.yaml against this)."""
    return asdict(Config())
