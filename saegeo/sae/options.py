"""The options of `saegeo train` (TrainConfig) and `saegeo eval` (EvalConfig).

Torch-free on purpose: the command line builds its flags from these dataclasses and checks the values a user gave
before torch is imported (benchmarks/startup_bench.py); the architecture registry (torch) is asked only once it is
loaded, or for decoder_norm = "free", the architecture's defaults and its own options (read then: `options`). train.py and evaluate.py use them (and
re-export them).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from saegeo.config import DeviceOption, Dtype, ProgressOption, StreamOptions, check, option
from saegeo.errors import BadInputError, FormatError

BDecInit = Literal["mean", "zeros", "geometric_median"]

DecoderNorm = Literal["unit", "free"]

B_DEC_INITS: tuple[str, ...] = get_args(BDecInit)


def registered_architecture_names() -> tuple[str, ...]:
    """The names ``saegeo.sae.architectures.architecture_names()`` gives, without importing torch while it is not
    loaded: then only the package's own modules can have registered, and each registers itself by a top-level
    ``register_architecture("name", Cls)`` line of its source, read here (tests/sae/test_train_defaults.py holds
    the two equal)."""
    registry = sys.modules.get("saegeo.sae.architectures")
    if registry is not None and hasattr(registry, "architecture_names"):  # loaded: it may hold the user's own
        return registry.architecture_names()
    spec = importlib.util.find_spec("saegeo.sae.architectures")
    folders = spec.submodule_search_locations if spec is not None else None
    registered = re.compile(r"^register_architecture\(\s*[\"'](\w+)[\"']", re.M)
    names = {
        m for folder in folders or () for f in Path(folder).glob("*.py") for m in registered.findall(f.read_text())
    }
    return tuple(sorted(names))


def _registry_loaded() -> bool:
    registry = sys.modules.get("saegeo.sae.architectures")
    return registry is not None and hasattr(registry, "architecture_names")


def _options_class(arch: str) -> type:
    from saegeo.sae.architectures import get_architecture

    return get_architecture(arch).Options


def _free_decoder(arch: str) -> bool:
    from saegeo.sae.architectures import get_architecture  # torch: only for decoder_norm = "free"

    return get_architecture(arch).free_decoder


@dataclass
class TrainConfig(StreamOptions, DeviceOption):
    """One SAE training run. Token counts are rows (tokens) of activations."""

    arch: str = option(
        "topk",
        "SAE architecture: relu, topk, batchtopk, jumprelu, gated, abstopk or another registered one (saegeo.sae.architectures); "
        "its own options are --ARCH.OPTION (see below)",
    )
    d_sae: int | None = option(None, "number of latents (overrides expansion); default expansion · d_in", low=1)
    expansion: int = option(8, "d_sae = expansion · d_in", low=1)
    decoder_norm: DecoderNorm | None = option(
        None,
        "unit-norm decoder rows, or free norms folded to unit at the end (relu: penalty Σ a_i‖w_i‖; topk: latents "
        "chosen by pre·‖w_i‖, SAELens' form); default: the architecture's (topk free, the others unit)",
    )
    grad_clip_norm: float | None = option(
        None, "clip the gradient to this global norm; 0 = never (default: the architecture's; SAELens: 1)", low=0
    )
    lr: float | None = option(
        None, "Adam learning rate (default: the architecture's, Architecture.train_defaults)", low=0, high=1
    )
    adam_betas: tuple[float, float] = option((0.9, 0.999), "Adam (beta1, beta2)", low=0, below=1)
    warmup_steps: int = option(10, "linear warm-up from lr/warmup_steps to lr", low=0)
    decay_fraction: float = option(
        0.2, "linear decay to 0 over the last fraction of steps (0 = constant)", low=0, high=1
    )
    batch_tokens: int = option(4096, "tokens per optimiser step", low=1)
    total_tokens: int = option(2_000_000, "training tokens, e.g. 2M or 500k", low=1)
    b_dec_init: BDecInit = option(
        "mean", "b_dec at init: activation mean, zeros (SAELens' default) or geometric median"
    )
    b_dec_init_tokens: int = option(100_000, "rows used to estimate the mean / geometric median", low=1)
    dead_window_tokens: int = option(200_000, "a latent that has not fired in this many tokens counts as dead", low=1)
    heldout_fraction: float = option(0.1, "fraction of the data held out for the final metrics", low=0, below=1)
    shuffle_buffer: int = option(65_536, "store source: rows mixed across shards", low=0)
    seed: int = option(0, "seeds the init and the data order", low=0)
    log_every: int = option(10, "metrics are read back from the device only every log_every steps", low=1)
    checkpoint_every: int = option(0, "steps between checkpoints; 0 = no intermediate checkpoints", low=0)
    out_dir: str | None = option(
        None, "checkpoints and the final SAE (SAELens layout) go here", flag_name="out", old_flags=("--out-dir",)
    )
    num_threads: int | None = option(None, "torch.set_num_threads; None leaves torch's default", low=1, high=4096)
    overwrite: bool = option(False, "replace a finished SAE and discard a checkpoint in --out (start a new run)")
    dtype: Dtype = option(
        "float32",
        "compute dtype of the SAE's matmuls: bfloat16 runs the steps under torch.autocast (weights, Adam and "
        "the metrics stay float32); float16 is refused (it needs loss scaling)",
    )
    wandb: bool = option(False, "also log the training_log.jsonl records to Weights & Biases (pip install wandb)")
    wandb_project: str = option("saegeo", "the W&B project of --wandb")
    # each architecture's own options (Architecture.Options, in its module), by architecture name: TOML [train.topk]
    # k = 64, flags --topk.k 64, Python arch_options={"topk": {"k": 64}}; the one of `arch` is filled with its
    # defaults, the others are checked and kept (a [train] table shared by SAEs of several architectures)
    arch_options: dict[str, Any] = option(
        factory=dict, help="each architecture's options, by its name", flag=False, tables=True
    )
    # The options of the release before, when they were flat here; read into arch_options for one release, with a
    # deprecation warning (`--k 64` is `--topk.k 64` for a topk run, `--jumprelu.l0-target 64` for a jumprelu one)
    k: int | None = option(None, "deprecated: --ARCH.k (jumprelu: --jumprelu.l0-target)", low=1)
    l1_coefficient: float | None = option(None, "deprecated: --relu.l1-coefficient", low=0)
    l1_warmup_fraction: float | None = option(None, "deprecated: --relu.l1-warmup-fraction", low=0, high=1)
    aux_k: int | None = option(None, "deprecated: --topk.aux-k, --batchtopk.aux-k", low=1)
    aux_coefficient: float | None = option(
        None, "deprecated: --topk.aux-coefficient, --batchtopk.aux-coefficient", low=0
    )
    threshold_ema: float | None = option(None, "deprecated: --batchtopk.threshold-ema", above=0, high=1)
    l0_coefficient: float | None = option(None, "deprecated: --jumprelu.l0-coefficient", low=0)
    bandwidth: float | None = option(None, "deprecated: --jumprelu.bandwidth", above=0)
    threshold_lr_scale: float | None = option(None, "deprecated: --jumprelu.threshold-lr-scale", low=0)

    def __post_init__(self) -> None:
        self.adam_betas = tuple(self.adam_betas)
        check(self)
        if self.dtype == "float16":
            raise BadInputError(
                "dtype = float16: training in float16 needs loss scaling, which saegeo does not do; use bfloat16 "
                "(bf16) for mixed precision, or float32"
            )
        names = registered_architecture_names()
        if self.arch not in names:  # registered at run time: not a Literal
            raise BadInputError(
                f"arch = {self.arch!r}: expected one of {list(names)} (the registered architectures, "
                "saegeo.sae.architectures)"
            )
        if self.decoder_norm == "free" and not _free_decoder(self.arch):
            from saegeo.sae.architectures import architecture_names, get_architecture

            free = [name for name in architecture_names() if get_architecture(name).free_decoder]
            raise BadInputError(
                f"decoder_norm = 'free' is for {free} (their codes scale with each decoder row); a {self.arch} "
                "SAE trains with unit-norm decoder rows: leave decoder_norm unset or 'unit'"
            )
        unknown = sorted(set(self.arch_options) - set(names))
        if unknown:
            raise BadInputError(
                f"arch_options: {unknown} name no registered architecture; expected tables of {list(names)} "
                "(e.g. [train.topk] k = 64)"
            )
        if _registry_loaded():  # else at the first use of the options (`options`, `record`, `resolved`): no torch yet
            self._resolve_options()
        if self.b_dec_init not in B_DEC_INITS:
            raise BadInputError(f"b_dec_init={self.b_dec_init!r}; expected one of {B_DEC_INITS}")
        if self.total_tokens < self.batch_tokens:
            raise BadInputError(f"total_tokens ({self.total_tokens}) must be at least one batch ({self.batch_tokens})")

    def _resolve_options(self) -> None:
        """arch_options as {name: its Options} (each table checked), the deprecated flat options read into it (and
        cleared), `arch`'s own defaults filled in (`architecture_options`)."""
        given = {name: getattr(self, name) for name in LEGACY_OPTIONS if getattr(self, name) is not None}
        for name in given:
            setattr(self, name, None)
        if given:
            warnings.warn(
                f"TrainConfig options {sorted(given)} are deprecated: each is now its architecture's option "
                f"(TOML [train.{self.arch}], flags --{self.arch}.NAME); they are read for one more release",
                FutureWarning,
                stacklevel=5,
            )
        self.arch_options = architecture_options(self.arch, self.arch_options, given)

    @property
    def options(self) -> Any:
        """The options of the architecture trained (`arch_options[arch]`, its Options dataclass)."""
        if not isinstance(self.arch_options.get(self.arch), _options_class(self.arch)):
            self._resolve_options()
        return self.arch_options[self.arch]

    def record(self) -> dict[str, Any]:
        """This config as recorded (cfg.json's train_config, the checkpoint): every option, the architecture's
        own under arch_options[arch] alone (the others do not change this SAE)."""
        self.options  # noqa: B018  (resolved first)
        return recorded_options(dataclasses.asdict(self))

    @property
    def total_steps(self) -> int:
        return self.total_tokens // self.batch_tokens

    def resolved(self) -> TrainConfig:
        """This config with each option left unset (None) that the architecture gives a default for filled in
        (``Architecture.train_defaults``: lr, grad_clip_norm, decoder_norm), its own options resolved; what
        ``train_sae`` trains and records."""
        from saegeo.sae.architectures import get_architecture

        self.options  # noqa: B018  (resolved first)
        defaults = get_architecture(self.arch).train_defaults
        unset = {name: value for name, value in defaults.items() if getattr(self, name) is None}
        return dataclasses.replace(self, **unset) if unset else self


