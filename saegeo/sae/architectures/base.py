"""What an SAE architecture is to saegeo, and the one registry of them.

An architecture is one module of saegeo.sae.architectures (found by `discover`, no import list to edit) holding
everything about it, as a dictionary_learning trainer file does: its training options (`Options`, a config
dataclass nested under TrainConfig, so its flags and TOML keys are generated like every other option), the tensors
it adds to the SAE's four (`extra_tensors`, declared), its encode, its training objective (a forward that returns
its loss terms by name, as sparsify's does: the trainer logs whatever comes back), its init and threshold updates,
and the names it is saved and read under in the peers' formats (`saved_names`, looked up by `by_saved_name`).
`SAE` (encode, forward, persistence), the trainer, the format readers and the report ask the registry; none of
them branches on an architecture's name. An architecture defined elsewhere (a test, a notebook) registers itself
with `register_architecture("name", Cls)`. `SAEConfig` lives here too: the format readers build it without the
model (saegeo.sae.model re-exports it). The `sae` the methods take is a saegeo.sae.model.SAE.
"""

from __future__ import annotations

import dataclasses
import importlib
import numbers
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.errors import BadInputError, FormatError

TOPK_ORDERS = ("relu_then_topk", "topk_then_relu")
INPUT_NORMALIZATIONS = ("none", "layer_norm", "constant_norm_rescale")


@dataclass
class SAEConfig:
    """Everything needed to rebuild the encode/decode of an SAE (shapes come from d_in, d_sae)."""

    d_in: int
    d_sae: int
    activation: str = "topk"  # a registered architecture (saegeo.sae.architectures)
    k: int | None = None  # topk: active latents per row; batchtopk: the training k (inference uses threshold)
    # topk order. relu_then_topk (sparsify): top-k of relu(pre). topk_then_relu (SAELens, OpenAI):
    # relu of the top-k of pre. Dense codes are identical; the chosen *indices* differ when a row
    # has fewer than k positive pre-activations (zeros vs. the least negative latents).
    topk_order: str = "relu_then_topk"
    apply_b_dec_to_input: bool = True  # subtract b_dec before encoding (SAELens, sparsify) or not (Gemma Scope npz)
    # SAELens TopK option: pre-activations scaled by ‖W_dec[i]‖ before TopK, codes divided by it in decode
    rescale_acts_by_decoder_norm: bool = False
    input_normalization: str = "none"  # "layer_norm": OpenAI's per-row LayerNorm, inverted after decode
    layer_norm_eps: float = 1e-5
    dtype: str = "float32"
    # Matryoshka: the nested prefixes' widths w_1 < … < w_G = d_sae (latents [0, w_ℓ) form level ℓ); the report
    # measures each prefix. Encode ignores it; every reader fills it where the files say (SAELens metadata,
    # dictionary_learning group_sizes)
    matryoshka_widths: list[int] | None = None

    def __post_init__(self) -> None:
        for name in ("d_in", "d_sae", "k"):  # a count: never a bool, a float or a string (one-line error)
            value = getattr(self, name)
            if value is None and name == "k":
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise FormatError(f"SAEConfig.{name} must be an integer >= 1, got {value!r}")
            setattr(self, name, int(value))
        try:
            arch = get_architecture(self.activation)
        except FormatError as err:
            raise FormatError(f"SAEConfig.activation: {err}") from None
        if self.matryoshka_widths is not None:
            self.matryoshka_widths = nested_widths(self.matryoshka_widths, self.d_sae)
        arch.check_config(self)
        if self.topk_order not in TOPK_ORDERS:
            raise FormatError(f"SAEConfig.topk_order={self.topk_order!r}; expected one of {TOPK_ORDERS}")
        if self.input_normalization not in INPUT_NORMALIZATIONS:
            raise FormatError(
                f"SAEConfig.input_normalization={self.input_normalization!r}; expected one of {INPUT_NORMALIZATIONS}"
            )

    def to_dict(self) -> dict:
        return asdict(self)


