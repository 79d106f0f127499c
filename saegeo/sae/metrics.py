"""SAEMetrics: the one streaming accumulator of an SAE's metrics on activations (held-out evaluation and
the report's SAE section both use it).

Per batch x (m, d), through the SAE (saegeo ``SAE`` or a SAELens-like object with encode/decode, W_dec, b_dec):
  * x' = normalize_input(x) when the SAE normalises its input (else x), codes a, reconstruction x̂ in the
    normalised space, then denormalised for the error;
  * Σ‖x − x̂‖² (float64) and, by Chan's parallel update of (n, μ, M₂), the centred sum of squares
    M₂ = Σ‖x − x̄‖²: each batch is centred on its own mean, so a large mean never cancels the spread
    (Σ‖x‖² − ‖Σx‖²/n does, losing digits when ‖μ‖ ≫ spread);
  * the codes with decoder norms folded in (a_i·‖W_dec,i‖: the weights of the unit rows u_i in x̂ − b_dec)
    into a ``CodeMomentAccumulator`` (L0, per-latent firing, E[a_i], the amplification law's moments);
  * ``UnitMean`` sums of x̂ − b_dec and x' − b_dec for their anisotropies A = (n‖m̂‖² − 1)/(n − 1);
  * for the amplification law's verdict: Σ‖x̂ − b_dec‖² (E‖Σ_i a_i u_i‖², the codes' own second moment, in
    the normalised space as the cone is) and the scatter Σ ŷŷᵀ of the unit vectors ŷ of x̂ − b_dec (d × d),
    which give the sampling sd of their A (``anisotropy_sampling_sd``).
Everything is a float64 sum: ``state_dict`` / ``from_state_dict`` / ``merge`` (so
``saegeo.distributed.merge_across_ranks`` works), and ``summary`` reads out the metrics.

Memory at published width: a batch is encoded ``encode_block_rows(d_sae)`` rows at a time, so the dense
(rows × d_sae) codes and their temporaries (pre-activations, masks, folded copies) stay within
ENCODE_BLOCK_BYTES whatever the batch; only each block's nonzero codes (COO) and its (rows × d) x̂ are kept, and the
batch's sums are taken over their concatenation in the order the whole batch gives (the COO is row-major either
way). What may differ is the encode's own float32 rounding: a GEMM's result for a row can depend on how many rows
it is given (by ≤ 2γ_d·Σ_j |x_j W_ji| per pre-activation, γ_d = d·2⁻²⁴/(1 − d·2⁻²⁴)), exactly as between two
batch sizes; on arithmetic that is exact (tests/test_check_width.py) every block size gives the same bits. The
encode must be row-wise -- each row's codes a function of that row alone -- as every inference encode is
(BatchTopK at inference is a fixed threshold).
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any, NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import UnitMean
from saegeo.geometry.amplification import CodeMomentAccumulator, coo_codes
from saegeo.geometry.dictionary import row_cosines, row_norms

ENCODE_BLOCK_BYTES = 256 * 2**20  # the dense codes of one encode block and their temporaries stay below this
# the most (rows × d_sae) arrays alive at once, in copies of the codes' element size: a JumpReLU encode holds pre,
# ReLU(pre), the mask [pre > θ] (¼) and their product (3¼); after it, the codes, their folded copy a_i·‖W_dec,i‖ and
# the top-k screen's two masks (2½); a dense TopK scatters into zeros_like(pre) beside pre and ReLU(pre) (3)
CODE_TEMPORARIES = 4
COO_ENTRY_BYTES = 8 + 8 + 4  # row, latent (int64) and value (float32) of one nonzero code
# the nonzero codes of a batch's blocks kept for one call of the code accumulator (its sums then run in the whole
# batch's order); codes so dense that a batch's pass this are added a part at a time (a JumpReLU batch of 8,192
# rows reaches it at L0 ≈ 1,600)
PENDING_CODES_BYTES = 256 * 2**20


@functools.cache
def glibc() -> Any:
    """The C library as ctypes sees it when it is glibc (malloc_trim, mallopt), else None (not Linux, or another
    C library): the trainer's and the encode blocks' heap settings both go through it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018  (glibc's, absent from musl and others)
        return libc
    except (OSError, AttributeError):
        return None


def release_free_heap() -> None:
    """Hand the C heap's free pages back to the kernel (glibc malloc_trim(0); a no-op elsewhere). Why: an encode
    block's mid-size temporaries (its (rows × d_sae) boolean masks are below glibc's 32 MiB mmap threshold) are carved
    from the heap between what the batch keeps (each block's nonzero codes and x̂), so every block leaves a hole the
    next cannot reuse: +18 MB per 256-row block at 65k latents, +0.6 GB over an 8,192-row batch. Trimming after each
    block keeps the heap flat for ~7 ms a block."""
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)


