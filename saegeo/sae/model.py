"""One SAE encode/decode contract for trained and published dictionaries.

    x' = normalize(x)                      (identity, or OpenAI-style LayerNorm; inverted after decode)
    pre = (x' - b_dec·[apply_b_dec_to_input]) @ W_enc + b_enc   (· ‖W_dec[i]‖ if rescale_acts_by_decoder_norm)
    codes = activation(pre) >= 0           (relu | topk | jumprelu | batchtopk)
    x_hat = denormalize(codes @ W_dec + b_dec)

Tensors: W_enc (d_in, d_sae), b_enc (d_sae), W_dec (d_sae, d_in), b_dec (d_in) -- the SAELens layout.
saegeo-trained SAEs keep unit-norm decoder rows; published ones need not. What a loader learned about
the files (format, source, how the inputs must be prepared) is ``SAE.format_info``, a ``FormatInfo``.
New activations register in `ACTIVATIONS` (dense codes from pre-activations); the trainer only calls
`forward_train`, so it needs no change.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from saegeo.errors import BadInputError, FormatError

ACTIVATION_NAMES = ("relu", "topk", "jumprelu", "batchtopk")
TOPK_ORDERS = ("relu_then_topk", "topk_then_relu")
INPUT_NORMALIZATIONS = ("none", "layer_norm", "constant_norm_rescale")


@dataclass
class SAEConfig:
    """Everything needed to rebuild the encode/decode of an SAE (shapes come from d_in, d_sae)."""

    d_in: int
    d_sae: int
    activation: str = "topk"  # one of ACTIVATION_NAMES
    k: int | None = None  # topk: active latents per row; batchtopk: the training k (inference uses threshold)
    # topk order. relu_then_topk (sparsify): top-k of relu(pre). topk_then_relu (SAELens, OpenAI):
    # relu of the top-k of pre. Dense codes are identical; the chosen *indices* differ when a row
    # has fewer than k positive pre-activations (zeros vs. the least negative latents).
    topk_order: str = "relu_then_topk"
    apply_b_dec_to_input: bool = True  # subtract b_dec before encoding (SAELens, sparsify) or not (Gemma Scope npz)
    # SAELens TopK option: pre-activations scaled by ‖W_dec[i]‖ before TopK, codes divided by it in decode
    rescale_acts_by_decoder_norm: bool = False
    input_normalization: str = "none"  # "layer_norm": OpenAI's per-row LayerNorm, inverted after decode
    layer_norm_eps: float = 1e-5
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATION_NAMES:
            raise FormatError(f"SAEConfig.activation={self.activation!r}; expected one of {ACTIVATION_NAMES}")
        if self.activation == "topk" and not (self.k and 0 < self.k <= self.d_sae):
            raise FormatError(f"topk SAE needs 0 < k <= d_sae={self.d_sae}, got k={self.k}")
        if self.topk_order not in TOPK_ORDERS:
            raise FormatError(f"SAEConfig.topk_order={self.topk_order!r}; expected one of {TOPK_ORDERS}")
        if self.input_normalization not in INPUT_NORMALIZATIONS:
            raise FormatError(
                f"SAEConfig.input_normalization={self.input_normalization!r}; expected one of {INPUT_NORMALIZATIONS}"
            )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class FormatInfo:
    """What a loader read from a dictionary's files beyond its encode/decode: provenance, and the facts
    `saegeo check` needs about how its inputs must be prepared. None: the format does not say."""

    format: str = "saegeo"  # a key of saegeo.sae.formats._LOADERS ("saelens", "sparsify", "llama_scope", ...) or "saegeo"
    source: str | None = None  # the file or directory it was loaded from
    written_by: str | None = None  # "saegeo" for directories saegeo wrote
    model_name: str | None = None
    model_fingerprint: dict | None = None  # what the training store's model is (models.model_fingerprint)
    hook_name: str | None = None
    source_dtype: str | None = None  # dtype(s) of the stored weights (they are loaded as float32)
    hub_id: str | None = None  # the hub id it was resolved from (load_dictionary("org/repo[/sub]" or a release id))
    # what the activations must be (SAELens metadata; `saegeo check --acts` compares them with the store)
    hook_head_index: int | None = None  # one attention head of a hook_z activation
    model_from_pretrained_kwargs: dict | None = None  # e.g. {"center_writing_weights": false}
    exclude_special_tokens: bool | list | None = None  # BOS / special-token rows left out of training
    prepend_bos: bool | None = None
    context_size: int | None = None
    expected_input_norm: float | None = None  # E‖x‖ of the training inputs (Llama Scope dataset_average_activation_norm.in)
    input_scale_folded: float | None = None  # Llama Scope: √d / norm_in folded into W_enc (and 1/it into W_dec, b_dec)
    # SAELens
    sae_lens_version: str | None = None
    architecture: str | None = None
    normalize_activations: str | None = None  # inputs must be scaled by a factor the files may not hold
    folded_scaling_factor: dict[str, float] | None = None  # {min, max} of a finetuning factor folded into W_dec
    # sparsify
    transcoder: bool = False  # reconstructs another activation than it reads (no b_dec subtraction)
    normalize_decoder: bool | None = None
    signed: bool = False  # top k of |pre|, negative codes kept (sparsify signed: true)
    # dictionary_learning
    dict_class: str | None = None
    trainer_class: str | None = None
    threshold: float | None = None  # BatchTopK / Matryoshka global threshold
    threshold_unset: bool = False  # BatchTopK threshold -1: never set in training, codes are dense
    stored_threshold_ignored: float | None = None  # AutoEncoderTopK keeps a threshold it does not use
    group_sizes: list[int] | None = None  # Matryoshka
    training_k: int | None = None  # BatchTopK k used in training (inference uses the threshold)
    # OpenAI
    openai_activation: str | None = None

    def to_dict(self) -> dict:
        """The fields that are set (not None / False), for reports."""
        return {k: v for k, v in asdict(self).items() if v is not None and v is not False}


class TrainOutput(NamedTuple):
    """What one training forward pass returns; losses are scalars, the rest is for metrics."""

    loss: Tensor  # total objective
    sse: Tensor  # Σ ‖x − x̂‖² over the batch (float32 scalar)
    centred_ss: Tensor  # Σ ‖x − mean_batch(x)‖²
    l0_sum: Tensor  # Σ over rows of the number of active latents
    aux_loss: Tensor  # AuxK (topk) or L1 (relu) term, before its coefficient
    fired: Tensor  # (d_sae,) bool: latent active on some row of the batch
    fire_count: Tensor  # (d_sae,) number of rows each latent fired on
    min_kept: Tensor | None = None  # batchtopk: smallest positive code kept in this batch (threshold estimate)


def _relu(sae: "SAE", pre: Tensor) -> Tensor:
    return F.relu(pre)


def _topk_dense(sae: "SAE", pre: Tensor) -> Tensor:
    values, indices = sae._topk(pre)
    return torch.zeros_like(pre).scatter_(-1, indices, values)


def _jumprelu(sae: "SAE", pre: Tensor) -> Tensor:
    # SAELens / Gemma Scope: relu(pre) gated by a per-latent threshold.
    return F.relu(pre) * (pre > sae.threshold)


def _batchtopk_inference(sae: "SAE", pre: Tensor) -> Tensor:
    # dictionary_learning BatchTopK at inference: one global scalar threshold, not per-row TopK.
    post = F.relu(pre)
    return post * (post > sae.threshold.reshape(-1)[0])


ACTIVATIONS: dict[str, Callable[["SAE", Tensor], Tensor]] = {
    "relu": _relu,
    "topk": _topk_dense,
    "jumprelu": _jumprelu,
    "batchtopk": _batchtopk_inference,
}


def _window(pre: Tensor, threshold: Tensor, bandwidth: float) -> Tensor:
    """Rectangle kernel K((pre − θ)/ε) = 1[|pre − θ| < ε/2], in the dtype of pre."""
    return ((pre - threshold).abs() < bandwidth / 2).to(pre.dtype)


def _sum_to(grad: Tensor, like: Tensor) -> Tensor:
    """grad summed over the leading dimensions that `like` was broadcast along ((n, d_sae) → (d_sae,)), or
    as it is when `like` has grad's shape (one θ per entry of a sparse set, gathered from the θ vector)."""
    return grad if grad.shape == like.shape else grad.sum(dim=0)


