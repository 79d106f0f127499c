"""`saegeo check`: should you trust a downloaded dictionary? Checks that need no activations.

From the weights alone (any format `SAE.load` reads):
  * A_dict = (N‖ū‖² − 1)/(N − 1) of the unit decoder rows and their own spectrum (erank, top-1, MP edges);
  * decoder-norm statistics and zero rows;
  * near-duplicate decoder rows, cos(w_i, w_j) > 0.99, found exactly and blockwise (no N × N matrix);
  * encoder–decoder alignment cos(W_enc[:, i], W_dec[i]);
  * b_dec against the dictionary's mean direction ū, and latents parallel to b_dec (or ū) -- the
    dictionary-only variant of the mean-direction flag (``saegeo.report.flags.dictionary_flags``);
  * configuration: input normalisation or scaling the files do not contain, folded scaling factors,
    whitening, transcoders, unset BatchTopK thresholds.
With activations (`--acts`), `saegeo check` first asks whether the SAE and the activations belong together
(``activations_match_flags``: hook and model names, scale, ‖b_dec − μ‖/‖μ‖, BOS / special rows the SAE excluded,
centred writing weights; one flag `activations_mismatch`), then adds these flags to the full `geometry_report`;
on a mismatch of severity error the report withholds FVE, the amplification law and cone shares (None, with a note).
Flags are ``saegeo.report.flags.Flag``; ``saegeo.render`` renders and writes a ``DictionaryCheck``.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from saegeo.activations.models import model_key, same_model, same_model_name
from saegeo.config import BATCH_ROWS
from saegeo.errors import BadInputError, FormatError
from saegeo.geometry.accumulate import as_rows
from saegeo.geometry.dictionary import (
    dictionary_geometry,
    encoder_decoder_cosines,
    near_duplicate_pairs,
    nearest_neighbour_summary,
    summary_stats,
    whitening_alignment,
)
from saegeo.io import dump_json, json_safe
from saegeo.progress import progress_bar
from saegeo.report.display import flag_counts, flags_frame, notebook_html, short
from saegeo.report.flags import (
    ACTIVATIONS_MISMATCH,
    WHITENING,
    Flag,
    FlagThresholds,
    config_flags,
    dictionary_flags,
    rounded,
    sort_flags,
)
from saegeo.report.options import CheckOptions, MatchOptions
from saegeo.sae.formats.weight_files import release_pages
from saegeo.sae.metrics import encode_block_rows, reconstruct
from saegeo.sae.model import SAE

CHECK_SCHEMA_VERSION = 1

# flag names of the dictionary-only checks (the mean-direction one is saegeo.report.flags.MEAN_DIRECTION)
ZERO_ROWS = "zero_decoder_rows"
DUPLICATES = "duplicate_decoder_rows"
MISALIGNED = "encoder_decoder_misalignment"
INPUT_SCALING = "input_scaling_outside_files"
INPUT_NORMALIZATION = "input_normalization"
FOLDED_SCALING = "scaling_factor_folded"
ZERO_B_DEC = "b_dec_zero"
TRANSCODER = "transcoder"
UNSET_THRESHOLD = "batchtopk_threshold_unset"
THRESHOLD_NOT_APPLIED = "threshold_not_applied"
RECORDED_CONTRADICTED = "recorded_metrics_contradicted"
THRESHOLD_L0_FACTOR = 3.0  # L0 on the rows above this × the recorded L0 / k: the threshold is not what training used
# |recorded explained variance − FVE on the rows| above this: contradicted. FVE of one SAE on three 4,096-row sets of
# its own store spreads up to 0.065 (docs/design.md, benchmarks/recorded_metrics_table.py), so less is no evidence
RECORDED_FVE_TOLERANCE = 0.07
ABOUT_ZERO_MATCH = 0.01  # recorded within this of 1 − Σ‖x − x̂‖²/Σ‖x‖² (and not of FVE): measured about zero
DEAD_CONTRADICTED_SHARE = 0.5  # at least this share of latents never fire on the rows, where training recorded
DEAD_RECORDED_SHARE = 0.1  # ... at most this share dead: contradicted
FOLDED_WHITENING_GAIN = 0.2  # median cos(e, G⁻¹w) above median cos(e, w) by more than this: a folded whitening
FOLDED_WHITENING_MIN_COS = 0.5  # ... and itself at least this (encoder and "whitened" decoder plainly aligned)
DICTIONARY_FLAGS = (
    WHITENING,  # only the folded kind: a config that whitens is the report's own config flag
    ZERO_ROWS,
    DUPLICATES,
    MISALIGNED,
    INPUT_SCALING,
    INPUT_NORMALIZATION,
    FOLDED_SCALING,
    ZERO_B_DEC,
    TRANSCODER,
    UNSET_THRESHOLD,
)


@dataclass
class DictionaryCheck:
    """What `check_dictionary` measured; ``to_json`` is schema-versioned."""

    schema_version: int
    source: dict[str, Any]  # path, format, d_in, d_sae, activation, k, model, hook, ...
    a_dict: float  # mean pairwise cosine of the unit decoder rows
    dict_mean_sq_norm: float  # ‖ū‖²
    dictionary_spectrum: dict[str, Any]  # eigenvalues, erank, top-1, IsoScore, MP edges of the u_i
    decoder_norms: dict[str, float]  # min, median, mean, max, std, cv of ‖W_dec,i‖
    n_zero_decoder_rows: int
    zero_rows: list[int]
    n_duplicate_pairs: int
    duplicate_pairs: list[list[float]]  # [i, j, cos], most similar first (at most max_pairs_listed)
    encoder_decoder_cos: dict[str, float]  # min, median, mean, max, n_below
    b_dec: dict[str, float | None]  # norm, cos with ū, norm relative to the median decoder norm
    config: dict[str, Any]
    flags: list[Flag]
    options: dict[str, Any]
    seconds: float
    notes: list[str] = field(default_factory=list)
    # max_{j≠i} cos(w_i, w_j) over latents: exact or sampled with its error (nearest_neighbour_summary)
    nearest_neighbour_cos: dict[str, Any] | None = None

    def flag_names(self) -> list[str]:
        return [f.name for f in self.flags]

    def __repr__(self) -> str:
        s, sp = self.source, self.dictionary_spectrum
        return (
            f"<DictionaryCheck {s.get('name')!r}: {s.get('format')}, {s.get('d_sae', 0):,} latents × d={s.get('d_in')} · "
            f"A_dict {short(self.a_dict, 4)} · erank {short(sp.get('effective_rank'), 1)} · "
            f"{self.n_duplicate_pairs} duplicate pair(s) · {self.n_zero_decoder_rows} zero row(s) · "
            f"flags: {flag_counts(self.flags)}>"
        )

    def _repr_html_(self) -> str:
        return notebook_html(self)

    def flags_frame(self) -> Any:
        """The flags as a DataFrame (one row per flag, its evidence as columns)."""
        return flags_frame(self.flags)

    def flag(self, name: str) -> Flag:
        for f in self.flags:
            if f.name == name:
                return f
        raise KeyError(f"no flag {name!r}; flags: {self.flag_names()}")

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["flags"] = [f.to_dict() for f in self.flags]
        return json_safe(out)

    def to_json(self, path: str | os.PathLike | None = None, *, indent: int | None = 1) -> str:
        return dump_json(self.to_dict(), path, indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DictionaryCheck:
        d = dict(d)
        if d.get("schema_version") != CHECK_SCHEMA_VERSION:
            raise FormatError(
                f"check schema_version {d.get('schema_version')!r} is not {CHECK_SCHEMA_VERSION}; rerun saegeo check"
            )
        d["flags"] = [Flag.from_dict(f) for f in d.get("flags", [])]
        return cls(**{k: v for k, v in d.items() if k in {f.name for f in fields(cls)}})


# =========================================================================== measurements
def check_dictionary(sae: Any, *, options: CheckOptions | None = None, name: str | None = None) -> DictionaryCheck:
    """All dictionary-only checks of an SAE (anything `SAE.load` takes; see the module docstring).
    Memory: W_dec, blocks of W_enc (a memory-mapped W_enc, as `SAE.load` gives for safetensors files, is handed
    back chunk by chunk), the duplicate screen's N·(screen_dim + 2) floats, and O(block_rows² + d²) -- never a
    d_sae × d_sae matrix, nor a copy of a weight matrix (benchmarks/check_bench.py measures it at 16k-262k)."""
    opts = options or CheckOptions()
    t0 = time.perf_counter()
    sae = SAE.load(sae)  # a path, an id or a peer library's SAE object: the one conversion
    info = sae.format_info
    subject = name or Path(str(info.source or "dictionary")).name or "dictionary"
    W_dec, W_enc = sae.W_dec.detach().cpu(), sae.W_enc.detach().cpu()
    b_dec = sae.b_dec.detach().cpu().to(torch.float64)
    n_lat, d = W_dec.shape
    if n_lat < 2:
        raise BadInputError(f"{subject}: a dictionary needs at least 2 decoder rows, found {n_lat}")
    bar = None
    if opts.progress:
        bar = progress_bar(total=n_lat, unit="row", unit_scale=True, desc="duplicates", dynamic_ncols=True)

    # float32 gram: fast enough for 65,536 × 2,304 rows on a laptop; the spectrum to float32 rounding
    geom = dictionary_geometry(
        W_dec, zero_rel_norm=opts.zero_row_rel_norm, block_rows=opts.block_rows, gram_dtype=torch.float32
    )
    zero, median = geom.zero, geom.norm_stats["median"]
    zero_rows = zero.nonzero().flatten().tolist()
    alive_norms = geom.direction_norms  # "zero" rows drop out of every direction statistic
    a_dict, mean_sq_norm, mean_dir, spectrum = geom.a_dict, geom.mean_sq_norm, geom.mean_direction, geom.spectrum

    pairs, pair_cos, n_pairs = near_duplicate_pairs(
        W_dec,
        opts.duplicate_cos,
        norms=alive_norms,
        block_rows=opts.block_rows,
        max_pairs=max(opts.max_pairs_listed, opts.thresholds.max_latents),
        progress=(lambda done: bar.update(done - bar.n)) if bar is not None else None,
        device=opts.device,
    )
    nearest = nearest_neighbour_summary(
        W_dec,
        norms=alive_norms,
        exact_max_rows=opts.nearest_exact_rows,
        sample=opts.nearest_sample,
        block_rows=opts.block_rows,
        device=opts.device,
    )
    if bar is not None:
        bar.close()
    # a mapped W_enc's pages go back after each chunk of its rows: W_enc and W_dec are never both resident
    enc_dec = encoder_decoder_cosines(
        W_enc, W_dec, block_rows=opts.block_rows, after_block=lambda r, r_end: release_pages(W_enc[r:r_end])
    )
    enc_dec_alive = enc_dec[~zero]
    whitening = whitening_alignment(  # a whitening folded into the weights; W_enc's pages handed back again
        W_enc, W_dec, block_rows=opts.block_rows, after_block=lambda r, r_end: release_pages(W_enc[r:r_end])
    )

    b_norm = float(b_dec.norm())
    b_info = {
        "norm": b_norm,
        "cos_mean_direction": float(b_dec @ mean_dir) / (b_norm * float(mean_dir.norm()))
        if b_norm > 0 and float(mean_dir.norm()) > 0
        else None,
        "norm_over_median_decoder_norm": b_norm / median if median > 0 else None,
        "mean_direction_norm": float(mean_dir.norm()),
    }
    cfg = sae.cfg
    source = {
        "path": info.source,
        "format": info.format,
        "name": subject,
        "d_in": int(d),
        "d_sae": int(n_lat),
        "activation": cfg.activation,
        "k": cfg.k,
        "apply_b_dec_to_input": cfg.apply_b_dec_to_input,
        "input_normalization": cfg.input_normalization,
        "model": info.model_name,
        "hook": info.hook_name,
        "source_dtype": info.source_dtype,
    }
    check = DictionaryCheck(
        schema_version=CHECK_SCHEMA_VERSION,
        source=source,
        a_dict=a_dict,
        dict_mean_sq_norm=mean_sq_norm,
        dictionary_spectrum=spectrum,
        decoder_norms=geom.norm_stats,
        n_zero_decoder_rows=len(zero_rows),
        zero_rows=zero_rows[:1000],
        n_duplicate_pairs=n_pairs,
        duplicate_pairs=[
            [int(i), int(j), float(c)] for (i, j), c in zip(pairs.tolist()[: opts.max_pairs_listed], pair_cos.tolist())
        ],
        encoder_decoder_cos={
            **{k: v for k, v in summary_stats(enc_dec_alive).items() if k != "cv"},
            "n_below": int((enc_dec_alive < opts.misaligned_cos).sum()),
        },
        b_dec=b_info,
        config=info.to_dict(),
        flags=[],
        options=json_safe(opts.to_dict()),
        seconds=0.0,
        nearest_neighbour_cos=nearest,
    )
    if zero_rows:
        check.notes.append(
            f"{len(zero_rows)} zero decoder row(s) excluded from A_dict, the spectrum and the duplicate search"
        )
    check.flags = sort_flags(
        _dictionary_only_flags(check, pairs, pair_cos, enc_dec, zero, opts, subject)
        + dictionary_flags(
            W_dec, b_dec, thresholds=opts.thresholds, subject=subject, norms=alive_norms, block_rows=opts.block_rows
        )
        + config_check_flags(sae, subject=subject, thresholds=opts.thresholds)
        + folded_whitening_flags(whitening, info.normalize_activations, subject=subject)
    )
    check.seconds = time.perf_counter() - t0
    return check


# =========================================================================== flags
def _dictionary_only_flags(
    check: DictionaryCheck, pairs, pair_cos, enc_dec, zero, opts: CheckOptions, subject: str
) -> list[Flag]:
    flags: list[Flag] = []
    n_lat = check.source["d_sae"]
    max_latents = opts.thresholds.max_latents
    if check.n_zero_decoder_rows:
        flags.append(
            Flag(
                ZERO_ROWS,
                "warning",
                {
                    "n_zero_rows": check.n_zero_decoder_rows,
                    "d_sae": n_lat,
                    "fraction": rounded(check.n_zero_decoder_rows / n_lat),
                    "median_decoder_norm": rounded(check.decoder_norms["median"]),
                },
                "Zero decoder rows are dead latents that write nothing: drop them before counting features or "
                "computing dictionary statistics.",
                summary=f"{check.n_zero_decoder_rows} of {n_lat} decoder rows are zero",
                latents=check.zero_rows[:max_latents],
                subject=subject,
            )
        )
    if check.n_duplicate_pairs:
        involved: list[int] = []
        for i, j in pairs.tolist():
            involved += [x for x in (i, j) if x not in involved]
        n_involved = len(set(pairs.flatten().tolist()))
        top = check.duplicate_pairs[:3]
        flags.append(
            Flag(
                DUPLICATES,
                "error" if n_involved / n_lat > opts.duplicate_error_fraction else "warning",
                {
                    "n_pairs": check.n_duplicate_pairs,
                    "n_latents_listed": n_involved,
                    "max_cos": rounded(float(pair_cos[0]), 6),
                    "threshold": opts.duplicate_cos,
                    "d_sae": n_lat,
                },
                "Near-duplicate latents split one feature between them (and their codes): merge or drop one of each "
                "pair before interpreting or counting features.",
                summary=(
                    f"{check.n_duplicate_pairs} pair(s) of decoder rows with cos > {opts.duplicate_cos:g}: "
                    + ", ".join(f"{i}–{j} ({c:.4f})" for i, j, c in top)
                    + (" …" if check.n_duplicate_pairs > 3 else "")
                ),
                latents=involved[:max_latents],
                subject=subject,
            )
        )
    below = ((enc_dec < opts.misaligned_cos) & ~zero).nonzero().flatten()
    if below.numel():
        order = below[enc_dec[below].argsort()].tolist()
        frac = len(order) / n_lat
        flags.append(
            Flag(
                MISALIGNED,
                "warning" if frac > opts.misaligned_warn_fraction else "info",
                {
                    "n_latents": len(order),
                    "fraction": rounded(frac),
                    "min_cos": rounded(float(enc_dec[order[0]])),
                    "median_cos": rounded(check.encoder_decoder_cos["median"]),
                    "threshold": opts.misaligned_cos,
                },
                "A latent whose encoder reads against the direction its decoder writes is usually dead or broken: "
                "check its firing on activations (saegeo check --acts) before trusting it.",
                summary=f"{len(order)} latent(s) with cos(encoder column, decoder row) < {opts.misaligned_cos:g}",
                latents=order[:max_latents],
                subject=subject,
            )
        )
    if check.b_dec["norm"] == 0:
        flags.append(
            Flag(
                ZERO_B_DEC,
                "info",
                {"b_dec_norm": 0.0, "mean_direction_norm": rounded(check.b_dec["mean_direction_norm"])},
                "b_dec is exactly zero (trained without centring, or never updated): any activation offset must be "
                "carried by latents -- run saegeo check --acts to see whether some do.",
                summary="b_dec is zero",
                subject=subject,
            )
        )
    return flags


def folded_whitening_flags(alignment: Mapping[str, Any] | None, normalize: str | None, *, subject: str) -> list[Flag]:
    """whitening_misuse (folded): the encoder columns match G⁻¹ × the decoder rows (`whitening_alignment`) by
    FOLDED_WHITENING_GAIN more than the rows themselves, and at least FOLDED_WHITENING_MIN_COS: the SAE was trained
    on whitened rows and the whitening is folded into its weights (SAELens' fold_activation_whitening sets
    normalize_activations to "none", so no config says so). An SAE whose config still whitens gets the config flag."""
    if alignment is None or normalize == "covariance_whitening":
        return []
    raw, white = alignment["median_cos"], alignment["median_cos_whitened"]
    if not (white - raw > FOLDED_WHITENING_GAIN and white >= FOLDED_WHITENING_MIN_COS):
        return []
    return [
        Flag(
            WHITENING,
            "warning",
            {
                "folded": True,
                "median_cos": rounded(raw),
                "median_cos_whitened": rounded(white),
                "latents": alignment["latents"],
            },
            "This SAE was trained on whitened activations and the whitening is folded into its weights: feed it raw "
            "activations, never whitened ones; its decoder rows carry the data's covariance, so A_dict, the "
            "dictionary spectrum and the decoder norms describe Σ as much as the features.",
            summary=f"the weights carry a folded covariance whitening: the encoder columns match Σ⁻¹ × the decoder "
            f"rows (median cos {white:.2f}), not the rows themselves ({raw:.2f})",
            subject=subject,
        )
    ]


def config_check_flags(
    sae: SAE, *, subject: str = "dictionary", thresholds: FlagThresholds | None = None
) -> list[Flag]:
    """Flags on how the dictionary expects its inputs, from the loaded config (``sae.cfg`` and ``sae.format_info``)."""
    cfg, info = sae.cfg, sae.format_info
    flags: list[Flag] = []
    norm = info.normalize_activations
    if norm == "expected_average_only_in":
        flags.append(
            Flag(
                INPUT_SCALING,
                "warning",
                {"normalize_activations": None},
                "This SAE expects inputs multiplied by a constant (√d / E‖x‖ of its training data) that is not in "
                "these files: rescale the activations the same way, or every code and threshold is off by that factor.",
                summary="normalize_activations = expected_average_only_in: inputs must be rescaled by a factor the files do not hold",
                subject=subject,
            )
        )
    if cfg.input_normalization != "none":
        flags.append(
            Flag(
                INPUT_NORMALIZATION,
                "info",
                {"layer_norm_eps": cfg.layer_norm_eps if cfg.input_normalization == "layer_norm" else None},
                "Each input row is normalised before encoding and the reconstruction is mapped back: compare codes "
                "across tokens with that in mind, and feed raw (not pre-normalised) activations.",
                summary=f"the SAE normalises every input row ({cfg.input_normalization}) and undoes it after decoding",
                subject=subject,
            )
        )
    folded = info.folded_scaling_factor
    if folded:
        flags.append(
            Flag(
                FOLDED_SCALING,
                "info",
                {"scaling_min": rounded(folded.get("min")), "scaling_max": rounded(folded.get("max"))},
                "A per-latent finetuning scaling factor was folded into the decoder rows (decode is unchanged); "
                "decoder norms therefore include it.",
                summary="finetuning scaling factor folded into W_dec",
                subject=subject,
            )
        )
    if info.transcoder:
        flags.append(
            Flag(
                TRANSCODER,
                "info",
                {},
                "A transcoder reconstructs a different activation than it reads: b_dec and the decoder live in the "
                "output space, so compare them with the output activations, not the inputs.",
                summary="this is a transcoder (no b_dec subtraction before encoding)",
                subject=subject,
            )
        )
    if info.threshold_unset:
        flags.append(
            Flag(
                UNSET_THRESHOLD,
                "warning",
                {"threshold": rounded(info.threshold)},
                "The BatchTopK inference threshold was never set in training (-1): every positive pre-activation "
                "passes, so codes are dense; set the threshold from training statistics before use.",
                summary="BatchTopK threshold is -1 (unset): inference codes are dense ReLU codes",
                subject=subject,
            )
        )
    flags += config_flags({"normalize_activations": norm} if norm else None, thresholds=thresholds, subject=subject)
    return flags


# =========================================================================== with activations
def sae_verdict(
    sae: Any, acts: Any, *, options: CheckOptions | None = None, name: str | None = None
) -> tuple[list[Flag], list[str], DictionaryCheck]:
    """The one verdict on an SAE read on these activations, which `saegeo check --acts`, `report --sae` and
    `latents` all take: the dictionary-only flags of `check_dictionary` (duplicate and zero decoder rows,
    encoder-decoder alignment, how the SAE expects its inputs) and `activations_match_flags` (do the SAE and the
    rows belong together). Returns (flags, notes, the DictionaryCheck); an `activations_mismatch` error among the
    flags makes `geometry_report` withhold the SAE's WITHHELD_METRICS."""
    opts = options or CheckOptions()
    sae = SAE.load(sae)
    dcheck = check_dictionary(sae, options=opts, name=name)
    notes: list[str] = []
    match = replace(opts.match, assume_same_model=opts.assume_same_model or opts.match.assume_same_model)
    measured: dict[str, Any] = {}
    subject = dcheck.source["name"]
    mismatch = activations_match_flags(sae, acts, subject=subject, options=match, notes=notes, measured=measured)
    # the activation-based mean-direction flag supersedes the dictionary-only guess; keep the rest
    dictionary_only = [f for f in dcheck.flags if f.name in DICTIONARY_FLAGS]
    refused = any(f.severity == "error" for f in mismatch)
    recorded = (
        []
        if refused or "sample" not in measured
        else recorded_metrics_flags(sae, measured, subject=subject, notes=notes)
    )
    return dictionary_only + mismatch + recorded, notes, dcheck


