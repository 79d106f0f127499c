"""Norm detectors (issue 41 item 2): each latent's activation correlated with ‖x‖, with position and with its token's
log frequency in the report's one pass (LatentCovariates), against numpy's corrcoef of the dense codes of every row;
latents planted to fire by norm, by position, by token frequency and by content are told apart."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from saegeo.geometry.latent_stats import LatentCovariates

N_ROWS, D, WINDOW = 4000, 8, 50


def _brute_r(codes: np.ndarray, s: np.ndarray) -> list[float | None]:
    out = []
    for i in range(codes.shape[1]):
        a = codes[:, i].astype(np.float64)
        out.append(None if a.std() == 0 else float(np.corrcoef(a, s)[0, 1]))
    return out


def _sparse(n, n_latents, seed, density=0.2):
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(n, n_latents, generator=g) * (torch.rand(n, n_latents, generator=g) < density)
    return dense


@pytest.mark.parametrize("batch", [1, 37, 1000])
def test_streamed_correlations_equal_numpy_with_a_covariate_far_from_zero(batch):
    codes = _sparse(1000, 12, 0)
    codes[:, 5] = 0  # a latent that never fires: no correlation
    codes[:, 7] = 0.25  # one that always fires at the same value: none either
    g = torch.Generator().manual_seed(1)
    s = torch.stack([1e4 + torch.randn(1000, generator=g) + 3 * codes[:, 2], torch.arange(1000.0) % 64], dim=1)
    acc = LatentCovariates(12, ("norm", "position"))
    for lo in range(0, 1000, batch):
        acc.add(codes[lo : lo + batch].to_sparse(), s[lo : lo + batch])
    got = acc.correlations()
    for j, name in enumerate(("norm", "position")):
        want = _brute_r(codes.numpy(), s[:, j].double().numpy())
        assert got[name][5] is None and got[name][7] is None
        for i in range(12):
            if want[i] is not None and i != 7:
                assert got[name][i] == pytest.approx(want[i], abs=1e-9), (name, i)
    assert got["norm"][2] > 0.5  # the planted dependence


def test_two_parts_merged_with_different_shifts_equal_one_pass():
    codes = _sparse(900, 6, 2)
    s = torch.linspace(100.0, 200.0, 900)[:, None] + codes[:, :1]
    whole = LatentCovariates(6).add(codes, s).correlations()["norm"]
    a = LatentCovariates(6).add(codes[:300], s[:300])  # shifts: the first batch's means (~117 and ~167)
    b = LatentCovariates(6).add(codes[300:], s[300:])
    merged = LatentCovariates.from_state_dict(a.state_dict()).merge(b).correlations()["norm"]
    assert merged == pytest.approx(whole, abs=1e-12)
    assert LatentCovariates(6).merge(a).correlations() == a.correlations()


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Rows x = r·(e₀ + ε) + content·e₁ + (position/WINDOW)·e₂ + (log f_t + 6 + noise)·e₃ with r ~ U(2, 10) per row
    and token ids t drawn from a skewed law (f_t: the id's share of the store's rows): an SAE (ReLU, identity encoder,
    b_enc = −0.5) whose latent 0 reads the norm direction e₀ (a norm detector), latent 1 content, latent 2 the
    position, latent 3 the token's log frequency, latent 4 never fires."""
    from saegeo.activations.store import ActivationStore, StoreWriter
    from saegeo.sae.model import SAE, SAEConfig

    root = tmp_path_factory.mktemp("norm_detectors")
    g = torch.Generator().manual_seed(0)
    r = 2 + 8 * torch.rand(N_ROWS, generator=g)
    positions = torch.arange(N_ROWS) % WINDOW
    x = 0.05 * torch.randn(N_ROWS, D, generator=g)
    x[:, 0] += r
    x[:, 1] += 2.0 * torch.randn(N_ROWS, generator=g).abs() * (torch.rand(N_ROWS, generator=g) < 0.3)
    x[:, 2] += 2.0 * positions / WINDOW
    ids = (500 * torch.rand(N_ROWS, generator=g) ** 3).long()  # id 0 about a fifth of the rows, most ids rare
    log_f = (torch.bincount(ids).double() / N_ROWS).log()[ids]
    x[:, 3] += (log_f + 6 + 0.3 * torch.randn(N_ROWS, generator=g).double()).float()
    x[:, 4] = -1.0
    with StoreWriter(root / "store", d=D, hook="blocks.0.hook_resid_post", model="toy", shard_rows=900) as w:
        for lo in range(0, N_ROWS, 700):
            w.append(x[lo : lo + 700], token_ids=ids[lo : lo + 700], positions=positions[lo : lo + 700])
    sae = SAE(SAEConfig(d_in=D, d_sae=5, activation="relu")).init_weights(torch.Generator().manual_seed(1))
    with torch.no_grad():
        sae.W_enc.zero_()
        sae.W_enc[torch.arange(5), torch.arange(5)] = 1.0
        sae.b_enc.fill_(-0.5)
        sae.b_dec.zero_()
        sae.W_dec.zero_()
        sae.W_dec[torch.arange(5), torch.arange(5)] = 1.0
    return {"store": ActivationStore(root / "store"), "sae": sae, "x": x, "pos": positions, "ids": ids}


