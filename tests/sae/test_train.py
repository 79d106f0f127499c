"""SAE trainer: feature recovery on synthetic ground truth, b_dec := mean vs 0 under a large offset,
the unit-norm invariant, checkpoint/resume, non-finite loss, and the three data sources."""

from __future__ import annotations

import json

import pytest
import torch

from saegeo.activations.store import write_store
from saegeo.errors import BadInputError
from saegeo.sae.model import SAE
from saegeo.sae.train import NonFiniteLossError, TrainConfig, geometric_median, train_sae
from saegeo.synthetic import SuperpositionGenerator, SyntheticConfig, recovery


def _synthetic(n: int, *, offset: float = 0.0, seed: int = 1):
    """N = 1024 unit features in d = 128, K = 10 active per row (Exp(1) magnitudes)."""
    gen = SuperpositionGenerator(SyntheticConfig(d=128, n_features=1024, rate=10 / 1024, offset=offset, seed=seed))
    x, _ = gen.sample(n)
    return x, gen.truth


@pytest.fixture
def one_thread():
    """The heavier tests run single-threaded: on 2 shared cores, two OpenMP threads competing with
    other processes are several times slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_topk_recovers_ground_truth_features(one_thread, monkeypatch):
    """A TopK SAE trained on N = 256 ground-truth features in d = 64 (K = 5 active per row) finds >= 95%
    of them at cos > 0.9, where its own random initial decoder finds almost none (so the recovery is
    learned, not inherited from an init that happens to contain the truth)."""
    gen = SuperpositionGenerator(SyntheticConfig(d=64, n_features=256, rate=5 / 256, seed=1))
    x, _ = gen.sample(20_000)
    truth = gen.truth
    import saegeo.sae.train as train_mod

    init = {}

    class Spy(train_mod.SAE):  # capture the decoder exactly as the trainer initialised it
        def init_weights(self, *a, **k):
            out = super().init_weights(*a, **k)
            init["W_dec"] = self.W_dec.detach().clone()
            return out

    monkeypatch.setattr(train_mod, "SAE", Spy)
    cfg = TrainConfig(
        arch="topk",
        d_sae=512,
        arch_options={"topk": {"k": 5}},
        lr=1e-2,
        batch_tokens=512,
        total_tokens=200 * 512,
        dead_window_tokens=10_240,
        heldout_fraction=0.05,
        seed=7,
        progress=False,
    )
    result = train_sae(cfg, x)
    at_init = recovery(truth.dictionary, init["W_dec"], threshold=0.9, match=False)
    # best of 512 random unit vectors against one direction in d = 64: |cos| ≈ 3.3/8 ≈ 0.4, far below 0.9
    assert at_init.frac_recovered <= 0.02, at_init.summary()
    rep = recovery(truth.dictionary, result.sae.W_dec.detach(), threshold=0.9, match=False)
    assert rep.frac_recovered >= 0.95, rep.summary()
    assert result.heldout["l0"] == pytest.approx(5, abs=0.5)
    assert result.heldout["fve"] > 0.7


def test_b_dec_mean_absorbs_a_large_offset_and_zero_init_does_worse(one_thread):
    """Under an offset 4x the rows' spread, b_dec := mean lands on the offset and no latent aligns with it;
    b_dec := 0 stays far from it, latents soak it up, and the fit is worse."""
    x, truth = _synthetic(12_000, offset=4.0)
    offset = truth.offset
    assert offset.norm() > 3 * (x - x.mean(0)).norm(dim=1).mean()  # the offset dominates the rows
    out = {}
    for init in ("mean", "zeros"):
        cfg = TrainConfig(
            arch="topk",
            d_sae=512,
            arch_options={"topk": {"k": 10}},
            lr=1e-2,
            batch_tokens=512,
            total_tokens=40 * 512,
            dead_window_tokens=10_240,
            heldout_fraction=0.05,
            seed=3,
            b_dec_init=init,
            progress=False,
        )
        r = train_sae(cfg, x)
        w = r.sae.W_dec.detach()
        cos_offset = (w @ offset) / (w.norm(dim=1) * offset.norm())
        out[init] = dict(
            b_dec_err=float((r.sae.b_dec.detach() - offset).norm() / offset.norm()),
            max_cos=float(cos_offset.abs().max()),
            fve=r.heldout["fve"],
        )
    # chance level for the best of 512 random unit vectors against one direction in d=128 is ≈ 3.1/√128 ≈ 0.27
    assert out["mean"]["b_dec_err"] < 0.05, out
    assert out["mean"]["max_cos"] < 0.4
    assert out["zeros"]["b_dec_err"] > 0.5  # b_dec never gets near the offset ...
    assert out["zeros"]["max_cos"] > out["mean"]["max_cos"] + 0.1  # ... latents soak it up instead
    assert out["zeros"]["fve"] < out["mean"]["fve"] - 0.03


def _small_cfg(tmp_path=None, **kw) -> TrainConfig:
    base = dict(
        arch="topk",
        d_sae=64,
        arch_options={"topk": {"k": 4}},
        lr=3e-3,
        batch_tokens=128,
        total_tokens=128 * 20,
        dead_window_tokens=512,
        heldout_fraction=0.1,
        seed=0,
        progress=False,
        log_every=5,
    )
    base["arch_options"] = {**base["arch_options"], **kw.pop("arch_options", {})}  # a caller's table joins
    base.update(kw)
    if tmp_path is not None:
        base["out_dir"] = str(tmp_path)
    return TrainConfig(**base)


@pytest.mark.parametrize("arch", ["topk", "relu"])
def test_decoder_rows_stay_unit_norm_after_every_step(arch):
    """decoder_norm unit (TopK's default is free: tests/sae/test_train_defaults.py)."""
    x, _ = _synthetic(4096)
    seen = []
    holder = {}

    def check(step, _):
        w = holder["sae"].W_dec.detach()
        seen.append(float((w.norm(dim=1) - 1).abs().max()))

    import saegeo.sae.train as train_mod

    orig = train_mod.SAE

    class Spy(orig):  # capture the model the trainer builds
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            holder["sae"] = self

    train_mod.SAE = Spy
    try:
        train_sae(
            _small_cfg(arch=arch, arch_options={"relu": {"l1_coefficient": 0.1}}, decoder_norm="unit"), x, on_step=check
        )
    finally:
        train_mod.SAE = orig
    assert len(seen) == 20
    assert max(seen) < 1e-5


def test_resume_after_kill_equals_uninterrupted(tmp_path):
    x, _ = _synthetic(4096)
    full = train_sae(_small_cfg(tmp_path / "full", checkpoint_every=4), x)

    class Killed(Exception):
        pass

    def kill(step, _):
        if step == 11:  # after the checkpoint at step 8, mid-interval
            raise Killed

    with pytest.raises(Killed):
        train_sae(_small_cfg(tmp_path / "resumed", checkpoint_every=4), x, on_step=kill)
    state = json.loads((tmp_path / "resumed" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 8
    resumed = train_sae(_small_cfg(tmp_path / "resumed", checkpoint_every=4), x)
    for name, p in full.sae.state_dict().items():
        assert torch.equal(p, resumed.sae.state_dict()[name]), name
    assert [h["fve"] for h in full.history] == [h["fve"] for h in resumed.history]
    # a fresh run without the checkpoint would differ if resume were a no-op restart
    assert not torch.equal(full.sae.W_dec, train_sae(_small_cfg(seed=1), x).sae.W_dec)
    # the final SAE was written in the SAELens layout
    assert torch.equal(SAE.load(tmp_path / "resumed").W_dec, full.sae.W_dec.detach())


def test_resume_refuses_a_checkpoint_of_a_different_model(tmp_path):
    x, _ = _synthetic(2048)
    train_sae(_small_cfg(tmp_path, checkpoint_every=2, total_tokens=128 * 2), x)
    with pytest.raises(BadInputError, match=r"topk.k=4; it cannot be resumed with topk.k=5"):
        train_sae(_small_cfg(tmp_path, checkpoint_every=2, total_tokens=128 * 2, arch_options={"topk": {"k": 5}}), x)
    with pytest.raises(BadInputError, match=r"d_sae=64; it cannot be resumed with d_sae=128"):
        train_sae(_small_cfg(tmp_path, checkpoint_every=2, total_tokens=128 * 2, d_sae=128), x)
    # another budget changes the lr schedule: refused too, and --overwrite starts a new run
    with pytest.raises(BadInputError, match=r"total_tokens=256; it cannot be resumed with total_tokens=512"):
        train_sae(_small_cfg(tmp_path, checkpoint_every=2, total_tokens=128 * 4), x)
    again = train_sae(_small_cfg(tmp_path, checkpoint_every=2, total_tokens=128 * 4, overwrite=True), x)
    assert again.history[-1]["step"] == 4


def test_resume_from_a_stream_without_heldout_rows_replays_the_same_batches(tmp_path):
    """heldout_fraction = 0: the replay must skip no rows (a skipped first batch shifts every later one)."""
    x, _ = _synthetic(4096)

    def batches():  # distinct rows per batch, so a shift changes what is trained on
        for lo in range(0, 4096, 128):
            yield x[lo : lo + 128]

    cfg = lambda out: _small_cfg(out, checkpoint_every=4, heldout_fraction=0.0)  # noqa: E731
    full = train_sae(cfg(tmp_path / "full"), batches)

    def kill(step, _):
        if step == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_sae(cfg(tmp_path / "resumed"), batches, on_step=kill)
    resumed = train_sae(cfg(tmp_path / "resumed"), batches)
    for name, p in full.sae.state_dict().items():
        assert torch.equal(p, resumed.sae.state_dict()[name]), name


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    x, _ = _synthetic(4096)
    cfg = _small_cfg(tmp_path, checkpoint_every=5, total_tokens=128 * 30, b_dec_init_tokens=256)

    def batches(poison):  # a replayable stream whose 15th batch is poisoned
        g = torch.Generator().manual_seed(0)
        for i in range(1000):
            b = x[torch.randint(0, x.shape[0], (128,), generator=g)].clone()
            if i == 3 + 11:  # 3 batches are held out first, so this is the 12th training step
                poison(b)
            yield b

    # an inf row is refused as data, named by its place in the stream, before anything trains on it
    with pytest.raises(BadInputError, match=r"the stream of batches, batch 14 row 5 \(global row 1797\)"):
        train_sae(cfg, lambda: batches(lambda b: b[5].fill_(float("inf"))))
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["step"] == 10
    # finite rows whose squares overflow float32 are refused as data too, the row named
    rerun = lambda: _small_cfg(  # noqa: E731
        tmp_path, checkpoint_every=5, total_tokens=128 * 30, b_dec_init_tokens=256, overwrite=True
    )
    with pytest.raises(
        BadInputError,
        match=r"the stream of batches, batch 14 row \d+ \(global row \d+\): values of magnitude .* overflow float32",
    ):
        train_sae(rerun(), lambda: batches(lambda b: b.mul_(1e30)))
    # past the readers' range check, the loss is inf: the run stops and keeps the step-10 checkpoint
    monkeypatch.setattr("saegeo.activations.sources.magnitude_range", lambda dtype: (0.0, float("inf")))
    with pytest.raises(NonFiniteLossError, match=r"between steps 11 and 15 .*last good checkpoint \(step 10\)"):
        train_sae(rerun(), lambda: batches(lambda b: b.mul_(1e30)))
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["step"] == 10
    # non-finite rows among those that initialise b_dec are named before training starts
    with pytest.raises(BadInputError, match=r"the tensor \(global row 5\), a row used to initialise b_dec"):
        bad = x.clone()
        bad[5, 3] = float("nan")
        train_sae(_small_cfg(), bad)


def test_store_and_iterator_sources(tmp_path):
    """Each source holds out the rows its docstring names, and b_dec := mean is the mean of training rows only
    (never a held-out one), computed here from the rows themselves: for a tensor or a store the exact mean of
    every training row when b_dec_init_tokens covers them (a uniform sample otherwise: test_b_dec_init_*), for an
    iterator the first b_dec_init_tokens rows after the held-out ones.
    lr = 0 keeps every parameter at its initial value, so b_dec after training is b_dec at init."""
    x, _ = _synthetic(5000)
    init_rows = 2000
    cfg = lambda **kw: _small_cfg(**{"lr": 0.0, "b_dec_init_tokens": init_rows, **kw})  # noqa: E731
    train_mean = x[:4500].double().mean(0)

    # tensor: the last round(0.1 · 5000) = 500 rows are held out; b_dec = mean of rows [0, 4500)
    r_tensor = train_sae(cfg(b_dec_init_tokens=4500), x)
    assert r_tensor.heldout["tokens"] == 500
    assert torch.allclose(r_tensor.sae.b_dec.detach().double(), train_mean, atol=1e-5)

    # store: the last 10% of rows in store order are held out; b_dec = mean of the other rows
    store = write_store(tmp_path / "store", x, shard_rows=1024)
    r_store = train_sae(cfg(b_dec_init_tokens=10_000), store)
    assert r_store.heldout["tokens"] == 500
    assert torch.allclose(r_store.activation_mean, train_mean, atol=1e-6)
    assert torch.allclose(r_store.sae.b_dec.detach().double(), train_mean, atol=1e-5)

    # iterator: the FIRST max(0.1 · total_tokens, batch_size) rows, rounded up to whole source batches,
    # are held out; b_dec is the mean of the init_rows rows that follow them
    gen = SuperpositionGenerator(SyntheticConfig(d=128, n_features=1024, rate=10 / 1024, seed=1))
    source_batch, total_tokens, batch_size = 700, 128 * 40, 128
    need = max(int(0.1 * total_tokens), batch_size)  # 512
    n_held = -(-need // source_batch) * source_batch  # 700: the held-out set is not cut inside a source batch
    assert n_held != need
    stream = torch.cat(list(gen.activations(20 * source_batch, source_batch)))
    r_iter = train_sae(cfg(total_tokens=total_tokens), lambda: gen.activations(20 * source_batch, source_batch))
    assert r_iter.heldout["tokens"] == n_held
    expect = stream[n_held : n_held + init_rows].double().mean(0)
    assert torch.allclose(r_iter.activation_mean, expect, atol=1e-6)
    assert torch.allclose(r_iter.sae.b_dec.detach().double(), expect, atol=1e-5)
    # (the held-out rows are not in it: their mean differs from it by far more than the tolerance)
    assert not torch.allclose(stream[:init_rows].double().mean(0), expect, atol=1e-3)


def test_geometric_median_matches_brute_force():
    from scipy.optimize import minimize

    g = torch.Generator().manual_seed(0)
    pts = torch.randn(200, 5, generator=g, dtype=torch.float64) + torch.tensor([3.0, 0, 0, 0, 0], dtype=torch.float64)
    pts[:20] += 50  # outliers move the mean, not the median
    ref = minimize(
        lambda m: (pts.numpy() - m).__pow__(2).sum(1).__pow__(0.5).sum(),
        pts.mean(0).numpy(),
        method="Nelder-Mead",
        options=dict(xatol=1e-9, fatol=1e-12, maxiter=20000, maxfev=40000),
    ).x
    got = geometric_median(pts).numpy()
    assert abs(got - ref).max() < 1e-4