def sae_verdicts(
    saes: Mapping[str, Any],
    acts: Any,
    *,
    stream: Mapping[str, Any] | None = None,
    thresholds: FlagThresholds | None = None,
) -> tuple[list[Flag], list[str], list[DictionaryCheck]]:
    """`sae_verdict` for each named SAE on the same rows, flags and notes concatenated (and each SAE's
    DictionaryCheck): what `report --sae` and `saegeo run` hand to `geometry_report` so that a report withholds
    what `check --acts` would. ``stream``: the report's stream options (`StreamOptions.stream()`: verify,
    skip_nonfinite, ...), so both read the rows alike; ``thresholds``: the report's, so one set reaches every flag."""
    opts = CheckOptions(**{**(stream or {}), "progress": False}, thresholds=thresholds or FlagThresholds())
    flags: list[Flag] = []
    notes: list[str] = []
    checks: list[DictionaryCheck] = []
    for name, sae in saes.items():
        found, said, dcheck = sae_verdict(sae, acts, options=opts, name=name)
        flags, notes, checks = flags + found, notes + said, [*checks, dcheck]
    return flags, notes, checks


def recorded_metrics_flags(
    sae: SAE, measured: Mapping[str, Any], *, subject: str, notes: list[str] | None = None
) -> list[Flag]:
    """What the SAE's training recorded about itself (FormatInfo.recorded_metrics: SAELens metadata l0,
    num_dead_features and explained_variance, a BatchTopK's training k) against the same rows
    `activations_match_flags` read (a note in ``notes`` gives the recorded and measured dead counts):
      threshold_not_applied     a thresholded SAE (JumpReLU; BatchTopK / Matryoshka saved as one) whose L0 on the rows
                                is above THRESHOLD_L0_FACTOR × the recorded L0 (else the training k): its threshold is missing,
                                zero or not applied (error; SAELens issue 608)
      recorded_metrics_contradicted  L0 above that factor for any other SAE; a recorded explained variance more than
                                RECORDED_FVE_TOLERANCE from FVE = 1 − Σ‖x − x̂‖²/Σ‖x − x̄‖² on the rows, or within
                                ABOUT_ZERO_MATCH of 1 − Σ‖x − x̂‖²/Σ‖x‖² and not of FVE: measured about zero (SAELens
                                issue 659); at least
                                DEAD_CONTRADICTED_SHARE of the latents never fire on the rows where training recorded at
                                most DEAD_RECORDED_SHARE dead (warning)
    """
    recorded = sae.format_info.recorded_metrics or {}
    x = measured["sample"]
    if not recorded or x.shape[0] == 0:
        return []
    flags: list[Flag] = []
    block = encode_block_rows(int(sae.W_dec.shape[0]), sae.W_enc.element_size())
    with torch.no_grad():
        l0_sum, sse = 0.0, 0.0
        fired = torch.zeros(int(sae.W_dec.shape[0]), dtype=torch.bool)
        for lo in range(0, x.shape[0], block):
            part = x[lo : lo + block].to(sae.W_enc.dtype)
            codes = sae.encode(part)
            l0_sum += float((codes != 0).sum())
            fired |= (codes != 0).any(0).cpu()
            sse += float((part.double() - sae(part).double()).pow(2).sum())
    l0 = l0_sum / x.shape[0]
    flags += _dead_latents_flags(recorded.get("num_dead_features"), ~fired, int(x.shape[0]), subject, notes)
    # the L0 training recorded; else the k it trained with (a BatchTopK's, or a TopK's own)
    expected = next((v for v in (recorded.get("l0"), recorded.get("training_k"), sae.cfg.k) if v is not None), None)
    if expected is not None and expected > 0 and l0 > THRESHOLD_L0_FACTOR * expected:
        thresholded = sae.cfg.activation == "jumprelu"
        threshold = getattr(sae, "threshold", None)
        t_max = float(threshold.detach().abs().max()) if threshold is not None else None
        flags.append(
            Flag(
                THRESHOLD_NOT_APPLIED if thresholded else RECORDED_CONTRADICTED,
                "error" if thresholded else "warning",
                {
                    "l0_on_rows": rounded(l0),
                    "recorded_l0": rounded(recorded.get("l0")),
                    "training_k": recorded.get("training_k") or sae.cfg.k,
                    "max_abs_threshold": rounded(t_max),
                    "rows": int(x.shape[0]),
                },
                "The threshold this SAE was trained with is missing, zero or not applied: its codes are dense and "
                "every number computed from them is not the trained SAE's; load the threshold (or the k) it recorded."
                if thresholded
                else "The SAE's codes on these rows are far denser than training recorded: check the loader and the "
                "sparsity settings before trusting its codes.",
                summary=f"L0 {l0:.1f} on {x.shape[0]} rows against {expected:g} recorded in training"
                + (f" (max |threshold| {t_max:.3g})" if thresholded and t_max is not None else ""),
                subject=subject,
            )
        )
    ev = recorded.get("explained_variance")
    fve = measured.get("fve")
    about_zero = 1 - sse / float(x.double().pow(2).sum()) if ev is not None else None
    # the recorded figure is the about-zero one (told apart from FVE about the mean), or simply far from FVE
    zero_baseline = (
        about_zero is not None and fve is not None and abs(ev - about_zero) <= ABOUT_ZERO_MATCH < abs(ev - fve)
    )
    if ev is not None and fve is not None and (zero_baseline or abs(ev - fve) > RECORDED_FVE_TOLERANCE):
        flags.append(
            Flag(
                RECORDED_CONTRADICTED,
                "warning",
                {
                    "recorded_explained_variance": rounded(ev),
                    "fve_on_rows": rounded(fve),
                    "explained_variance_about_zero": rounded(about_zero),
                    "measured_about_zero": zero_baseline,
                },
                "Read the FVE measured here: the recorded explained variance does not describe these rows"
                + (" (it was measured about zero, not about the mean)." if zero_baseline else "."),
                summary=f"recorded explained variance {ev:.3f}, FVE on these rows {fve:.3f}"
                + (
                    f": the recorded figure is the variance explained about zero ({about_zero:.3f}), not about the "
                    "mean (SAELens before 6.45.1, its issue 659)"
                    if zero_baseline
                    else ""
                ),
                subject=subject,
            )
        )
    return flags


