"""One SAE encode/decode contract for trained and published dictionaries.

    x' = normalize(x)                      (identity, or OpenAI-style LayerNorm; inverted after decode)
    pre = (x' - b_dec·[apply_b_dec_to_input]) @ W_enc + b_enc   (· ‖W_dec[i]‖ if rescale_acts_by_decoder_norm)
    codes = architecture.encode(pre)       (relu | topk | jumprelu | batchtopk | gated: ≥ 0; abstopk: both signs)
    x_hat = denormalize(codes @ W_dec + b_dec)

Tensors: W_enc (d_in, d_sae), b_enc (d_sae), W_dec (d_sae, d_in), b_dec (d_in) -- the SAELens layout.
saegeo-trained SAEs keep unit-norm decoder rows; published ones need not. What a loader learned about
the files (format, source, how the inputs must be prepared) is ``SAE.format_info``, a ``FormatInfo``.
What differs between architectures (encode, training objective, thresholds, what is saved) lives in its
module under saegeo.sae.architectures; the SAE asks the registry, so a new architecture is one module.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from saegeo.errors import BadInputError
from saegeo.sae.architectures import Architecture, SAEConfig, TrainOutput, get_architecture
from saegeo.sae.formats import Dictionary, FormatInfo, object_dictionary, object_kinds, read_dictionary
from saegeo.sae.formats.saelens import write_sae_dir

__all__ = ["SAE", "SAEConfig", "FormatInfo", "TrainOutput"]


class SAE(nn.Module):
    """Sparse autoencoder with the SAELens tensor layout and a configurable encode (see module doc)."""

    def __init__(
        self, cfg: SAEConfig, *, device: str | torch.device = "cpu", format_info: FormatInfo | None = None
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.format_info = format_info if format_info is not None else FormatInfo()
        dtype = getattr(torch, cfg.dtype)
        kw = dict(device=device, dtype=dtype)
        self.W_enc = nn.Parameter(torch.zeros(cfg.d_in, cfg.d_sae, **kw))
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae, **kw))
        self.W_dec = nn.Parameter(torch.zeros(cfg.d_sae, cfg.d_in, **kw))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_in, **kw))
        # the architecture's own tensors (jumprelu: a per-latent threshold the trainer trains; batchtopk: a scalar
        # threshold estimated in training), zero until trained or read from a file
        for name, extra in self.architecture.extra_tensors.items():
            value = torch.zeros(extra.shape(cfg), **kw)
            if extra.trained:  # its gradient is turned on by the trainer (Architecture.param_groups)
                setattr(self, name, nn.Parameter(value, requires_grad=False))
            else:
                self.register_buffer(name, value)

    def extra_repr(self) -> str:
        """What ``repr(sae)`` shows inside ``SAE(...)``: its shapes, architecture and where it came from."""
        cfg, info = self.cfg, self.format_info
        parts = [f"d_in={cfg.d_in}", f"d_sae={cfg.d_sae}", f"activation={cfg.activation!r}"]
        parts += [f"k={cfg.k}"] if cfg.k else []
        parts += [f"dtype={cfg.dtype!r}", f"format={info.format!r}"]
        parts += [f"source={str(info.source)!r}"] if info.source else []
        return ", ".join(parts)

    def _repr_html_(self) -> str:
        # drawn by the renderers, imported on first display (importing the SAE never loads them)
        from saegeo.render.notebook import html_of

        return html_of(self)

    @property
    def architecture(self) -> Architecture:
        """The registered architecture of cfg.activation: its encode, training objective and saved form."""
        return get_architecture(self.cfg.activation)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike, provenance: dict | None = None) -> Path:
        """Write this SAE as a SAELens-compatible directory (cfg.json + sae_weights.safetensors) at `path` and
        return it; `provenance` (b_dec init, data identity, metrics, ...) goes under cfg.json's "saegeo" block.
        The two files are replaced as one, and non-finite weights are refused before anything is written
        (saegeo.sae.formats.saelens.write_sae_dir)."""
        return write_sae_dir(self, path, provenance)

    @classmethod
    def load(cls, source: Any, device: str = "cpu") -> SAE:
        """The one way to get an SAE, from anything that holds one:

          SAE                          itself
          str / PathLike               a directory `SAE.save` wrote, or a file or directory in any supported
                                       published format (detected), a hub id (org/repo[/subfolder]) or a SAELens
                                       release id (RELEASE/sae_id), read through the Hugging Face cache
          SAELens SAE, sparsify SparseCoder, dictionary_learning dictionary (in memory)
                                       read from its config and state dict exactly as from the files its library
                                       saves (saegeo.sae.formats.object_dictionary); format_info.source says
                                       "in memory: <class>"
          Dictionary                   a format reader's result (saegeo.sae.formats)

        ``format_info`` says what was read; anything else is a BadInputError naming what is accepted."""
        if isinstance(source, SAE):
            return source
        if isinstance(source, (str, os.PathLike)):
            return cls._build(read_dictionary(source), device)
        found = source if isinstance(source, Dictionary) else object_dictionary(source)
        if found is None:
            raise BadInputError(
                f"cannot use a {type(source).__name__} as an SAE; pass a path, an id or {object_kinds()}"
            )
        return cls._build(found, device)

    @classmethod
    def from_dictionary(cls, found: Dictionary, device: str = "cpu") -> SAE:
        """Deprecated: `SAE.load(found)` (kept for one release)."""
        warnings.warn("SAE.from_dictionary is deprecated; use SAE.load(dictionary)", DeprecationWarning, stacklevel=2)
        return cls._build(found, device)

    @classmethod
    def _build(cls, found: Dictionary, device: str) -> SAE:
        """Build the SAE of a reader's Dictionary (its tensors cast to cfg.dtype). A tensor already of cfg.dtype
        on `device` becomes the parameter as it is, not a copy: the weights of a memory-mapped file stay mapped
        (saegeo.sae.formats.weight_files.read_safetensors), so a 262k-latent dictionary is not held twice. The module
        is built on the meta device first (no memory); what the files do not hold is zero."""
        sae = cls(found.cfg, device="meta", format_info=found.info)
        with torch.no_grad():
            for name, value in found.tensors.items():
                target = getattr(sae, name)
                tensor = value.detach().reshape(target.shape).to(device=device, dtype=target.dtype)
                if isinstance(target, nn.Parameter):
                    setattr(sae, name, nn.Parameter(tensor, requires_grad=target.requires_grad))
                else:
                    sae.register_buffer(name, tensor)
            for holder in (sae._parameters, sae._buffers):  # what the files do not hold (a relu SAE's threshold)
                for key, left in list(holder.items()):
                    if left is not None and left.is_meta:
                        zeros = torch.zeros(left.shape, dtype=left.dtype, device=device)
                        holder[key] = nn.Parameter(zeros, left.requires_grad) if holder is sae._parameters else zeros
        return sae

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def init_weights(
        self, generator: torch.Generator | None = None, b_dec: Tensor | None = None, encoder_scale: float | None = None
    ) -> SAE:
        """Random unit-norm decoder rows, tied encoder W_enc = encoder_scale · W_decᵀ, b_enc = 0, b_dec as given
        (else 0). encoder_scale defaults to the architecture's `init_encoder_scale` (relu 0.1, see its module; 1
        otherwise: TopK picks the same latents at any scale).
        """
        if encoder_scale is None:
            encoder_scale = self.architecture.init_encoder_scale
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

    def centre(self, xn: Float[Tensor, "n d_in"]) -> Float[Tensor, "n d_in"]:
        """The encoder's input: xn − b_dec·[apply_b_dec_to_input] (xn already through `normalize_input`). Every
        encode and every architecture's training forward starts here."""
        return xn - self.b_dec if self.cfg.apply_b_dec_to_input else xn

    def _pre(self, xn: Tensor) -> Tensor:
        pre = torch.addmm(self.b_enc, self.centre(xn).to(self.W_enc.dtype), self.W_enc)
        if self.cfg.rescale_acts_by_decoder_norm:
            pre = pre * self.W_dec.norm(dim=-1)
        return pre

    def _codes_for_decode(self, codes: Tensor) -> Tensor:
        return codes / self.W_dec.norm(dim=-1) if self.cfg.rescale_acts_by_decoder_norm else codes

    def encode(self, x: Float[Tensor, "n d_in"]) -> Float[Tensor, "n d_sae"]:
        """codes = activation(pre), dense (n, d_sae): ≥ 0, or of both signs for abstopk."""
        self._check_input(x)
        return self.architecture.encode(self, self.pre_activations(x))

    def encode_topk(self, x: Float[Tensor, "n d_in"]) -> tuple[Float[Tensor, "n k"], Int[Tensor, "n k"]]:
        """TopK codes as (values ≥ 0, latent indices), each (n, k); the dense codes scatter these. Only for
        architectures with k codes per row (`self.architecture.topk_codes`)."""
        self._check_input(x)
        return self.architecture.encode_topk(self, self.pre_activations(x))

    def pre_activation_blocks(
        self,
        xn: Float[Tensor, "n d_in"],
        latent_block: int,
        after_block: Callable[[slice], None] | None = None,
    ) -> Iterator[tuple[slice, Float[Tensor, "n b"]]]:
        """The pre-activations of rows already through `normalize_input`, `latent_block` latents B at a time, each
        block formed when asked for: pre_B = (xn − b_dec·[apply_b_dec_to_input]) @ W_enc[:, B] + b_enc[B]
        (· ‖W_dec[B]‖ if rescale_acts_by_decoder_norm). after_block(B) runs once block B is used (a caller hands
        a mapped W_enc's pages back there)."""
        xn = self.centre(xn).to(self.W_enc.dtype)
        d_sae = self.cfg.d_sae
        for lo in range(0, d_sae, max(1, int(latent_block))):
            latents = slice(lo, min(d_sae, lo + max(1, int(latent_block))))
            try:
                pre = torch.addmm(self.b_enc[latents], xn, self.W_enc[:, latents])
                if self.cfg.rescale_acts_by_decoder_norm:
                    pre = pre * self.W_dec[latents].norm(dim=-1)
                yield latents, pre
            finally:
                if after_block is not None:
                    after_block(latents)

    def sparse_codes(
        self,
        xn: Float[Tensor, "n d_in"],
        *,
        latent_block: int | None = None,
        after_block: Callable[[slice], None] | None = None,
        max_entries: int | None = None,
    ) -> tuple[Int[Tensor, " nnz"], Int[Tensor, " nnz"], Float[Tensor, " nnz"]] | None:
        """The nonzero codes of rows already through `normalize_input`, as row-major COO (row, latent, value): the
        entries of `encode`'s dense codes in `Tensor.nonzero`'s order, formed `latent_block` latents at a time
        (`pre_activation_blocks`; default all at once), so no (n × d_sae) matrix exists beyond a block: latent-wise
        architectures keep each block's nonzeros, TopK merges each block's top-k into the row's
        (`Architecture.sparse_codes`). None once more than `max_entries` codes are found (latent-wise ones)."""
        self._check_input(xn)
        blocks = self.pre_activation_blocks(xn, latent_block or self.cfg.d_sae, after_block)
        try:
            return self.architecture.sparse_codes(self, blocks, max_entries)
        finally:
            blocks.close()  # an early return: the open block's after_block runs now

    # ------------------------------------------------------------------ decode
    def decode(self, codes: Float[Tensor, "n d_sae"], norm_state: tuple | None = None) -> Float[Tensor, "n d_in"]:
        """x̂ = denormalize(codes @ W_dec + b_dec)."""
        return self.denormalize(torch.addmm(self.b_dec, self._codes_for_decode(codes), self.W_dec), norm_state)

    def decode_sparse(
        self,
        values: Float[Tensor, "n k"],
        indices: Int[Tensor, "n k"],
        norm_state: tuple | None = None,
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

    def decode_coo(
        self,
        rows: Int[Tensor, " nnz"],
        cols: Int[Tensor, " nnz"],
        values: Float[Tensor, " nnz"],
        n_rows: int,
        norm_state: tuple | None = None,
    ) -> Float[Tensor, "n d_in"]:
        """x̂ of `n_rows` rows from their row-major COO codes (`sparse_codes`): row r sums its entries' values ·
        W_dec[latent] (`decode_sparse` with the rows' offsets), + b_dec; a row without codes is b_dec."""
        counts = torch.bincount(rows, minlength=n_rows)
        offsets = torch.zeros(n_rows, dtype=torch.long, device=cols.device)
        offsets[1:] = counts.cumsum(0)[:-1]
        return self.decode_sparse(values, cols, norm_state, offsets=offsets)

    def forward(self, x: Float[Tensor, "n d_in"]) -> Float[Tensor, "n d_in"]:
        """Reconstruction x̂ = decode(encode(x)) (sparse path for TopK)."""
        self._check_input(x)
        xn, state = self.normalize_input(x)
        return self.architecture.reconstruct(self, self._pre(xn), state)

    # ------------------------------------------------------------------ training
    def forward_train(
        self,
        x: Float[Tensor, "n d_in"],
        *,
        dead_mask: Tensor | None = None,
        centred_ss_fn: Callable[[Tensor], Tensor] | None = None,
        **options: Any,
    ) -> TrainOutput:
        """The architecture's training objective on one batch (see its module in saegeo.sae.architectures):
        loss, metrics and auxiliary terms. `options` are the architecture's (`step_options`: aux_k and
        aux_coefficient for topk/batchtopk, l1_coefficient for relu, l0_target, l0_coefficient and bandwidth for
        jumprelu); others are ignored. dead_mask: latents the trainer counts as dead (AuxK).

        centred_ss_fn(t) gives the centred sums of squares Σ‖t − t̄‖² the losses are normalised by (default:
        over this batch); under DDP the trainer passes the global batch's divided by the world size
        (saegeo.distributed), so the mean of the ranks' losses, which DDP's gradient averaging differentiates,
        is the global batch's loss.
        """
        if self.cfg.input_normalization != "none" or (
            self.cfg.rescale_acts_by_decoder_norm and not self.architecture.trains_rescaled
        ):
            raise BadInputError(
                "training supports input_normalization='none', and decoder-norm rescaling only for topk"
            )
        centred_ss_fn = centred_ss_fn or (lambda t: (t - t.mean(dim=0)).pow(2).sum())
        return self.architecture.forward_train(
            self, x, centred_ss=centred_ss_fn(x), centred_ss_fn=centred_ss_fn, dead_mask=dead_mask, **options
        )

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
        """Make decoder rows unit norm without changing encode∘decode: W_enc[:, i] ·= ‖w_i‖, b_enc[i] ·= ‖w_i‖,
        threshold[i] ·= ‖w_i‖, w_i /= ‖w_i‖ (the architecture's `scale_latents`). Exact for relu/jumprelu
        (positively homogeneous per latent) and for a topk SAE that chooses on pre·‖w_i‖
        (rescale_acts_by_decoder_norm, which the unit rows then make the identity: it is switched off); refused
        where the rescaling would change which latents fire."""
        norms = self.W_dec.norm(dim=1)
        norms = torch.where(norms > 0, norms, torch.ones_like(norms))
        self.architecture.scale_latents(self, norms)
        self.W_dec.div_(norms[:, None])
        self.cfg.rescale_acts_by_decoder_norm = False


def load_dictionary(path: str | os.PathLike, device: str = "cpu") -> SAE:
    """Deprecated: `SAE.load(path)` (kept for one release)."""
    warnings.warn("load_dictionary is deprecated; use saegeo.SAE.load(path)", DeprecationWarning, stacklevel=2)
    return SAE.load(path, device=device)


def as_sae(obj: Any, device: str = "cpu") -> SAE:
    """Deprecated: `SAE.load(obj)`, which takes everything this took (kept for one release)."""
    warnings.warn("as_sae is deprecated; use saegeo.SAE.load(obj)", DeprecationWarning, stacklevel=2)
    return SAE.load(obj, device=device)