class _JumpReLUFn(torch.autograd.Function):
    """codes = pre·H(pre − θ) with a straight-through estimator for θ (Rajamanoharan et al. 2024).

    ∂codes/∂pre = H(pre − θ) (exact away from the jump); ∂codes/∂θ_i := −(θ_i/ε)·K((pre − θ_i)/ε) with the
    rectangle kernel K(u) = 1[|u| < ½] and bandwidth ε: the jump of height θ_i spread over a window of width ε.
    """

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return pre * (pre > threshold)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        eps = ctx.bandwidth
        grad_pre = grad * (pre > threshold) if ctx.needs_input_grad[0] else None
        grad_thr = None
        if ctx.needs_input_grad[1]:
            grad_thr = _sum_to(-(threshold / eps) * grad * _window(pre, threshold, eps), threshold)
        return grad_pre, grad_thr, None


class _StepFn(torch.autograd.Function):
    """H(pre − θ) with ∂/∂pre := 0 and ∂/∂θ_i := −(1/ε)·K((pre − θ_i)/ε): the L0 that trains the threshold.

    Summed over rows this is exactly the central finite difference of Σ_r H(pre_r − θ_i) with step ε:
    −#{r: |pre_r − θ_i| < ε/2}/ε.
    """

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        eps = ctx.bandwidth
        grad_thr = _sum_to(-(grad * _window(pre, threshold, eps)) / eps, threshold) if ctx.needs_input_grad[1] else None
        return None, grad_thr, None