def _dead_latents_flags(
    recorded_dead: Any, dead: torch.Tensor, rows: int, subject: str, notes: list[str] | None
) -> list[Flag]:
    """The dead count training recorded against the latents that never fired on these rows: a note always; a
    warning when at least DEAD_CONTRADICTED_SHARE never fire where training recorded at most DEAD_RECORDED_SHARE
    (a latent rarer than 1 in `rows` rows looks dead here, so smaller gaps are no evidence)."""
    if recorded_dead is None:
        return []
    n_lat, n_dead = int(dead.numel()), int(dead.sum())
    if notes is not None:
        notes.append(
            f"{subject}: {int(recorded_dead)} dead latent(s) recorded in training; {n_dead} of {n_lat} never fire on "
            f"these {rows:,} rows (a latent rarer than 1 in {rows:,} rows looks dead here)"
        )
    if not (n_dead >= DEAD_CONTRADICTED_SHARE * n_lat and recorded_dead <= DEAD_RECORDED_SHARE * n_lat):
        return []
    return [
        Flag(
            RECORDED_CONTRADICTED,
            "warning",
            {"recorded_dead": int(recorded_dead), "dead_on_rows": n_dead, "d_sae": n_lat, "rows": rows},
            "Most latents never fire on these rows though training recorded them alive: check the loader, the "
            "encoder bias or threshold, and the rows (scale, hook) before trusting its codes.",
            summary=f"{n_dead} of {n_lat} latents never fire on {rows:,} rows; training recorded {int(recorded_dead)} dead",
            latents=dead.nonzero().flatten().tolist()[:20],
            subject=subject,
        )
    ]


