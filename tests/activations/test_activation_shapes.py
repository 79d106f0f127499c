"""Activations as transformer-lens gives them: (batch, pos, d) tensors and files are read as batch·pos rows, each
row keeping its position (0..pos-1 within its batch row), and a shape that cannot be rows says so once, the same
way for every kind of source."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from saegeo.activations.sources import open_rows
from saegeo.errors import BadInputError
from saegeo.geometry import GeometryAccumulator, activation_geometry

B, P, D = 3, 5, 4


def _acts() -> torch.Tensor:
    return torch.randn(B, P, D, generator=torch.Generator().manual_seed(0))


def _write(kind: str, x: torch.Tensor, path):
    if kind == "pt":
        torch.save(x, path)
    elif kind == "npy":
        np.save(path, x.numpy())
    else:
        save_file({"resid": x.contiguous()}, path)
    return path


def _all_rows(rows, batch_size=4):
    return torch.cat([b.float() for b in rows.batches(batch_size)[0]])


@pytest.mark.parametrize("kind", ["tensor", "array", "pt", "npy", "safetensors"])
def test_batch_pos_d_is_read_as_rows_in_order(kind, tmp_path):
    x = _acts()
    in_memory = {"tensor": x, "array": x.numpy()}
    source = in_memory[kind] if kind in in_memory else _write(kind, x, tmp_path / f"a.{kind}")
    rows = open_rows(source)
    assert (rows.n_rows, rows.d) == (B * P, D)
    flat = x.reshape(B * P, D)
    torch.testing.assert_close(_all_rows(rows), flat, rtol=0, atol=0)  # batch rows 4 cut across windows
    torch.testing.assert_close(rows.read(torch.tensor([7, 0, 14])), flat[[7, 0, 14]], rtol=0, atol=0)
    # the positions kept: row g is position g mod pos of batch row g div pos
    pos = torch.cat([p for _, _, p in rows.batches(4, metadata=True)[0]])
    assert pos.tolist() == [g % P for g in range(B * P)]
    assert rows.describe["shape"] == [B, P, D]


def test_geometry_of_batch_pos_d_equals_the_flattened_rows():
    x = _acts().double()
    acc = GeometryAccumulator(D)
    acc.add(x.reshape(-1, D))
    ref = activation_geometry(acc)
    from saegeo.report import geometry_report
    from saegeo.report.geometry_report import ReportOptions

    got = geometry_report(x, options=ReportOptions(progress=False)).activations
    assert got["n"] == B * P
    assert got["anisotropy"] == pytest.approx(ref.anisotropy, rel=1e-12)


@pytest.mark.parametrize("shape", [(6,), (2, 3, 4, 5)])
def test_shapes_that_are_not_rows_get_one_message(shape, tmp_path):
    x = torch.randn(*shape)
    expected = r"shape \(" + ", ".join(map(str, shape)) + r",?\); activations are \(rows, d\) or \(batch, pos, d\)"
    with pytest.raises(BadInputError, match=expected):
        open_rows(x)
    torch.save(x, tmp_path / "x.pt")
    with pytest.raises(BadInputError, match=expected):
        open_rows(tmp_path / "x.pt")
    save_file({"acts": x}, tmp_path / "x.safetensors")
    with pytest.raises(BadInputError, match=expected):
        open_rows(tmp_path / "x.safetensors", key="acts")


def test_key_is_needed_only_when_several_tensors_could_be_rows(tmp_path):
    save_file({"resid": _acts(), "tokens": torch.zeros(B, P, dtype=torch.int64)}, tmp_path / "c.safetensors")
    assert open_rows(tmp_path / "c.safetensors").n_rows == B * P  # the only 2-D or 3-D float tensor
    save_file({"a": _acts(), "b": _acts()}, tmp_path / "two.safetensors")
    with pytest.raises(BadInputError, match=r"tensors that could be activations: \[.a., .b.\] .*; pass --key NAME"):
        open_rows(tmp_path / "two.safetensors")


def test_cli_geometry_reads_a_batch_pos_d_file(tmp_path):
    x = _acts()
    torch.save(x, tmp_path / "cache.pt")
    np.save(tmp_path / "flat.npy", x.reshape(-1, D).numpy())
    out = {}
    for name in ("cache.pt", "flat.npy"):
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "saegeo.cli",
                "geometry",
                str(tmp_path / name),
                "--json",
                str(tmp_path / f"{name}.json"),
            ],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
        out[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert "15 rows × 4 dims" in res.stdout
    a, b = out["cache.pt"], out["flat.npy"]
    assert a["anisotropy"] == pytest.approx(b["anisotropy"], rel=1e-12)
    bad = tmp_path / "bad.pt"
    torch.save(torch.randn(2, 3, 4, 5), bad)
    res = subprocess.run([sys.executable, "-m", "saegeo.cli", "geometry", str(bad)], capture_output=True, text=True)
    assert res.returncode == 2
    assert "activations are (rows, d) or (batch, pos, d)" in res.stderr and "Traceback" not in res.stderr


def test_positions_of_batch_pos_d_reach_the_bos_check():
    """An SAE trained without BOS, checked on (batch, pos, d) activations: the B rows at position 0 are counted
    (a flat tensor has no positions, which is said instead)."""
    from saegeo.report.dictionary_check import activations_match_flags
    from saegeo.sae.model import SAE, SAEConfig

    sae = SAE(SAEConfig(d_in=D, d_sae=8, activation="relu")).init_weights(torch.Generator().manual_seed(0))
    sae.format_info.exclude_special_tokens = True
    x = _acts() + 3.0
    flags = activations_match_flags(sae, x)
    [mismatch] = [f for f in flags if f.name == "activations_mismatch"]
    assert mismatch.evidence["special_rows"]["position0_rows"] == B
    notes: list[str] = []
    activations_match_flags(sae, x.reshape(-1, D), notes=notes)
    assert any("no positions" in n for n in notes)
