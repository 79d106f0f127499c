"""Every tensor a user can hold is read or refused in one line: every safetensors and torch dtype
(float8, bool, integers, complex, quantized, sparse, meta) as activation rows and as SAE weights, and magnitudes
from subnormal to float64's largest, computed exactly or refused with the reason. The readers agree across
.safetensors, .npy and .pt: the same values give the same geometry whichever file holds them. Each refused case
below ended in a traceback, and bool .npy was refused while .safetensors and .pt read it, before."""

from __future__ import annotations

import contextlib
import io
import json
import math
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from saegeo.cli import main
from saegeo.errors import FormatError
from saegeo.geometry.diagnosis import kmeans_between_share
from saegeo.sae.model import SAE
from tests.sae.test_published_formats import _V6, D_IN, D_SAE, _dl_state_dict, _weights

# scale-free numbers of the geometry summary: equal for x and c·x when c is a power of two (exact scaling)
SCALE_FREE = ("anisotropy", "isotropic_z", "mean_norm_ratio", "top1_share", "effective_rank", "participation_ratio")


def _rows(seed: int = 0, n: int = 600, d: int = 8) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _save(path, x: torch.Tensor) -> None:
    if path.suffix == ".safetensors":
        save_file({"activations": x.contiguous()}, path)
    elif path.suffix == ".pt":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensors' deprecation notice
            torch.save(x, path)
    else:
        np.save(path, x.numpy())


def _geometry(path, out) -> tuple[int, str, dict | None]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["geometry", str(path), "--no-progress", "--json", str(out)])
    text = err.getvalue().strip()
    return code, text, json.loads(out.read_text()) if code == 0 else None


def _refused(tmp_path, path, *shown) -> str:
    code, text, _ = _geometry(path, tmp_path / "g.json")
    assert code == 2 and "\n" not in text and "Traceback" not in text, text
    assert all(s in text for s in shown), text
    assert not (tmp_path / "g.json").exists()
    return text


def _same(a: dict, b: dict) -> None:
    assert a["n"] == b["n"] and a["d"] == b["d"]
    for key in SCALE_FREE + ("mean_row_norm", "total_variance"):
        assert math.isclose(a[key], b[key], rel_tol=1e-9, abs_tol=1e-12), (key, a[key], b[key])


# --------------------------------------------------------------------------- rows: dtypes and file kinds
READ_AS = {  # dtype -> how its values are read (an independent float64 reference of the same numbers)
    "float8_e4m3fn": lambda x: x.to(torch.float8_e4m3fn).to(torch.float64),
    "float8_e5m2": lambda x: x.to(torch.float8_e5m2).to(torch.float64),
    "bool": lambda x: (x > 0).to(torch.float64),
    "int8": lambda x: (3 * x).to(torch.int8).to(torch.float64),
    "uint8": lambda x: (3 * x.abs()).to(torch.uint8).to(torch.float64),
    "int64": lambda x: (3 * x).to(torch.int64).to(torch.float64),
    "float16": lambda x: x.to(torch.float16).to(torch.float64),
    "bfloat16": lambda x: x.to(torch.bfloat16).to(torch.float64),
}


def _as(dtype: str, x: torch.Tensor) -> torch.Tensor:
    if dtype == "bool":
        return x > 0
    scale = {"int8": 3, "int64": 3}.get(dtype, 1)
    src = 3 * x.abs() if dtype == "uint8" else scale * x
    return src.to(getattr(torch, dtype))


@pytest.mark.parametrize("dtype", list(READ_AS))
@pytest.mark.parametrize("ext", [".safetensors", ".pt", ".npy"])
def test_every_real_dtype_is_read_as_its_values_from_every_file_kind(tmp_path, dtype, ext):
    x = _rows()
    held = _as(dtype, x)
    if ext == ".npy" and dtype in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        pytest.skip("numpy has no bfloat16 / float8")
    _save(tmp_path / f"x{ext}", held)
    # the reference: the same numbers in the dtype the geometry computes them in (float64 for integers, float32
    # for floats of 32 bits or fewer), read from .npy
    compute = torch.float32 if held.is_floating_point() else torch.float64
    _save(tmp_path / "ref.npy", READ_AS[dtype](x).to(compute))
    code, text, got = _geometry(tmp_path / f"x{ext}", tmp_path / "g.json")
    assert code == 0, text
    _same(got, _geometry(tmp_path / "ref.npy", tmp_path / "ref.json")[2])