def check_with_activations(
    sae: Any, acts: Any, *, options: CheckOptions | None = None, name: str | None = None, report_options: Any = None
):
    """`geometry_report(acts, sae)` with the flags and notes of `sae_verdict`, merged into one report so the same
    renderings apply (an `activations_mismatch` error withholds the SAE's WITHHELD_METRICS).
    Returns (GeometryReport, DictionaryCheck)."""
    from saegeo.activations.sources import open_rows
    from saegeo.report.geometry_report import geometry_report

    opts = options or CheckOptions()
    sae = SAE.load(sae)
    # opened once, so the match pass and the report read alike: --no-verify and the NaN policy for both
    acts = open_rows(
        acts,
        verify=opts.verify and getattr(report_options, "verify", True),
        skip_nonfinite=opts.skip_nonfinite or bool(getattr(report_options, "skip_nonfinite", False)),
    )
    flags, match_notes, dcheck = sae_verdict(sae, acts, options=opts, name=name)
    subject = dcheck.source["name"]
    summary = (
        f"dictionary check: {dcheck.n_duplicate_pairs} near-duplicate pair(s) (cos > {opts.duplicate_cos:g}), "
        f"{dcheck.n_zero_decoder_rows} zero row(s), median cos(encoder, decoder) "
        f"{dcheck.encoder_decoder_cos['median']:.3f}"
    )
    report = geometry_report(
        acts, sae={subject: sae}, options=report_options, flags=flags, notes=match_notes, closing_notes=[summary]
    )
    return report, dcheck


