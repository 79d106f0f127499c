"""Issue 16: BatchTopK and JumpReLU training, the hand-written ReLU backward, and resume that seeks in a store.

References are independent: brute-force sorts, the objective re-written with plain autograd, central finite
differences, store.iter_batches itself."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest
import torch

from saegeo.activations.store import ActivationStore, write_store
from saegeo.sae.architectures.jumprelu import JumpReLUFn, StepFn
from saegeo.sae.model import SAE, SAEConfig
from saegeo.sae.train import TrainConfig, _StoreSource, train_sae
from saegeo.synthetic import SuperpositionGenerator, SyntheticConfig


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _synthetic(n: int, seed: int = 1, k: int = 8):
    gen = SuperpositionGenerator(SyntheticConfig(d=64, n_features=512, rate=k / 512, offset=2.0, seed=seed))
    return gen.sample(n)[0]


def _sae(activation: str, d_in: int = 16, d_sae: int = 48, k: int | None = None, dtype: str = "float32") -> SAE:
    sae = SAE(SAEConfig(d_in, d_sae, activation=activation, k=k, dtype=dtype))
    sae.init_weights(
        torch.Generator().manual_seed(0), b_dec=torch.randn(d_in, generator=torch.Generator().manual_seed(1))
    )
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.3, generator=torch.Generator().manual_seed(2))
    return sae


# ---------------------------------------------------------------- BatchTopK
def test_batchtopk_keeps_exactly_k_times_batch_entries_the_largest_of_the_batch():
    sae = _sae("batchtopk", k=5)
    x = torch.randn(40, 16) * 3
    out = sae.forward_train(x)
    with torch.no_grad():
        post = torch.relu(sae.pre_activations(x))
    assert int((post > 0).sum()) > 5 * 40  # enough positive entries: the selection binds
    assert int(out.l0_sum) == 5 * 40
    # brute force: the 200 largest of the flattened batch, by a full sort
    kth = post.flatten().sort(descending=True).values[5 * 40 - 1]
    assert torch.isclose(out.state["min_kept"], kth)
    assert int(out.fire_count.sum()) == 5 * 40
    assert torch.equal(out.fire_count, (post >= kth).sum(dim=0).float())


def test_batchtopk_saved_as_saelens_jumprelu_round_trips_with_identical_codes(tmp_path):
    x = _synthetic(6000)
    cfg = TrainConfig(
        arch="batchtopk",
        d_sae=128,
        arch_options={"batchtopk": {"k": 8}},
        batch_tokens=500,
        total_tokens=20_000,
        lr=1e-3,
        progress=False,
        out_dir=str(tmp_path / "btk"),
    )
    res = train_sae(cfg, x)
    assert res.sae.cfg.activation == "batchtopk" and float(res.sae.threshold) > 0
    saved = json.loads((tmp_path / "btk" / "cfg.json").read_text())
    assert saved["architecture"] == "jumprelu" and saved["saegeo"]["trained_as"] == "batchtopk"
    loaded = SAE.load(tmp_path / "btk")
    assert loaded.cfg.activation == "jumprelu"
    assert torch.equal(loaded.threshold, res.sae.threshold.expand(128))  # broadcast per latent
    with torch.no_grad():
        assert torch.equal(loaded.encode(x), res.sae.encode(x))
    # the inference threshold keeps about k latents per row (it is estimated from the codes kept)
    assert 0.5 * 8 < res.heldout["l0"] < 2 * 8


# ---------------------------------------------------------------- JumpReLU
def test_jumprelu_step_gradient_is_the_central_finite_difference_of_width_bandwidth():
    torch.manual_seed(0)
    pre = torch.rand(5000, 3, dtype=torch.float64) * 2
    theta = torch.tensor([0.3, 0.9, 1.4], dtype=torch.float64, requires_grad=True)
    eps = 0.05
    (grad,) = torch.autograd.grad(StepFn.apply(pre, theta, eps).sum(), theta)
    with torch.no_grad():
        fd = ((pre > theta + eps / 2).double().sum(0) - (pre > theta - eps / 2).double().sum(0)) / eps
    torch.testing.assert_close(grad, fd)
    assert (grad < 0).all()  # raising θ lowers L0
    # the JumpReLU output: ∂/∂θ_i = −(θ_i/ε)·#{|pre − θ_i| < ε/2}, closed form; ∂/∂pre = H(pre − θ)
    pre.requires_grad_(True)
    g_pre, g_theta = torch.autograd.grad(JumpReLUFn.apply(pre, theta, eps).sum(), (pre, theta))
    with torch.no_grad():
        window = ((pre - theta).abs() < eps / 2).double().sum(0)
        torch.testing.assert_close(g_theta, -(theta / eps) * window)
        assert torch.equal(g_pre, (pre > theta).double())
        # and it approximates the finite difference of Σ pre·H(pre − θ) (the jump carries pre ≈ θ)
        f = lambda t: (pre * (pre > t)).sum(0)  # noqa: E731
        torch.testing.assert_close(g_theta, (f(theta + eps / 2) - f(theta - eps / 2)) / eps, rtol=0.05, atol=0)


def test_jumprelu_reaches_its_l0_target_on_synthetic_data():
    x = _synthetic(30_000)
    target = {"jumprelu": {"l0_target": 8}}
    cfg = TrainConfig(
        arch="jumprelu",
        arch_options=target,
        d_sae=256,
        batch_tokens=1000,
        total_tokens=250_000,
        lr=1e-3,
        progress=False,
    )
    res = train_sae(cfg, x)
    assert abs(res.heldout["l0"] / 8 - 1) < 0.2, res.heldout["l0"]
    assert res.heldout["fve"] > 0.5
    # without the threshold's learning-rate scale the thresholds cannot follow the encoder: L0 falls far short
    slow = train_sae(replace(cfg, arch_options={"jumprelu": {"l0_target": 8, "threshold_lr_scale": 1.0}}), x)
    assert slow.heldout["l0"] < 0.7 * 8


# ---------------------------------------------------------------- ReLU
@pytest.mark.parametrize("apply_b_dec", [True, False])
def test_relu_hand_written_backward_equals_autograd_of_the_objective(apply_b_dec):
    sae = SAE(SAEConfig(16, 48, activation="relu", apply_b_dec_to_input=apply_b_dec, dtype="float64"))
    sae.init_weights(torch.Generator().manual_seed(0), encoder_scale=1.0)
    with torch.no_grad():
        sae.b_dec.normal_()
        sae.W_dec.mul_(torch.rand(48, 1, dtype=torch.float64) + 0.5)  # free norms: the ‖w‖ terms matter
        sae.b_enc.normal_(0, 0.1)
    x = torch.randn(64, 16, dtype=torch.float64)
    out = sae.forward_train(x, l1_coefficient=0.7)
    got = torch.autograd.grad(out.loss, [sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec])
    W_enc, b_enc, W_dec, b_dec = (
        p.detach().clone().requires_grad_() for p in (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec)
    )
    codes = torch.relu(((x - b_dec) if apply_b_dec else x) @ W_enc + b_enc)
    loss = ((x - codes @ W_dec - b_dec) ** 2).sum() / 64 + 0.7 * (codes * W_dec.norm(dim=1)).sum() / 64
    want = torch.autograd.grad(loss, [W_enc, b_enc, W_dec, b_dec])
    torch.testing.assert_close(out.loss.detach(), loss.detach())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    assert int(out.l0_sum) == int((codes > 0).sum())


def test_relu_free_decoder_norms_end_folded_to_unit_rows():
    x = _synthetic(6000)
    res = train_sae(
        TrainConfig(
            arch="relu",
            d_sae=128,
            batch_tokens=500,
            total_tokens=20_000,
            decoder_norm="free",
            arch_options={"relu": {"l1_warmup_fraction": 0.5}},
            progress=False,
        ),
        x,
    )
    torch.testing.assert_close(res.sae.W_dec.norm(dim=1), torch.ones(128), rtol=0, atol=1e-5)


# ---------------------------------------------------------------- resume seeks in a store
def test_store_source_seeks_to_a_batch_without_reading_the_shards_before_it(tmp_path, monkeypatch):
    store = write_store(tmp_path / "s", torch.randn(30_000, 8), shard_rows=2_000)
    cfg = TrainConfig(batch_tokens=256, total_tokens=256 * 300, shuffle_buffer=3_000, seed=3)
    src = _StoreSource(store, cfg)
    # reference: the store's own shuffled epochs, read in full
    ref = list(
        itertools.islice(
            (
                b
                for e in range(4)
                for b in store.iter_batches(
                    256,
                    shuffle=True,
                    shuffle_buffer=3_000,
                    seed=3 * 1_000_003 + e,
                    stop_row=src.n_train,
                    drop_last=True,
                )
            ),
            300,
        )
    )
    reads: list[int] = []
    orig = ActivationStore.read_shard
    monkeypatch.setattr(
        ActivationStore, "read_shard", lambda self, i, *a, **k: reads.append(i) or orig(self, i, *a, **k)
    )
    for start in (0, 1, 50, 140, 260):  # 140, 260: later epochs
        reads.clear()
        got = list(itertools.islice(src.train_batches(start), 300 - start))
        assert len(got) == 300 - start and all(torch.equal(a, b) for a, b in zip(ref[start:], got)), start
        if start == 50:  # the first batch reads fewer shards than replaying the stream up to it does
            reads.clear()
            next(iter(src.train_batches(start)))
            seek_reads = len(reads)
            reads.clear()
            next(
                itertools.islice(
                    store.iter_batches(
                        256,
                        shuffle=True,
                        shuffle_buffer=3_000,
                        seed=3 * 1_000_003,
                        stop_row=src.n_train,
                        drop_last=True,
                    ),
                    start,
                    None,
                )
            )
            assert seek_reads <= len(reads) // 2, (seek_reads, len(reads))


def test_resume_from_a_store_checkpoint_equals_uninterrupted(tmp_path):
    store = write_store(tmp_path / "s", _synthetic(8_000), shard_rows=1_000)

    def cfg(out):
        return TrainConfig(
            arch="topk",
            d_sae=64,
            arch_options={"topk": {"k": 4}},
            batch_tokens=256,
            total_tokens=256 * 16,
            shuffle_buffer=1_500,
            checkpoint_every=5,
            out_dir=str(out),
            progress=False,
            log_every=4,
        )

    full = train_sae(cfg(tmp_path / "full"), store)
    with pytest.raises(KeyboardInterrupt):  # killed at step 12, after the step-10 checkpoint
        train_sae(cfg(tmp_path / "cut"), store, on_step=lambda step, _: _interrupt_at(step, 12))
    resumed = train_sae(cfg(tmp_path / "cut"), store).sae.state_dict()
    assert all(torch.equal(p, resumed[name]) for name, p in full.sae.state_dict().items())


def _interrupt_at(step: int, at: int) -> None:
    if step == at:
        raise KeyboardInterrupt


def test_batchtopk_and_jumprelu_resume_refuses_another_k(tmp_path):
    from saegeo.errors import BadInputError

    x = _synthetic(3000)
    base = dict(
        arch="jumprelu",
        d_sae=64,
        batch_tokens=256,
        total_tokens=256 * 4,
        checkpoint_every=2,
        out_dir=str(tmp_path / "j"),
        progress=False,
    )
    with pytest.raises(KeyboardInterrupt):  # stopped after the checkpoint at step 2: a run to resume
        train_sae(
            TrainConfig(arch_options={"jumprelu": {"l0_target": 4}}, **base),
            x,
            on_step=lambda step, _: _interrupt_at(step, 3),
        )
    with pytest.raises(
        BadInputError, match="with jumprelu.l0_target=4; it cannot be resumed with jumprelu.l0_target=6"
    ):
        train_sae(TrainConfig(arch_options={"jumprelu": {"l0_target": 6}}, **base), x)


def test_save_sae_broadcasts_a_batchtopk_threshold(tmp_path):
    sae = _sae("batchtopk", k=3)
    with torch.no_grad():
        sae.threshold.fill_(0.4)
    sae.save(tmp_path / "b")
    loaded = SAE.load(tmp_path / "b")
    x = torch.randn(100, 16) * 2
    with torch.no_grad():
        assert torch.equal(loaded.encode(x), sae.encode(x))
        assert (sae.encode(x) > 0).any()


def test_report_names_a_batchtopk_sae_saved_as_jumprelu(tmp_path):
    from saegeo.report.geometry_report import ReportOptions, geometry_report

    x = _synthetic(3000)
    train_sae(
        TrainConfig(
            arch="batchtopk",
            d_sae=128,
            arch_options={"batchtopk": {"k": 6}},
            batch_tokens=500,
            total_tokens=5_000,
            progress=False,
            out_dir=str(tmp_path / "b"),
        ),
        x,
    )
    rep = geometry_report(x, str(tmp_path / "b"), options=ReportOptions(progress=False, device="cpu"))
    assert rep.saes[0].architecture == "batchtopk (saved as jumprelu)" and rep.saes[0].k == 6
    # the pipeline passes loaded SAE objects: the loader carries what the saegeo block says
    rep = geometry_report(x, {"b": SAE.load(tmp_path / "b")}, options=ReportOptions(progress=False))
    assert rep.saes[0].architecture == "batchtopk (saved as jumprelu)" and rep.saes[0].k == 6


# ---------------------------------------------------------------- sparse steps against the dense objective
def _dense_objective(
    sae: SAE,
    x: torch.Tensor,
    arch: str,
    eps: float,
    l0_target: float,
    l0_coefficient: float,
    form: str = "dictionary_learning",
    tanh_scale: float = 4.0,
):
    """The BatchTopK / JumpReLU training loss written densely with plain autograd on (n, d_sae) tensors.
    JumpReLU's straight-through estimator as a zero-valued surrogate: (θ − θ.detach())·g has value 0 and
    gradient g wrt θ, with g = −(θ/ε)·K for the codes and −K/ε for the L0 (K = 1[|pre − θ| < ε/2]). The
    sparsity forms as SAELens' JumpReLUTrainingSAE.calculate_aux_loss and dictionary_learning's JumpReluTrainer
    write them: step mean_r L0_r; quadratic mean_r (2/t)(L0_r − t)²; tanh mean_r Σ_i tanh(c·codes·‖W_dec[i]‖);
    dictionary_learning (mean_r L0_r / t − 1)²."""
    n = x.shape[0]
    pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    if arch == "batchtopk":
        post = torch.relu(pre).flatten()
        keep = post.detach().topk(sae.cfg.k * n).indices
        codes = torch.zeros_like(post).scatter(0, keep, post[keep]).view_as(pre)
    else:
        theta = sae.threshold
        step = (pre.detach() > theta).to(pre.dtype)
        window = ((pre.detach() - theta.detach()).abs() < eps / 2).to(pre.dtype)
        codes = pre * step + (theta - theta.detach()) * (-(theta.detach() / eps) * window)
        l0_rows = (step + (theta - theta.detach()) * (-window / eps)).sum(1)
    x_hat = codes @ sae.W_dec + sae.b_dec
    loss = ((x - x_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    if arch == "jumprelu":
        penalty = {
            "dictionary_learning": lambda: (l0_rows.mean() / l0_target - 1) ** 2,
            "step": lambda: l0_rows.mean(),
            "quadratic": lambda: (2 / l0_target * (l0_rows - l0_target) ** 2).mean(),
            "tanh": lambda: torch.tanh(tanh_scale * codes * sae.W_dec.norm(dim=1)).sum(1).mean(),
        }[form]()
        loss = loss + l0_coefficient * penalty
    return loss, codes


@pytest.mark.parametrize(
    "arch, quantile, form",
    [("batchtopk", None, None)]
    + [("jumprelu", q, f) for f in ("dictionary_learning", "step", "quadratic", "tanh") for q in (0.95, 0.5)],
    ids=lambda v: {None: "-", 0.95: "sparse", 0.5: "dense"}.get(v, v) if not isinstance(v, str) or v else v,
)
def test_sparse_step_equals_the_dense_objective(arch, quantile, form, monkeypatch):
    """forward_train's sparse path (the entries with a gradient only) gives the dense objective's loss, codes
    and the gradient of every parameter, θ included; so does JumpReLU's dense fallback (thresholds at the
    median: half the entries active); for each of JumpReLU's sparsity forms."""
    sae = _sae(arch, d_in=16, d_sae=64, k=6, dtype="float64")
    x = torch.randn(300, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 2 + 1
    eps, target, coefficient = 0.2, 6.0, 0.7
    dense_calls = []
    if arch == "jumprelu":
        with torch.no_grad():  # thresholds at a percentile of each latent; many entries in the window
            pre = sae.pre_activations(x)
            sae.threshold.copy_(pre.quantile(quantile, dim=0).clamp_min(0.0))  # θ ≥ 0, as the trainer keeps it
        sae.threshold.requires_grad_(True)  # as the trainer sets it
        from saegeo.sae.architectures import jumprelu

        dense = jumprelu.dense_step
        monkeypatch.setattr(jumprelu, "dense_step", lambda *a: dense_calls.append(1) or dense(*a))
    forms = {"sparsity_loss": form, "tanh_scale": 1.5} if form else {}
    out = sae.forward_train(x, l0_target=target, l0_coefficient=coefficient, bandwidth=eps, **forms)
    assert len(dense_calls) == (quantile == 0.5)
    params = [
        p
        for p in (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec, getattr(sae, "threshold", None))
        if p is not None and p.requires_grad
    ]
    got = torch.autograd.grad(out.loss, params)
    loss, codes = _dense_objective(sae, x, arch, eps, target, coefficient, form or "dictionary_learning", 1.5)
    want = torch.autograd.grad(loss, params)
    torch.testing.assert_close(out.loss, loss, rtol=1e-10, atol=1e-12)
    assert out.l0_sum == int((codes > 0).sum()) and torch.equal(out.fire_count, (codes > 0).sum(0).float())
    if arch == "jumprelu":
        assert out.terms["l0_loss"] > 0 and 0 < int((codes > 0).sum()) < codes.numel() * (1 - quantile + 0.02)
    assert len(params) == 4 + (arch == "jumprelu")
    for p, g, w in zip(params, got, want):
        assert w.abs().max() > 0
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11)


