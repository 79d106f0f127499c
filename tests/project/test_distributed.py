"""torch.distributed: 2 CPU ranks (gloo, loopback) launched by torchrun, against single-process runs.

Each multi-process test starts one `torchrun --standalone --nproc_per_node 2` job (a few seconds) and
compares what the ranks wrote with a single-process computation done here (the stalled-rank test
starts its two ranks as plain processes instead, so that only saegeo's timeout can end them). Collective timeouts are
short (SAEGEO_DIST_TIMEOUT) and every launch has a wall-clock guard, so a hang fails instead of blocking.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from saegeo import distributed
from saegeo.activations.store import ActivationStore, write_store
from saegeo.geometry import GeometryAccumulator
from saegeo.report import ReportOptions, geometry_report
from saegeo.sae.model import SAE, SAEConfig
from saegeo.sae.train import TrainConfig, train_sae

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_GUARD_S = 120  # a launch that takes longer than this has hung


def _torchrun(args: list[str], tmp_path: Path, *, expect_ok: bool = True) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        GLOO_SOCKET_IFNAME="lo",
        SAEGEO_DIST_TIMEOUT="30",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(ROOT),
        TQDM_DISABLE="1",
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=LAUNCH_GUARD_S)
    out = proc.stdout + proc.stderr
    if expect_ok:
        assert proc.returncode == 0, out[-4000:]
    return proc


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


# =========================================================================== pure helpers (no processes)
@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_split_shards_gives_every_shard_to_exactly_one_rank_balanced_by_rows(world):
    """Contiguous blocks in store order, each shard once, and balanced as well as whole shards allow:
    the boundaries are as close to the row quantiles r·N/W as any choice of W − 1 shard boundaries
    (brute force over all of them), and so no rank gets more than the best largest block plus one shard."""
    from itertools import combinations_with_replacement

    rng = np.random.default_rng(world)
    for _ in range(30):
        rows = rng.integers(1, 100, size=int(rng.integers(1, 10))).tolist()
        blocks = [distributed.split_shards(rows, r, world) for r in range(world)]
        flat = [i for b in blocks for i in b]
        assert flat == list(range(len(rows)))  # contiguous, in store order, each shard once
        cum = np.concatenate([[0], np.cumsum(rows)])
        targets = cum[-1] * np.arange(1, world) / world
        got_bounds = np.array([b.start for b in blocks[1:]], dtype=int)
        # every non-decreasing choice of the W − 1 inner boundaries (indices into cum)
        combos = list(combinations_with_replacement(range(len(rows) + 1), world - 1))
        choices = np.array(combos, dtype=int).reshape(len(combos), world - 1)
        cost = np.abs(cum[choices] - targets).sum(axis=1)
        got_cost = np.abs(cum[got_bounds] - targets).sum()
        assert got_cost <= cost.min() + 1e-9, (rows, got_bounds.tolist(), choices[cost.argmin()].tolist())
        # the largest block against the best possible largest block (brute force, same choices)
        edges = np.concatenate([np.zeros((len(choices), 1), int), choices, np.full((len(choices), 1), len(rows))], 1)
        best_max = (cum[edges[:, 1:]] - cum[edges[:, :-1]]).max(axis=1).min()
        got_max = max(int(cum[b.stop] - cum[b.start]) if b else 0 for b in blocks)
        assert got_max <= best_max + max(rows), (rows, [list(b) for b in blocks])


def test_rank_rows_partition_a_batch():
    for n in (1, 7, 128, 129):
        for world in (1, 2, 3):
            parts = [np.arange(n)[distributed.rank_rows(n, r, world)] for r in range(world)]
            assert np.concatenate(parts).tolist() == list(range(n))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_without_a_launcher_everything_is_single_process():
    assert distributed.current() is None and distributed.init_from_env() is None
    x = torch.randn(50, 4, dtype=torch.float64) + 100.0
    acc = GeometryAccumulator(4).add(x)
    assert distributed.merge_across_ranks(acc) is acc
    assert distributed.sum_across_ranks(3) == 3
    expected = float(((x - x.mean(0)) ** 2).sum())
    assert float(distributed.centred_sum_of_squares(x)) == pytest.approx(expected, rel=1e-12)
    assert torch.allclose(distributed.mean_across_ranks(iter([x[:20], x[20:]])), x.mean(0), rtol=1e-14)


# =========================================================================== one 2-rank job, several checks
# Starting torch in 3 processes costs seconds, so one torchrun job does everything that ends cleanly:
# reductions, training (tensor and store), the report through the CLI, and two bad launches whose
# errors every rank catches. The tests below each check one part of what it wrote.
WORKER = r"""
import json, sys, torch
from pathlib import Path
from safetensors.torch import save_file
from saegeo import distributed
from saegeo.cli import main
from saegeo.errors import SaegeoError
from saegeo.geometry import GeometryAccumulator
from saegeo.geometry.amplification import CodeMomentAccumulator
from saegeo.report import ReportOptions, geometry_report
from saegeo.sae.train import TrainConfig, train_sae