# =========================================================================== do the SAE and the activations belong together?
_SITES = (
    ("resid_post", ("resid_post", "hook_resid_post")),
    ("resid_pre", ("resid_pre",)),
    ("resid_mid", ("resid_mid",)),
    ("mlp_out", ("mlp_out", "hook_mlp_out")),
    ("mlp_in", ("mlp_in", "hook_mlp_in")),
    ("attn", ("hook_z", "attn_out", "hook_attn_out", "attn.", "self_attn")),
    ("embed", ("embed",)),
)


def _hook_parts(name: str | None) -> tuple[int | None, str | None]:
    """(layer, site) from a transformer-lens name (blocks.6.hook_resid_post) or an HF module name (layers.6,
    model.layers.6.output = that block's residual output); None where the name does not say."""
    if not name:
        return None, None
    low = name.lower()
    m = re.search(r"(?:blocks|layers|layer|h)[._](\d+)", low)
    layer = int(m.group(1)) if m else None
    site = next((s for s, keys in _SITES if any(k in low for k in keys)), None)
    if (
        site is None
        and layer is not None
        and re.fullmatch(r"(model\.)?(gpt_neox\.|transformer\.)?(layers|h)\.\d+(\.output)?", low)
    ):
        site = "resid_post"  # the output of an HF decoder layer is the residual stream after it
    return layer, site


