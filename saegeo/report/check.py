"""`saegeo check`: should you trust a downloaded dictionary? Checks that need no activations.

From the weights alone (any format `load_dictionary` reads):
  * A_dict = (N‖ū‖² − 1)/(N − 1) of the unit decoder rows and their own spectrum (erank, top-1, MP edges);
  * decoder-norm statistics and zero rows;
  * near-duplicate decoder rows, cos(w_i, w_j) > 0.99, found exactly and blockwise (no N × N matrix);
  * encoder–decoder alignment cos(W_enc[:, i], W_dec[i]);
  * b_dec against the dictionary's mean direction ū, and latents parallel to b_dec (or ū) -- the
    dictionary-only variant of the mean-direction flag (``saegeo.report.flags.dictionary_flags``);
  * configuration: input normalisation or scaling the files do not contain, folded scaling factors,
    whitening, transcoders, unset BatchTopK thresholds.
With activations (`--acts`), `saegeo check` adds these flags to the full `geometry_report`.
Flags are ``saegeo.report.flags.Flag``; ``saegeo.report.render`` renders and writes a ``DictionaryCheck``.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

import torch

from saegeo.errors import BadInputError, FormatError
from saegeo.geometry.dictionary import (
    DEFAULT_BLOCK_ROWS,
    dictionary_geometry,
    encoder_decoder_cosines,
    near_duplicate_pairs,
    summary_stats,
)
from saegeo.report.flags import Flag, FlagThresholds, rounded, config_flags, dictionary_flags, sort_flags
from saegeo.io import config_from_dict, dump_json, json_safe
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
DICTIONARY_FLAGS = (ZERO_ROWS, DUPLICATES, MISALIGNED, INPUT_SCALING, INPUT_NORMALIZATION, FOLDED_SCALING,
                    ZERO_B_DEC, TRANSCODER, UNSET_THRESHOLD)


@dataclass
class CheckOptions:
    """Thresholds of the dictionary-only checks (the mean-direction one is FlagThresholds.dictionary_min_cos)."""

    duplicate_cos: float = 0.99  # pairs with cos(w_i, w_j) above this are near-duplicates
    zero_row_rel_norm: float = 1e-6  # ‖w_i‖ ≤ this × median ‖w‖ counts as a zero row
    misaligned_cos: float = 0.0  # latents with cos(encoder column, decoder row) below this are misaligned
    misaligned_warn_fraction: float = 0.01  # above this fraction of latents the flag is a warning, else info
    duplicate_error_fraction: float = 0.01  # latents in duplicate pairs above this fraction: error
    block_rows: int = DEFAULT_BLOCK_ROWS  # rows per block of the duplicate search (memory ~ block² floats)
    max_pairs_listed: int = 50  # near-duplicate pairs listed in the result
    progress: bool = True  # progress bars
    verify: bool = True  # sha256 check of each --acts store shard as it is read
    thresholds: FlagThresholds = field(default_factory=FlagThresholds)  # of the flags

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, where: str | None = None) -> "CheckOptions":
        return config_from_dict(cls, d, "check option", where)


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

    def flag_names(self) -> list[str]:
        return [f.name for f in self.flags]

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
    def from_dict(cls, d: Mapping[str, Any]) -> "DictionaryCheck":
        d = dict(d)
        if d.get("schema_version") != CHECK_SCHEMA_VERSION:
            raise FormatError(f"check schema_version {d.get('schema_version')!r} is not {CHECK_SCHEMA_VERSION}; rerun saegeo check")
        d["flags"] = [Flag.from_dict(f) for f in d.get("flags", [])]
        return cls(**{k: v for k, v in d.items() if k in {f.name for f in fields(cls)}})


# =========================================================================== measurements
def check_dictionary(sae: SAE, *, options: CheckOptions | None = None, name: str | None = None) -> DictionaryCheck:
    """All dictionary-only checks of a loaded SAE (see the module docstring). Memory: the weights plus
    O(block_rows² + d²) -- never a d_sae × d_sae matrix."""
    opts = options or CheckOptions()
    t0 = time.perf_counter()
    info = sae.format_info
    subject = name or Path(str(info.source or "dictionary")).name or "dictionary"
    W_dec, W_enc = sae.W_dec.detach().cpu(), sae.W_enc.detach().cpu()
    b_dec = sae.b_dec.detach().cpu().to(torch.float64)
    n_lat, d = W_dec.shape
    if n_lat < 2:
        raise BadInputError(f"{subject}: a dictionary needs at least 2 decoder rows, found {n_lat}")
    bar = None
    if opts.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_lat, unit="row", unit_scale=True, desc="duplicates", dynamic_ncols=True)

    # float32 gram: fast enough for 65,536 × 2,304 rows on a laptop; the spectrum to float32 rounding
    geom = dictionary_geometry(W_dec, zero_rel_norm=opts.zero_row_rel_norm, block_rows=opts.block_rows,
                               gram_dtype=torch.float32)
    zero, median = geom.zero, geom.norm_stats["median"]
    zero_rows = zero.nonzero().flatten().tolist()
    alive_norms = geom.direction_norms  # "zero" rows drop out of every direction statistic
    a_dict, mean_sq_norm, mean_dir, spectrum = geom.a_dict, geom.mean_sq_norm, geom.mean_direction, geom.spectrum

    pairs, pair_cos, n_pairs = near_duplicate_pairs(
        W_dec, opts.duplicate_cos, norms=alive_norms, block_rows=opts.block_rows,
        max_pairs=max(opts.max_pairs_listed, opts.thresholds.max_latents),
        progress=(lambda done: bar.update(done - bar.n)) if bar is not None else None,
    )
    if bar is not None:
        bar.close()
    enc_dec = encoder_decoder_cosines(W_enc, W_dec, block_rows=opts.block_rows)
    enc_dec_alive = enc_dec[~zero]

    b_norm = float(b_dec.norm())
    b_info = {
        "norm": b_norm,
        "cos_mean_direction": float(b_dec @ mean_dir) / (b_norm * float(mean_dir.norm())) if b_norm > 0 and float(mean_dir.norm()) > 0 else None,
        "norm_over_median_decoder_norm": b_norm / median if median > 0 else None,
        "mean_direction_norm": float(mean_dir.norm()),
    }
    cfg = sae.cfg
    source = {
        "path": info.source, "format": info.format, "name": subject, "d_in": int(d), "d_sae": int(n_lat),
        "activation": cfg.activation, "k": cfg.k, "apply_b_dec_to_input": cfg.apply_b_dec_to_input,
        "input_normalization": cfg.input_normalization, "model": info.model_name, "hook": info.hook_name,
        "source_dtype": info.source_dtype,
    }
    check = DictionaryCheck(
        schema_version=CHECK_SCHEMA_VERSION, source=source, a_dict=a_dict, dict_mean_sq_norm=mean_sq_norm,
        dictionary_spectrum=spectrum, decoder_norms=geom.norm_stats, n_zero_decoder_rows=len(zero_rows),
        zero_rows=zero_rows[:1000], n_duplicate_pairs=n_pairs,
        duplicate_pairs=[[int(i), int(j), float(c)] for (i, j), c in zip(pairs.tolist()[: opts.max_pairs_listed], pair_cos.tolist())],
        encoder_decoder_cos={**{k: v for k, v in summary_stats(enc_dec_alive).items() if k != "cv"},
                             "n_below": int((enc_dec_alive < opts.misaligned_cos).sum())},
        b_dec=b_info, config=info.to_dict(), flags=[], options=json_safe(opts.to_dict()), seconds=0.0,
    )
    if zero_rows:
        check.notes.append(f"{len(zero_rows)} zero decoder row(s) excluded from A_dict, the spectrum and the duplicate search")
    check.flags = sort_flags(
        _dictionary_only_flags(check, pairs, pair_cos, enc_dec, zero, opts, subject)
        + dictionary_flags(W_dec if not zero_rows else torch.where(zero[:, None], 0.0, W_dec), b_dec,
                           thresholds=opts.thresholds, subject=subject)
        + config_check_flags(sae, subject=subject, thresholds=opts.thresholds)
    )
    check.seconds = time.perf_counter() - t0
    return check


# =========================================================================== flags
def _dictionary_only_flags(check: DictionaryCheck, pairs, pair_cos, enc_dec, zero, opts: CheckOptions, subject: str) -> list[Flag]:
    flags: list[Flag] = []
    n_lat = check.source["d_sae"]
    max_latents = opts.thresholds.max_latents
    if check.n_zero_decoder_rows:
        flags.append(Flag(
            ZERO_ROWS, "warning",
            {"n_zero_rows": check.n_zero_decoder_rows, "d_sae": n_lat, "fraction": rounded(check.n_zero_decoder_rows / n_lat),
             "median_decoder_norm": rounded(check.decoder_norms["median"])},
            "Zero decoder rows are dead latents that write nothing: drop them before counting features or "
            "computing dictionary statistics.",
            summary=f"{check.n_zero_decoder_rows} of {n_lat} decoder rows are zero",
            latents=check.zero_rows[:max_latents], subject=subject,
        ))
    if check.n_duplicate_pairs:
        involved: list[int] = []
        for i, j in pairs.tolist():
            involved += [x for x in (i, j) if x not in involved]
        n_involved = len(set(pairs.flatten().tolist()))
        top = check.duplicate_pairs[:3]
        flags.append(Flag(
            DUPLICATES, "error" if n_involved / n_lat > opts.duplicate_error_fraction else "warning",
            {"n_pairs": check.n_duplicate_pairs, "n_latents_listed": n_involved, "max_cos": rounded(float(pair_cos[0]), 6),
             "threshold": opts.duplicate_cos, "d_sae": n_lat},
            "Near-duplicate latents split one feature between them (and their codes): merge or drop one of each "
            "pair before interpreting or counting features.",
            summary=(f"{check.n_duplicate_pairs} pair(s) of decoder rows with cos > {opts.duplicate_cos:g}: "
                     + ", ".join(f"{i}–{j} ({c:.4f})" for i, j, c in top) + (" …" if check.n_duplicate_pairs > 3 else "")),
            latents=involved[:max_latents], subject=subject,
        ))
    below = ((enc_dec < opts.misaligned_cos) & ~zero).nonzero().flatten()
    if below.numel():
        order = below[enc_dec[below].argsort()].tolist()
        frac = len(order) / n_lat
        flags.append(Flag(
            MISALIGNED, "warning" if frac > opts.misaligned_warn_fraction else "info",
            {"n_latents": len(order), "fraction": rounded(frac), "min_cos": rounded(float(enc_dec[order[0]])),
             "median_cos": rounded(check.encoder_decoder_cos["median"]), "threshold": opts.misaligned_cos},
            "A latent whose encoder reads against the direction its decoder writes is usually dead or broken: "
            "check its firing on activations (saegeo check --acts) before trusting it.",
            summary=f"{len(order)} latent(s) with cos(encoder column, decoder row) < {opts.misaligned_cos:g}",
            latents=order[:max_latents], subject=subject,
        ))
    if check.b_dec["norm"] == 0:
        flags.append(Flag(
            ZERO_B_DEC, "info", {"b_dec_norm": 0.0, "mean_direction_norm": rounded(check.b_dec["mean_direction_norm"])},
            "b_dec is exactly zero (trained without centring, or never updated): any activation offset must be "
            "carried by latents -- run saegeo check --acts to see whether some do.",
            summary="b_dec is zero", subject=subject,
        ))
    return flags


def config_check_flags(sae: SAE, *, subject: str = "dictionary", thresholds: FlagThresholds | None = None) -> list[Flag]:
    """Flags on how the dictionary expects its inputs, from the loaded config (``sae.cfg`` and ``sae.format_info``)."""
    cfg, info = sae.cfg, sae.format_info
    flags: list[Flag] = []
    norm = info.normalize_activations
    if norm == "expected_average_only_in":
        flags.append(Flag(
            INPUT_SCALING, "warning", {"normalize_activations": None},
            "This SAE expects inputs multiplied by a constant (√d / E‖x‖ of its training data) that is not in "
            "these files: rescale the activations the same way, or every code and threshold is off by that factor.",
            summary="normalize_activations = expected_average_only_in: inputs must be rescaled by a factor the files do not hold",
            subject=subject,
        ))
    if cfg.input_normalization != "none":
        flags.append(Flag(
            INPUT_NORMALIZATION, "info", {"layer_norm_eps": cfg.layer_norm_eps if cfg.input_normalization == "layer_norm" else None},
            "Each input row is normalised before encoding and the reconstruction is mapped back: compare codes "
            "across tokens with that in mind, and feed raw (not pre-normalised) activations.",
            summary=f"the SAE normalises every input row ({cfg.input_normalization}) and undoes it after decoding",
            subject=subject,
        ))
    folded = info.folded_scaling_factor
    if folded:
        flags.append(Flag(
            FOLDED_SCALING, "info", {"scaling_min": rounded(folded.get("min")), "scaling_max": rounded(folded.get("max"))},
            "A per-latent finetuning scaling factor was folded into the decoder rows (decode is unchanged); "
            "decoder norms therefore include it.",
            summary="finetuning scaling factor folded into W_dec", subject=subject,
        ))
    if info.transcoder:
        flags.append(Flag(
            TRANSCODER, "info", {},
            "A transcoder reconstructs a different activation than it reads: b_dec and the decoder live in the "
            "output space, so compare them with the output activations, not the inputs.",
            summary="this is a transcoder (no b_dec subtraction before encoding)", subject=subject,
        ))
    if info.threshold_unset:
        flags.append(Flag(
            UNSET_THRESHOLD, "warning", {"threshold": rounded(info.threshold)},
            "The BatchTopK inference threshold was never set in training (-1): every positive pre-activation "
            "passes, so codes are dense; set the threshold from training statistics before use.",
            summary="BatchTopK threshold is -1 (unset): inference codes are dense ReLU codes", subject=subject,
        ))
    flags += config_flags({"normalize_activations": norm} if norm else None, thresholds=thresholds, subject=subject)
    return flags


# =========================================================================== with activations
def check_with_activations(sae: SAE, acts: Any, *, options: CheckOptions | None = None, name: str | None = None,
                           report_options: Any = None):
    """`geometry_report(acts, sae)` plus the dictionary-only flags above (duplicates, zero rows, alignment,
    config), merged into one report so the same renderings apply. Returns (GeometryReport, DictionaryCheck)."""
    from saegeo.report.report import geometry_report

    opts = options or CheckOptions()
    dcheck = check_dictionary(sae, options=opts, name=name)
    subject = dcheck.source["name"]
    report = geometry_report(acts, sae={subject: sae}, options=report_options)
    have = {(f.name, f.subject) for f in report.flags}
    # the activation-based mean-direction flag supersedes the dictionary-only guess; keep the rest
    extra_flags = [f for f in dcheck.flags if f.name in DICTIONARY_FLAGS and (f.name, f.subject) not in have]
    report.flags = sort_flags(report.flags + extra_flags)
    report.notes = list(report.notes) + [
        f"dictionary check: {dcheck.n_duplicate_pairs} near-duplicate pair(s) (cos > {opts.duplicate_cos:g}), "
        f"{dcheck.n_zero_decoder_rows} zero row(s), median cos(encoder, decoder) {dcheck.encoder_decoder_cos['median']:.3f}"
    ]
    return report, dcheck
