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

Memory at published width. A saegeo SAE's batch is encoded by blocks of latents (``SAE.sparse_codes``): the
(rows × block) pre-activations and their temporaries stay within ENCODE_BLOCK_BYTES (``encode_latent_block``: 1,024
latents for an 8,192-row batch), the block's nonzero codes are kept (TopK: each row's running top-k), and a
memory-mapped W_enc's pages are handed back after each block, so W_enc is never resident beside W_dec. The codes
are never dense: x̂ is decoded from them (``SAE.decode_coo``: only the active rows of W_dec) and the float64 sums
are taken SUM_ROWS rows at a time, so no (batch × d) float64 copy exists either. Rows go through in groups of the
whole batch (up to ``max_group_rows``); a group whose codes pass PENDING_CODES_BYTES (nearly dense codes) is
encoded again in smaller groups, its code sums then added group by group. Every sum runs in the same order
whatever the latent blocks: the COO is row-major as the dense codes' ``nonzero`` would be, and the SUM_ROWS chunks
lie on the same rows. What may differ is the encode's own float32 rounding: a GEMM's result can depend on how
many columns it is given (by ≤ 2γ_d·Σ_j |x_j W_ji| per pre-activation, γ_d = d·2⁻²⁴/(1 − d·2⁻²⁴)); on arithmetic
that is exact (tests/report/test_check_width.py) every block size gives the same bits. Any other SAE (a peer library's
object measured through its own encode and decode) is encoded ``encode_block_rows(d_sae)`` rows at a time, its
dense codes a block at a time. The encode must be row-wise -- each row's codes a function of that row alone -- as
every inference encode is (BatchTopK at inference is a fixed threshold).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from saegeo.errors import BadInputError
from saegeo.geometry.accumulate import UnitMean
from saegeo.geometry.amplification import CodeMomentAccumulator, coo_codes
from saegeo.geometry.dictionary import row_cosines, row_norms
from saegeo.runtime import release_free_heap
from saegeo.sae.formats.weight_files import read_sparsely, release_pages

ENCODE_BLOCK_BYTES = 128 * 2**20  # the dense pre-activations of one encode block and their temporaries stay below this
# the most (rows × block) arrays alive at once, in copies of the codes' element size: a JumpReLU block holds pre,
# ReLU(pre), the mask [pre > θ] (¼) and their product (3¼); a peer SAE's dense codes, their folded copy and the
# nonzero screen's masks (2½); a dense TopK scatters into zeros_like(pre) beside pre and ReLU(pre) (3)
CODE_TEMPORARIES = 4
COO_ENTRY_BYTES = 8 + 8 + 4  # row, latent (int64) and value (float32) of one nonzero code
# the nonzero codes of one group of rows: a group whose codes pass this is encoded again in smaller groups (a
# JumpReLU batch of 8,192 rows reaches it at L0 ≈ 1,600)
PENDING_CODES_BYTES = 256 * 2**20
SUM_ROWS = 1024  # rows whose x̂ and float64 error terms exist at once, after the encode (9 MB + 19 MB at d 2,304)
# the widest latent block: its W_enc columns (9 MB at d 2,304) and, up to 8,192 rows, its pre-activations; a GEMM this
# wide keeps its speed, and groups of rows are cut so that their blocks are this wide
LATENT_BLOCK = 1024