_SQRT_D_NOTE = (
    " -- Gemma's √d embedding scale (Gemma Scope embedding SAEs need W_enc/√d and W_dec·√d against "
    "transformer-lens hook_embed)"
)


def _near_sqrt_d(ratio: float, d: int) -> bool:
    """ratio within a factor e^0.25 of √d or 1/√d."""
    return abs(abs(math.log(ratio)) - 0.5 * math.log(d)) < 0.25


FINGERPRINT_KEYS = ("architecture", "tokenizer_sha256", "weights_sha256")


def _model_identity(info: Any, store_model: str | None, store: Any, opts: MatchOptions) -> dict[str, Any]:
    """What the names and fingerprints say about the model: {"by": fingerprint | name | assumed, "same": True |
    False | None (no evidence), "why": text}. The rows decide where this is None or False by name
    (`activations_match_flags`); a fingerprint mismatch is evidence in itself."""
    names = f"store {store_model!r}, SAE {info.model_name!r}"
    store_fp = (store.manifest.get("extra") or {}).get("model_fingerprint") if store is not None else None
    verdict = same_model(info.model_fingerprint, store_fp)
    if opts.assume_same_model:
        differ = (
            "" if verdict is None else (" (their fingerprints agree)" if verdict else " (their fingerprints differ)")
        )
        return {"by": "assumed", "same": True, "why": f"assumed the same (--assume-same-model){differ}; {names}"}
    if verdict is not None:
        scope = store_fp["weights_scope"]
        if verdict:
            return {
                "by": "fingerprint",
                "same": True,
                "why": f"the same model by fingerprint (architecture, tokenizer, sha256 of the {scope}); {names}",
            }
        differ = [k for k in FINGERPRINT_KEYS if info.model_fingerprint.get(k) != store_fp.get(k)]
        return {
            "by": "fingerprint",
            "same": False,
            "why": f"model fingerprints differ ({', '.join(differ)} over the {scope}); {names}",
            "differ": differ,
        }
    same = same_model_name(info.model_name, store_model)
    if same is None:
        missing = [w for w, n in (("the store", store_model), ("the SAE", info.model_name)) if not model_key(n)]
        why = f"no model name in {' or '.join(missing)}"
    else:
        why = (
            f"the same model by name ({model_key(info.model_name)!r})"
            if same
            else f"model names differ ({model_key(store_model)!r} vs {model_key(info.model_name)!r})"
        )
    return {"by": "name", "same": same, "why": f"{why}; {names}"}


_MEASURE_CHUNK_ROWS = 1024