class _ReLUStep(torch.autograd.Function):
    """The ReLU SAE's training forward with a hand-written backward (no autograd graph of (n, d_sae) temporaries).

    Forward: xc = x − b_dec·[apply], codes = relu(xc @ W_enc + b_enc), x̂ = codes @ W_dec + b_dec,
    l1 = Σ_i ‖w_i‖·Σ_rows codes_ri / n; also the per-latent firing counts (no gradient).
    Backward, given G = ∂L/∂x̂ and g = ∂L/∂l1:
      ∂codes = G W_decᵀ + (g/n)‖w‖ (one GEMM with a broadcast bias), ∂pre = ∂codes·[codes > 0],
      ∂W_enc = xcᵀ ∂pre, ∂b_enc = Σ_rows ∂pre, ∂W_dec = codesᵀ G + (g/n)(Σ_rows codes)_i w_i/‖w_i‖,
      ∂b_dec = Σ_rows G − W_enc ∂b_enc·[apply]; x gets none.
    Five GEMMs of n·d·d_sae and four elementwise passes over (n, d_sae): relu, its backward, two column sums.
    (Folding the biases and sums into the GEMMs as an extra row/column was measured slower: d + 1 = 385
    columns cost the GEMMs ~8 %, more than the passes they save.)
    """

    @staticmethod
    def forward(ctx, x, W_enc, b_enc, W_dec, b_dec, apply_b_dec: bool):
        xc = x - b_dec if apply_b_dec else x
        codes = torch.addmm(b_enc, xc, W_enc).relu_()
        x_hat = torch.addmm(b_dec, codes, W_dec)
        norms = W_dec.norm(dim=1)
        code_sums = codes.sum(dim=0)
        l1 = code_sums @ norms / x.shape[0]
        fire_count = torch.count_nonzero(codes, dim=0).to(torch.float32)
        ctx.save_for_backward(xc, codes, W_enc, W_dec, norms, code_sums)
        ctx.apply_b_dec = apply_b_dec
        ctx.mark_non_differentiable(fire_count)
        return x_hat, l1, fire_count

    @staticmethod
    def backward(ctx, grad_x_hat, grad_l1, _):
        xc, codes, W_enc, W_dec, norms, code_sums = ctx.saved_tensors
        g = grad_l1 / xc.shape[0]
        # ∂pre = ∂codes where codes > 0: ReLU's own fused backward kernel, one pass
        grad_pre = torch.ops.aten.threshold_backward(torch.addmm(g * norms, grad_x_hat, W_dec.t()), codes, 0.0)
        grad_W_enc = xc.t() @ grad_pre
        grad_b_enc = grad_pre.sum(dim=0)
        del grad_pre
        grad_W_dec = torch.addmm((g * code_sums / norms.clamp_min(1e-12))[:, None] * W_dec, codes.t(), grad_x_hat)
        grad_b_dec = grad_x_hat.sum(dim=0)
        if ctx.apply_b_dec:
            grad_b_dec = grad_b_dec - W_enc @ grad_b_enc
        return None, grad_W_enc, grad_b_enc, grad_W_dec, grad_b_dec, None


class _GatheredLinear(torch.autograd.Function):
    """v_j = x[r_j] · W_enc[:, c_j] + b_enc[c_j] over a sparse set of entries (r_j, c_j), with a sparse backward.

    The entries are either k per row (`cols` (n, k), rows implied) or a flat list sorted by row (`cols` (m,),
    `rows` (m,) and the bag `offsets` (n,) of each row's first entry: BatchTopK, JumpReLU). The forward takes
    the already-computed values (`gathered`, from the no-grad dense pre-activations); the backward scatters
    the upstream gradients g: ∂W_enc[:, i] = Σ_{j: c_j = i} g_j·x[r_j] (a sparse (d_sae × n) @ (n × d_in)
    product), ∂b_enc = scatter-add of g, ∂x[r] = Σ_{j: r_j = r} g_j·W_enc[:, c_j] (an embedding_bag over
    W_encᵀ). Cost O(m·d_in) instead of O(n·d_sae·d_in). Same idea as sparsify's fused encoder.
    """

    @staticmethod
    def forward(ctx, x, W_enc, b_enc, cols, gathered, rows=None, offsets=None):
        ctx.save_for_backward(x, W_enc, cols, rows, offsets)
        return gathered.clone()

    @staticmethod
    def backward(ctx, grad):
        x, W_enc, cols, rows, offsets = ctx.saved_tensors
        n, d_sae = x.shape[0], W_enc.shape[1]
        grad_x = grad_w = grad_b = None
        flat_idx, flat_g = cols.reshape(-1), grad.reshape(-1).to(W_enc.dtype)
        if ctx.needs_input_grad[0]:
            grad_x = F.embedding_bag(cols, W_enc.t().contiguous(), offsets, per_sample_weights=grad.to(W_enc.dtype),
                                     mode="sum")
        if ctx.needs_input_grad[1]:
            if rows is None:
                rows = torch.arange(n, device=x.device).repeat_interleave(cols.shape[1])
            g_sparse = torch.sparse_coo_tensor(torch.stack([flat_idx, rows]), flat_g, (d_sae, n), check_invariants=False)
            grad_w = torch.sparse.mm(g_sparse, x.to(W_enc.dtype)).t().contiguous()
        if ctx.needs_input_grad[2]:
            grad_b = torch.zeros(d_sae, device=x.device, dtype=W_enc.dtype).index_add_(0, flat_idx, flat_g)
        return grad_x, grad_w, grad_b, None, None, None, None