def nested_widths(widths: Any, d_sae: int) -> list[int]:
    """`widths` as a list of ints, checked to be nested prefix widths 1 ≤ w_1 < … < w_G = d_sae (FormatError)."""
    values = list(widths) if isinstance(widths, (list, tuple)) else None
    if (
        not values
        or any(isinstance(w, bool) or not isinstance(w, numbers.Integral) for w in values)
        or values[0] < 1
        or any(b <= a for a, b in zip(values, values[1:]))
        or values[-1] != d_sae
    ):
        raise FormatError(f"SAEConfig.matryoshka_widths must rise strictly from >= 1 to d_sae={d_sae}, got {widths!r}")
    return [int(w) for w in values]


class TrainOutput(NamedTuple):
    """What one training forward pass returns; losses are scalars, the rest is for metrics."""

    loss: Tensor  # total objective
    sse: Tensor  # Σ ‖x − x̂‖² over the batch (float32 scalar)
    centred_ss: Tensor  # Σ ‖x − mean_batch(x)‖²
    l0_sum: Tensor  # Σ over rows of the number of active latents
    fired: Tensor  # (d_sae,) bool: latent active on some row of the batch
    fire_count: Tensor  # (d_sae,) number of rows each latent fired on
    # the architecture's loss terms by name (AuxK, L1, L0 penalty, ...), each before its coefficient and detached:
    # the trainer logs the mean of each per step under its name (training_log.jsonl), whatever the names are
    terms: Mapping[str, Tensor] = {}
    state: Mapping[str, Tensor] = {}  # what the architecture's after_step reads (batchtopk: min_kept); not logged


@dataclass(frozen=True)
class ExtraTensor:
    """A tensor an architecture adds to the SAE's W_enc, b_enc, W_dec, b_dec (JumpReLU's per-latent threshold).

    shape(cfg) gives its shape; `trained`: an nn.Parameter the trainer optimises (zero-initialised, its gradient
    turned on by `Architecture.param_groups`), else a buffer; `in_file`: written to and required in the weights
    file (the readers check its shape), else zero when a file does not hold it."""

    shape: Callable[[SAEConfig], tuple[int, ...]]
    trained: bool = False
    in_file: bool = False


@dataclass
class NoOptions:
    """The options of an architecture that has none."""