@pytest.mark.parametrize("make", ["sparse_coo", "sparse_csr", "quantized"])
def test_sparse_and_quantized_pt_rows_are_read_as_their_dense_values(tmp_path, make):
    x = _rows().float()
    if make == "sparse_coo":
        held, values = x.to_sparse(), x
    elif make == "sparse_csr":
        held, values = x.to_sparse_csr(), x
    else:
        held = torch.quantize_per_tensor(x, 0.05, 0, torch.qint8)
        values = held.int_repr().to(torch.float32) * 0.05  # q·scale + zero point (0), computed here
    _save(tmp_path / "x.pt", held)
    _save(tmp_path / "ref.npy", values)
    code, text, got = _geometry(tmp_path / "x.pt", tmp_path / "g.json")
    assert code == 0 and text == "", text
    _same(got, _geometry(tmp_path / "ref.npy", tmp_path / "ref.json")[2])


def test_meta_and_complex_rows_are_refused_in_one_line_from_every_file(tmp_path):
    _save(tmp_path / "meta.pt", torch.empty(600, 8, device="meta"))
    _refused(tmp_path, tmp_path / "meta.pt", "meta.pt", "meta tensor")
    for ext in (".safetensors", ".pt", ".npy"):
        _save(tmp_path / f"c{ext}", _rows().to(torch.complex64))
        _refused(tmp_path, tmp_path / f"c{ext}", "complex")


# --------------------------------------------------------------------------- magnitudes
@pytest.mark.parametrize("exponent", [-125, -100, -60, 100, 125])
def test_float64_rows_far_from_one_give_the_same_scale_free_geometry(tmp_path, exponent):
    """2**exponent·x is x with another exponent (exact): every scale-free number must be the same."""
    x = _rows()
    _save(tmp_path / "x.npy", x)
    _save(tmp_path / "scaled.npy", x * 2.0**exponent)
    code, text, got = _geometry(tmp_path / "scaled.npy", tmp_path / "g.json")
    assert code == 0, text
    ref = _geometry(tmp_path / "x.npy", tmp_path / "ref.json")[2]
    for key in SCALE_FREE:
        assert math.isclose(got[key], ref[key], rel_tol=1e-9, abs_tol=1e-12), (key, got[key], ref[key])
    assert math.isclose(got["mean_row_norm"], ref["mean_row_norm"] * 2.0**exponent, rel_tol=1e-12)


def test_kmeans_between_share_is_scale_free_down_to_tiny_probabilities():
    """Around 1e-30 the k-means++ probabilities underflowed float32 (a traceback); a power-of-two scale must
    change nothing."""
    x = _rows(1, 200, 6)
    assert kmeans_between_share(x * 2.0**-100) == kmeans_between_share(x)
    assert kmeans_between_share((x * 2.0**-100).float()) == kmeans_between_share(x.float())


@pytest.mark.parametrize(
    "scale, dtype, shown",
    [
        (1e-310, torch.float64, "underflow float64"),  # subnormal: ZeroDivisionError in the null test before
        (1e300, torch.float64, "overflow float64"),  # finite: OverflowError before
        (1e-30, torch.float32, "underflow float32"),  # squares below float32's range: wrong covariance / traceback
        (1e-40, torch.float32, "underflow float32"),  # float32 subnormals
        (1e15, torch.float32, "overflow float32"),
        (2.0**-135, torch.float64, "underflow float64"),  # the null test's sixth powers: ZeroDivisionError before
        (2.0**135, torch.float64, "overflow float64"),  # ... and OverflowError
    ],
)
def test_magnitudes_outside_the_computed_range_are_refused_with_the_reason(tmp_path, scale, dtype, shown):
    _save(tmp_path / "x.npy", (_rows() * scale).to(dtype))
    text = _refused(tmp_path, tmp_path / "x.npy", "x.npy", "row", shown, "Multiply the activations by one constant")
    assert "NaN" not in text