def _log_frequency(ids: torch.Tensor) -> np.ndarray:
    """log(c_t / n) of each row's token, counted by numpy over these rows."""
    ids = ids.numpy()
    return np.log(np.bincount(ids)[ids] / len(ids))


@pytest.mark.parametrize("group_rows", [None, 64])
def test_the_report_table_finds_the_planted_norm_and_position_latents_as_brute_force(planted, monkeypatch, group_rows):
    from saegeo.report import ReportOptions, geometry_report

    if group_rows:  # a batch encoded in several groups of rows: each group's codes meet their own rows' covariates
        monkeypatch.setattr("saegeo.sae.metrics.max_group_rows", lambda *a, **k: group_rows)

    opts = ReportOptions(progress=False, batch_rows=600, latent_contexts=2)
    table = geometry_report(planted["store"], {"p": planted["sae"]}, options=opts).saes[0].latent_table
    with torch.no_grad():
        codes = planted["sae"].encode(planted["x"]).double().numpy()
    norms = planted["x"].double().norm(dim=1).numpy()
    covariates = {
        "norm_corr": norms,
        "position_corr": planted["pos"].double().numpy(),
        "log_frequency_corr": _log_frequency(planted["ids"]),
    }
    for column, s in covariates.items():
        want = _brute_r(codes, s)
        assert table[column][4] is None and want[4] is None  # never fires
        assert table[column][:4] == pytest.approx(want[:4], abs=1e-9), column
    assert table["norm_corr"][0] > 0.95 and abs(table["norm_corr"][1]) < 0.2  # the detector; content (its share of ‖x‖)
    assert table["position_corr"][2] > 0.95 and abs(table["position_corr"][0]) < 0.1
    assert table["log_frequency_corr"][3] > 0.9 and abs(table["log_frequency_corr"][2]) < 0.1


def test_log_frequency_counts_only_the_rows_the_pass_reads(planted):
    from saegeo.report import ReportOptions, geometry_report

    n = 2500  # inside the third shard: the counts stop there too
    opts = ReportOptions(progress=False, batch_rows=600, latent_contexts=2, max_tokens=n)
    table = geometry_report(planted["store"], {"p": planted["sae"]}, options=opts).saes[0].latent_table
    with torch.no_grad():
        codes = planted["sae"].encode(planted["x"][:n]).double().numpy()
    want = _brute_r(codes, _log_frequency(planted["ids"][:n]))
    assert table["log_frequency_corr"][:4] == pytest.approx(want[:4], abs=1e-9)


def test_without_positions_the_position_column_is_empty_and_latents_ranks_by_norm_corr(planted, tmp_path, capsys):
    import json

    from saegeo.cli import main
    from saegeo.report import ReportOptions, geometry_report

    opts = ReportOptions(progress=False, batch_rows=600, latent_contexts=2)
    table = geometry_report(planted["x"], {"p": planted["sae"]}, options=opts).saes[0].latent_table
    assert table["position_corr"] == [None] * 5 and table["log_frequency_corr"] == [None] * 5
    assert table["norm_corr"][0] > 0.95
    planted["sae"].save(tmp_path / "sae")
    store = str(planted["store"].path)
    out = tmp_path / "lat"
    assert main(["latents", str(tmp_path / "sae"), "--acts", store, "--by", "norm_corr", "--top", "1",
                 "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    doc = json.loads((out / "latents.json").read_text())
    assert [c["id"] for c in doc["saes"][0]["latents"]] == [0]
    assert doc["saes"][0]["latent_table"]["log_frequency_corr"][3] > 0.9  # `latents` measures it too
    capsys.readouterr()