def encode_block_rows(d_sae: int, element_size: int = 4, budget_bytes: int | None = None) -> int:
    """Rows encoded at once, all latents together, so that the dense codes of a block and their temporaries fit
    ``budget_bytes`` (default ENCODE_BLOCK_BYTES): max(1, ⌊budget / (CODE_TEMPORARIES · d_sae · element_size)⌋),
    element_size the bytes of the codes' dtype (at least float32's 4: the codes are folded in float32). 128 MiB gives
    512 rows at 16k latents, 128 at 65k, 32 at 262k (an SAE encoded through its own dense encode)."""
    budget = ENCODE_BLOCK_BYTES if budget_bytes is None else budget_bytes
    return max(1, budget // (CODE_TEMPORARIES * int(d_sae) * max(int(element_size), 4)))


def encode_latent_block(rows: int, d_sae: int, element_size: int = 4) -> int:
    """Latents whose (rows × block) pre-activations are formed at once: at most LATENT_BLOCK, and fewer where
    ``encode_block_rows`` with rows and latents exchanged says so -- min(d_sae, LATENT_BLOCK, max(1,
    ⌊ENCODE_BLOCK_BYTES / (CODE_TEMPORARIES · rows · element_size)⌋)): 1,024 up to 8,192 rows."""
    return min(int(d_sae), LATENT_BLOCK, encode_block_rows(rows, element_size))


def max_group_rows(d_sae: int, element_size: int = 4) -> int:
    """The most rows encoded together by latent blocks: those whose blocks are still LATENT_BLOCK latents wide
    (8,192 rows), a multiple of SUM_ROWS; every latent block reads all of W_enc's rows, so the fewer groups, the
    fewer times a mapped W_enc is read."""
    rows = encode_block_rows(min(int(d_sae), LATENT_BLOCK), element_size)
    return max(SUM_ROWS, rows // SUM_ROWS * SUM_ROWS)


class _COO(NamedTuple):
    """Nonzero codes of a batch (the shape CodeMomentAccumulator.add reads)."""

    n_rows: int
    rows: Int[Tensor, " nnz"]
    cols: Int[Tensor, " nnz"]
    values: Float[Tensor, " nnz"]


@torch.inference_mode()
def reconstruct(sae: Any, x: Float[Tensor, "m d"]) -> Float[Tensor, "m d"]:
    """x̂ (denormalised, float32) of rows through the SAE, encoded as ``SAEMetrics.add`` encodes a batch: a saegeo SAE
    by latent blocks into sparse codes and decoded from them, so no (m × d_sae) matrix exists beyond a block."""
    metrics = SAEMetrics(sae)
    x = x.to(metrics.device, torch.float32)
    parts = [metrics._chunk(group, group.lo, group.hi)[2] for group in metrics._groups(x)]
    return torch.cat(parts) if parts else x.clone()


class _Group(NamedTuple):
    """One group of a batch's rows through the SAE (`SAEMetrics._encode_group`)."""

    lo: int  # its first and one-past-last rows in the batch
    hi: int
    x_normalized: Tensor  # x' of its rows
    norm_state: tuple | None  # what denormalize needs (per-row tensors)
    coo: _COO  # the folded codes a_i·‖W_dec,i‖, rows numbered from the group's first (CPU)
    codes: tuple[Tensor, Tensor, Tensor] | None  # the codes themselves, row-major COO on the device (saegeo SAE)
    recon: Tensor | None  # x̂ in the normalised space (a peer SAE's dense decode)


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
        # accumulators of the rows and their reconstructions, fed every chunk in row order as observer.add(x, x̂)
        # (x̂ denormalised, float32, on the device; the report's dark-matter sums); not in the state
        self.row_observers: list[Any] = []
        if sae is not None:
            cfg = getattr(sae, "cfg", None)
            # codes of SAEs that rescale by the decoder norm already carry it
            self._rescaled = bool(getattr(cfg, "rescale_acts_by_decoder_norm", False))
            # a saegeo SAE: codes by latent blocks (no dense code matrix) and x̂ from them; a peer's own encode/decode
            # otherwise, by blocks of rows
            self._latent_blocks = hasattr(sae, "sparse_codes") and hasattr(sae, "decode_coo")
            self._group_rows = max_group_rows(self.d_sae, self._element_size)  # lowered when codes come out dense
            if self._latent_blocks:
                read_sparsely(sae.W_enc)  # a mapped W_enc: only the pages of a block's columns become resident
            self._fold = row_norms(sae.W_dec.detach()).to(self.device, torch.float32)
            self._b_dec = sae.b_dec.detach().to(self.device, torch.float32)

    # ------------------------------------------------------------------ streaming
    @property
    def _element_size(self) -> int:
        weights = getattr(self.sae, "W_enc", None)  # a peer SAE measured through its own encode may have none
        return (weights if weights is not None else self.sae.W_dec).element_size()

    @property
    def encode_rows(self) -> int:
        """Rows per encode block of an SAE measured through its own dense encode (``encode_block_rows`` of its d_sae
        and code dtype); a saegeo SAE encodes groups of up to ``max_group_rows`` rows by latent blocks."""
        return encode_block_rows(self.d_sae, self._element_size)

    @torch.inference_mode()
    def add(self, x: Float[Tensor, "m d"]) -> SAEMetrics:
        """Stream one batch of activations through the SAE and add its sums (see the module docstring for the
        blocks it is encoded in; the sums are the whole batch's)."""
        if self.sae is None:
            raise BadInputError("SAEMetrics.add needs the SAE: SAEMetrics(sae) or from_state_dict(sd, sae=sae)")
        x = x.to(self.device, torch.float32)
        m = x.shape[0]
        if m == 0:
            return self
        # the batch's mean first: its centred sum of squares is taken about it, chunk by chunk below
        total = torch.zeros(self.d_in, dtype=torch.float64, device=x.device)
        for lo in range(0, m, SUM_ROWS):
            total += x[lo : lo + SUM_ROWS].double().sum(dim=0)
        batch_mean = total / m
        centred_ss = 0.0
        pending, pending_lo, n_pending = [], 0, 0  # groups' COO for the code accumulator (rows from pending_lo)
        pieces = []  # (x', x̂, x̂ denormalised) of the rows of the open SUM_ROWS chunk
        for group in self._groups(x):
            for observer in self.code_observers:
                observer.add(group.coo)  # each group's own rows, in order: the observers number them
            if not pending:
                pending_lo = group.lo
            pending.append(group.coo._replace(rows=group.coo.rows + (group.lo - pending_lo)))
            n_pending += group.coo.values.numel()
            # the sums over chunks of the batch's SUM_ROWS grid, whatever the groups (the same rows, the same rounding):
            # a chunk's rows are gathered from the groups it spans
            for a in range(group.lo, group.hi, SUM_ROWS):
                b = min(group.hi, a - a % SUM_ROWS + SUM_ROWS)
                pieces.append(self._chunk(group, a, b))
                if b % SUM_ROWS == 0 or b == m:
                    parts = [torch.cat(p) if len(pieces) > 1 else p[0] for p in zip(*pieces)]
                    centred_ss += self._add_rows(x[b - parts[0].shape[0] : b], batch_mean, *parts)
                    pieces = []
            if n_pending * COO_ENTRY_BYTES > PENDING_CODES_BYTES:
                self._add_codes(pending)
                pending, n_pending = [], 0
        self._add_codes(pending)
        self._combine(m, batch_mean.cpu(), centred_ss)
        return self

    def _add_rows(
        self, x: Float[Tensor, "c d"], batch_mean: Float[Tensor, " d"], x_normalized: Tensor, recon: Tensor, out: Tensor
    ) -> float:
        """The sums of one chunk of rows given its x', x̂ (normalised space) and x̂ denormalised; returns the chunk's
        Σ‖x − x̄_batch‖²."""
        y = recon - self._b_dec
        self.recon_unit.add(y)
        norms = torch.linalg.vector_norm(y.double(), dim=1)
        self.recon_sq_sum += float(norms.square().sum())
        unit = y[norms > 0] / norms[norms > 0, None].to(y.dtype)
        self.recon_unit_scatter += (unit.T @ unit).to("cpu", torch.float64)  # float32 gram: an sd needs no more
        self.input_unit.add(x_normalized - self._b_dec)
        for observer in self.row_observers:
            observer.add(x, out)
        # in place on one float64 copy (the same values as x64 − x̂64: a float32 operand is widened exactly)
        self.sse += float(x.double().sub_(out).square_().sum())
        return float(x.double().sub_(batch_mean).square_().sum())

    def _groups(self, x: Float[Tensor, "m d"]) -> Iterator[_Group]:
        """The batch's rows in groups, each encoded (`_encode_group`): a saegeo SAE's in groups of up to
        _group_rows rows (cut smaller, for this and later batches, when a group's codes pass PENDING_CODES_BYTES),
        any other SAE's ``encode_rows`` rows at a time."""
        m, lo = x.shape[0], 0
        while lo < m:
            rows = min(m - lo, self._group_rows if self._latent_blocks else self.encode_rows)
            group = self._encode_group(x[lo : lo + rows], lo, limit=rows > 1)
            if group is None:  # codes too dense for the group: a quarter of the rows, on a SUM_ROWS multiple if any
                rows = max(1, rows // 4)
                self._group_rows = rows // SUM_ROWS * SUM_ROWS or rows
                continue
            if x.shape[0] > rows:  # several groups leave heap holes between what each keeps
                release_free_heap()
            yield group
            lo += rows

    def _encode_group(self, x: Float[Tensor, "g d"], lo: int = 0, *, limit: bool = False) -> _Group | None:
        """One group of rows through the SAE: x', the normalisation state, the folded codes as COO and what gives
        x̂ (the codes, or a peer's dense decode). None when `limit` and its codes pass PENDING_CODES_BYTES."""
        sae = self.sae
        # SAEs with input normalisation (OpenAI LayerNorm, SAELens layer_norm / constant_norm_rescale) decode in
        # the normalised space: the cone is measured there, the error on the denormalised reconstruction.
        x_normalized, norm_state = sae.normalize_input(x) if hasattr(sae, "normalize_input") else (x, None)
        n = x.shape[0]
        if self._latent_blocks:
            found = sae.sparse_codes(
                x_normalized,
                latent_block=encode_latent_block(n, self.d_sae, self._element_size),
                after_block=self._release_encoder,
                max_entries=PENDING_CODES_BYTES // COO_ENTRY_BYTES if limit else None,
            )
            if found is None:
                return None
            rows, cols, values = found
            folded = values if self._rescaled else values * self._fold[cols]
            coo = _COO(n, rows.cpu(), cols.cpu(), folded.float().cpu())
            return _Group(lo, lo + n, x_normalized, norm_state, coo, found, None)
        codes = sae.encode(x)
        recon = sae.decode(codes)
        dense = (codes if self._rescaled else codes * self._fold).float().cpu()
        del codes
        return _Group(lo, lo + n, x_normalized, norm_state, _COO(*coo_codes(dense)), None, recon)

    def _release_encoder(self, latents: slice) -> None:
        """A memory-mapped W_enc's pages go back after each latent block (a no-op for weights in memory), and the C
        heap's free pages: each block's (rows × block) temporaries (≤ 32 MiB, from the heap) sit between the small
        nonzero parts the group keeps, and left a hole a block (+0.45 GB over one 8,192-row batch at 65k latents)."""
        release_pages(self.sae.W_enc[:, latents])
        release_free_heap()

    def _chunk(self, group: _Group, a: int, b: int) -> tuple[Tensor, Tensor, Tensor]:
        """(x', x̂ in the normalised space, x̂ denormalised) of the batch's rows a … b − 1, inside `group`."""
        i, j = a - group.lo, b - group.lo
        if group.codes is not None:  # decoded from the chunk's own entries (the COO is row-major)
            rows, cols, values = group.codes
            first, last = torch.searchsorted(rows, torch.tensor([i, j], device=rows.device)).tolist()
            recon = self.sae.decode_coo(rows[first:last] - i, cols[first:last], values[first:last], j - i)
        else:
            recon = group.recon[i:j]
        state = None if group.norm_state is None else tuple(t[i:j] for t in group.norm_state)
        out = recon if state is None else self.sae.denormalize(recon, state)
        return group.x_normalized[i:j], recon, out

    def _add_codes(self, parts: list[_COO]) -> None:
        """Add the COO codes of consecutive row groups (rows numbered from the first group's first row)."""
        if parts:
            self.codes.add(
                _COO(
                    sum(p.n_rows for p in parts),
                    torch.cat([p.rows for p in parts]),
                    torch.cat([p.cols for p in parts]),
                    torch.cat([p.values for p in parts]),
                )
            )

    @torch.inference_mode()
    def sample_codes(self, x: Float[Tensor, "m d"]) -> _COO:
        """The folded codes a_i·‖W_dec,i‖ of a few rows (e.g. the report's row sample) as COO, encoded as ``add``
        encodes a batch (no (m, d_sae) matrix beyond a block); nothing is added to the sums."""
        x = x.to(self.device, torch.float32)
        parts = []
        for group in self._groups(x):
            _, rows, cols, values = coo_codes(group.coo)
            keep = values != 0
            parts.append((rows[keep] + group.lo, cols[keep], values[keep]))
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
