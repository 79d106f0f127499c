"""SAE model contract: shapes and gradients per variant, sparse TopK path == dense computation
(values and gradients), encode semantics against independent formulas, unit-norm helpers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from saegeo.errors import BadInputError, FormatError
from saegeo.sae.model import SAE, SAEConfig

D_IN, D_SAE, N = 16, 48, 32


def _sae(activation="topk", *, k=5, dtype="float64", seed=0, **kw) -> SAE:
    sae = SAE(
        SAEConfig(
            D_IN, D_SAE, activation=activation, k=k if activation in ("topk", "batchtopk") else None, dtype=dtype, **kw
        )
    )
    g = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(D_IN, D_SAE, generator=g, dtype=dt) / D_IN**0.5)
        sae.W_dec.copy_(
            torch.randn(D_SAE, D_IN, generator=g, dtype=dt) * torch.rand(D_SAE, 1, generator=g, dtype=dt) * 2
        )
        sae.b_enc.copy_(0.1 * torch.randn(D_SAE, generator=g, dtype=dt))
        sae.b_dec.copy_(torch.randn(D_IN, generator=g, dtype=dt))
        sae.threshold.copy_(0.2 * torch.rand(sae.threshold.shape, generator=g, dtype=dt))
    return sae


def _x(seed=1, dtype=torch.float64):
    return torch.randn(N, D_IN, generator=torch.Generator().manual_seed(seed), dtype=dtype) + 1.0


def _reference_codes(sae: SAE, x: torch.Tensor) -> torch.Tensor:
    """Independent transcription of each activation on pre = (x − b_dec) W_enc + b_enc."""
    W, be, bd = (t.detach() for t in (sae.W_enc, sae.b_enc, sae.b_dec))
    pre = ((x - bd) if sae.cfg.apply_b_dec_to_input else x) @ W + be
    a = sae.cfg.activation
    if a == "relu":
        return pre.clamp_min(0)
    if a == "jumprelu":
        return torch.where(pre > sae.threshold, pre, torch.zeros_like(pre)).clamp_min(0)
    if a == "batchtopk":
        post = pre.clamp_min(0)
        return torch.where(post > sae.threshold[0], post, torch.zeros_like(post))
    out = torch.zeros_like(pre)
    for r in range(pre.shape[0]):  # brute force: sort each row
        order = torch.argsort(pre[r], descending=True)[: sae.cfg.k]
        out[r, order] = pre[r, order].clamp_min(0)
    return out


@pytest.mark.parametrize("activation", ["relu", "topk", "jumprelu", "batchtopk"])
@pytest.mark.parametrize("apply_b_dec", [True, False])
def test_encode_decode_match_independent_formulas(activation, apply_b_dec):
    sae = _sae(activation, apply_b_dec_to_input=apply_b_dec)
    x = _x()
    codes = sae.encode(x)
    assert codes.shape == (N, D_SAE) and (codes >= 0).all()
    torch.testing.assert_close(codes, _reference_codes(sae, x))
    ref_x_hat = _reference_codes(sae, x) @ sae.W_dec.detach() + sae.b_dec.detach()
    torch.testing.assert_close(sae(x), ref_x_hat)
    torch.testing.assert_close(sae.decode(codes), ref_x_hat)
    if activation == "topk":
        assert ((codes > 0).sum(1) <= 5).all()


def test_topk_orders_give_same_codes_but_differ_in_indices_when_few_positives():
    """With fewer than k positive pre-activations in a row, both orders keep exactly the positive latents
    (same dense codes), but topk_then_relu fills the other slots with the least negative latents while
    relu_then_topk fills them with arbitrary zeros: the index sets differ."""
    a = _sae("topk", topk_order="relu_then_topk")
    b = _sae("topk", topk_order="topk_then_relu")
    x = _x()
    with torch.no_grad():  # shift b_enc so that a row has about 2 positives on average (k = 5)
        c = float(torch.quantile(a.pre_activations(x).flatten(), 1 - 2 / D_SAE))
        a.b_enc.sub_(c), b.b_enc.sub_(c)
    pre = a.pre_activations(x).detach()
    n_pos = (pre > 0).sum(1)
    few = (n_pos > 0) & (n_pos < 5)
    assert few.sum() >= N // 2, n_pos  # the case under test, and not an all-zero one
    codes_a, codes_b = a.encode(x), b.encode(x)
    torch.testing.assert_close(codes_a, codes_b)
    torch.testing.assert_close(codes_a, torch.where((pre > 0) & (pre >= pre.topk(5, dim=1).values[:, -1:]), pre, 0.0))
    va, ia = (t.detach() for t in a.encode_topk(x))
    vb, ib = (t.detach() for t in b.encode_topk(x))
    # topk_then_relu picks the k largest pre-activations, positive or not
    assert torch.equal(torch.sort(ib, 1).values, torch.sort(pre.topk(5, dim=1).indices, 1).values)
    # both keep the same positive latents with the same values: the positive ones among the top k
    for r in range(N):
        pos_a = {int(i): float(v) for i, v in zip(ia[r], va[r]) if v > 0}
        pos_b = {int(i): float(v) for i, v in zip(ib[r], vb[r]) if v > 0}
        top = pre[r].topk(5).indices.tolist()
        assert pos_a == pos_b == {j: float(pre[r, j]) for j in top if pre[r, j] > 0}, r
    # ... but relu_then_topk's other slots are not the least negative latents
    sets_a = [set(ia[r].tolist()) for r in range(N)]
    sets_b = [set(ib[r].tolist()) for r in range(N)]
    differ = [r for r in range(N) if few[r] and sets_a[r] != sets_b[r]]
    assert len(differ) >= N // 4, (differ, few.nonzero().flatten().tolist())
    # where a row has k or more positives the two orders pick the same latents
    assert all(sets_a[r] == sets_b[r] for r in range(N) if n_pos[r] >= 5)


def test_sparse_decode_equals_dense_values_and_grads():
    sae = _sae("topk")
    x = _x()
    values, indices = sae.encode_topk(x)
    values = values.detach().requires_grad_(True)
    out_sparse = sae.decode_sparse(values, indices)
    g_out = torch.randn_like(out_sparse)
    (out_sparse * g_out).sum().backward()
    gv_sparse, gW_sparse, gb_sparse = values.grad.clone(), sae.W_dec.grad.clone(), sae.b_dec.grad.clone()
    sae.zero_grad(), values.grad.zero_()
    dense = torch.zeros(N, D_SAE, dtype=values.dtype).scatter(1, indices, values)
    out_dense = dense @ sae.W_dec + sae.b_dec
    (out_dense * g_out).sum().backward()
    torch.testing.assert_close(out_sparse, out_dense)
    torch.testing.assert_close(values.grad, gv_sparse)
    torch.testing.assert_close(sae.W_dec.grad, gW_sparse)
    torch.testing.assert_close(sae.b_dec.grad, gb_sparse)


def _dense_topk_loss(sae: SAE, x, dead_mask, aux_k, aux_coef, rescaled=False):
    """The TopK objective written densely with plain autograd (reference for the fused path). rescaled: the
    latents (and AuxK's) chosen on pre_i·‖w_i‖, x̂ still Σ relu(pre_i)·w_i (SAELens' TopK, decoder_norm free)."""
    pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    score = pre * sae.W_dec.norm(dim=1).detach() if rescaled else pre
    idx = F.relu(score).topk(sae.cfg.k, dim=1).indices
    codes = torch.zeros_like(pre).scatter(1, idx, F.relu(pre.gather(1, idx)))
    x_hat = codes @ sae.W_dec + sae.b_dec
    err = x - x_hat
    loss = err.pow(2).sum() / (x - x.mean(0)).pow(2).sum()
    dead_pre = torch.where(dead_mask, score, torch.full_like(pre, -torch.inf))
    aidx = dead_pre.topk(aux_k, dim=1).indices
    acodes = torch.zeros_like(pre).scatter(1, aidx, F.relu(pre.gather(1, aidx)) * dead_mask[aidx])
    e = err.detach()
    aux = (e - acodes @ sae.W_dec).pow(2).sum() / (e - e.mean(0)).pow(2).sum() * min(dead_mask.sum() / aux_k, 1.0)
    return loss + aux_coef * aux


@pytest.mark.parametrize("rescaled", [False, True], ids=["unit-choice", "choice-by-decoder-norm"])
def test_fused_topk_training_gradients_equal_dense_autograd(rescaled):
    """The fused step equals the dense objective; rescaled (rows of norms 0–2): the choice on pre·‖w_i‖ and the
    codes' ·‖w_i‖ / ‖w_i‖ round trip through decode_sparse leave x̂ = Σ relu(pre_i)·w_i and no gradient of its own."""
    sae = _sae("topk", rescale_acts_by_decoder_norm=rescaled)
    x = _x()
    dead = torch.zeros(D_SAE, dtype=torch.bool)
    dead[::3] = True  # 16 dead latents, aux_k 6
    out = sae.forward_train(x, dead_mask=dead, aux_k=6, aux_coefficient=0.5)
    out.loss.backward()
    fused = {n: p.grad.clone() for n, p in sae.named_parameters()}
    sae.zero_grad()
    ref = _dense_topk_loss(sae, x, dead, 6, 0.5, rescaled)
    with torch.no_grad():  # the two choices differ here, so a step that ignored the rescaling would fail
        other = _dense_topk_loss(sae, x, dead, 6, 0.5, not rescaled)
    assert abs(float(other) - float(ref.detach())) > 1e-3
    ref.backward()
    torch.testing.assert_close(out.loss, ref)
    for n, p in sae.named_parameters():
        torch.testing.assert_close(fused[n], p.grad, msg=n)
        assert p.grad.abs().sum() > 0, n  # every parameter receives gradient