def _store_measures(acts: Any, opts: MatchOptions) -> dict[str, Any] | None:
    """One pass over the first max_rows rows: n, E‖x‖, μ, the all-ones share E|x·1|/(√d E‖x‖), massive rows, the
    rows at position 0 (a store's positions column), and up to fve_rows rows kept for the scale test."""
    from saegeo.activations.sources import open_rows

    rows = open_rows(acts)
    if rows.kind == "iterator":
        return None  # an iterator can be read once: the report needs it
    batches, _ = rows.batches(BATCH_ROWS)
    n, d = 0, None
    total, norms, ones, kept = None, [], 0.0, []
    for batch in batches:
        rows_in = as_rows(batch)[: opts.max_rows - n]
        if rows_in.shape[0] == 0:
            break
        # float64 a chunk at a time: a whole batch's copy is 151 MB at 8,192 × 2,304
        for lo in range(0, rows_in.shape[0], _MEASURE_CHUNK_ROWS):
            x = rows_in[lo : lo + _MEASURE_CHUNK_ROWS].to(torch.float64)
            d = x.shape[1]
            total = x.sum(0) if total is None else total + x.sum(0)
            norms.append(x.norm(dim=1))
            ones += float(x.sum(1).abs().sum()) / d**0.5
            if sum(k.shape[0] for k in kept) < opts.fve_rows:
                kept.append(x[: opts.fve_rows].to(torch.float32))
        n += rows_in.shape[0]
        if n >= opts.max_rows:
            break
    if n == 0:
        return None
    norm = torch.cat(norms)
    mean_norm = float(norm.mean())
    position0 = None
    if rows.window is not None:  # a (batch, pos, d) source: rows g < n with g mod pos = 0
        position0 = -(-n // rows.window)
    elif rows.store is not None:
        position0, seen = 0, 0
        for i, shard in enumerate(rows.store.shards):
            pos = rows.store.read_positions(i)
            if pos is None:
                position0 = None
                break
            position0 += int((pos[: max(0, n - seen)] == 0).sum())
            seen += shard.rows
            if seen >= n:
                break
    return {
        "n": n,
        "mean": total / n,
        "mean_norm": mean_norm,
        "median_norm": float(norm.median()),
        "n_massive": int((norm > opts.massive_row_factor * float(norm.median())).sum()),
        "ones_share": ones / n / mean_norm if mean_norm > 0 else 0.0,
        "position0_rows": position0,
        "sample": torch.cat(kept)[: opts.fve_rows],
        "store": rows.store,
        "describe": rows.describe,
    }


def _sample_fit(sae: SAE, x: torch.Tensor) -> tuple[float | None, float | None]:
    """(FVE, mean cosine) of the SAE's reconstruction of the kept rows: FVE = 1 − Σ‖x − x̂‖²/Σ‖x − x̄‖² (x̄ their
    mean) and E cos(x, x̂); reconstructed by latent blocks (``saegeo.sae.metrics.reconstruct``: the (rows × d_sae)
    pre-activations of 4,096 rows at once would be 1 GB at 65k latents)."""
    if x.shape[0] == 0:
        return None, None
    x_hat = reconstruct(sae, x).to(torch.float64)
    x = x.to(torch.float64)
    centred = float((x - x.mean(0)).pow(2).sum())
    fve = 1 - float((x - x_hat).pow(2).sum()) / centred if centred > 0 else None
    cos = float(torch.nn.functional.cosine_similarity(x, x_hat, dim=1, eps=1e-30).mean())
    return fve, cos


def _fve(sae: SAE, x: torch.Tensor) -> float | None:
    """The FVE of `_sample_fit`."""
    return _sample_fit(sae, x)[0]


def activations_match_flags(
    sae: SAE,
    acts: Any,
    *,
    subject: str = "dictionary",
    options: MatchOptions | None = None,
    notes: list[str] | None = None,
    measured: dict[str, Any] | None = None,
) -> list[Flag]:
    """Do the SAE and `acts` belong together? The one decision `saegeo check --acts`, `report --sae` and `latents`
    take (through `sae_verdict`): from the SAE's metadata (sae.format_info) against the store's manifest, and
    from the rows themselves -- the SAE's FVE = 1 − Σ‖x − x̂‖²/Σ‖x − x̄‖² and mean cos(x, x̂) on the first fve_rows
    rows. Refused (error) only on evidence; each cause with its numbers:

      hook         layer or site parsed from the names differ (transformer-lens or HF module names)
      model        fingerprints differ; or the names (`model_key`: decorations, aliases, org/ stripped) differ or
                   are missing and the rows do not overrule them: FVE < fit_refuse_fve an error when the names
                   differ (a warning when one is missing: no evidence of another model), < fit_accept_fve a
                   warning; at or above fit_accept_fve the rows overrule the names, and the note says so
      scale        E‖x‖ vs the norm the SAE recorded (Llama Scope dataset_average_activation_norm; √d for SAELens
                   expected_average_only_in): error beyond scale_error_ratio. Without a recorded norm, ‖μ‖/‖b_dec‖
                   beyond scale_hint_ratio is tested, not believed: an error only when x / ratio is reconstructed
                   clearly better (FVE + scale_fve_gain); otherwise a note (a b_dec that did not absorb the mean
                   is `offset_not_absorbed`, a finding about b_dec, not about the rows)
      special_rows the SAE's metadata excludes BOS / special tokens but the store kept them (manifest
                   corpus.exclude_special false, rows at position 0); error when they are massive-activation rows
      centred      the SAE's model_from_pretrained_kwargs centre the writing weights (Σ_j x_j = 0 per row) and
                   the store's rows are not: E|x·1|/(√d E‖x‖) above centred_warn (warning)
    One flag `activations_mismatch` (its severity the worst cause's) or none. `notes` gets one line saying what was
    compared and why the pair was accepted or refused, and what could not be checked."""
    opts = options or MatchOptions()
    info, notes = sae.format_info, notes if notes is not None else []
    m = _store_measures(acts, opts)
    if m is None:
        notes.append("activations_mismatch not checked: the activations are an iterator (read once, by the report)")
        return []
    desc = m["describe"]
    causes: dict[str, dict[str, Any]] = {}

    def cause(name: str, severity: str, summary: str, **evidence: Any) -> None:
        causes[name] = {
            "severity": severity,
            "summary": summary,
            **{k: rounded(v) if isinstance(v, float) else v for k, v in evidence.items()},
        }

    fve, cos = _sample_fit(sae, m["sample"]) if m["sample"].shape[0] else (None, None)
    if measured is not None:  # for the recorded-metrics check: the same rows, read once
        measured.update(sample=m["sample"], fve=fve)
    fit = f"FVE {fve:.3f}, cos(x, x̂) {cos:.3f} on {m['sample'].shape[0]} rows" if fve is not None else "no fit measured"

    # hook: the names are the evidence (a wrong layer can reconstruct well: neighbouring layers are alike)
    store_hook, store_model = desc.get("hook") or None, desc.get("model") or None
    if info.hook_name and store_hook and info.hook_name != store_hook:
        (la, sa), (lb, sb) = _hook_parts(info.hook_name), _hook_parts(store_hook)
        differ = (la is not None and lb is not None and la != lb) or (sa is not None and sb is not None and sa != sb)
        if differ or None in (la, lb, sa, sb):
            cause(
                "hook",
                "error" if differ else "warning",
                f"hook {store_hook!r} in the store, {info.hook_name!r} in the SAE"
                + ("" if differ else " (cannot tell whether they are the same)"),
                sae_hook=info.hook_name,
                store_hook=store_hook,
            )
    if info.hook_head_index is not None:
        notes.append(
            f"the SAE reads attention head {info.hook_head_index} of {info.hook_name}: the store must hold that head only"
        )

    # model: fingerprints when both have one, then names, then the rows
    ident = _model_identity(info, store_model, m["store"], opts)
    if ident["same"] is False and ident["by"] == "fingerprint":
        decided = "refused"
        cause(
            "model",
            "error",
            ident["why"],
            sae_model=info.model_name,
            store_model=store_model,
            compared_by="fingerprint",
            differ=ident["differ"],
        )
    elif ident["same"]:
        decided = "accepted"  # the names agree: the fit is reported, not judged (a poor SAE is not a wrong store)
    elif fve is None:
        decided = "refused" if ident["same"] is False else "not decided"
        if ident["same"] is False:
            cause(
                "model", "error", ident["why"], sae_model=info.model_name, store_model=store_model, compared_by="name"
            )
    else:
        severity = "error" if fve < opts.fit_refuse_fve else "warning" if fve < opts.fit_accept_fve else None
        if severity == "error" and ident["same"] is None:
            severity = "warning"  # a missing name is no evidence of another model: a poor fit is only a doubt
        decided = {"error": "refused", "warning": "in doubt", None: "accepted"}[severity]
        if severity is not None:
            cause(
                "model",
                severity,
                f"{ident['why']}, and the rows do not settle it: {fit} (accepted at FVE ≥ {opts.fit_accept_fve:g}, "
                f"refused below {opts.fit_refuse_fve:g})",
                sae_model=info.model_name,
                store_model=store_model,
                compared_by="name and rows",
                fve=fve,
                cos=cos,
            )
    by = {"fingerprint": "by fingerprint", "assumed": "by assumption", "name": "by name"}[ident["by"]]
    if ident["by"] == "name" and not ident["same"] and fve is not None:
        by = "by the rows (names do not settle it)"

    # scale: a recorded norm is evidence; ‖μ‖/‖b_dec‖ only a hypothesis the rows must confirm
    mu = m["mean"]
    b_dec = sae.b_dec.detach().cpu().to(torch.float64)
    mu_norm, b_norm = float(mu.norm()), float(b_dec.norm())
    d = int(mu.shape[0])
    gemma = "gemma" in (info.model_name or store_model or "").lower()
    expected, expected_from = info.expected_input_norm, "dataset_average_activation_norm.in"
    if expected is None and info.normalize_activations == "expected_average_only_in":
        expected, expected_from = d**0.5, "√d (normalize_activations expected_average_only_in, after rescaling)"
    if expected:
        ratio = m["mean_norm"] / expected
        if not 1 / opts.scale_error_ratio <= ratio <= opts.scale_error_ratio:
            near_sqrt_d = gemma and _near_sqrt_d(ratio, d)
            cause(
                "scale",
                "error",
                f"E‖x‖ = {m['mean_norm']:.4g} in the store, {expected:.4g} expected ({expected_from}): ×{ratio:.3g}"
                + (_SQRT_D_NOTE if near_sqrt_d else ""),
                store_mean_norm=m["mean_norm"],
                expected_mean_norm=expected,
                expected_from=expected_from,
                ratio=ratio,
                gemma_sqrt_d=near_sqrt_d,
            )
    elif b_norm > 0 and mu_norm > 0:
        ratio = mu_norm / b_norm
        if not 1 / opts.scale_hint_ratio <= ratio <= opts.scale_hint_ratio:
            fve_rescaled = _sample_fit(sae, m["sample"] / ratio)[0]
            confirmed = fve is not None and fve_rescaled is not None and fve_rescaled - fve > opts.scale_fve_gain
            near_sqrt_d = gemma and _near_sqrt_d(ratio, d)
            if confirmed:
                cause(
                    "scale",
                    "error",
                    f"‖μ‖ = {mu_norm:.4g} in the store against ‖b_dec‖ = {b_norm:.4g}: ×{ratio:.3g}"
                    + (_SQRT_D_NOTE if near_sqrt_d else "")
                    + f"; FVE rises from {fve:.3f} to {fve_rescaled:.3f} with x/{ratio:.3g}",
                    store_mean_norm=m["mean_norm"],
                    store_mean_vector_norm=mu_norm,
                    b_dec_norm=b_norm,
                    ratio=ratio,
                    fve=fve,
                    fve_rescaled=fve_rescaled,
                    gemma_sqrt_d=near_sqrt_d,
                )
            else:
                notes.append(
                    f"‖μ‖/‖b_dec‖ = {ratio:.3g} for {subject}, but x/{ratio:.3g} is reconstructed no better "
                    f"(FVE {fve_rescaled if fve_rescaled is None else round(fve_rescaled, 3)} against "
                    f"{fve if fve is None else round(fve, 3)}): b_dec did not absorb the mean (offset_not_absorbed), "
                    "the rows' scale is not in question" + (_SQRT_D_NOTE if near_sqrt_d else "")
                )
    offset = float((b_dec - mu).norm()) / mu_norm if mu_norm > 0 else None

    # BOS / special rows
    excluded = info.exclude_special_tokens
    corpus = (m["store"].corpus if m["store"] is not None else {}) or {}
    if excluded and not corpus.get("exclude_special", False):
        pos0 = m["position0_rows"]
        if pos0 is None and m["store"] is None:
            notes.append("the SAE excludes special tokens; these activations have no positions to check that against")
        elif pos0 is None or pos0 > 0:
            massive = m["n_massive"]
            cause(
                "special_rows",
                "error" if massive else "warning",
                f"the SAE's metadata excludes BOS / special tokens (exclude_special_tokens={excluded!r}) but the store kept them "
                f"(corpus.exclude_special false{f', {pos0} rows at position 0' if pos0 else ''}"
                f"{f', {massive} massive-activation rows (‖x‖ > {opts.massive_row_factor:g}× median)' if massive else ''})",
                exclude_special_tokens=excluded,
                store_exclude_special=bool(corpus.get("exclude_special", False)),
                position0_rows=pos0,
                massive_rows=massive,
                rows_read=m["n"],
            )

    # centred writing weights
    kwargs = info.model_from_pretrained_kwargs or {}
    if kwargs.get("center_writing_weights") is True and m["ones_share"] > opts.centred_warn:
        cause(
            "centred",
            "warning",
            f"the SAE was trained with center_writing_weights (rows sum to 0) but these rows carry "
            f"{m['ones_share']:.3g} of their norm along the all-ones direction",
            all_ones_share=m["ones_share"],
        )

    errors = sorted(k for k, c in causes.items() if c["severity"] == "error")
    outcome = (
        f"refused ({', '.join(errors)})"
        if errors
        else "in doubt (" + ", ".join(sorted(causes)) + ")"
        if causes
        else "accepted"
    )
    notes.append(
        f"{subject} on these activations: {outcome}; model {by}: {ident['why']}; hook store {store_hook!r}, "
        f"SAE {info.hook_name!r}; d_in {int(sae.W_dec.shape[1])}, rows d {d}; {fit}"
        + ("" if decided == "accepted" or errors else f" (model {decided})")
    )
    if not causes:
        return []
    severity = "error" if errors else "warning"
    evidence = {
        "causes": sorted(causes),
        **causes,
        "rows_read": m["n"],
        "store_mean_norm": rounded(m["mean_norm"]),
        "b_dec_offset": rounded(offset) if offset is not None else None,
        "fve_sample": rounded(fve) if fve is not None else None,
        "cos_sample": rounded(cos) if cos is not None else None,
    }
    return [
        Flag(
            ACTIVATIONS_MISMATCH,
            severity,
            evidence,
            "These activations are not the ones this SAE was trained on: cache the hook and model its metadata names, "
            "with its preprocessing (scale, special tokens, centring), before reading FVE or the amplification law.",
            summary="SAE and activations do not belong together: "
            + "; ".join(f"{k}: {c['summary']}" for k, c in sorted(causes.items())),
            subject=subject,
        )
    ]