def encode_block_rows(d_sae: int, element_size: int = 4, budget_bytes: int | None = None) -> int:
    """Rows encoded at once so that the dense codes of a block and their temporaries fit ``budget_bytes``
    (default ENCODE_BLOCK_BYTES): max(1, ⌊budget / (CODE_TEMPORARIES · d_sae · element_size)⌋), element_size the
    bytes of the codes' dtype (at least float32's 4: the codes are folded in float32). 256 MiB gives 1,024 rows at
    16k latents, 256 at 65k, 64 at 262k."""
    budget = ENCODE_BLOCK_BYTES if budget_bytes is None else budget_bytes
    return max(1, budget // (CODE_TEMPORARIES * int(d_sae) * max(int(element_size), 4)))


class _COO(NamedTuple):
    """Nonzero codes of a batch (the shape CodeMomentAccumulator.add reads)."""

    n_rows: int
    rows: Int[Tensor, " nnz"]
    cols: Int[Tensor, " nnz"]
    values: Float[Tensor, " nnz"]


class SAEMetrics:
    """Mergeable float64 sums of one SAE on a stream of activation batches; see the module docstring.

    ``sae`` is needed to ``add`` batches and for the decoder read-outs of ``summary``; it is not part of
    the state (``from_state_dict(sd, sae=...)`` re-attaches it). ``mean_sq_norm`` (‖ū‖² of the unit
    decoder rows, from ``dictionary_geometry``) enables the law's mean-cosine moment.
    """

    def __init__(
        self,
        sae: Any,
        *,
        mean_sq_norm: float | None = None,
        device: str | torch.device | None = None,
        d_in: int | None = None,
        d_sae: int | None = None,
    ):
        self.sae = sae  # d_in / d_sae are only needed without one (from_state_dict)
        if sae is not None:
            d_sae, d_in = sae.W_dec.shape
        self.d_in, self.d_sae = int(d_in), int(d_sae)
        self.device = (
            torch.device(device)
            if device is not None
            else (sae.W_dec.device if sae is not None else torch.device("cpu"))
        )
        self.n = 0
        self.sse = 0.0  # Σ‖x − x̂‖²
        self.mean = torch.zeros(self.d_in, dtype=torch.float64)  # x̄
        self.centred_ss = 0.0  # M₂ = Σ‖x − x̄‖²
        self.codes = CodeMomentAccumulator(self.d_sae, mean_sq_norm=mean_sq_norm)
        self.recon_unit = UnitMean(self.d_in)  # Σ unit(x̂ − b_dec)
        self.input_unit = UnitMean(self.d_in)  # Σ unit(x' − b_dec)
        self.recon_sq_sum = 0.0  # Σ‖x̂ − b_dec‖²
        self.recon_unit_scatter = torch.zeros(self.d_in, self.d_in, dtype=torch.float64)  # Σ ŷŷᵀ, ŷ = unit(x̂ − b_dec)
        # accumulators of the same folded codes, fed every batch as observer.add(coo) (the report's
        # LatentCollector); not in the state
        self.code_observers: list[Any] = []
        if sae is not None:
            cfg = getattr(sae, "cfg", None)
            # codes of SAEs that rescale by the decoder norm already carry it
            self._rescaled = bool(getattr(cfg, "rescale_acts_by_decoder_norm", False))
            # saegeo TopK: encode_topk/decode_sparse give the same codes and x̂ without the dense code matrix
            self._sparse_topk = bool(getattr(getattr(sae, "architecture", None), "topk_codes", False)) and hasattr(
                sae, "decode_sparse"
            )
            self._fold = row_norms(sae.W_dec.detach()).to(self.device, torch.float32)
            self._b_dec = sae.b_dec.detach().to(self.device, torch.float32)

    # ------------------------------------------------------------------ streaming
    @property
    def encode_rows(self) -> int:
        """Rows per encode block (``encode_block_rows`` of this SAE's d_sae and code dtype)."""
        weights = getattr(self.sae, "W_enc", None)  # a peer SAE measured through its own encode may have none
        return encode_block_rows(self.d_sae, (weights if weights is not None else self.sae.W_dec).element_size())

    @torch.inference_mode()
    def add(self, x: Float[Tensor, "m d"]) -> SAEMetrics:
        """Stream one batch of activations through the SAE and add its sums (encoded ``encode_rows`` rows at a
        time; the sums over the whole batch)."""
        sae = self.sae
        if sae is None:
            raise BadInputError("SAEMetrics.add needs the SAE: SAEMetrics(sae) or from_state_dict(sd, sae=sae)")
        x = x.to(self.device, torch.float32)
        if x.shape[0] == 0:
            return self
        x_normalized, recon, recon_out = self._encode_batch(x)
        y = recon - self._b_dec
        self.recon_unit.add(y)
        norms = torch.linalg.vector_norm(y.double(), dim=1)
        self.recon_sq_sum += float(norms.square().sum())
        unit = y[norms > 0] / norms[norms > 0, None].to(y.dtype)
        self.recon_unit_scatter += (unit.T @ unit).to("cpu", torch.float64)  # float32 gram: an sd needs no more
        self.input_unit.add(x_normalized - self._b_dec)
        # in place on one float64 copy at a time (the same values and sums as x64 − x̂64 and x64 − x̄: a float32
        # operand is widened exactly): (rows × d) float64 temporaries are 151 MB each at 8,192 × 2,304
        error = x.double().sub_(recon_out)
        self.sse += float(error.square_().sum())
        del error
        x64 = x.double()
        batch_mean = x64.mean(dim=0)
        self._combine(x.shape[0], batch_mean.cpu(), float(x64.sub_(batch_mean).square_().sum()))
        return self

    def _encode_batch(self, x: Float[Tensor, "m d"]) -> tuple[Tensor, Tensor, Tensor]:
        """(x', x̂ in the normalised space, x̂ denormalised) of a batch, encoded ``encode_rows`` rows at a time.
        Each block's dense codes are screened by the code observers (their own block: the top-k and histogram are
        exact whatever the blocks) and kept as COO; the code accumulator gets the batch's concatenated COO (the
        whole batch's row-major order) once, or a part of it whenever the kept nonzeros pass PENDING_CODES_BYTES
        (codes nearly dense: its float sums are then over those parts, rounding differently)."""
        block = self.encode_rows
        normalized, recons, outs, pending = [], [], [], []
        group_start, n_pending = 0, 0  # the first row of the pending COO parts, their nonzeros
        unnormalized = True  # x' is x itself (no input normalisation): no copy of it is made
        for lo in range(0, x.shape[0], block):
            rows = x[lo : lo + block]
            x_normalized, norm_state, recon, codes = self._encode(rows)
            unnormalized &= x_normalized is rows
            dense = codes if isinstance(codes, Tensor) else None
            coo = _COO(*coo_codes(codes)) if dense is not None else codes
            for observer in self.code_observers:
                observer.add(coo)  # the COO, also of a dense block: the observers screen its nonzeros
            del dense, codes  # the block's (rows × d_sae) codes go before the next block's
            if x.shape[0] > block:  # only a batch of several blocks leaves heap holes between them
                release_free_heap()
            normalized.append(x_normalized)
            recons.append(recon)
            outs.append(recon if norm_state is None else self.sae.denormalize(recon, norm_state))
            pending.append(coo._replace(rows=coo.rows + (lo - group_start)))
            n_pending += coo.values.numel()
            if n_pending * COO_ENTRY_BYTES > PENDING_CODES_BYTES:
                self._add_codes(pending)
                pending, n_pending, group_start = [], 0, lo + coo.n_rows
        self._add_codes(pending)
        if len(recons) == 1:
            return normalized[0], recons[0], outs[0]
        recon = torch.cat(recons)
        out = recon if all(o is r for o, r in zip(outs, recons)) else torch.cat(outs)
        return (x if unnormalized else torch.cat(normalized)), recon, out

    def _add_codes(self, parts: list[_COO]) -> None:
        """Add the COO codes of consecutive row blocks (rows numbered from the first block's first row)."""
        if parts:
            self.codes.add(
                _COO(
                    sum(p.n_rows for p in parts),
                    torch.cat([p.rows for p in parts]),
                    torch.cat([p.cols for p in parts]),
                    torch.cat([p.values for p in parts]),
                )
            )

    def _encode(self, x: Float[Tensor, "m d"]) -> tuple[Tensor, Any, Tensor, Any]:
        """(x', the normalisation state, x̂ in the normalised space, the folded codes as COO or a dense matrix) of
        one block of rows."""
        sae = self.sae
        # SAEs with input normalisation (OpenAI LayerNorm, SAELens layer_norm / constant_norm_rescale) decode in
        # the normalised space: the cone is measured there, the error on the denormalised reconstruction.
        x_normalized, norm_state = sae.normalize_input(x) if hasattr(sae, "normalize_input") else (x, None)
        if self._sparse_topk:  # gather only the k active decoder rows: no (batch, d_sae) matrix at all
            values, indices = sae.encode_topk(x)
            recon = sae.decode_sparse(values, indices)
            folded = values if self._rescaled else values * self._fold[indices]
            rows = torch.arange(x.shape[0], device=x.device).repeat_interleave(indices.shape[1])
            return (
                x_normalized,
                norm_state,
                recon,
                _COO(x.shape[0], rows.cpu(), indices.flatten().cpu(), folded.flatten().float().cpu()),
            )
        codes = sae.encode(x)
        recon = sae.decode(codes)
        return x_normalized, norm_state, recon, (codes if self._rescaled else codes * self._fold).float().cpu()

    @torch.inference_mode()
    def sample_codes(self, x: Float[Tensor, "m d"], *, chunk: int | None = None) -> _COO:
        """The folded codes a_i·‖W_dec,i‖ of a few rows (e.g. the report's row sample) as COO, encoded ``chunk``
        rows at a time (default ``encode_rows``: no (m, d_sae) matrix beyond a block); nothing is added to the
        sums."""
        chunk = chunk or self.encode_rows
        parts = []
        for lo in range(0, x.shape[0], chunk):
            *_, coo = self._encode(x[lo : lo + chunk].to(self.device, torch.float32))
            _, rows, cols, values = coo_codes(coo)
            keep = values != 0
            parts.append((rows[keep] + lo, cols[keep], values[keep]))
        if not parts:
            return _COO(0, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0))
        rows, cols, values = (torch.cat(p) for p in zip(*parts))
        return _COO(int(x.shape[0]), rows, cols, values)

    def _combine(self, m: int, mean_b: Float[Tensor, " d"], centred_ss_b: float) -> None:
        """Chan et al.: M₂ = M₂ᵃ + M₂ᵇ + ‖δ‖²·nₐm/n, μ = μₐ + δ·m/n, δ = μ_b − μₐ."""
        if m == 0:
            return
        n = self.n + m
        delta = mean_b - self.mean
        self.centred_ss += centred_ss_b + float(delta.square().sum()) * self.n * m / n
        self.mean = self.mean + delta * (m / n)
        self.n = n

    # ------------------------------------------------------------------ combining
    def merge(self, other: SAEMetrics) -> SAEMetrics:
        """Fold ``other`` (the same SAE on other rows) into ``self``; returns ``self``."""
        if (other.d_in, other.d_sae) != (self.d_in, self.d_sae):
            raise BadInputError(
                f"cannot merge SAE metrics of {other.d_sae} × {other.d_in} into {self.d_sae} × {self.d_in}"
            )
        self._combine(other.n, other.mean, other.centred_ss)
        self.sse += other.sse
        self.codes.merge(other.codes)
        self.recon_unit.merge(other.recon_unit)
        self.input_unit.merge(other.input_unit)
        self.recon_sq_sum += other.recon_sq_sum
        self.recon_unit_scatter += other.recon_unit_scatter
        return self

    def state_dict(self) -> dict[str, Any]:
        return {
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            "n": self.n,
            "sse": self.sse,
            "mean": self.mean.clone(),
            "centred_ss": self.centred_ss,
            "codes": self.codes.state_dict(),
            "recon_unit": self.recon_unit.state_dict(),
            "input_unit": self.input_unit.state_dict(),
            "recon_sq_sum": self.recon_sq_sum,
            "recon_unit_scatter": self.recon_unit_scatter.clone(),
        }

    @classmethod
    def from_state_dict(
        cls, sd: dict[str, Any], sae: Any = None, device: str | torch.device | None = None
    ) -> SAEMetrics:
        out = cls(sae, device=device, d_in=sd["d_in"], d_sae=sd["d_sae"])
        out.n, out.sse, out.centred_ss = int(sd["n"]), float(sd["sse"]), float(sd["centred_ss"])
        out.mean = torch.as_tensor(sd["mean"]).to(torch.float64).clone()
        out.codes = CodeMomentAccumulator.from_state_dict(sd["codes"])
        out.recon_unit = UnitMean.from_state_dict(sd["recon_unit"])
        out.input_unit = UnitMean.from_state_dict(sd["input_unit"])
        out.recon_sq_sum = float(sd.get("recon_sq_sum", 0.0))
        if "recon_unit_scatter" in sd:
            out.recon_unit_scatter = torch.as_tensor(sd["recon_unit_scatter"]).to(torch.float64).clone()
        return out

    # ------------------------------------------------------------------ read-outs
    @property
    def mse(self) -> float:
        """Σ‖x − x̂‖²/(n·d)."""
        return self.sse / (self.n * self.d_in)

    @property
    def recon_second_moment(self) -> float | None:
        """E‖x̂ − b_dec‖² = E‖Σ_i a_i u_i‖² (None before any row)."""
        return self.recon_sq_sum / self.n if self.n else None

    @property
    def fve(self) -> float | None:
        """1 − Σ‖x − x̂‖²/Σ‖x − x̄‖² (None when the rows have no spread)."""
        return 1.0 - self.sse / self.centred_ss if self.centred_ss > 0 else None

    def decoder_mean_cosines(self, mean: Float[Tensor, " d"] | None = None) -> Float[Tensor, " d_sae"]:
        """cos(W_dec,i, μ) per latent (0 for a zero row or μ = 0); μ = the rows' mean unless given."""
        mu = self.mean if mean is None else mean
        return row_cosines(self.sae.W_dec.detach(), mu)

    def b_dec_against_mean(self, mean: Float[Tensor, " d"] | None = None) -> dict[str, float | None]:
        """‖b_dec‖, ‖μ‖, ‖b_dec − μ‖/‖μ‖ and cos(b_dec, μ) (None where a norm is 0)."""
        mu = (self.mean if mean is None else mean).to("cpu", torch.float64)
        b = self.sae.b_dec.detach().to("cpu", torch.float64)
        b_norm, mu_norm = float(b.norm()), float(mu.norm())
        return {
            "b_dec_norm": b_norm,
            "mean_norm": mu_norm,
            "b_dec_dist_to_mean": float((b - mu).norm()) / mu_norm if mu_norm > 0 else None,
            "b_dec_cos_mean": float(b @ mu) / (b_norm * mu_norm) if b_norm > 0 and mu_norm > 0 else None,
        }

    def summary(self, activation_mean: Float[Tensor, " d"] | None = None, *, dense_frequency: float = 0.5) -> dict:
        """The held-out metrics: tokens, mse, fve, l0 (mean active latents per row), dead_fraction (never
        fired), dense_fraction (fired on > dense_frequency of rows), max_abs_cos_mean = max_i |cos(W_dec,i, μ)|,
        n_latents_cos_mean_gt_0.5, b_dec_norm, mean_norm and b_dec_dist_to_mean = ‖b_dec − μ‖/‖μ‖, with μ =
        ``activation_mean`` (e.g. the training mean) or else the rows' own mean. {} when no row was added."""
        if self.n == 0:
            return {}
        cos = self.decoder_mean_cosines(activation_mean).abs()
        freq = self.codes.firing_frequency
        b_dec = self.b_dec_against_mean(activation_mean)
        return {
            "tokens": self.n,
            "mse": self.mse,
            "fve": self.fve,
            "l0": self.codes.K,
            "dead_fraction": float((freq == 0).double().mean()),
            "dense_fraction": float((freq > dense_frequency).double().mean()),
            "max_abs_cos_mean": float(cos.max()),
            "n_latents_cos_mean_gt_0.5": int((cos > 0.5).sum()),
            **{k: b_dec[k] for k in ("b_dec_norm", "mean_norm", "b_dec_dist_to_mean")},
        }