@pytest.mark.parametrize("activation", ["relu", "topk"])
def test_training_loss_gradcheck(activation):
    """Finite differences against autograd (incl. the fused sparse TopK backward) for every parameter.
    No dead latents here: AuxK reconstructs a *detached* residual, which finite differences cannot
    respect; its gradients are checked against dense autograd above."""
    sae = _sae(activation)
    x = _x()
    dead = torch.zeros(D_SAE, dtype=torch.bool)
    names = [n for n, _ in sae.named_parameters()]
    inputs = tuple(p.detach().clone().requires_grad_(True) for p in sae.parameters())
    wrapper = _TrainWrapper(sae)

    def objective(*ps):
        return torch.func.functional_call(wrapper, dict(zip(["sae." + n for n in names], ps)), (x, dead))

    assert torch.autograd.gradcheck(objective, inputs, eps=1e-6, atol=1e-5, fast_mode=True)


class _TrainWrapper(torch.nn.Module):
    def __init__(self, sae):
        super().__init__()
        self.sae = sae

    def forward(self, x, dead):
        return self.sae.forward_train(x, dead_mask=dead, aux_k=4, l1_coefficient=0.3, aux_coefficient=0.5).loss


def test_parallel_gradient_removal_and_renormalisation():
    sae = _sae("topk")
    sae.normalize_decoder()
    torch.testing.assert_close(sae.W_dec.norm(dim=1), torch.ones(D_SAE, dtype=torch.float64))
    sae.forward_train(_x(), dead_mask=None).loss.backward()
    raw = sae.W_dec.grad.clone()
    sae.remove_parallel_decoder_grad()
    w = sae.W_dec.detach()
    torch.testing.assert_close((sae.W_dec.grad * w).sum(1), torch.zeros(D_SAE, dtype=torch.float64))
    # what was removed is exactly the radial part
    torch.testing.assert_close(raw - sae.W_dec.grad, (raw * w).sum(1, keepdim=True) * w)