def _batch_topk_entries(values: Float[Tensor, "n d_sae"], count: int, per_row: int | None = None) -> Int[Tensor, " count"]:
    """Flat indices r·d_sae + c of the `count` largest entries of `values` (BatchTopK's selection), exactly as
    a topk over the flattened matrix, but from each row's top `per_row` (default 2·count/n) candidates: the
    global set lies inside them unless a row's smallest candidate exceeds the count-th largest candidate τ;
    such rows join with all their entries (τ only rises, so the rest stay complete). ≈2.5× faster on CPU."""
    n, d_sae = values.shape
    per_row = min(d_sae, per_row or max(1, 2 * -(-count // n)))
    if per_row * n <= count or per_row == d_sae:
        return values.view(-1).topk(count, sorted=False).indices
    cand_values, cand_cols = values.topk(per_row, dim=1, sorted=False)
    tau = cand_values.view(-1).topk(count, sorted=False).values.min()
    overflow = cand_values.min(dim=1).values > tau  # rows that may hold more than their candidates
    truncated, keep = overflow.nonzero()[:, 0], ~overflow
    cand_flat = torch.arange(n, device=values.device)[:, None] * d_sae + cand_cols
    flat = torch.cat([cand_flat[keep].view(-1), (truncated[:, None] * d_sae + torch.arange(d_sae, device=values.device)).view(-1)])
    pool = torch.cat([cand_values[keep].view(-1), values[truncated].view(-1)])
    return flat[pool.topk(count, sorted=False).indices]


def _row_sorted_entries(flat_index: Int[Tensor, " m"], n: int, d_sae: int) -> tuple[Tensor, Tensor, Tensor]:
    """(rows, cols, offsets) of entries given by their row-major flat indices r·d_sae + c, sorted by row
    (then column); offsets[r] = the first entry of row r (embedding_bag's bags, empty rows allowed)."""
    flat_index = flat_index.sort().values
    rows, cols = flat_index // d_sae, flat_index % d_sae
    offsets = torch.zeros(n, dtype=torch.long, device=flat_index.device)
    offsets[1:] = torch.bincount(rows, minlength=n).cumsum(0)[:-1]
    return rows, cols, offsets


class SAE(nn.Module):
    """Sparse autoencoder with the SAELens tensor layout and a configurable encode (see module doc)."""

    def __init__(self, cfg: SAEConfig, *, device: str | torch.device = "cpu", format_info: FormatInfo | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.format_info = format_info if format_info is not None else FormatInfo()
        dtype = getattr(torch, cfg.dtype)
        kw = dict(device=device, dtype=dtype)
        self.W_enc = nn.Parameter(torch.zeros(cfg.d_in, cfg.d_sae, **kw))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, **kw))
        self.W_dec = nn.Parameter(torch.zeros(cfg.d_sae, cfg.d_in, **kw))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_in, **kw))
        # jumprelu: per-latent threshold (d_sae), a parameter (the trainer turns its gradient on);
        # batchtopk: one scalar (shape (1,)), a buffer the trainer estimates from the codes it keeps.
        if cfg.activation == "jumprelu":
            self.threshold = nn.Parameter(torch.zeros(cfg.d_sae, **kw), requires_grad=False)
        else:
            self.register_buffer("threshold", torch.zeros(1, **kw))

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def init_weights(
        self, generator: torch.Generator | None = None, b_dec: Tensor | None = None, encoder_scale: float | None = None
    ) -> "SAE":
        """Random unit-norm decoder rows, tied encoder W_enc = encoder_scale · W_decᵀ, b_enc = 0, b_dec as given
        (else 0). encoder_scale defaults to 0.1 for relu and 1 otherwise (TopK picks the same latents at any scale).

        Why 0.1 for relu: with W_enc = W_decᵀ about half of the d_sae latents fire on a row, and
        x̂ − b_dec ≈ (d_sae / 2d_in)·(x − b_dec), several times the data, so the L1 term dominates early and
        the run ends dense and poorly fit. SAELens starts decoder rows at norm 0.1 with a tied encoder (initial
        x̂ 0.01× that); in unit-decoder form that is encoder_scale 0.01. On MiniLM layer 3 (180 steps of
        4096, l1 1) 0.1 and 0.01 end alike (held-out FVE 0.879 / 0.878, L0 471 / 500) against 0.64 / 1114 at 1.
        """
        if encoder_scale is None:
            encoder_scale = 0.1 if self.cfg.activation == "relu" else 1.0
        w = torch.randn(self.cfg.d_sae, self.cfg.d_in, generator=generator, dtype=torch.float32)
        w /= w.norm(dim=1, keepdim=True)
        self.W_dec.copy_(w)
        self.W_enc.copy_(encoder_scale * w.T)
        self.b_enc.zero_()
        self.b_dec.copy_(b_dec if b_dec is not None else torch.zeros(self.cfg.d_in))
        return self

    # ------------------------------------------------------------------ input normalisation hook
    def normalize_input(self, x: Float[Tensor, "n d_in"]) -> tuple[Float[Tensor, "n d_in"], tuple | None]:
        """Identity; layer_norm: x' = (x − mean_row x) / (std_row x + eps) (OpenAI `LN`, SAELens "layer_norm",
        unbiased std); constant_norm_rescale: x' = x·√d_in/‖x‖ (SAELens). Returns what `denormalize` needs."""
        if self.cfg.input_normalization == "none":
            return x, None
        if self.cfg.input_normalization == "constant_norm_rescale":
            coeff = self.cfg.d_in**0.5 / x.norm(dim=-1, keepdim=True)
            return x * coeff, (coeff,)
        mu = x.mean(dim=-1, keepdim=True)
        xc = x - mu
        std = xc.std(dim=-1, keepdim=True)
        return xc / (std + self.cfg.layer_norm_eps), (mu, std)

    def denormalize(self, x_hat: Float[Tensor, "n d_in"], state: tuple | None) -> Float[Tensor, "n d_in"]:
        """Undo `normalize_input` as the libraries do: x̂ = x̂'·std + mean (OpenAI and SAELens multiply by the
        std without the eps), or x̂ = x̂'/coeff for constant_norm_rescale."""
        if state is None:
            return x_hat
        if len(state) == 1:
            return x_hat / state[0]
        mu, std = state
        return x_hat * std + mu

    # ------------------------------------------------------------------ encode
    def _check_input(self, x: Tensor) -> None:
        if x.ndim != 2 or x.shape[1] != self.cfg.d_in:
            raise BadInputError(f"SAE expects activations of shape (n, {self.cfg.d_in}), got {tuple(x.shape)}")

    def pre_activations(self, x: Float[Tensor, "n d_in"]) -> Float[Tensor, "n d_sae"]:
        """pre = (normalize(x) − b_dec·[apply_b_dec_to_input]) @ W_enc + b_enc (no normalisation state kept)."""
        return self._pre(self.normalize_input(x)[0])

    def _pre(self, xn: Tensor) -> Tensor:
        if self.cfg.apply_b_dec_to_input:
            xn = xn - self.b_dec
        pre = torch.addmm(self.b_enc, xn.to(self.W_enc.dtype), self.W_enc)
        if self.cfg.rescale_acts_by_decoder_norm:
            pre = pre * self.W_dec.norm(dim=-1)
        return pre

    def _codes_for_decode(self, codes: Tensor) -> Tensor:
        return codes / self.W_dec.norm(dim=-1) if self.cfg.rescale_acts_by_decoder_norm else codes

    def _topk(self, pre: Tensor) -> tuple[Tensor, Tensor]:
        k = int(self.cfg.k)
        if self.cfg.topk_order == "relu_then_topk":
            return F.relu(pre).topk(k, dim=-1, sorted=False)
        values, indices = pre.topk(k, dim=-1, sorted=False)
        return F.relu(values), indices

    def encode(self, x: Float[Tensor, "n d_in"]) -> Float[Tensor, "n d_sae"]:
        """codes = activation(pre) ≥ 0, dense (n, d_sae)."""
        self._check_input(x)
        return ACTIVATIONS[self.cfg.activation](self, self.pre_activations(x))

    def encode_topk(self, x: Float[Tensor, "n d_in"]) -> tuple[Float[Tensor, "n k"], Int[Tensor, "n k"]]:
        """TopK codes as (values ≥ 0, latent indices), each (n, k); the dense codes scatter these."""
        self._check_input(x)
        if self.cfg.activation != "topk":
            raise BadInputError(f"encode_topk needs a topk SAE, this one is {self.cfg.activation!r}")
        return self._topk(self.pre_activations(x))

    # ------------------------------------------------------------------ decode
    def decode(self, codes: Float[Tensor, "n d_sae"], norm_state: tuple | None = None) -> Float[Tensor, "n d_in"]:
        """x̂ = denormalize(codes @ W_dec + b_dec)."""
        return self.denormalize(torch.addmm(self.b_dec, self._codes_for_decode(codes), self.W_dec), norm_state)

    def decode_sparse(
        self, values: Float[Tensor, "n k"], indices: Int[Tensor, "n k"], norm_state: tuple | None = None,
        offsets: Int[Tensor, " n"] | None = None,
    ) -> Float[Tensor, "n d_in"]:
        """x̂ = Σ_j values[:, j] · W_dec[indices[:, j]] + b_dec, gathering only the k active rows (or, with
        `offsets`, flat row-sorted entries: row r sums entries offsets[r] … offsets[r + 1] − 1).

        embedding_bag(mode="sum", per_sample_weights) is a gather-and-sum whose backward scatters into
        the rows used: no dense (n, d_sae) matmul in the forward or the backward.
        """
        if self.cfg.rescale_acts_by_decoder_norm:
            values = values / self.W_dec.norm(dim=-1)[indices]
        out = F.embedding_bag(indices, self.W_dec, offsets, per_sample_weights=values.to(self.W_dec.dtype), mode="sum")
        return self.denormalize(out + self.b_dec, norm_state)

    def forward(self, x: Float[Tensor, "n d_in"]) -> Float[Tensor, "n d_in"]:
        """Reconstruction x̂ = decode(encode(x)) (sparse path for TopK)."""
        self._check_input(x)
        xn, state = self.normalize_input(x)
        pre = self._pre(xn)
        if self.cfg.activation == "topk":
            return self.decode_sparse(*self._topk(pre), norm_state=state)
        return self.decode(ACTIVATIONS[self.cfg.activation](self, pre), norm_state=state)

    # ------------------------------------------------------------------ training
    def forward_train(
        self,
        x: Float[Tensor, "n d_in"],
        *,
        dead_mask: Tensor | None = None,
        aux_k: int = 0,
        l1_coefficient: float = 0.0,
        aux_coefficient: float = 0.0,
        centred_ss_fn: Callable[[Tensor], Tensor] | None = None,
        l0_target: float | None = None,
        l0_coefficient: float = 0.0,
        bandwidth: float = 0.05,
    ) -> TrainOutput:
        """Training objective for the variant.

        topk: loss = SSE/centred SS (FVU) + aux_coefficient · AuxK, where AuxK reconstructs the residual
              e = x − x̂ from the top-`aux_k` *dead* latents: ‖e − ê‖² / ‖e − ē‖², scaled by
              min(n_dead/aux_k, 1) (Gao et al. 2024). Unlike sparsify, which divides by the batch's Σ‖x − x̄‖²
              and adds b_dec to ê, the residual is normalised by its own centred sum of squares.
        batchtopk: codes = the k·n largest entries of relu(pre) over the whole batch (k per row on average,
              Bussmann et al. 2024); loss as topk (FVU + AuxK). `min_kept` is the smallest positive code kept,
              from which the trainer estimates the inference threshold.
        jumprelu: codes = pre·H(pre − θ) (`_JumpReLUFn`); loss = FVU + l0_coefficient·(L0/l0_target − 1)² with
              L0 = mean_rows Σ_i H(pre − θ_i) (`_StepFn`: straight-through for θ, rectangle kernel of width
              `bandwidth`); without l0_target the penalty is l0_coefficient·L0 (the paper's form).
        relu: loss = mean_rows ‖x − x̂‖² + l1_coefficient · mean_rows Σ_i codes_i·‖W_dec[i]‖ (the SAELens
              Standard objective, so coefficients transfer).
        centred_ss_fn(t) gives the centred sums of squares Σ‖t − t̄‖² used above (default: over this batch);
        under DDP the trainer passes the global batch's divided by the world size (saegeo.distributed), so the
        mean of the ranks' losses, which DDP's gradient averaging differentiates, is the global batch's loss.
        """
        if self.cfg.input_normalization != "none" or self.cfg.rescale_acts_by_decoder_norm:
            raise BadInputError("training supports input_normalization='none' without decoder-norm rescaling")
        centred_ss_fn = centred_ss_fn or (lambda t: (t - t.mean(dim=0)).pow(2).sum())
        centred_ss = centred_ss_fn(x)
        n = x.shape[0]
        act = self.cfg.activation
        aux, min_kept = x.new_zeros(()), None
        if act == "topk":
            # Dense pre-activations without autograd; gradients flow only through the k selected
            # (and AuxK) entries via _GatheredLinear, so the backward never forms a (n, d_sae) matrix.
            xc = x - self.b_dec if self.cfg.apply_b_dec_to_input else x
            with torch.no_grad():
                pre = torch.addmm(self.b_enc, xc, self.W_enc)
                if self.cfg.topk_order == "relu_then_topk":
                    # in place: the entries used below are relu'd again, and a latent at 0 adds nothing and gets
                    # no gradient either way; saves a (n × d_sae) copy per step
                    pre.relu_()
                indices = pre.topk(int(self.cfg.k), dim=-1, sorted=False).indices
            values = F.relu(_GatheredLinear.apply(xc, self.W_enc, self.b_enc, indices, pre.gather(1, indices)))
            x_hat = self.decode_sparse(values, indices)
            err = x - x_hat
            sse = err.pow(2).sum()
            loss = sse / centred_ss
            aux = self._auxk(err, pre, dead_mask, aux_k, aux_coefficient, centred_ss_fn,
                             lambda idx: _GatheredLinear.apply(xc, self.W_enc, self.b_enc, idx, pre.gather(1, idx)))
            loss = loss + aux_coefficient * aux
            active = values > 0
            fire_count = torch.zeros(self.cfg.d_sae, device=x.device, dtype=torch.float32)
            fire_count.index_add_(0, indices.flatten(), active.flatten().float())
            l0_sum = active.sum()
        elif act == "relu":
            x_hat, aux, fire_count = _ReLUStep.apply(x, self.W_enc, self.b_enc, self.W_dec, self.b_dec,
                                                     self.cfg.apply_b_dec_to_input)
            sse = (x - x_hat).pow(2).sum()
            loss = sse / n + l1_coefficient * aux
            l0_sum = fire_count.sum()
        else:
            # BatchTopK and JumpReLU: dense pre-activations without autograd, then the sparse set of entries
            # that carry a gradient (flat, sorted by row) through _GatheredLinear and a bagged decode.
            xc = x - self.b_dec if self.cfg.apply_b_dec_to_input else x
            d_sae = self.cfg.d_sae
            with torch.no_grad():
                pre = torch.addmm(self.b_enc, xc, self.W_enc)
                if act == "batchtopk":  # the k·n largest entries of relu(pre) over the batch
                    entries = _batch_topk_entries(pre.relu_(), min(int(self.cfg.k) * n, pre.numel()))
                else:  # active (pre > θ) or inside the threshold's window: every entry with a gradient
                    entries = ((pre > self.threshold) | (_window(pre, self.threshold, bandwidth) > 0)).view(-1).nonzero()[:, 0]
            if act == "jumprelu" and entries.numel() > pre.numel() // 8:  # far from sparse (thresholds too low)
                return self._jumprelu_dense_step(x, centred_ss, l0_target, l0_coefficient, bandwidth)
            rows, cols, offsets = _row_sorted_entries(entries, n, d_sae)
            gathered = _GatheredLinear.apply(xc, self.W_enc, self.b_enc, cols, pre[rows, cols], rows, offsets)
            if act == "batchtopk":
                values = F.relu(gathered)
                with torch.no_grad():
                    positive = values[values > 0]
                    min_kept = positive.min() if positive.numel() else values.new_zeros(())
            else:
                threshold = self.threshold[cols]  # one θ per entry: its gradient scatters back per latent
                values = _JumpReLUFn.apply(gathered, threshold, bandwidth)
            x_hat = self.decode_sparse(values, cols, offsets=offsets)
            err = x - x_hat
            sse = err.pow(2).sum()
            active = values.detach() > 0
            fire_count = torch.zeros(d_sae, device=x.device, dtype=torch.float32).index_add_(0, cols, active.float())
            l0_sum = active.sum()
            if act == "batchtopk":
                aux = self._auxk(err, pre, dead_mask, aux_k, aux_coefficient, centred_ss_fn,
                                 lambda idx: _GatheredLinear.apply(xc, self.W_enc, self.b_enc, idx, pre.gather(1, idx)))
                loss = sse / centred_ss + aux_coefficient * aux
            else:  # entries outside the set add H = 0 and no gradient: the L0 of the whole batch
                l0 = _StepFn.apply(gathered, threshold, bandwidth).sum() / n
                aux = (l0 / l0_target - 1).pow(2) if l0_target else l0
                loss = sse / centred_ss + l0_coefficient * aux
        return TrainOutput(loss, sse.detach(), centred_ss, l0_sum, aux.detach(), fire_count > 0, fire_count, min_kept)

    def _jumprelu_dense_step(self, x: Tensor, centred_ss: Tensor, l0_target: float | None, l0_coefficient: float,
                             bandwidth: float) -> TrainOutput:
        """JumpReLU's objective on dense (n, d_sae) tensors: cheaper than the sparse path when more than an
        eighth of the entries are active or near θ. (x − b_dec) W_enc + b_enc = x W_enc + (b_enc − b_dec W_enc):
        x needs no gradient, so the backward skips the (n × d_sae) @ (d_sae × d_in) product of ∂x."""
        bias = self.b_enc - self.b_dec @ self.W_enc if self.cfg.apply_b_dec_to_input else self.b_enc
        pre = torch.addmm(bias, x, self.W_enc)
        codes = _JumpReLUFn.apply(pre, self.threshold, bandwidth)
        sse = (x - torch.addmm(self.b_dec, codes, self.W_dec)).pow(2).sum()
        fire_count = torch.count_nonzero(codes.detach(), dim=0).to(torch.float32)
        l0 = _StepFn.apply(pre, self.threshold, bandwidth).sum() / x.shape[0]
        aux = (l0 / l0_target - 1).pow(2) if l0_target else l0
        loss = sse / centred_ss + l0_coefficient * aux
        return TrainOutput(loss, sse.detach(), centred_ss, fire_count.sum(), aux.detach(), fire_count > 0, fire_count)

    def _auxk(self, err: Tensor, pre: Tensor, dead_mask: Tensor | None, aux_k: int, aux_coefficient: float,
              centred_ss_fn: Callable[[Tensor], Tensor], gathered_pre: Callable[[Tensor], Tensor]) -> Tensor:
        """AuxK: ‖e − ê‖²/‖e − ē‖² · min(n_dead/aux_k, 1), ê from the top-aux_k dead latents of each row (pre is
        detached; `gathered_pre(idx)` gives those entries with their gradient). Zero without dead latents."""
        use_aux = dead_mask is not None and aux_k > 0 and aux_coefficient > 0
        if use_aux and dead_mask.device.type == "cpu":
            use_aux = bool(dead_mask.any())  # free on CPU; on GPU we avoid the sync and compute a zero
        if not use_aux:
            return err.new_zeros(())
        n_dead = dead_mask.sum()  # stays on device: no host sync per step
        k_aux = min(aux_k, self.cfg.d_sae)
        with torch.no_grad():
            if dead_mask.device.type == "cpu":  # the dead columns only (the mask is on the host: no sync)
                cols = dead_mask.nonzero().squeeze(1)
                aux_idx = cols[pre.index_select(1, cols).topk(min(k_aux, cols.numel()), dim=-1, sorted=False).indices]
            else:
                dead_pre = torch.where(dead_mask, pre, torch.full_like(pre, -torch.inf))
                aux_idx = dead_pre.topk(k_aux, dim=-1, sorted=False).indices
        aux_vals = F.relu(gathered_pre(aux_idx)) * dead_mask[aux_idx]  # rows with < k_aux dead latents: mask the rest
        e = err.detach()
        e_hat = F.embedding_bag(aux_idx, self.W_dec, per_sample_weights=aux_vals, mode="sum")
        aux = (e - e_hat).pow(2).sum() / centred_ss_fn(e)
        aux = aux * (n_dead.float() / k_aux).clamp(max=1.0)
        return torch.nan_to_num(aux, nan=0.0)

    # ------------------------------------------------------------------ unit-norm decoder
    @torch.no_grad()
    def remove_parallel_decoder_grad(self) -> None:
        """grad_i ← grad_i − (grad_i·w_i) w_i for each unit decoder row w_i (keeps the step tangent to the sphere)."""
        if self.W_dec.grad is None:
            return
        w = self.W_dec
        parallel = (self.W_dec.grad * w).sum(dim=1, keepdim=True)
        self.W_dec.grad.sub_(parallel * w)

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        """w_i ← w_i / ‖w_i‖ (rows of W_dec; zero rows left as they are)."""
        norms = self.W_dec.norm(dim=1, keepdim=True)
        self.W_dec.div_(torch.where(norms > 0, norms, torch.ones_like(norms)))

    @torch.no_grad()
    def fold_decoder_norms(self) -> None:
        """Make decoder rows unit norm without changing encode∘decode, for relu/jumprelu (positively
        homogeneous per latent): W_enc[:, i] ·= ‖w_i‖, b_enc[i] ·= ‖w_i‖, threshold[i] ·= ‖w_i‖, w_i /= ‖w_i‖.
        TopK/BatchTopK compare latents with each other, so rescaling would change which fire: refused."""
        if self.cfg.activation not in ("relu", "jumprelu"):
            raise FormatError(f"cannot fold decoder norms into a {self.cfg.activation} SAE without changing its codes")
        norms = self.W_dec.norm(dim=1)
        norms = torch.where(norms > 0, norms, torch.ones_like(norms))
        self.W_enc.mul_(norms)
        self.b_enc.mul_(norms)
        if self.cfg.activation == "jumprelu":
            self.threshold.mul_(norms)
        self.W_dec.div_(norms[:, None])
