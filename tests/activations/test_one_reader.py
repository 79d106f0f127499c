"""One reader of rows, one NaN policy: geometry, report, check, sweep, train and
the artifact pass read through ``open_rows``; a NaN row is one error naming the store, its shard and the row, or,
with --skip-nonfinite, skipped and counted alike everywhere; --no-verify is honoured by every read (check's match
pass included); one store given twice is refused."""

import json
import shutil

import pytest
import torch

from saegeo.activations.sources import open_rows
from saegeo.cli import main
from saegeo.errors import BadInputError, StoreError
from saegeo.report.dictionary_check import CheckOptions, check_with_activations
from saegeo.report.geometry_report import ReportOptions, geometry_report
from saegeo.report.layer_sweep import SweepOptions, sweep_stores
from saegeo.sae.model import SAE, SAEConfig
from saegeo.sae.train import TrainConfig, train_sae

D = 8
BAD_ROW = 700  # shard 2 (rows 512..767), row 188 of it


def _rows(n: int = 1200) -> torch.Tensor:
    return torch.randn(n, D, generator=torch.Generator().manual_seed(0)).abs() + 0.1


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A clean store and the same rows with one NaN at BAD_ROW, both with token ids and positions."""
    root = tmp_path_factory.mktemp("reader")
    x = _rows()
    ids, pos = torch.arange(1200) % 37, torch.arange(1200) % 16
    bad = x.clone()
    bad[BAD_ROW, 3] = float("nan")
    out = {}
    for name, data in (("clean", x), ("nan", bad)):
        from saegeo.activations.store import StoreWriter

        with StoreWriter(root / name, d=D, hook="blocks.0.hook_resid_post", model="m", shard_rows=256) as w:
            w.append(data, token_ids=ids, positions=pos)
        out[name] = root / name
    return out


NAMED = r"shard 2 \(shard_00002.safetensors\) row 188.*\(global row 700\)"


def _one_line_error(argv, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_nan_row_is_named_alike_by_every_command(stores, capsys, tmp_path):
    import re

    path = stores["nan"]
    err = _one_line_error(["geometry", str(path), "--no-progress"], capsys)
    assert str(path) in err and re.search(NAMED, err) and "--skip-nonfinite" in err, err
    with pytest.raises(BadInputError, match=NAMED):
        geometry_report(path, options=ReportOptions(progress=False))
    with pytest.raises(BadInputError, match=NAMED):
        sweep_stores([path])
    with pytest.raises(BadInputError, match=NAMED):  # a training row: it used to end as a non-finite loss
        train_sae(
            TrainConfig(
                d_sae=16,
                arch_options={"topk": {"k": 2}},
                batch_tokens=64,
                total_tokens=64 * 17,
                b_dec_init="zeros",
                b_dec_init_tokens=64,
                progress=False,
                shuffle_buffer=128,
            ),
            path,
        )  # a whole epoch


def test_skip_nonfinite_skips_and_counts_alike_artifact_pass_included(stores, tmp_path):
    path = stores["nan"]
    out = tmp_path / "g.json"
    # the artifact pass (a second pass over the store) used to stop at the NaN row despite --skip-nonfinite
    assert main(["geometry", str(path), "--skip-nonfinite", "--json", str(out), "--no-progress"]) == 0
    geo = json.loads(out.read_text())
    assert geo["n_nonfinite_skipped"] == 1 and geo["n"] == 1199 and geo["artifact"] is not None
    report = geometry_report(path, options=ReportOptions(progress=False, skip_nonfinite=True))
    assert report.activations["n_nonfinite_skipped"] == 1 and report.activations["n"] == 1199
    assert report.artifact is not None
    sweep = sweep_stores([path], SweepOptions(progress=False, skip_nonfinite=True))
    assert sweep.layers[0]["n"] == 1199
    res = train_sae(
        TrainConfig(
            d_sae=16,
            arch_options={"topk": {"k": 2}},
            batch_tokens=64,
            total_tokens=64 * 12,
            b_dec_init_tokens=2000,
            progress=False,
            shuffle_buffer=128,
            skip_nonfinite=True,
        ),
        path,
    )
    skipped = res.provenance["nonfinite_rows_skipped"]
    assert skipped["b_dec_init"] == 1 and skipped["heldout"] == 0 and skipped["training"] <= 1
    # the same numbers as the rows without the NaN row, read from a tensor
    clean = torch.cat([_rows()[:BAD_ROW], _rows()[BAD_ROW + 1 :]])
    ref = geometry_report(clean, options=ReportOptions(progress=False))
    assert report.activations["anisotropy"] == pytest.approx(ref.activations["anisotropy"], abs=1e-9)


def test_no_verify_is_honoured_by_checks_match_pass(stores, tmp_path):
    path = shutil.copytree(stores["clean"], tmp_path / "s")
    shard = path / "shard_00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-7] ^= 0x04  # one flipped bit in the payload
    shard.write_bytes(bytes(data))
    sae = SAE(SAEConfig(d_in=D, d_sae=16, activation="topk", k=2))
    sae.init_weights(torch.Generator().manual_seed(0))
    with pytest.raises(StoreError, match="fails its sha256 check"):
        check_with_activations(
            sae, path, options=CheckOptions(progress=False), report_options=ReportOptions(progress=False)
        )
    report, _ = check_with_activations(
        sae,
        path,
        options=CheckOptions(progress=False, verify=False),
        report_options=ReportOptions(progress=False, verify=False),
    )
    assert report.activations["n"] == 1200


def test_one_store_given_twice_is_refused(stores, tmp_path, capsys):
    path = stores["clean"]
    err = _one_line_error(["geometry", str(path), str(path) + "/", "--no-progress"], capsys)
    assert "given twice" in err, err
    copy = shutil.copytree(path, tmp_path / "copy")
    err = _one_line_error(["geometry", str(path), str(copy), "--no-progress"], capsys)
    assert "same shards" in err, err


def test_the_reader_names_file_and_tensor_rows(tmp_path):
    x = _rows(50)
    x[17, 2] = float("inf")
    rows = open_rows(x)
    with pytest.raises(BadInputError, match=r"in the tensor, batch 1 row 7 \(global row 17\)"):
        list(rows.batches(10)[0])
    rows = open_rows(x, skip_nonfinite=True)
    assert sum(len(b) for b in rows.batches(10)[0]) == 49 and rows.n_nonfinite_skipped == 1
    # a huge finite row is not called non-finite (its sum overflows; its entries do not): it is refused for what it
    # is, values whose squares overflow float32
    big = torch.full((3, D), 3e38)
    with pytest.raises(BadInputError, match=r"magnitude up to 3e\+38, above .* overflow float32") as err:
        next(open_rows(big).batches(10)[0])
    assert "non-finite" not in str(err.value)
    # stop_row: no row at or after it, whatever the batch size
    assert sum(len(b) for b in open_rows(_rows(50)).batches(7, stop_row=23)[0]) == 23


def test_read_by_index_is_what_the_batches_hold(stores):
    rows = open_rows(stores["clean"])
    index = torch.tensor([1199, 0, 256, 255, 700])
    assert torch.equal(rows.read(index), _rows()[index])
    assert torch.equal(open_rows(_rows()).read(index), _rows()[index])