def test_batch_topk_selection_equals_the_flat_topk_also_when_rows_overflow():
    """The candidate-based selection returns the flat topk's entry set, also when some rows hold many more than
    their share (rows scaled up: they overflow the per-row candidates and join whole) and with ties at 0."""
    from saegeo.sae.architectures.batchtopk import batch_topk_entries

    g = torch.Generator().manual_seed(0)
    values = torch.randn(200, 300, generator=g).relu_()
    values[[3, 77, 150]] *= 50  # these rows alone hold more than 2·count/n of the largest entries
    for count in (1, 600, 2000, 30_000):
        want = set(values.view(-1).topk(count).indices.tolist())
        got = batch_topk_entries(values, count)
        assert got.numel() == count and set(got.tolist()) == want, count
    sparse = torch.zeros(50, 40)
    sparse[0, :3] = torch.tensor([3.0, 2.0, 1.0])  # fewer positives than count: the rest are ties at 0
    got = batch_topk_entries(sparse, 100)
    assert got.numel() == 100 and {0, 1, 2} <= set(got.tolist())


def test_jumprelu_sparsity_forms_against_their_formulas_on_a_small_input():
    """S of each form on H = [[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]] (L0_r = 2, 1, 0; t = 2), by hand:
    dictionary_learning (1/2 − 1)² = 1/4; step mean L0 = 1; quadratic (2/2)·(0² + 1² + 2²)/3 = 5/3; the same from
    the flat entries of the sparse path (rows 0, 0, 1)."""
    from saegeo.sae.architectures.jumprelu import sparsity_penalty

    dense = torch.tensor([[1.0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
    flat, rows = torch.ones(3, dtype=torch.float64), torch.tensor([0, 0, 1])
    for form, want in (("dictionary_learning", 0.25), ("step", 1.0), ("quadratic", 5 / 3), ("tanh", 1.0)):
        assert float(sparsity_penalty(form, dense, None, 3, 2.0)) == pytest.approx(want, rel=1e-12), form
        assert float(sparsity_penalty(form, flat, rows, 3, 2.0)) == pytest.approx(want, rel=1e-12), form


def test_jumprelu_sparsity_forms_train():
    """Each form trains (60 steps of 1,000 rows): step and tanh lower L0 as their coefficient grows from 1e-3 to
    3e-2; quadratic lowers its own penalty. Its L0 settles below the target on these rows (1.7 at t = 8; the rows
    near each threshold carry L0_r above t, so its gradient raises every θ: benchmarks/README.md)."""
    x = _synthetic(20_000)

    def run(form: str, coefficient: float):
        opts = {"l0_target": 8, "sparsity_loss": form, "l0_coefficient": coefficient}
        cfg = TrainConfig(arch="jumprelu", arch_options={"jumprelu": opts}, d_sae=256, batch_tokens=1000,
                          total_tokens=60_000, lr=1e-3, log_every=5, progress=False)  # fmt: skip
        res = train_sae(cfg, x)
        assert all(h["l0_loss"] > 0 for h in res.history), form
        return res

    for form in ("step", "tanh"):
        low, high = run(form, 1e-3).heldout["l0"], run(form, 3e-2).heldout["l0"]
        assert high < 0.7 * low, (form, low, high)
    quadratic = run("quadratic", 0.05).history
    assert quadratic[-1]["l0_loss"] < 0.5 * quadratic[0]["l0_loss"]
