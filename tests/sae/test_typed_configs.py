"""Foreign configs are read through one typed schema per format: a wrong type or range in any
field a reader uses is refused in one line naming the file, the field, the value and what was expected; exit 2,
nothing written, never a traceback. Each case below ended in a Python traceback (or was silently misread) before.
The property-based fuzz at the end replaces one field of each format's config (or the table of tensors beside it)
with an arbitrary JSON value, through `saegeo check`; `make fuzz` runs it with many more examples."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import os
import pathlib
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from saegeo.cli import main
from tests.sae.test_published_formats import _V6, D_IN, D_SAE, _dl_state_dict, _openai_state_dict, _weights

FUZZ_EXAMPLES = int(os.environ.get("SAEGEO_FUZZ_EXAMPLES", "40"))  # `make fuzz` sets thousands


def _tensors(seed: int = 1) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in _weights(seed).items()}


def _write(path: pathlib.Path, fmt: str, config: dict | None = None, tensors: dict | None = None) -> pathlib.Path:
    """A valid SAE of format `fmt` under `path` (its config replaced by `config`, its tensor table by `tensors`
    where given); returns the path `saegeo check` is pointed at."""
    path.mkdir(parents=True, exist_ok=True)
    t = _tensors()
    if fmt == "saelens":
        save_file(tensors or t, path / "sae_weights.safetensors")
        cfg = {**_V6, "d_in": D_IN, "d_sae": D_SAE, "architecture": "topk", "k": 5, "apply_b_dec_to_input": True}
        (path / "cfg.json").write_text(json.dumps(cfg if config is None else config))
        return path
    if fmt == "sparsify":
        sd = {"encoder.weight": t["W_enc"].T.contiguous(), "encoder.bias": t["b_enc"], "W_dec": t["W_dec"]}
        save_file(tensors or {**sd, "b_dec": t["b_dec"]}, path / "sae.safetensors")
        cfg = {"activation": "topk", "expansion_factor": 4, "normalize_decoder": True, "num_latents": D_SAE}
        cfg.update({"k": 6, "multi_topk": False, "skip_connection": False, "transcode": False, "d_in": D_IN})
        (path / "cfg.json").write_text(json.dumps(cfg if config is None else config))
        return path
    if fmt == "dictionary_learning":
        torch.save(tensors or _dl_state_dict("AutoEncoderTopK"), path / "ae.pt")
        trainer = {"dict_class": "AutoEncoderTopK", "trainer_class": "TopKTrainer", "activation_dim": D_IN}
        trainer.update({"dict_size": D_SAE, "k": 5, "layer": 3, "lm_name": "m", "submodule_name": "resid_post_layer_3"})
        (path / "config.json").write_text(json.dumps({"trainer": trainer} if config is None else config))
        return path / "ae.pt"
    if fmt == "llama_scope":
        (path / "checkpoints").mkdir(exist_ok=True)
        sd = {"encoder.weight": t["W_enc"].T.contiguous(), "encoder.bias": t["b_enc"]}
        sd.update({"decoder.weight": t["W_dec"].T.contiguous(), "decoder.bias": t["b_dec"]})
        save_file(tensors or sd, path / "checkpoints" / "final.safetensors")
        hp = {"d_model": D_IN, "d_sae": D_SAE, "jump_relu_threshold": 0.5, "norm_activation": "dataset-wise"}
        hp.update({"dataset_average_activation_norm": {"in": 3.0, "out": 3.0}, "sparsity_include_decoder_norm": True})
        hp.update({"apply_decoder_bias_to_pre_encoder": False, "act_fn": "jumprelu", "hook_point_in": "blocks.3"})
        (path / "hyperparams.json").write_text(json.dumps(hp if config is None else config))
        return path
    if fmt == "gemma_scope_2":
        sd = {"w_enc": t["W_enc"], "w_dec": t["W_dec"], "b_enc": t["b_enc"], "b_dec": t["b_dec"]}
        save_file(tensors or {**sd, "threshold": torch.full((D_SAE,), 0.3)}, path / "params.safetensors")
        cfg = {"architecture": "jump_relu", "model_name": "gemma-3-1b-pt", "hf_hook_point_in": "model.layers.3"}
        (path / "config.json").write_text(json.dumps(cfg if config is None else config))
        return path
    if fmt == "saegeo":  # saegeo's own SAELens-layout directory, with its "saegeo" block
        from saegeo.sae.model import SAE, SAEConfig

        sae = SAE(SAEConfig(d_in=D_IN, d_sae=D_SAE, activation="topk", k=5))
        sae.init_weights(torch.Generator().manual_seed(0)).save(path, provenance={"data": {"model": "m", "hook": "h"}})
        if config is not None:
            (path / "cfg.json").write_text(json.dumps(config))
        return path
    if fmt == "openai":
        sd = tensors or _openai_state_dict("TopK")
        if config is not None:
            sd = {k: v for k, v in sd.items() if not isinstance(v, (str, dict))} | config
        torch.save(sd, path / "ae.pt")
        return path / "ae.pt"
    raise AssertionError(fmt)


CONFIG_FILE = {
    "saelens": "cfg.json",
    "sparsify": "cfg.json",
    "dictionary_learning": "config.json",
    "llama_scope": "hyperparams.json",
    "gemma_scope_2": "config.json",
    "openai": "ae.pt",
    "saegeo": "cfg.json",
}


def _schema(fmt: str) -> type:
    from saegeo.sae.formats import dictionary_learning, gemma_scope, llama_scope, openai, saelens, sparsify

    return {
        "saelens": saelens.saelens_schema,
        "saegeo": saelens.saelens_schema,
        "sparsify": sparsify.sparsify_schema,
        "dictionary_learning": dictionary_learning.dictionary_learning_schema,
        "llama_scope": llama_scope.llama_scope_schema,
        "gemma_scope_2": gemma_scope.gemma_scope_2_schema,
        "openai": openai.openai_schema,
    }[fmt]()


def _declared(fmt: str, path: list[str]) -> bool:
    """Whether the schema declares the field at `path` (the fuzz asserts a refusal only for fields a reader reads;
    other keys pass unread)."""
    import typing

    from pydantic import BaseModel

    model = _schema(fmt)
    for i, key in enumerate(path):
        field = next((f for name, f in model.model_fields.items() if key in (name, f.alias)), None)
        if field is None:
            return False
        if i == len(path) - 1:
            return True
        kinds = [field.annotation, *typing.get_args(field.annotation)]
        model = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)
        if model is None:
            return False
    return False


def _valid_config(fmt: str) -> dict:
    return copy.deepcopy(_valid_config_once(fmt))


@functools.cache
def _valid_config_once(fmt: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        target = _write(pathlib.Path(tmp), fmt)
        if fmt == "openai":
            state = torch.load(target, weights_only=True)
            return {k: v for k, v in state.items() if isinstance(v, (str, dict))}
        return json.loads((pathlib.Path(tmp) / CONFIG_FILE[fmt]).read_text())


def _check(target: pathlib.Path, out: pathlib.Path | None = None) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        argv = ["check", str(target), "--no-progress"] + (["--out", str(out)] if out else [])
        code = main(argv)
    return code, err.getvalue().strip()


def _files(root: pathlib.Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*")}


def _assert_refused(tmp_path, target, *shown) -> str:
    before = _files(tmp_path)
    code, text = _check(target, tmp_path / "out")
    assert code == 2, text
    assert "\n" not in text and "Traceback" not in text, text
    assert all(s in text for s in shown), (shown, text)
    assert _files(tmp_path) == before, "something was written or touched"
    return text


# --------------------------------------------------------------------------- the known cases
def _saelens(cfg_update: dict) -> dict:
    return {**_V6, "d_in": D_IN, "d_sae": D_SAE, "architecture": "standard", **cfg_update}


KNOWN = [
    ("saelens", _saelens({"metadata": "gpt2"}), "metadata", "'gpt2'", "a JSON object"),
    ("saelens", _saelens({"metadata": ["gpt2"]}), "metadata", "['gpt2']", "a JSON object"),
    ("saelens", _saelens({"normalize_activations": ["none"]}), "normalize_activations", "['none']", "one of"),
    ("saelens", _saelens({"activation_fn_kwargs": [4]}), "activation_fn_kwargs", "[4]", "a JSON object"),
    ("saelens", _saelens({"apply_b_dec_to_input": "false"}), "apply_b_dec_to_input", "'false'", "true or false"),
    ("saelens", _saelens({"metadata": {"context_size": "128"}}), "metadata.context_size", "'128'", "an integer"),
    ("dictionary_learning", {"trainer": "TopKTrainer"}, "trainer", "'TopKTrainer'", "a JSON object"),
    ("dictionary_learning", {"trainer": {"dict_class": ["AutoEncoderTopK"]}}, "trainer.dict_class", "[", "a string"),
    ("llama_scope", {"jump_relu_threshold": "abc"}, "jump_relu_threshold", "'abc'", "a number"),
    ("llama_scope", {"jump_relu_threshold": None}, "jump_relu_threshold", "None", "a number"),
    ("llama_scope", {"jump_relu_threshold": -0.5}, "jump_relu_threshold", "-0.5", ">= 0"),
    ("llama_scope", {"dataset_average_activation_norm": [3.0]}, "dataset_average_activation_norm", "[3.0]", "object"),
    (
        "llama_scope",
        {"dataset_average_activation_norm": {"in": "abc"}},
        "dataset_average_activation_norm.in",
        "'abc'",
        "",
    ),
    (
        "llama_scope",
        {"dataset_average_activation_norm": {"in": -3.0}},
        "dataset_average_activation_norm.in",
        "-3.0",
        "> 0",
    ),
    (
        "llama_scope",
        {"dataset_average_activation_norm": {"in": True}},
        "dataset_average_activation_norm.in",
        "True",
        "",
    ),
    ("sparsify", {"transcode": "false"}, "transcode", "'false'", "true or false"),
    ("gemma_scope_2", {"hf_hook_point_in": 3}, "hf_hook_point_in", "3", "a string"),
    ("openai", {"activation": "TopK", "activation_state_dict": [32]}, "activation_state_dict", "[32]", "object"),
]


@pytest.mark.parametrize("fmt, update, field, value, expected", KNOWN, ids=[f"{k[0]}-{k[2]}" for k in KNOWN])
def test_a_wrong_type_in_a_foreign_config_is_one_line_naming_file_field_value(
    tmp_path, fmt, update, field, value, expected
):
    config = update if fmt in ("saelens", "dictionary_learning", "openai") else {**_valid_config(fmt), **update}
    target = _write(tmp_path / "sae", fmt, config)
    text = _assert_refused(tmp_path, target, field, value, expected, CONFIG_FILE[fmt])
    if value == "'false'":  # said so: a string is never read as a boolean
        assert "not a boolean" in text


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (("saegeo", "data"), "store", "a JSON object"),
        (("saegeo", "sae_config", "dtype"), "int8", "one of ['float32'"),
        (("saegeo", "sae_config", "k"), "5", "an integer"),
        (("saegeo", "sae_config", "layer_norm_eps"), -1.0, "a number > 0"),
    ],
)
def test_saegeos_own_block_is_checked_like_a_foreign_config(tmp_path, path, value, expected):
    """A file saegeo wrote can be edited: its block is typed too (dtype int8 built an SAE that failed later)."""
    config = _valid_config("saegeo")
    holder = config
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    target = _write(tmp_path / "sae", "saegeo", config)
    _assert_refused(tmp_path, target, "cfg.json", ".".join(path), repr(value), expected)


def test_a_config_nested_100000_levels_deep_is_refused_in_one_line(tmp_path):
    target = _write(tmp_path / "sae", "saelens")
    (target / "cfg.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    _assert_refused(tmp_path, target, "cfg.json", "nested")


def test_null_switches_read_as_the_libraries_read_them(tmp_path):
    """SAELens and sparsify test their switches with `if cfg.x:`: null is false there and here."""
    from saegeo.sae.model import SAE

    target = _write(tmp_path / "s", "saelens", _saelens({"apply_b_dec_to_input": None}))
    assert SAE.load(target).cfg.apply_b_dec_to_input is False
    target = _write(tmp_path / "t", "saelens", _saelens({"apply_b_dec_to_input": False}))
    assert SAE.load(target).cfg.apply_b_dec_to_input is False


@pytest.mark.parametrize("fmt", list(CONFIG_FILE))
def test_every_format_fixture_here_is_valid(tmp_path, fmt):
    """The fuzz below starts from these: each must load (exit 0) before one field is broken."""
    code, text = _check(_write(tmp_path / "sae", fmt))
    assert code == 0, text


# --------------------------------------------------------------------------- the fuzz
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(["false", "true", "none", "topk", "1", "", "nan"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4) | st.just("in"), inner, max_size=3),
    max_leaves=6,
)


def _kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


@st.composite
def broken_config(draw):
    fmt = draw(st.sampled_from(sorted(CONFIG_FILE)))
    config = _valid_config(fmt)
    path, holder = [], config  # descend up to three levels (saegeo.sae_config.k), then replace that value
    while True:
        key = draw(st.sampled_from(sorted(holder)))
        path.append(key)
        if not (isinstance(holder[key], dict) and holder[key] and len(path) < 3 and draw(st.booleans())):
            break
        holder = holder[key]
    old, value = holder[key], draw(_json)
    holder[key] = value
    wrong = _kind(old) != _kind(value) and value is not None and _declared(fmt, path)
    return fmt, config, ".".join(path), wrong


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=broken_config())
def test_fuzz_one_config_field_is_read_or_refused_in_one_line(case):
    fmt, config, key, wrong_type = case
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        target = _write(root / "sae", fmt, config)
        before = _files(root)
        code, text = _check(target)
        assert code in (0, 2), (fmt, config, text)
        assert "Traceback" not in text and text.count("\n") == 0, text
        assert _files(root) == before
        if wrong_type:  # a value of another JSON type than the library writes is never read
            assert code == 2, (fmt, key, config)


_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8, torch.bool]
_DTYPES += [torch.uint8, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2]


@st.composite
def broken_table(draw):
    fmt = draw(
        st.sampled_from(["saelens", "sparsify", "llama_scope", "gemma_scope_2", "dictionary_learning", "openai"])
    )
    with tempfile.TemporaryDirectory() as tmp:
        target = _write(pathlib.Path(tmp), fmt)
        if target.suffix == ".pt":  # a pickled state dict: its non-tensor entries (k, activation) stay
            table = torch.load(target, weights_only=True)
        else:
            from safetensors.torch import load_file

            table = load_file(next(pathlib.Path(tmp).rglob("*.safetensors")))
    name = draw(st.sampled_from(sorted(k for k, v in table.items() if isinstance(v, torch.Tensor))))
    action = draw(st.sampled_from(["dtype", "shape", "drop", "extra"]))
    if action == "drop":
        del table[name]
    elif action == "extra":
        table[draw(st.text(min_size=1, max_size=6))] = torch.zeros(draw(st.integers(0, 3)))
    else:
        shape = tuple(table[name].shape)
        if action == "shape":
            shape = tuple(draw(st.lists(st.integers(0, 50), max_size=3)))
        dtype = draw(st.sampled_from(_DTYPES))
        values = torch.from_numpy(np.asarray(np.random.default_rng(0).standard_normal(shape) * 3))
        table[name] = values.to(dtype) if dtype is not torch.bool else values > 0
    return fmt, table


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=broken_table())
def test_fuzz_the_tensor_table_is_read_or_refused_in_one_line(case):
    fmt, table = case
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        target = _write(root / "sae", fmt, tensors=table)
        before = _files(root)
        code, text = _check(target)
        assert code in (0, 2), (fmt, {k: (v.dtype, tuple(v.shape)) for k, v in table.items()}, text)
        assert "Traceback" not in text and text.count("\n") == 0, text
        assert _files(root) == before


def test_the_validation_library_is_imported_only_when_a_config_is_read():
    """pydantic costs ~0.1 s to import (benchmarks/README.md): not at the CLI's start, nor with the readers."""
    import subprocess
    import sys

    code = "import sys, saegeo.cli, saegeo.sae.formats, saegeo.sae.model; print('pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