LEGACY_OPTIONS = (
    "k",
    "l1_coefficient",
    "l1_warmup_fraction",
    "aux_k",
    "aux_coefficient",
    "threshold_ema",
    "l0_coefficient",
    "bandwidth",
    "threshold_lr_scale",
)


def architecture_options(arch: str, given: Mapping[str, Any], legacy: Mapping[str, Any]) -> dict[str, Any]:
    """{architecture name: its Options} from the tables given (Options instances or dicts, each checked), the
    deprecated flat options read into every architecture that has one of that meaning (a shared [train] table) over
    the tables' values, and `arch`'s own defaults where nothing was given."""
    from saegeo.config import from_dict
    from saegeo.sae.architectures import architecture_names, get_architecture

    tables = {name: dict(dataclasses.asdict(t)) if dataclasses.is_dataclass(t) else t for name, t in given.items()}
    for name in architecture_names():
        renamed = {new: legacy[old] for old, new in get_architecture(name).legacy_options.items() if old in legacy}
        if renamed or name == arch:  # a deprecated option is given afresh (replace(cfg, k=8)): it wins
            tables[name] = {**(tables.get(name) or {}), **renamed}
    out = {}
    for name, table in tables.items():
        if not isinstance(table, Mapping):
            raise BadInputError(f"arch_options.{name} = {table!r}: expected a table of {name}'s options")
        options = get_architecture(name).Options
        try:
            out[name] = from_dict(options, table)
        except BadInputError as err:  # named as the flag and the TOML table name it: topk.k, [train.topk]
            field = str(err).split(" ", 1)[0]
            named = f"{name}.{err}" if field in {f.name for f in dataclasses.fields(options)} else str(err)
            raise BadInputError(f"{named} (--{name}.OPTION, [train.{name}])") from None
    return out