class Architecture:
    """One SAE architecture. Subclasses implement `encode` and `forward_train`; the rest has defaults that fit
    an architecture without a threshold, trained with a unit-norm decoder and Adam on every parameter.

    `tcfg` below is a `saegeo.sae.train.TrainConfig`: each architecture reads the training options it uses.
    """

    name: str = ""  # set by register_architecture
    # the training options only this architecture reads: a config dataclass (saegeo.config.option fields), nested
    # under TrainConfig as arch_options[name] (TOML [train.<name>], flags --<name>.<option>)
    Options: ClassVar[type] = NoOptions
    # TrainConfig's flat options of the release before (`--k`, `k = 32` in [train]) -> this architecture's option of
    # that meaning: still read, with a deprecation warning, for one release
    legacy_options: ClassVar[dict[str, str]] = {}
    # the names this architecture is saved and read under in the peers' formats: "saelens" (cfg.json
    # "architecture"; default: its own name), "dictionary_learning" (dictionary classes), "sparsify" (activation),
    # "openai" (activation class); a str or a tuple of them, the first the one it is saved under
    saved_names: ClassVar[dict[str, str | tuple[str, ...]]] = {}
    # the tensors it adds to the four (see ExtraTensor). Every SAE holds a `threshold`: published files and older
    # checkpoints carry one; by default a scalar buffer that no code reads.
    extra_tensors: ClassVar[dict[str, ExtraTensor]] = {"threshold": ExtraTensor(lambda cfg: (1,))}
    # a tensor the SAELens layout names otherwise (saegeo's name -> the file's: gated's b_enc is SAELens' b_gate);
    # saved_tensors writes the file's name, the SAELens reader reads it back
    file_tensor_names: ClassVar[dict[str, str]] = {}
    uses_k: bool = False  # SAEConfig.k is set from the option `k` (topk, batchtopk) or the L0 target (jumprelu)
    topk_codes: bool = False  # exactly k (values, indices) per row: encode_topk and the sparse decode apply
    # each code a function of its own latent's pre-activation and parameters (`encode_latents`): blocks of latents
    # encode on their own and their nonzero codes together are the whole row's (`sparse_codes`)
    latent_wise: bool = False
    init_encoder_scale: float = 1.0  # SAE.init_weights' tied encoder W_enc = scale · W_decᵀ
    # TrainConfig options this architecture fills in when they are left unset (TrainConfig.resolved); the values
    # are those measured best on MiniLM layer 3 by benchmarks/train_bench.py (benchmarks/README.md)
    train_defaults: dict[str, Any] = {"lr": 3e-4, "grad_clip_norm": 0.0, "decoder_norm": "unit"}
    # decoder_norm "free" trains this architecture with free decoder-row norms, folded to unit rows at the end
    # (`scale_latents` must then keep which latents fire: relu by homogeneity, topk by choosing on pre·‖w_i‖)
    free_decoder: bool = False
    trains_rescaled: bool = False  # forward_train honours SAEConfig.rescale_acts_by_decoder_norm

    def __repr__(self) -> str:
        saved = f", saved as {self.saved_name('saelens')!r}" if self.saved_name("saelens") != self.name else ""
        return f"<architecture {self.name!r} ({type(self).__name__}){saved}>"

    def saved_name(self, library: str) -> str | None:
        """The name this architecture is saved under in `library`'s format (SAELens: its own name by default)."""
        names = self.read_names(library)
        return names[0] if names else None

    def read_names(self, library: str) -> tuple[str, ...]:
        """Every name `library`'s files or objects give this architecture under (read back as this one)."""
        names = self.saved_names.get(library, self.name if library == "saelens" else ())
        return names if isinstance(names, tuple) else (names,)

    def options(self, tcfg: Any) -> Any:
        """This architecture's options in the training config (an instance of `Options`)."""
        return tcfg.arch_options[self.name]

    # ------------------------------------------------------------------ the model
    def check_config(self, cfg: SAEConfig) -> None:
        """Refuse an SAEConfig this architecture cannot run (FormatError)."""

    def file_tensor_shapes(self, cfg: SAEConfig) -> dict[str, tuple[int, ...]]:
        """The extra tensors a weights file must hold for this architecture, and their shapes."""
        return {name: tuple(t.shape(cfg)) for name, t in self.extra_tensors.items() if t.in_file}

    # ------------------------------------------------------------------ inference
    def encode(self, sae, pre: Float[Tensor, "n d_sae"]) -> Float[Tensor, "n d_sae"]:
        """Dense codes from the pre-activations, ≥ 0 unless the architecture keeps signs (abstopk); a latent-wise
        architecture: `encode_latents` of them all."""
        if self.latent_wise:
            return self.encode_latents(sae, pre, slice(0, pre.shape[-1]))
        raise NotImplementedError

    def encode_latents(self, sae, pre: Float[Tensor, "n b"], latents: slice) -> Float[Tensor, "n b"]:
        """Codes of the latents `latents` (a block of d_sae) from their own pre-activations: latent-wise only."""
        raise NotImplementedError(f"architecture {self.name!r} is not latent-wise")

    def sparse_codes(self, sae, blocks: Iterable[tuple[slice, Tensor]], max_entries: int | None = None) -> Any:
        """The nonzero codes of n rows as row-major COO (rows, latents, values), rows ascending and each row's latents
        ascending: the order `Tensor.nonzero` gives on the dense codes, whatever the blocks. `blocks` yields
        (latents, pre-activations of those latents), consecutive blocks covering 0 … d_sae − 1 in order.

        Latent-wise: each block's nonzeros, concatenated -- exact, a code depends on its own latent alone. Any other
        architecture: the blocks put back together and `encode` of the whole (no saving). None as soon as more than
        `max_entries` nonzeros are found (the caller retries on fewer rows; an architecture with at most k codes a row
        may ignore it)."""
        if not self.latent_wise:
            codes = self.encode(sae, torch.cat([pre for _, pre in blocks], dim=-1))
            rows, cols = codes.nonzero(as_tuple=True)
            if max_entries is not None and rows.numel() > max_entries:
                return None
            return rows, cols, codes[rows, cols]
        parts, n_entries = [], 0
        for latents, pre in blocks:
            codes = self.encode_latents(sae, pre, latents)
            rows, cols = codes.nonzero(as_tuple=True)
            parts.append((rows, cols + latents.start, codes[rows, cols]))
            del codes
            n_entries += rows.numel()
            if max_entries is not None and n_entries > max_entries:
                return None
        return row_major(*(torch.cat(t) for t in zip(*parts)), n_latents=int(sae.cfg.d_sae))

    def encode_topk(self, sae, pre: Float[Tensor, "n d_sae"]) -> tuple[Float[Tensor, "n k"], Int[Tensor, "n k"]]:
        """(values, latent indices), k per row: only for architectures with `topk_codes`."""
        raise BadInputError(f"encode_topk needs a topk SAE, this one is {self.name!r}")

    def reconstruct(self, sae, pre: Float[Tensor, "n d_sae"], norm_state: tuple | None) -> Float[Tensor, "n d_in"]:
        """x̂ from the pre-activations of normalised inputs (default: the dense decode of `encode`)."""
        return sae.decode(self.encode(sae, pre), norm_state=norm_state)

    def scale_latents(self, sae, scale: Float[Tensor, " d_sae"]) -> None:
        """Multiply each latent's code by scale_i without changing which latents fire (decoder-norm folding);
        only for positively homogeneous architectures."""
        raise FormatError(f"cannot fold decoder norms into a {self.name} SAE without changing its codes")

    # ------------------------------------------------------------------ training
    def forward_train(
        self,
        sae,
        x: Float[Tensor, "n d_in"],
        *,
        centred_ss: Tensor,
        centred_ss_fn: Callable[[Tensor], Tensor],
        dead_mask: Tensor | None,
        **options: Any,
    ) -> TrainOutput:
        """The training objective on one batch; `options` are those of `step_options` (unknown ones ignored)."""
        raise NotImplementedError(f"architecture {self.name!r} cannot be trained")

    def sae_config_fields(self, tcfg: Any, d_sae: int) -> dict[str, Any]:
        """SAEConfig fields set from the training options (beyond d_in, d_sae, activation), for `d_sae` latents."""
        return {"k": self.options(tcfg).k} if self.uses_k else {}

    def unit_decoder(self, tcfg: Any) -> bool:
        """Whether decoder rows are kept at unit norm during training (otherwise folded to unit at the end); an unset
        decoder_norm is this architecture's default."""
        return not (self.free_decoder and (tcfg.decoder_norm or self.train_defaults["decoder_norm"]) == "free")

    def option_summary(self, tcfg: Any) -> str:
        """This architecture's options as the trainer's summary prints them ("k=32"): by default each one."""
        options = self.options(tcfg)
        return ", ".join(f"{f}={_shown(getattr(options, f))}" for f in options.__dataclass_fields__)

    def param_groups(self, sae, tcfg: Any) -> list[dict]:
        """Adam's parameter groups, each with an `lr_scale`: by default one of every parameter, the trained extra
        tensors' gradients turned on."""
        for name, extra in self.extra_tensors.items():
            if extra.trained:
                getattr(sae, name).requires_grad_(True)
        return [{"params": list(sae.parameters()), "lr_scale": 1.0}]

    def init_training(self, sae, tcfg: Any, sample_rows: Callable[[int], Tensor]) -> None:
        """After SAE.init_weights of a new run: what else this architecture initialises; `sample_rows(n)` gives
        up to n training rows."""

    def step_options(self, tcfg: Any, step: int, d_in: int) -> dict[str, Any]:
        """The keyword options of `forward_train` at this step."""
        return {}

    def after_step(
        self, sae, out: TrainOutput, step: int, tcfg: Any, mean_across_ranks: Callable[[Tensor], Tensor]
    ) -> None:
        """After each optimiser step (thresholds); `mean_across_ranks` averages a tensor over DDP ranks."""

    # ------------------------------------------------------------------ persistence (SAELens layout)
    def saved_form(self, cfg: SAEConfig) -> tuple[SAEConfig, dict]:
        """The SAEConfig written to disk and the provenance to record with it (default: as it is)."""
        return cfg, {}

    def saved_tensors(self, sae, cfg: SAEConfig) -> dict[str, Tensor]:
        """The tensors written to sae_weights.safetensors, in the SAELens layout: the four and the extra tensors
        kept in the file."""
        return {
            "W_enc": sae.W_enc.detach(),
            "W_dec": sae.W_dec.detach(),
            "b_enc": sae.b_enc.detach(),
            "b_dec": sae.b_dec.detach(),
            **{name: getattr(sae, name).detach() for name in self.file_tensor_shapes(cfg)},
        }

    def saelens_fields(self, cfg: SAEConfig) -> dict[str, Any]:
        """Architecture-specific SAELens cfg.json keys (e.g. topk's k)."""
        return {}

    def saelens_metadata(self, cfg: SAEConfig) -> dict[str, Any]:
        """Keys of cfg.json's metadata that this (trained) architecture adds, as SAELens records a training
        architecture saved in another form (matryoshka: training_architecture, training_architecture_details)."""
        return {}


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def row_major(
    rows: Int[Tensor, " nnz"], cols: Int[Tensor, " nnz"], values: Float[Tensor, " nnz"], *, n_latents: int
) -> tuple[Tensor, Tensor, Tensor]:
    """COO entries sorted by row, then latent (the order of `Tensor.nonzero` on the dense codes): one sort of the
    keys row·n_latents + latent."""
    order = (rows * n_latents + cols).argsort()
    return rows[order], cols[order], values[order]