out = Path(sys.argv[1])
ctx = distributed.init_from_env()
assert ctx is not None and ctx.world_size == 2 and ctx.backend == "gloo"
r = ctx.rank

# ---- reductions: each rank's rows differ in size and mean (a large mean tests Chan's merge)
g = torch.Generator().manual_seed(100 + r)
x = torch.randn(300 + 77 * r, 6, generator=g, dtype=torch.float64) * (1 + r) + 1e4
acc = GeometryAccumulator(6)
for lo in range(0, x.shape[0], 64):
    acc.add(x[lo:lo + 64])
merged = distributed.merge_across_ranks(acc)
codes = torch.relu(torch.randn(40 + 10 * r, 9, generator=g, dtype=torch.float64) - 0.5)
cm = distributed.merge_across_ranks(CodeMomentAccumulator(9, mean_sq_norm=0.3).add(codes))
css = distributed.centred_sum_of_squares(x)
css_empty_share = distributed.centred_sum_of_squares(x[:0] if r == 0 else x[:5])  # rank 0 holds no rows
common = torch.randn(250, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64) + 3.0
mean = distributed.mean_across_ranks(iter([common[:101], common[101:]]))  # same batches on every rank
save_file({"cov": merged.covariance(), "mean": merged.mean, "unit_mean": merged.unit_mean,
           "n": torch.tensor([merged.n]), "css": css.reshape(1), "css_empty_share": css_empty_share.reshape(1), "init_mean": mean, "cm_fire": cm.fire_count,
           "cm_stats": torch.tensor([cm.n, cm.l0_sum, cm.value_sum, cm.ratio_sum], dtype=torch.float64)},
          str(out / f"reduce_{r}.safetensors"))

# ---- training on a tensor: every rank holds the data, computes half of each global batch
data = torch.load(out / "train_x.pt", weights_only=True)
cfg = TrainConfig(**json.loads((out / "train_cfg.json").read_text()))
full = train_sae(TrainConfig(**{**cfg.__dict__, "out_dir": str(out / "full")}), data)
save_file({k: v.detach().contiguous() for k, v in full.sae.state_dict().items()}, str(out / f"weights_{r}.safetensors"))
(out / f"history_{r}.json").write_text(json.dumps({"history": full.history, "heldout": full.heldout}))

class Stop(Exception):
    pass

def stop_at_4(step, live):
    if step == 4:
        raise Stop()

try:  # interrupted after the step-4 checkpoint: the test resumes it on one process
    train_sae(TrainConfig(**{**cfg.__dict__, "out_dir": str(out / "cut"), "checkpoint_every": 4}), data,
              on_step=stop_at_4)
except Stop:
    pass

# ---- training from a store: each rank streams its own shards; weights stay identical across ranks
store_run = train_sae(TrainConfig(**{**cfg.__dict__, "total_tokens": 3 * cfg.batch_tokens}), str(out / "store"))
w = distributed.gather_objects(store_run.sae.W_dec.detach())
(out / f"store_{r}.json").write_text(json.dumps({"identical": bool(torch.equal(w[0], w[1])),
                                                 "finite": bool(torch.isfinite(w[r]).all())}))

# ---- the report through the CLI, exactly as `torchrun -m saegeo.cli report ...` runs it
code = main(["report", "--acts", str(out / "rstore"), "--sae", f"s={out / 'sae'}", "--out", str(out / "report"),
             "--format", "json", "--batch-rows", "128", "--no-progress"])
assert code == 0