# --------------------------------------------------------------------------- SAE weights
def _saelens(tmp_path, tensors: dict) -> object:
    save_file(tensors, tmp_path / "sae_weights.safetensors")
    (tmp_path / "cfg.json").write_text(json.dumps({**_V6, "d_in": D_IN, "d_sae": D_SAE, "architecture": "standard"}))
    return tmp_path


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_sae_weights_load_as_their_values(tmp_path, dtype):
    w = {k: torch.from_numpy(v).to(dtype) for k, v in _weights(1).items()}
    sae = SAE.load(_saelens(tmp_path, w))
    for name, value in w.items():
        assert torch.equal(getattr(sae, name).detach(), value.to(torch.float32)), name


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.complex64, torch.uint8])
def test_sae_weights_that_are_not_real_floats_are_refused_by_name(tmp_path, dtype):
    w = {k: torch.from_numpy(v) for k, v in _weights(1).items()}
    w["W_dec"] = w["W_dec"] > 0 if dtype == torch.bool else w["W_dec"].to(dtype)
    with pytest.raises(FormatError, match=r"sae_weights\.safetensors: W_dec is \w+; an SAE's weights are real"):
        SAE.load(_saelens(tmp_path, w))


@pytest.mark.parametrize("make", ["sparse", "quantized", "float8"])
def test_sparse_quantized_and_float8_pt_weights_load_as_their_values(tmp_path, make):
    sd = _dl_state_dict("AutoEncoder")
    dense = sd["encoder.weight"]
    if make == "sparse":
        sd["encoder.weight"], expected = dense.to_sparse(), dense
    elif make == "quantized":
        sd["encoder.weight"] = torch.quantize_per_tensor(dense, 0.01, 0, torch.qint8)
        expected = sd["encoder.weight"].int_repr().to(torch.float32) * 0.01
    else:
        sd["encoder.weight"] = dense.to(torch.float8_e5m2)
        expected = sd["encoder.weight"].to(torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(sd, tmp_path / "ae.pt")
    sae = SAE.load(tmp_path / "ae.pt")
    assert torch.allclose(sae.W_enc.detach(), expected.T, rtol=0, atol=1e-7)


def test_a_meta_tensor_in_a_pt_dictionary_is_refused_by_name(tmp_path):
    sd = _dl_state_dict("AutoEncoder")
    sd["encoder.weight"] = torch.empty(sd["encoder.weight"].shape, device="meta")
    torch.save(sd, tmp_path / "ae.pt")
    with pytest.raises(FormatError, match=r"ae\.pt: encoder\.weight is a meta tensor"):
        SAE.load(tmp_path / "ae.pt")


@pytest.mark.parametrize("source", ["npy", "store"])
def test_rows_read_by_index_are_range_checked_naming_the_row(tmp_path, source):
    """Rows.read(index), the trainer's random access, is refused like a batch read, naming the global row: a
    float64 .npy row of 1e20 (beyond float32's computed range once read as float32) and a float32 store row of
    1e13."""
    from saegeo.activations.sources import open_rows
    from saegeo.activations.store import write_store
    from saegeo.errors import BadInputError

    x = _rows(2, 50, 8)
    if source == "npy":
        x = x.double()
        x[37] *= 1e20
        _save(tmp_path / "x.npy", x)
        rows = open_rows(tmp_path / "x.npy")
    else:
        x[37] *= 1e13
        rows = open_rows(write_store(tmp_path / "st", iter([x[:30], x[30:]]), hook="h", model="m", shard_rows=30))
    assert rows.read(torch.tensor([3, 5])).dtype == torch.float32  # rows in range are read
    with pytest.raises(BadInputError, match=r"\(global row 37\).*Multiply the activations by one constant, e\.g\. 1e-"):
        rows.read(torch.tensor([3, 37, 5]))