_REGISTRY: dict[str, Architecture] = {}


def discover() -> None:
    """Import every module of saegeo.sae.architectures (pkgutil): each registers the architecture it defines.
    A new architecture is a new module there; nothing lists it."""
    import saegeo.sae.architectures as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")


def register_architecture(name: str, cls: type[Architecture]) -> Architecture:
    """Make `cls` the architecture called `name` (SAEConfig.activation, TrainConfig.arch); returns its instance.
    Registering a name again replaces it (a test or a notebook redefining its class)."""
    if not name.isidentifier():
        raise BadInputError(f"architecture name {name!r} must be an identifier")
    if not dataclasses.is_dataclass(cls.Options):
        raise BadInputError(f"architecture {name!r}: Options must be a dataclass, got {cls.Options!r}")
    arch = cls()
    arch.name = name
    _REGISTRY[name] = arch
    return arch


def unregister_architecture(name: str) -> None:
    """Remove a registered architecture (a test's or a notebook's; SAEs of it can no longer be built)."""
    _REGISTRY.pop(name, None)


def get_architecture(name: str) -> Architecture:
    """The registered architecture called `name`; FormatError listing the registered ones otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise FormatError(f"unknown SAE architecture {name!r}; registered: {', '.join(architecture_names())}") from None


def architecture_names() -> tuple[str, ...]:
    """The registered architecture names, sorted."""
    return tuple(sorted(_REGISTRY))


def by_saved_name(library: str, name: str) -> Architecture | None:
    """The registered architecture `library`'s files or objects name `name` (its `saved_names`; SAELens "standard"
    → relu, dictionary_learning "BatchTopKSAE" → batchtopk), or None."""
    return next((a for a in _REGISTRY.values() if name in a.read_names(library)), None)