# ---- bad launches: every rank must end with a message (caught here so the job goes on)
errors = {}
for case, store in (("mismatch", "rstore" if r == 0 else "other"), ("nan", "rstore_bad")):
    try:
        geometry_report(str(out / store), options=ReportOptions(progress=False, batch_rows=128))
        errors[case] = None
    except SaegeoError as err:
        errors[case] = f"{type(err).__name__}: {err}"
(out / f"errors_{r}.json").write_text(json.dumps(errors))

# ---- a store of one shard: rank 1 streams nothing and still takes part in the merge
one = geometry_report(str(out / "one"), options=ReportOptions(progress=False))
(out / f"one_{r}.json").write_text(json.dumps({"n": one.activations["n"], "A": one.activations["anisotropy"]}))

# ---- rank 0 alone inside the job (e.g. a report from a DDP training loop): no collective, no hang
if r == 0:
    with distributed.local_only():
        solo = geometry_report(torch.arange(1.0, 41.0).reshape(20, 2), options=ReportOptions(progress=False))
    (out / "solo.json").write_text(json.dumps({"n": solo.activations["n"]}))
distributed.barrier()
"""


def _train_cfg(**kw) -> dict:
    base = dict(
        arch="topk",
        d_sae=48,
        arch_options={"topk": {"k": 4}},
        lr=2e-3,
        batch_tokens=64,
        total_tokens=64 * 10,
        warmup_steps=2,
        dead_window_tokens=256,
        b_dec_init_tokens=600,
        heldout_fraction=0.1,
        seed=3,
        progress=False,
        log_every=1,
        shuffle_buffer=128,
    )
    base.update(kw)
    return base


def _train_data() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(12, generator=g) * 3
    return torch.relu(torch.randn(1200, 12, generator=g)) + mean  # offset + non-negative spread


def _report_data(poison_row: int | None = None) -> torch.Tensor:
    """1500 rows; stored in shards of 200 rows the split gives rank 0 shards 0-3 (800 rows), rank 1 shards 4-7."""
    x = torch.randn(1500, 10, generator=torch.Generator().manual_seed(7)) * torch.linspace(0.5, 2.0, 10) + 5.0
    if poison_row is not None:
        x[poison_row, 3] = float("nan")
    return x


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """Run WORKER on 2 ranks once; return the directory it wrote to."""
    tmp = tmp_path_factory.mktemp("dist")
    data = _train_data()
    torch.save(data, tmp / "train_x.pt")
    (tmp / "train_cfg.json").write_text(json.dumps(_train_cfg()))
    write_store(tmp / "store", data, shard_rows=150)  # 8 shards: 4 per rank and epoch
    for name, poison in (("rstore", None), ("rstore_bad", 1400)):
        write_store(tmp / name, _report_data(poison), shard_rows=200)
    write_store(tmp / "other", torch.randn(300, 10), shard_rows=100)
    write_store(tmp / "one", torch.rand(50, 4), shard_rows=100)
    sae = SAE(SAEConfig(d_in=10, d_sae=40, activation="topk", k=5)).init_weights(torch.Generator().manual_seed(1))
    with torch.no_grad():
        sae.b_dec.copy_(_report_data().mean(0) * 0.5)  # b_dec halfway to the mean
    sae.save(tmp / "sae")
    _torchrun([_script(tmp, "worker.py", WORKER), str(tmp)], tmp)
    return tmp


def test_reductions_on_two_ranks_equal_brute_force_over_all_rows(job):
    xs = [
        (
            torch.randn(300 + 77 * r, 6, generator=torch.Generator().manual_seed(100 + r), dtype=torch.float64)
            * (1 + r)
            + 1e4
        ).numpy()
        for r in range(2)
    ]
    allx = np.concatenate(xs)
    ranks = [load_file(str(job / f"reduce_{r}.safetensors")) for r in range(2)]
    for key in ranks[0]:
        assert torch.equal(ranks[0][key], ranks[1][key]), f"{key} differs between ranks"
    red = ranks[0]
    assert int(red["n"]) == allx.shape[0]
    np.testing.assert_allclose(red["mean"].numpy(), allx.mean(0), rtol=1e-14)
    np.testing.assert_allclose(red["cov"].numpy(), np.cov(allx.T, bias=True), rtol=1e-9, atol=1e-12)
    unit = allx / np.linalg.norm(allx, axis=1, keepdims=True)
    np.testing.assert_allclose(red["unit_mean"].numpy(), unit.mean(0), rtol=1e-13)
    np.testing.assert_allclose(float(red["css"]), ((allx - allx.mean(0)) ** 2).sum(), rtol=1e-10)
    np.testing.assert_allclose(float(red["css_empty_share"]), ((xs[1][:5] - xs[1][:5].mean(0)) ** 2).sum(), rtol=1e-10)
    common = torch.randn(250, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64).numpy() + 3.0
    np.testing.assert_allclose(red["init_mean"].numpy(), common.mean(0), rtol=1e-13)
    codes = []
    for r in range(2):
        gr = torch.Generator().manual_seed(100 + r)
        torch.randn(300 + 77 * r, 6, generator=gr, dtype=torch.float64)  # same stream position as the worker
        codes.append(torch.relu(torch.randn(40 + 10 * r, 9, generator=gr, dtype=torch.float64) - 0.5).numpy())
    c = np.concatenate(codes)
    np.testing.assert_array_equal(red["cm_fire"].numpy(), (c > 0).sum(0))
    s, q = c.sum(1), (c**2).sum(1)
    ratio = np.where(s > 0, s / np.sqrt(s**2 * 0.3 + 0.7 * q + (s == 0)), 0.0).sum()
    np.testing.assert_allclose(red["cm_stats"].numpy(), [c.shape[0], (c > 0).sum(), c.sum(), ratio], rtol=1e-12)


def test_two_rank_training_equals_one_process_on_the_concatenated_batches_and_resumes_on_one(job, tmp_path):
    data = _train_data()
    single = train_sae(TrainConfig(**_train_cfg(out_dir=str(tmp_path / "single"))), data)
    two = json.loads((job / "history_0.json").read_text())
    curve_1 = [h["mse"] for h in single.history]
    curve_2 = [h["mse"] for h in two["history"]]
    assert len(curve_1) == len(curve_2) == 10
    np.testing.assert_allclose(curve_2, curve_1, rtol=1e-5)
    np.testing.assert_allclose([h["fve"] for h in two["history"]], [h["fve"] for h in single.history], atol=1e-5)
    np.testing.assert_allclose([h["dead"] for h in two["history"]], [h["dead"] for h in single.history])
    w0, w1 = (load_file(str(job / f"weights_{r}.safetensors")) for r in range(2))
    for name, p in single.sae.state_dict().items():
        assert torch.equal(w0[name], w1[name]), f"{name} differs between ranks"
        torch.testing.assert_close(w0[name], p, rtol=1e-5, atol=2e-6, msg=f"{name}: 2 ranks vs 1 process")
    assert two["heldout"]["fve"] == pytest.approx(single.heldout["fve"], abs=1e-5)
    # the SAE was written once (rank 0), with the world size in its provenance
    assert json.loads((job / "full" / "cfg.json").read_text())["saegeo"]["world_size"] == 2
    torch.testing.assert_close(SAE.load(job / "full").W_dec, single.sae.W_dec, rtol=1e-5, atol=2e-6)

    # a checkpoint written by 2 ranks (step 4) resumes on 1 process to the uninterrupted result
    state = json.loads((job / "cut" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 4
    resumed = train_sae(TrainConfig(**_train_cfg(out_dir=str(job / "cut"), checkpoint_every=4)), data)
    assert [h["step"] for h in resumed.history] == list(range(1, 11))
    np.testing.assert_allclose([h["mse"] for h in resumed.history], curve_1, rtol=1e-5)
    for name, p in single.sae.state_dict().items():
        torch.testing.assert_close(resumed.sae.state_dict()[name], p, rtol=1e-5, atol=2e-6, msg=name)


def test_store_training_keeps_ranks_identical(job):
    for r in range(2):
        assert json.loads((job / f"store_{r}.json").read_text()) == {"identical": True, "finite": True}


# The distributed report's tolerance, from the arithmetic (not from a rebatching). The two ranks see the same
# float32 rows as the single process, cut into other chunks (each rank's shard block, then --batch-rows 128 rows),
# so what can differ is rounding inside a chunk. The accumulator forms every sum over rows in float64 from the
# rows except two float32 products over a chunk of m ≤ 128 rows: the gram of the shifted rows (the covariance)
# and the gram of the unit vectors' part w ⊥ r (r: the running unit mean; geometry/accumulate.py). A float32 sum
# of m terms errs by ≤ √m·u·Σ|terms| (u = 2⁻²⁴, the probabilistic bound of Higham & Mary 2019); two runs: ε = 2√m·u.
#   * Null family (A, its sds, z and the sign null): float64 sums, plus the ⊥ gram, whose terms are ‖w‖² ≈ 1 − A of
#     the unit vectors' and whose rounding along r is projected out: relative error ≤ ε·(1 − A) (float64's own
#     rounding, ~1e-16 times the sd's cancellation ‖m‖⁴/ζ₁ ≈ 3e3 here, is far below it).
#   * Everything else reads the covariance gram (or the SAE's float32 matmuls, of fewer terms): entry errors
#     |ΔΣ_ab| ≤ ε·√(Σ_aa·Σ_bb), so ‖ΔΣ‖₂ ≤ ‖ΔΣ‖_F ≤ ε·tr Σ. Eigenvalues move by ≤ ε·tr Σ (Weyl), eigenvectors and
#     what is computed from them (shares, ranks, MP fits, projections, split thresholds) by ≤ ε·tr Σ/gap
#     (Davis–Kahan, gap = the smallest eigengap): |a − b| ≤ ε·κ·max(1, |b|), κ = tr Σ / min(gap, λ_min).
# Before the float64 unit sums, null_z differed by ~2e-3 relative between the two (4e4 × the null family's bound).
U32 = 2.0**-24
NULL_FAMILY = {
    "anisotropy",
    "A",
    "A_sd",
    "null_sd",
    "null_bias",
    "null_bias_relative",
    "isotropic_sd",
    "isotropic_z",
    "isotropic_cosine_sd",
    "null_z",
    "z_vs_null",
    "offset",
    "sign_null",
    "finite_d_bias",
    "excess_over_sign_null",
    "share_explained_by_sign",
    "z_vs_sign_null",
    "z_vs_assumed",
}


def _close(a, b, path, tol_null, tol_abs):
    """a (distributed) equals b (single process) within the float32 rounding bound derived above."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            if k not in ("seconds", "tokens_per_second", "options"):
                _close(a[k], b[k], f"{path}.{k}", tol_null, tol_abs)
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (u, v) in enumerate(zip(a, b)):
            _close(u, v, f"{path}[{i}]", tol_null, tol_abs)
    elif isinstance(a, float) and isinstance(b, float):
        key = path.rsplit(".", 1)[-1]
        null_family = key in NULL_FAMILY and not path.startswith((".saes", ".sample_diagnostics"))
        tol = tol_null * abs(b) if null_family else tol_abs(b)
        assert abs(a - b) <= tol, f"{path}: {a} vs {b} (|difference| {abs(a - b):.3g} > bound {tol:.3g})"
    else:
        assert a == b, path


