"""`saegeo geometry FILE…`: formats, streaming over several files, JSON, clear errors."""

import json
import pickle

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from saegeo.cli import main


@pytest.fixture
def three_files(tmp_path):
    rng = np.random.default_rng(0)
    x = (np.maximum(rng.normal(size=(900, 16)), 0) + 0.2).astype(np.float32)
    np.save(tmp_path / "a.npy", x[:300])
    save_file({"activations": torch.from_numpy(x[300:600]), "token_ids": torch.arange(300)}, tmp_path / "b.safetensors")
    torch.save({"acts": torch.from_numpy(x[600:])}, tmp_path / "c.pt")
    return x, [str(tmp_path / n) for n in ("a.npy", "b.safetensors", "c.pt")]


def test_streams_several_formats_and_writes_json(three_files, tmp_path, capsys, brute_mean_cosine):
    x, files = three_files
    out = tmp_path / "geo.json"
    assert main(["geometry", *files, "--json", str(out), "--batch-rows", "128", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "900 rows × 16 dims" in printed and "A = " in printed and "IsoScore" in printed
    result = json.loads(out.read_text())
    x64 = x.astype(np.float64)
    assert result["n"] == 900 and result["d"] == 16 and result["files"] == files
    assert result["anisotropy"] == pytest.approx(brute_mean_cosine(x64), abs=1e-7)
    s = np.linalg.svd(x64 - x64.mean(0), compute_uv=False)
    np.testing.assert_allclose(result["eigenvalues"], s**2 / 900, rtol=1e-5, atol=1e-7)


def test_store_directory_is_read(tmp_path, capsys, brute_mean_cosine):
    from saegeo.activations.store import write_store

    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 8)).astype(np.float32) + 1
    write_store(tmp_path / "store", torch.from_numpy(x), shard_rows=200)
    out = tmp_path / "g.json"
    assert main(["geometry", str(tmp_path / "store"), "--json", str(out), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert result["n"] == 500
    assert result["anisotropy"] == pytest.approx(brute_mean_cosine(x.astype(np.float64)), abs=1e-7)


def test_errors_name_the_file_and_what_to_do(tmp_path, capsys):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(50, 4)).astype(np.float32)
    x[17, 2] = np.nan
    np.save(tmp_path / "nan.npy", x)
    assert main(["geometry", str(tmp_path / "nan.npy"), "--batch-rows", "10", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "nan.npy" in err and "batch 1" in err and "row 7" in err and "--skip-nonfinite" in err
    assert "Traceback" not in err
    # …and --skip-nonfinite counts it instead
    out = tmp_path / "skip.json"
    assert main(["geometry", str(tmp_path / "nan.npy"), "--skip-nonfinite", "--json", str(out), "--no-progress"]) == 0
    assert json.loads(out.read_text())["n_nonfinite_skipped"] == 1

    # ambiguous safetensors key, wrong --key, 4-D tensor, unknown type, mismatched d
    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5, 4)}, tmp_path / "two.safetensors")
    assert main(["geometry", str(tmp_path / "two.safetensors"), "--no-progress"]) == 2
    assert "--key" in capsys.readouterr().err
    assert main(["geometry", str(tmp_path / "two.safetensors"), "--key", "zz", "--no-progress"]) == 2
    assert "no tensor named 'zz'" in capsys.readouterr().err
    np.save(tmp_path / "hypercube.npy", np.zeros((2, 3, 4, 5)))  # (batch, pos, d) is read; 4-D is not
    assert main(["geometry", str(tmp_path / "hypercube.npy"), "--no-progress"]) == 2
    assert "activations are (rows, d) or (batch, pos, d)" in capsys.readouterr().err
    (tmp_path / "x.csv").write_text("1,2\n")
    assert main(["geometry", str(tmp_path / "x.csv"), "--no-progress"]) == 2
    assert "unknown file type" in capsys.readouterr().err
    np.save(tmp_path / "d5.npy", np.ones((4, 5)))
    assert main(["geometry", str(tmp_path / "nan.npy"), str(tmp_path / "d5.npy"), "--no-progress"]) == 2
    assert "disagree on d" in capsys.readouterr().err


class _Evil:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('x')",))


def test_pickle_that_runs_code_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(tmp_path / "evil.pt", "wb") as fh:
        pickle.dump({"acts": _Evil()}, fh)
    assert main(["geometry", str(tmp_path / "evil.pt"), "--no-progress"]) == 2
    assert "weights_only" in capsys.readouterr().err
    assert not (tmp_path / "PWNED").exists()


def test_geometry_and_report_say_the_same_mean_explains_share(tmp_path, capsys):
    """Issue 25: `saegeo geometry` reads the offset-dominated cone's share as 1 − A_centred/A on the report's row
    sample (same size, same seed), not the clipped proxy (‖μ‖/E‖x‖)²/A: both commands print one number."""
    import re

    import numpy as np
    import torch

    from saegeo.report import ReportOptions, geometry_report

    g = torch.Generator().manual_seed(0)
    d, n = 64, 4000
    mu = torch.randn(d, generator=g)
    mu *= 12 / mu.norm()
    x = (mu + torch.randn(n, d, generator=g)) * torch.exp(0.5 * torch.randn(n, 1, generator=g))
    np.save(tmp_path / "x.npy", x.numpy())
    assert main(["geometry", str(tmp_path / "x.npy"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    said = re.search(r"the mean explains (\d+)% of it \(centred rows: A = ", printed)
    assert said, printed
    report = geometry_report(str(tmp_path / "x.npy"), options=ReportOptions())
    [flag] = [f for f in report.flags if f.name == "offset_dominated_cone"]
    assert flag.evidence["explained_by"] == "1 - A(centred sample rows)/A"
    assert int(said.group(1)) == round(100 * flag.evidence["share_of_A_explained_by_mean"])
