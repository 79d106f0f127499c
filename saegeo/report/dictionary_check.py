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

import os
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
from saegeo.report.flags import ACTIVATIONS_MISMATCH, Flag, raised_by, run_flags, sort_flags
from saegeo.report.flags.b_dec_zero import ZERO_B_DEC
from saegeo.report.flags.dictionary_config import (
    FOLDED_SCALING,
    INPUT_NORMALIZATION,
    INPUT_SCALING,
    TRANSCODER,
    UNSET_THRESHOLD,
)
from saegeo.report.flags.duplicate_decoder_rows import DUPLICATES
from saegeo.report.flags.encoder_decoder_misalignment import MISALIGNED
from saegeo.report.flags.recorded_metrics import RECORDED_CONTRADICTED, THRESHOLD_NOT_APPLIED
from saegeo.report.flags.zero_decoder_rows import ZERO_ROWS
from saegeo.report.options import CheckOptions, FlagThresholds, MatchOptions
from saegeo.sae.formats.weight_files import release_pages
from saegeo.sae.metrics import encode_block_rows, reconstruct
from saegeo.sae.model import SAE

CHECK_SCHEMA_VERSION = 1

__all__ = [  # the flag names of the dictionary and match stages, re-exported from their modules (their old home)
    "ACTIVATIONS_MISMATCH",
    "DUPLICATES",
    "FOLDED_SCALING",
    "INPUT_NORMALIZATION",
    "INPUT_SCALING",
    "MISALIGNED",
    "RECORDED_CONTRADICTED",
    "THRESHOLD_NOT_APPLIED",
    "TRANSCODER",
    "UNSET_THRESHOLD",
    "ZERO_B_DEC",
    "ZERO_ROWS",
    "CheckOptions",
    "DictionaryCheck",
    "MatchOptions",
    "activations_match_flags",
    "check_dictionary",
    "check_with_activations",
    "sae_verdict",
]


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
    # the dictionary stage of the flag registry, then a config that whitens (saegeo.report.flags)
    dictionary = {
        "check": check,
        "sae": sae,
        "subject": subject,
        "pairs": pairs,
        "pair_cos": pair_cos,
        "duplicate_cos": opts.duplicate_cos,
        "enc_dec": enc_dec,
        "zero": zero,
        "misaligned_cos": opts.misaligned_cos,
        "W_dec": W_dec,
        "b_dec": b_dec,
        "direction_norms": alive_norms,
        "block_rows": opts.block_rows,
        "whitening_alignment": whitening,
    }
    norm = info.normalize_activations
    check.flags = sort_flags(
        run_flags("dictionary", opts.thresholds, **dictionary)
        + run_flags(
            "config",
            opts.thresholds,
            config={"normalize_activations": norm} if norm else None,
            geo=None,
            whitening_cost=None,
            subject=subject,
        )
    )
    check.seconds = time.perf_counter() - t0
    return check


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
    mismatch = activations_match_flags(
        sae, acts, subject=subject, options=match, notes=notes, measured=measured, thresholds=opts.thresholds
    )
    # the activation-based flags supersede the dictionary-only guesses (mean direction; a config's whitening, which
    # the report raises from the SAE's config); keep the rest of the dictionary stage (a folded whitening included)
    dictionary_only = [
        f for f in dcheck.flags if (s := raised_by(f)) and s.stage == "dictionary" and not s.superseded_by_activations
    ]
    refused = any(f.severity == "error" for f in mismatch)
    recorded = (
        []
        if refused or "sample" not in measured
        else recorded_metrics_flags(sae, measured, subject=subject, thresholds=opts.thresholds, notes=notes)
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
    sae: SAE,
    measured: Mapping[str, Any],
    *,
    subject: str,
    thresholds: FlagThresholds | None = None,
    notes: list[str] | None = None,
) -> list[Flag]:
    """What the SAE's training recorded about itself (FormatInfo.recorded_metrics) against the same rows
    `activations_match_flags` read: the L0 of the SAE's codes on them, the FVE, the latents that never fire (a note
    in ``notes`` gives the recorded and measured dead counts), then the registry's recorded stage
    (threshold_not_applied, recorded_metrics_contradicted: saegeo.report.flags.recorded_metrics)."""
    recorded = sae.format_info.recorded_metrics or {}
    x = measured["sample"]
    if not recorded or x.shape[0] == 0:
        return []
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
    rows, dead = int(x.shape[0]), ~fired
    if recorded.get("num_dead_features") is not None and notes is not None:
        notes.append(
            f"{subject}: {int(recorded['num_dead_features'])} dead latent(s) recorded in training; {int(dead.sum())} "
            f"of {dead.numel()} never fire on these {rows:,} rows (a latent rarer than 1 in {rows:,} rows looks dead here)"
        )
    threshold = getattr(sae, "threshold", None)
    return run_flags(
        "recorded",
        thresholds,
        subject=subject,
        recorded=recorded,
        k=sae.cfg.k,
        rows=rows,
        dead=dead,
        l0=l0_sum / x.shape[0],
        # the L0 training recorded; else the k it trained with (a BatchTopK's, or a TopK's own)
        expected_l0=next(
            (v for v in (recorded.get("l0"), recorded.get("training_k"), sae.cfg.k) if v is not None), None
        ),
        thresholded=sae.cfg.activation == "jumprelu",
        max_abs_threshold=float(threshold.detach().abs().max()) if threshold is not None else None,
        fve=measured.get("fve"),
        explained_variance_about_zero=1 - sse / float(x.double().pow(2).sum()),
    )


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


def _store_measures(acts: Any, opts: MatchOptions, thresholds: FlagThresholds | None = None) -> dict[str, Any] | None:
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
    massive_row_ratio = (thresholds or FlagThresholds()).massive_row_ratio  # massive_activations' threshold
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
        "n_massive": int((norm > massive_row_ratio * float(norm.median())).sum()),
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
    thresholds: FlagThresholds | None = None,
) -> list[Flag]:
    """Do the SAE and `acts` belong together? The one decision `saegeo check --acts`, `report --sae` and `latents`
    take (through `sae_verdict`). Measured here, from the first max_rows rows: E‖x‖, μ, massive and position-0
    rows, the all-ones share, what names and fingerprints say of the model, and the SAE's FVE = 1 − Σ‖x − x̂‖²/
    Σ‖x − x̄‖² and mean cos(x, x̂) on the first fve_rows rows; decided by the registry's match stage
    (activations_mismatch: saegeo.report.flags.activations_mismatch, which lists the causes). One flag or none;
    `notes` gets one line saying what was compared and why the pair was accepted or refused."""
    opts = options or MatchOptions()
    t = thresholds or FlagThresholds()
    notes = notes if notes is not None else []
    m = _store_measures(acts, opts, t)
    if m is None:
        notes.append("activations_mismatch not checked: the activations are an iterator (read once, by the report)")
        return []
    fve, cos = _sample_fit(sae, m["sample"]) if m["sample"].shape[0] else (None, None)
    if measured is not None:  # for the recorded-metrics check: the same rows, read once
        measured.update(sample=m["sample"], fve=fve)
    store_model = m["describe"].get("model") or None
    return run_flags(
        "match",
        t,
        sae=sae,
        subject=subject,
        measures=m,
        fve=fve,
        cos=cos,
        identity=_model_identity(sae.format_info, store_model, m["store"], opts),
        fve_of_rows_over=lambda ratio: _sample_fit(sae, m["sample"] / ratio)[0],
        notes=notes,
    )