@pytest.mark.parametrize("activation", ["relu", "jumprelu", "topk-rescaled"])
def test_fold_decoder_norms_keeps_reconstructions(activation):
    """Folding keeps x̂ (and, for a TopK that chooses on pre·‖w_i‖, which latents fire: the rescaling becomes the
    identity and is switched off); a TopK choosing on pre alone is refused (rows of norms 0–2 here)."""
    rescaled = activation == "topk-rescaled"
    sae = _sae(activation.removesuffix("-rescaled"), rescale_acts_by_decoder_norm=rescaled)
    x = _x()
    before, support = sae(x).detach(), sae.encode(x) > 0
    sae.fold_decoder_norms()
    torch.testing.assert_close(sae.W_dec.norm(dim=1), torch.ones(D_SAE, dtype=torch.float64))
    torch.testing.assert_close(sae(x), before)
    assert torch.equal(sae.encode(x) > 0, support) and not sae.cfg.rescale_acts_by_decoder_norm
    with pytest.raises(FormatError, match="cannot fold decoder norms into a topk SAE"):
        _sae("topk").fold_decoder_norms()


def test_layer_norm_input_hook_is_inverted_after_decode():
    sae = _sae("relu", input_normalization="layer_norm")
    x = _x() * 3 + 2
    mu, sd = x.mean(1, keepdim=True), x.std(1, keepdim=True)
    xn = (x - mu) / (sd + 1e-5)
    codes_ref = ((xn - sae.b_dec) @ sae.W_enc + sae.b_enc).clamp_min(0)
    torch.testing.assert_close(sae.encode(x), codes_ref.detach())
    x_hat_ref = (codes_ref @ sae.W_dec + sae.b_dec) * sd + mu  # OpenAI/SAELens undo with the std, no eps
    torch.testing.assert_close(sae(x), x_hat_ref.detach())