def test_report_on_two_ranks_equals_the_single_process_report(job):
    dist_report = json.loads((job / "report" / "report.json").read_text())  # written by rank 0 only
    rows = 128  # --batch-rows of both runs: the longest float32 sum
    # `saegeo report --sae` takes the verdict `check --acts` gives (sae_verdict), so the reference does too
    from saegeo.report.dictionary_check import sae_verdict
    from saegeo.report.options import CheckOptions

    flags, notes, _ = sae_verdict(job / "sae", job / "rstore", options=CheckOptions(progress=False), name="s")
    single = geometry_report(
        job / "rstore",
        {"s": job / "sae"},
        options=ReportOptions(batch_rows=rows, progress=False),
        flags=flags,
        notes=notes,
    ).to_dict()
    assert dist_report["activations"]["n"] == 1500
    # the sample behind the cosine histogram is the same rows (bottom-k priorities by global row index)
    assert dist_report["cosine_histogram"]["counts"] == single["cosine_histogram"]["counts"]
    eps = 2 * rows**0.5 * U32
    lam = single["activations"]["eigenvalues"]
    gap = min(lo - hi for lo, hi in zip(lam, lam[1:]))
    kappa = sum(lam) / min(gap, lam[-1])
    one_minus_a = 1 - single["activations"]["anisotropy"]
    _close(dist_report, single, "", eps * one_minus_a, lambda b: eps * kappa * max(1.0, abs(b)))