def recorded_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """A training config as recorded, from a TrainConfig's fields or a record of any release: the deprecated flat
    options moved into the trained architecture's table (a record from before the tables), that table alone kept,
    with its defaults."""
    from saegeo.sae.architectures import get_architecture

    config = dict(config)
    legacy = {name: config.pop(name) for name in LEGACY_OPTIONS if name in config}
    arch = config.get("arch", "topk")
    table = (config.get("arch_options") or {}).get(arch) or {}
    try:
        architecture = get_architecture(arch)
    except FormatError:  # an architecture no longer registered: its record as it is
        return {**config, "arch_options": {arch: dict(table)}}
    renamed = {new: legacy[old] for old, new in architecture.legacy_options.items() if legacy.get(old) is not None}
    options = dataclasses.asdict(architecture.Options(**{**renamed, **table}))
    return {**config, "arch_options": {arch: options}}


@dataclass
class EvalConfig(ProgressOption, DeviceOption):
    """`saegeo eval`: which model, SAE, hook and text; None fields come from the SAE's own metadata."""

    model: str | None = option(
        None,
        "'smollm2' (bundled decoder), 'minilm', a local HF dir, ...; default: the model the SAE's metadata names "
        "(its cfg.json model_name), refused before loading anything when it names none",
    )
    sae: str = option("", "the SAE: any SAE.load path or hub id (native or published); required")
    hook: str | None = option(None, "default: the SAE's hook_name")
    corpus: str = option("default", "text to evaluate on, as for `saegeo cache`")
    context: int | None = option(None, "default: the SAE's training context, else 128", low=2)
    max_tokens: int = option(4096, "tokens (window positions) evaluated", low=1)
    skip_tokens: int | None = option(
        None,
        "skip whole windows until this many tokens; default: the positions the "
        "SAE's training store read (held-out text)",
        low=0,
    )
    batch_windows: int = option(
        4,
        "windows per batch (the clean logits and probabilities and one variant's "
        "logits, batch × context × vocab each, are held; the mean ablation uses the batch's "
        "mean)",
        low=1,
    )
    pass_special: bool | None = option(
        None, "pass BOS/[CLS]/[SEP] through unreplaced; default: as the SAE's training store (decoders: yes)"
    )
    pass_norm_ratio: float | None = option(
        None, "also pass rows with ‖x‖ > m × window median (default: as the store)", above=1
    )
    text_field: str = option("text", "the field (JSON) or column (parquet, datasets) holding the text or the token ids")
    model_dtype: Dtype = option("float32", "dtype the model's weights are loaded in and its forward runs in")

    def __post_init__(self) -> None:
        check(self)