def test_rescale_acts_by_decoder_norm_matches_saelens_formula():
    sae = _sae("topk", rescale_acts_by_decoder_norm=True)
    x = _x()
    norms = sae.W_dec.norm(dim=1).detach()
    pre = ((x - sae.b_dec) @ sae.W_enc + sae.b_enc).detach() * norms
    idx = pre.topk(5, dim=1).indices
    codes = torch.zeros_like(pre).scatter(1, idx, pre.gather(1, idx).clamp_min(0))
    torch.testing.assert_close(sae.encode(x), codes)
    torch.testing.assert_close(sae(x), (codes / norms) @ sae.W_dec.detach() + sae.b_dec.detach())


def test_bad_inputs_and_configs_are_refused():
    with pytest.raises(FormatError, match="k"):
        SAEConfig(8, 16, activation="topk", k=None)
    with pytest.raises(FormatError, match="activation"):
        SAEConfig(8, 16, activation="gelu")
    with pytest.raises(BadInputError, match=r"\(n, 16\)"):
        _sae("relu").encode(torch.zeros(3, 5, dtype=torch.float64))


@pytest.mark.parametrize("apply_b_dec", [True, False])
def test_relu_training_objective_metrics_and_grads_match_plain_formula(apply_b_dec):
    """mean_rows ‖x − x̂‖² + l1 · mean_rows Σ_i codes_i ‖W_dec[i]‖ (non-unit rows), written densely."""
    sae = _sae("relu", apply_b_dec_to_input=apply_b_dec)
    x = _x()
    out = sae.forward_train(x, l1_coefficient=0.3)
    out.loss.backward()
    got = {n: p.grad.clone() for n, p in sae.named_parameters()}
    sae.zero_grad()
    pre = ((x - sae.b_dec) if apply_b_dec else x) @ sae.W_enc + sae.b_enc
    codes = pre.clamp_min(0)
    err = x - (codes @ sae.W_dec + sae.b_dec)
    l1 = sum(codes[r, i] * sae.W_dec[i].norm() for r in range(N) for i in range(D_SAE)) / N
    ref = err.pow(2).sum() / N + 0.3 * l1
    ref.backward()
    torch.testing.assert_close(out.loss, ref)
    torch.testing.assert_close(out.terms["l1_loss"], l1.detach())
    for n, p in sae.named_parameters():
        torch.testing.assert_close(got[n], p.grad, msg=n)
    counts = torch.tensor([sum(1 for r in range(N) if codes[r, i] > 0) for i in range(D_SAE)], dtype=torch.float64)
    torch.testing.assert_close(out.fire_count.double(), counts)
    assert float(out.l0_sum) == float(counts.sum())
    assert torch.equal(out.fired, counts > 0)


def test_relu_init_reconstructs_small_topk_init_stays_tied():
    """Fresh ReLU SAE: ‖x̂ − b_dec‖ well below ‖x − b_dec‖ (a tied unit-norm init gives ≈ d_sae/(2 d_in) = 4×,
    which lets the L1 term dominate the first steps). TopK keeps W_enc = W_decᵀ exactly."""
    d_in, d_sae = 32, 256
    g = torch.Generator().manual_seed(3)
    x = torch.randn(512, d_in, generator=g) * torch.linspace(0.5, 2.0, d_in) + 3.0
    mean = x.mean(0)
    relu = SAE(SAEConfig(d_in, d_sae, activation="relu")).init_weights(torch.Generator().manual_seed(0), b_dec=mean)
    with torch.no_grad():
        codes = ((x - mean) @ relu.W_enc).clamp_min(0)
        ratio = float((codes @ relu.W_dec).norm(dim=1).mean() / (x - mean).norm(dim=1).mean())
    torch.testing.assert_close(relu.W_dec.norm(dim=1), torch.ones(d_sae))
    assert ratio < 0.6, ratio
    topk = SAE(SAEConfig(d_in, d_sae, activation="topk", k=8)).init_weights(torch.Generator().manual_seed(0))
    assert torch.equal(topk.W_enc, topk.W_dec.T)
    torch.testing.assert_close(topk.W_dec.norm(dim=1), torch.ones(d_sae))