def test_mismatched_stores_end_every_rank_with_a_clear_message(job):
    for r in range(2):
        msg = json.loads((job / f"errors_{r}.json").read_text())["mismatch"]
        assert msg.startswith("StoreError: the ranks disagree on activation store"), msg
        assert "rank 0: " in msg and "1500 tokens, 8 shards" in msg and "rank 1: " in msg and "300 tokens" in msg


def test_a_failing_rank_ends_every_rank_with_its_message(job):
    # the NaN sits in shard 7, streamed by rank 1; rank 0 must hear of it instead of waiting
    own = json.loads((job / "errors_1.json").read_text())["nan"]
    assert own.startswith("BadInputError: non-finite value") and "global row 1400" in own, own
    other = json.loads((job / "errors_0.json").read_text())["nan"]
    assert other.startswith(
        "DistributedError: rank 1 of 2 failed while streaming the activations: BadInputError: non-finite value"
    ), other
    assert "global row 1400" in other


def _free_loopback_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_rank_that_stops_responding_mid_training_does_not_hang_the_other(tmp_path):
    """saegeo's collective timeout (SAEGEO_DIST_TIMEOUT), not a launcher, ends the surviving rank.

    The two ranks are plain processes (no torchrun, which would kill the peers itself). Rank 1 stops
    responding inside on_step at step 3 without exiting, so rank 0 waits in the next collective; it
    must fail on its own with gloo's timeout error naming the configured timeout. The wall-clock
    bound is only a hang guard (the timeout is 3 s; the guard 90 s)."""
    torch.save(_train_data(), tmp_path / "x.pt")
    script = _script(
        tmp_path,
        "stall.py",
        f"""
        import os, time, torch
        from saegeo.sae.train import TrainConfig, train_sae
        # start together: a slow import on a loaded machine must not eat into the short timeout
        open(f"ready_{{os.environ['RANK']}}", "w").close()
        while not (os.path.exists("ready_0") and os.path.exists("ready_1")):
            time.sleep(0.05)
        def on_step(step, live):
            if step == 3 and os.environ["RANK"] == "1":
                open("rank1_stalled", "w").close()
                time.sleep(3600)  # alive but silent: the peer is left inside a collective
        train_sae(TrainConfig(**{_train_cfg(total_tokens=64 * 40)!r}), torch.load("x.pt", weights_only=True),
                  on_step=on_step)
        open(f"finished_{{os.environ['RANK']}}", "w").close()
    """,
    )
    timeout_s = 3
    base = dict(
        os.environ,
        GLOO_SOCKET_IFNAME="lo",
        SAEGEO_DIST_TIMEOUT=str(timeout_s),
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(ROOT),
        TQDM_DISABLE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_loopback_port()),
        WORLD_SIZE="2",
    )
    for k in ("TORCHELASTIC_RUN_ID", "GROUP_RANK", "LOCAL_WORLD_SIZE"):
        base.pop(k, None)
    procs = [
        subprocess.Popen(
            [sys.executable, script],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(base, RANK=str(r), LOCAL_RANK=str(r)),
        )
        for r in range(2)
    ]
    try:
        try:
            out0, _ = procs[0].communicate(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"rank 0 still waits 90 s after rank 1 stopped, with SAEGEO_DIST_TIMEOUT={timeout_s}")
        assert (tmp_path / "rank1_stalled").exists(), out0[-3000:]
        assert procs[1].poll() is None, "rank 1 was meant to still be alive (stalled, not dead)"
        assert procs[0].returncode != 0, out0[-3000:]
        assert not (tmp_path / "finished_0").exists()
        assert "Timed out" in out0 and f"{timeout_s * 1000}ms" in out0, out0[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


def test_local_only_lets_one_rank_work_alone_inside_a_job(job):
    # all 20 rows: inside local_only the report neither splits the tensor nor waits for rank 1
    assert json.loads((job / "solo.json").read_text()) == {"n": 20}


def test_a_rank_without_shards_still_gives_the_whole_report(job):
    x = ActivationStore(job / "one").read_shard(0).double()
    unit = x / x.norm(dim=1, keepdim=True)
    a_brute = float((unit @ unit.T).sum() - 50) / (50 * 49)  # mean pairwise cosine, i ≠ j
    for r in range(2):
        got = json.loads((job / f"one_{r}.json").read_text())
        assert got["n"] == 50 and got["A"] == pytest.approx(a_brute, abs=1e-6)
