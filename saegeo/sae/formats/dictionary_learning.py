"""dictionary_learning (saprmarks): ae.pt [+ config.json whose trainer.dict_class names the class].

nn.Linear layout: decoder.weight is (d_in, d_sae); `bias` is b_dec in AutoEncoder. Its JumpReLU does not
subtract b_dec; its BatchTopK encodes with one global scalar threshold by default (not per-row TopK); its
TopK ignores the stored threshold by default; its GatedAutoEncoder keeps the gate's bias as gate_bias and the
magnitude path's as r_mag, mag_bias (saegeo's gated architecture: b_enc, r_mag, b_mag).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from saegeo.errors import FormatError
from saegeo.sae.architectures import SAEConfig, by_saved_name
from saegeo.sae.formats.format_reader import PICKLE_SUFFIXES, Dictionary, FormatInfo, FormatReader, register_format
from saegeo.sae.formats.reader_checks import (
    check_config,
    count_field,
    dtype_name,
    expect_shape,
    make_dictionary,
    matrix_shape,
    require_keys,
    schema_types,
)
from saegeo.sae.formats.weight_files import read_json, read_pickle


@dataclass
class DictionaryLearningFacts:
    """What a dictionary_learning ae.pt and its config.json record that no other format does (FormatInfo.facts)."""

    dict_class: str | None = None
    trainer_class: str | None = None
    stored_threshold_ignored: float | None = None  # AutoEncoderTopK keeps a threshold it does not use
    group_sizes: list[int] | None = None  # Matryoshka


# dict_class -> (activation, subtracts b_dec before encoding, state-dict keys). From dictionary.py and trainers/.
_DL_CLASSES = {
    "AutoEncoder": ("relu", True, ("bias", "encoder.weight", "encoder.bias", "decoder.weight")),
    "AutoEncoderNew": ("relu", False, ("encoder.weight", "encoder.bias", "decoder.weight", "decoder.bias")),
    "AutoEncoderTopK": ("topk", True, ("encoder.weight", "encoder.bias", "decoder.weight", "b_dec", "k")),
    "BatchTopKSAE": (
        "batchtopk",
        True,
        ("encoder.weight", "encoder.bias", "decoder.weight", "b_dec", "k", "threshold"),
    ),
    "MatryoshkaBatchTopKSAE": (
        "matryoshka",
        True,
        ("W_enc", "b_enc", "W_dec", "b_dec", "k", "threshold", "group_sizes"),
    ),
    "JumpReluAutoEncoder": ("jumprelu", False, ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")),
    "GatedAutoEncoder": (
        "gated",
        True,
        ("encoder.weight", "gate_bias", "r_mag", "mag_bias", "decoder.weight", "decoder_bias"),
    ),
}
DICTIONARY_LEARNING_CLASSES = (*_DL_CLASSES, "CrossCoder")  # known names (the last one refused)
_DL_UNSUPPORTED = {"CrossCoder": "a crosscoder (several layers)"}
# the nn.Linear classes' bias names in the state dict, (b_enc, b_dec); the others keep encoder.bias and b_dec
_DL_BIASES = {
    "AutoEncoder": ("encoder.bias", "bias"),
    "AutoEncoderNew": ("encoder.bias", "decoder.bias"),
    "GatedAutoEncoder": ("gate_bias", "decoder_bias"),
}


@functools.cache
def dictionary_learning_schema() -> type:
    """The keys of a dictionary_learning config.json that saegeo reads: its `trainer` block, as the trainers'
    `config` properties write it (dict_class and trainer_class names, activation_dim, dict_size, k, layer,
    lm_name, submodule_name). Other keys pass unread; `check_config` reports the first mismatch."""
    T = schema_types()

    class Trainer(T.Config):
        dict_class: T.Text = None
        trainer_class: T.Text = None
        activation_dim: T.Count | None = None
        dict_size: T.Count | None = None
        k: T.Count | None = None
        layer: T.Size | None = None
        lm_name: T.Text = None
        submodule_name: T.Text = None

    class DictionaryLearningConfig(T.Config):
        trainer: Trainer | None = None

    return DictionaryLearningConfig


def _dictionary_learning_class(state: dict, where: object) -> str:
    keys = set(state)
    if {"r_mag", "gate_bias", "mag_bias"} <= keys:
        return "GatedAutoEncoder"
    if "group_sizes" in keys:
        return "MatryoshkaBatchTopKSAE"
    if {"W_enc", "threshold"} <= keys and "k" not in keys:
        return "JumpReluAutoEncoder"
    if "bias" in keys and "decoder.bias" not in keys:
        return "AutoEncoder"
    if "decoder.bias" in keys:
        return "AutoEncoderNew"
    if {"k", "threshold", "encoder.weight"} <= keys:
        raise FormatError(
            f"{where}: these keys fit both AutoEncoderTopK (per-row top-k, stored threshold ignored) and BatchTopKSAE "
            "(one global threshold), which encode differently; put the training config.json (with trainer.dict_class) next to it"
        )
    raise FormatError(
        f"{where}: keys {sorted(keys)} match no dictionary_learning class; expected one of {sorted(_DL_CLASSES)}"
    )


def _tensor_count(where: object, value: torch.Tensor, name: str) -> int:
    """A count stored as a one-element tensor (dictionary_learning's k buffer), refused unless an integer >= 1."""
    if (
        value.numel() != 1
        or value.is_complex()
        or not math.isfinite(float(value))
        or not float(value) == int(value)
        or int(value) < 1
    ):
        raise FormatError(f"{where}: {name} must be one integer >= 1, found {value.tolist()!r}")
    return int(value)


def read_dictionary_learning(path: str | os.PathLike) -> Dictionary:
    """dictionary_learning `ae.pt` (+ `config.json` whose trainer.dict_class names the class). nn.Linear layout:
    encoder.weight (d_sae, d_in), decoder.weight (d_in, d_sae); `bias` is b_dec in AutoEncoder.

    AutoEncoder: relu(encoder(x − bias)), decoder(f) + bias.  AutoEncoderNew: relu(encoder(x)), decoder(f) + decoder.bias.
    AutoEncoderTopK: relu(encoder(x − b_dec)) then per-row top-k; the stored threshold is ignored (use_threshold=False).
    GatedAutoEncoder: e = encoder(x − decoder_bias); f = [e + gate_bias > 0]·relu(exp(r_mag)·e + mag_bias);
    decoder(f) + decoder_bias (saegeo's gated architecture with b_enc = gate_bias, b_mag = mag_bias).
    BatchTopKSAE / Matryoshka: relu(pre)·[relu(pre) > threshold], one global scalar (use_threshold=True by default).
    JumpReluAutoEncoder (0.1.0 and main): f = relu(pre·[pre > θ]), pre = x @ W_enc + b_enc -- no b_dec subtraction,
    no decoder-norm scaling; decode f @ W_dec + b_dec.
    A training backup ae.pt ({step, ae, optimizer, config, norm_factor}) is refused by name (see _refuse_dl_backup).
    """
    p = Path(path)
    pt = p / "ae.pt" if p.is_dir() else p
    if not pt.is_file():
        raise FormatError(f"{p}: no ae.pt found (dictionary_learning saves ae.pt next to config.json)")
    config_file = pt.parent / "config.json"
    config = read_json(config_file) if config_file.is_file() else {}
    check_config(config_file, config, dictionary_learning_schema())
    trainer = config.get("trainer") or {}
    state = read_pickle(pt)
    if {"ae", "optimizer"} <= set(state):
        raise FormatError(
            f"{pt}: a dictionary_learning training backup (keys 'ae' and 'optimizer'{', norm_factor' if 'norm_factor' in state else ''}, "
            f"step {state.get('step')}), not a saved dictionary: its weights are for inputs divided by norm_factor. Load it with "
            "dictionary_learning, call ae.scale_biases(norm_factor) and save ae.state_dict() as ae.pt (what training writes at the end)"
        )
    return dictionary_learning_state_dictionary(state, trainer, pt, str(pt), config_file)


def dictionary_learning_state_dictionary(
    state: dict,
    trainer: dict,
    pt: object,
    source: str,
    config_file: object = "config.json",
    dict_class: str | None = None,
) -> Dictionary:
    """A dictionary_learning state dict (ae.pt's, or `state_dict()` of a dictionary in memory, whose class name is
    `dict_class`) and its training config's `trainer` block ({} when there is none) -> the Dictionary (see
    read_dictionary_learning). `pt` and `config_file` name them in messages; `source` is FormatInfo.source."""
    dict_class = dict_class or trainer.get("dict_class") or _dictionary_learning_class(state, pt)
    if dict_class in _DL_UNSUPPORTED:
        raise FormatError(
            f"{pt}: dictionary_learning {dict_class} is {_DL_UNSUPPORTED[dict_class]}; not in saegeo's encode contract"
        )
    if dict_class not in _DL_CLASSES:
        raise FormatError(
            f"{pt}: dictionary_learning dict_class {dict_class!r} is not supported; expected one of {sorted(_DL_CLASSES)}"
        )
    _, subtract_b_dec, keys = _DL_CLASSES[dict_class]
    activation = by_saved_name("dictionary_learning", dict_class).name  # the architecture declares its class names
    require_keys(pt, state, keys, f"dictionary_learning {dict_class}")
    t = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if "W_enc" in keys:  # nn.Parameter layout: W_enc (d_in, d_sae), W_dec (d_sae, d_in)
        d_in, d_sae = matrix_shape(pt, "W_enc", t["W_enc"], "(d_in, d_sae)")
        tensors = {"W_enc": t["W_enc"], "b_enc": t["b_enc"], "W_dec": t["W_dec"], "b_dec": t["b_dec"]}
    else:  # nn.Linear layout: encoder.weight (d_sae, d_in), decoder.weight (d_in, d_sae)
        d_sae, d_in = matrix_shape(pt, "encoder.weight", t["encoder.weight"], "(d_sae, d_in)")
        b_enc_key, b_dec_key = _DL_BIASES.get(dict_class, ("encoder.bias", "b_dec"))
        tensors = {
            "W_enc": t["encoder.weight"].T,
            "b_enc": t[b_enc_key],
            "W_dec": t["decoder.weight"].T,
            "b_dec": t[b_dec_key],
        }
    implied = f"{'W_enc' if 'W_enc' in keys else 'encoder.weight'} (d_in={d_in}, d_sae={d_sae})"
    for name, expected in (("activation_dim", d_in), ("dict_size", d_sae)):
        if name in trainer and count_field(config_file, trainer, name, label=f"trainer.{name}") != expected:
            raise FormatError(f"{config_file}: trainer.{name}={trainer[name]} but {Path(str(pt)).name} holds {implied}")
    expect_shape(pt, "W_dec" if "W_dec" in keys else "decoder.weight.T", tensors["W_dec"], (d_sae, d_in), implied)
    expect_shape(pt, "b_enc" if "b_enc" in keys else b_enc_key, tensors["b_enc"], (d_sae,), implied)
    expect_shape(pt, "b_dec", tensors["b_dec"], (d_in,), implied)
    k = _tensor_count(pt, t["k"], "k") if "k" in t else None
    if k is not None and "k" in trainer and count_field(config_file, trainer, "k", label="trainer.k") != k:
        raise FormatError(f"{pt}: k={k} in the weights but trainer.k={trainer['k']} in {Path(str(config_file)).name}")
    info = FormatInfo(
        format="dictionary_learning",
        source=source,
        source_dtype=dtype_name(t),
        facts=DictionaryLearningFacts(dict_class=dict_class, trainer_class=trainer.get("trainer_class")),
        model_name=trainer.get("lm_name"),
        hook_name=trainer.get("submodule_name") or (f"layer {trainer['layer']}" if "layer" in trainer else None),
    )
    _activation_tensors(activation, dict_class, t, tensors, info, pt, d_sae, implied)
    if dict_class == "MatryoshkaBatchTopKSAE":
        if (
            t["group_sizes"].is_floating_point()
            or t["group_sizes"].is_complex()
            or t["group_sizes"].dtype == torch.bool
        ):
            raise FormatError(
                f"{pt}: group_sizes must be integers, found {str(t['group_sizes'].dtype).removeprefix('torch.')}"
            )
        sizes = [int(s) for s in t["group_sizes"].reshape(-1)]
        if sum(sizes) != d_sae or min(sizes, default=0) < 1:
            raise FormatError(
                f"{pt}: group_sizes {sizes} must be positive and sum to dict_size {d_sae} (sum {sum(sizes)})"
            )
        info.facts.group_sizes = sizes
    cfg = SAEConfig(
        d_in=int(d_in),
        d_sae=int(d_sae),
        activation=activation,
        k=k if activation == "topk" else None,
        topk_order="relu_then_topk",
        apply_b_dec_to_input=subtract_b_dec,
        dtype="float32",
        matryoshka_widths=_prefix_widths(info.facts.group_sizes),
    )
    if k is not None and activation != "topk":
        info.training_k = k
    return make_dictionary(cfg, tensors, pt, info)


def _activation_tensors(
    activation: str, dict_class: str, t: dict, tensors: dict, info: FormatInfo, pt: object, d_sae: int, implied: str
) -> None:
    """The tensors one activation adds to W_enc, b_enc, W_dec, b_dec (into `tensors`), and its facts (into `info`)."""
    if activation == "jumprelu":
        expect_shape(pt, "threshold", t["threshold"], (d_sae,), implied)
        tensors["threshold"] = t["threshold"]
    elif activation in ("batchtopk", "matryoshka"):  # one global scalar threshold
        if t["threshold"].numel() != 1:
            raise FormatError(
                f"{pt}: {dict_class} threshold must be one scalar, found shape {tuple(t['threshold'].shape)}"
            )
        tensors["threshold"] = t["threshold"].reshape(1)
        info.threshold = float(t["threshold"].real)  # a complex one is refused by name in make_dictionary
        info.threshold_unset = info.threshold < 0  # -1 = never updated in training: every ReLU code passes (dense)
    elif activation == "gated":
        for ours, theirs in (("r_mag", "r_mag"), ("b_mag", "mag_bias")):
            expect_shape(pt, theirs, t[theirs], (d_sae,), implied)
            tensors[ours] = t[theirs]
    elif activation == "topk":
        stored = t.get("threshold")
        if stored is not None and stored.numel() == 1 and not stored.is_complex():  # unused: recorded when readable
            info.facts.stored_threshold_ignored = float(stored)


def _prefix_widths(group_sizes: list[int] | None) -> list[int] | None:
    """Matryoshka group sizes s_g -> the nested widths w_ℓ = Σ_{g ≤ ℓ} s_g (None stays None)."""
    return None if group_sizes is None else [sum(group_sizes[: g + 1]) for g in range(len(group_sizes))]


def read_dictionary_learning_object(obj) -> Dictionary | None:
    """A dictionary_learning dictionary in memory, recognised by its class name (one of
    DICTIONARY_LEARNING_CLASSES): its state dict, read as ae.pt is; None for anything else."""
    name = type(obj).__name__
    if name not in DICTIONARY_LEARNING_CLASSES or not hasattr(obj, "state_dict"):
        return None
    state = {k: v.detach().cpu() for k, v in obj.state_dict().items()}
    return dictionary_learning_state_dictionary(state, {}, f"in memory: {name}", f"in memory: {name}", dict_class=name)


def _claims_file(path: Path, keys) -> int:
    """A lone pickle: certain beside a config.json with a trainer block (read before the pickle), sure for a
    training backup ({ae, optimizer}), a weak guess for any SAE weight names (the other formats' own keys win)."""
    if path.suffix not in PICKLE_SUFFIXES:
        return 0
    config = path.parent / "config.json"
    if config.is_file() and "trainer" in read_json(config):
        return 3
    if {"ae", "optimizer"} <= keys():
        return 2  # refused by name in the reader
    return 1 if keys() & {"encoder.weight", "W_enc", "decoder.weight", "W_dec"} else 0


register_format(
    FormatReader(
        name="dictionary_learning",
        read=read_dictionary_learning,
        layout="dictionary_learning: ae.pt [+ config.json]",
        files=("ae.pt", "config.json"),
        marker=("ae.pt",),
        claims_file=_claims_file,
        facts=DictionaryLearningFacts,
        conversions=("dictionary_learning_1",),
        read_object=read_dictionary_learning_object,
        object_kinds=f"a dictionary_learning dictionary ({', '.join(DICTIONARY_LEARNING_CLASSES)})",
        priority=30,
    )
)
