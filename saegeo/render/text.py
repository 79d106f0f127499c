"""The terminal text of every command that is not a page: geometry, eval, train, cache, store, synth, run,
the sweep's caching line; and the pieces the pages share with them (cache exclusions, the artifact test).

``geometry_summary(geo) -> str``        the few lines of an ActivationGeometry.
``render_geometry(result) -> str``      `saegeo geometry`: the summary, artifact test, exclusions, position 0, flags.
``exclusion_lines(extra) -> list[str]`` what a store cached with exclusions left out, and its share of ‖μ‖² / tr Σ.
``artifact_text(artifact) -> str``      |corr(PC_j, ·)| with log frequency, position and ‖x‖.
``render_eval(result) -> str``          one `splice_eval` result.
``render_train(result) -> str``         the trainer's held-out summary.
``render_cache(result)``, ``render_store(store, verify)``, ``render_synth(...)``, ``render_run(result)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from saegeo.geometry.measures import ActivationGeometry
from saegeo.render.common import edge_spike_phrase, fmt_num, null_eigenvalue_phrase, terminal_flags
from saegeo.sae.architectures import get_architecture


# =========================================================================== geometry
def geometry_summary(geo: ActivationGeometry) -> str:
    """The few lines of an ActivationGeometry a person reads first (`saegeo geometry`)."""
    f = lambda v, spec=".4f": "n/a" if v is None else format(v, spec)  # noqa: E731
    s = geo.sign
    lines = [f"{geo.n:,} rows × {geo.d} dims"]
    lines.append(
        f"cone:      A = {f(geo.anisotropy)} (mean pairwise cosine) against the sign-aware null {s.null:.4f}; "
        f"offset ‖m̂‖ = {f(geo.offset)}; one cosine under isotropy has sd {geo.isotropic_cosine_sd:.4f}"
    )
    if geo.null_z is not None:
        lines.append(
            f"vs null:   z = {geo.null_z:,.1f} = (A − null − finite-d bias {geo.null_bias:.2g}) / sd {geo.null_sd:.2g} "
            f"(sd of A alone {geo.A_sd:.2g}; isotropic sd {f(geo.isotropic_sd, '.2g')}, isotropic z {f(geo.isotropic_z, ',.1f')})"
        )
    elif geo.null_z_withheld:
        lines.append(f"vs null:   no z: {geo.null_z_withheld}")
    if geo.unit_effective_rank is not None:
        lines.append(
            f"unit x̂:   erank of E[x̂x̂ᵀ] {geo.unit_effective_rank:.1f} of {geo.d}, top-1 {f(geo.unit_top1_share, '.1%')} "
            f"(uniform directions: {geo.d}, {1 / geo.d:.1%})"
        )
    lines.append(
        f"sign:      {s.regime}, q = {s.fraction_nonzero:.3f}, r = {s.magnitude_ratio:.3f}; null m̄²/s̄ = {s.null:.4f} "
        f"(1/π = {s.dense_relu_null:.4f}, q/2 = {s.sparse_exp_null:.4f}; matches: {s.canonical})"
    )
    lines.append(
        f"mean:      ‖μ‖ = {geo.mean_vector_norm:.4g} = {f(geo.mean_norm_ratio, '.3f')} of E‖x‖ ({geo.mean_row_norm:.4g}); "
        f"share of E‖x‖² {f(geo.mean_share_of_second_moment, '.1%')}; outlier severity {f(geo.outlier_severity, '.3g')}"
    )
    lines.append(
        f"spectrum:  top-1 {f(geo.top1_share, '.1%')}, top-10 {f(geo.top10_share, '.1%')}, "
        f"erank {geo.effective_rank:.1f} (isotropic noise of this n, d: {geo.noise_effective_rank:.1f}), "
        f"PR {geo.participation_ratio:.1f}, rank {geo.numerical_rank}, IsoScore {f(geo.isoscore, '.3f')}"
    )
    bulk = geo.mp_bulk or {}
    if geo.n_spikes is None and bulk.get("has_flat_bulk"):  # flat but not MP-shaped: correlated noise
        counted = (
            f"{bulk.get('verdict')}: KS distance to MP {f(bulk.get('mp_distance'), '.3g')} "
            f"> {f(bulk.get('mp_distance_threshold'), '.3g')} (white noise); no spike count "
            f"({bulk.get('n_spikes_fitted')} above the edge would be noise); power-law slope α = "
            f"{f(bulk.get('power_law_alpha'), '.3f')}{edge_spike_phrase(bulk)}"
        )
    elif geo.n_spikes is None:
        alpha = bulk.get("power_law_alpha")
        counted = (
            f"no flat bulk (it would hold {bulk.get('bulk_fraction', 0):.0%} of the eigenvalues, "
            f"{bulk.get('fraction_below_lower_edge', 0):.0%} of those below its lower edge): "
            f"power law, slope α = {f(alpha, '.3f')} over ranks {bulk.get('power_law_ranks')}{edge_spike_phrase(bulk)}"
        )
    else:
        counted = (
            f"{geo.n_spikes} spike(s) above edge + Tracy–Widom {100 * bulk.get('tracy_widom_quantile', 0.99):.0f}% "
            f"margin (bulk KS distance to MP {f(bulk.get('mp_distance'), '.3g')}, white-noise threshold "
            f"{f(bulk.get('mp_distance_threshold'), '.3g')})"
        )
    lines.append(
        f"MP null:   σ² = {geo.mp_sigma2_bulk:.4g} from the bulk (tr Σ/d = {f(geo.mp_sigma2_trace, '.4g')}), "
        f"bulk [{geo.mp_lower_edge:.4g}, {geo.mp_upper_edge:.4g}]{null_eigenvalue_phrase(bulk)}; {counted}"
    )
    if geo.median_row_norm:
        lines.append(f"rows:      median ‖x‖ ≈ {geo.median_row_norm:.4g}, largest ≈ {f(geo.max_row_norm_bin, '.4g')}")
    if geo.rogue.top_indices:
        top = ", ".join(f"#{i} {sh:.0%}" for i, sh in zip(geo.rogue.top_indices[:3], geo.rogue.top_shares[:3]))
        lines.append(
            f"rogue:     {geo.rogue.n_for_50} coordinate(s) carry 50% of ‖m̂‖², {geo.rogue.n_for_90} carry 90% (top: {top})"
        )
    lines += [f"note:      {note}" for note in geo.notes]
    return "\n".join(lines)


def render_geometry(result: Any) -> str:
    """`saegeo geometry`: the summary of a ``saegeo.report.geometry.FilesGeometry``, the artifact test (or why
    not), what exclusions left out, what position 0 carries, and the activation flags."""
    geo, artifact = result.geometry, result.artifact
    lines = [f"saegeo geometry: {len(result.files)} file(s)", geometry_summary(geo)]
    if artifact is not None:
        lines.append(f"artifact:  {artifact_text(artifact)} ({artifact['source']})")
    else:
        lines.append(
            "note:      artifact test not run: it needs activation stores (token ids and positions) and --artifact-components ≥ 1"
        )
    for path, extra in result.exclusions.items():  # stores cached with exclusions: what the left-out rows carried
        lines += [f"{path}: {line}" for line in exclusion_lines(extra)]
    first = (artifact or {}).get("first_position")  # what position 0 (BOS / attention sinks) carries
    if first:
        lines.append(
            f"position 0: {first['rows']:,} rows ({100 * first['row_share']:.2f}%) carry "
            f"{100 * first['mu_share']:.1f}% of ‖μ‖² and {100 * first['trace_share']:.1f}% of tr Σ"
        )
    lines += terminal_flags(result.flags)
    return "\n".join(lines)


# =========================================================================== shared with the pages
def exclusion_lines(manifest_extra: Mapping[str, Any]) -> list[str]:
    """Lines for a summary: what was excluded, then per group "label: rows (share), share of ‖μ‖², share of tr Σ,
    RMS norm ratio" (shares of all N rows, stored and excluded, said once in the first line; [] if nothing). Each
    label ends in a colon and a subgroup reads "of which …": a page's table collapses the terminal's padding."""
    rule, excl = manifest_extra.get("exclusion_rule"), manifest_extra.get("excluded")
    if not rule or not excl:
        return []
    what = []
    sp = rule["special_positions"]
    if sp["prefix"] or sp["suffix"]:
        what.append("special positions " + " … ".join(" ".join(t) for t in (sp["prefix"], sp["suffix"]) if t))
    if rule.get("norm_rule"):
        what.append(rule["norm_rule"])
    lines = [
        f"excluded from the store: {'; '.join(what)} (shares below of all {excl['all']['n']:,} rows, stored + excluded)"
    ]
    names = {
        "excluded": "all excluded rows",
        "excluded_special": "special positions",
        "excluded_norm": "norm outliers",
        "first_position": "first position (stored or not)",
    }
    # groups that are the same rows (all excluded = the special positions = position 0, as with BOS only): one line
    merged: dict[str, list[str]] = {}
    from saegeo.activations.cache import exclusion_shares  # here: `saegeo geometry` need not load the cache

    for g, sh in exclusion_shares(excl).items():
        numbers = (
            f"{sh['rows']:,} rows ({100 * sh['row_share']:.2f}%), {100 * sh['mu_share']:.1f}% of ‖μ‖², "
            f"{100 * sh['trace_share']:.1f}% of tr Σ, RMS norm {sh['norm_ratio']:.1f}× the average"
        )
        merged.setdefault(numbers, []).append(g)
    for numbers, groups in merged.items():
        # a part of the excluded rows reads as one (indented for the terminal); a group equal to them does not
        of_which = "  of which " if groups[0] in ("excluded_special", "excluded_norm") else ""
        label = of_which + " = ".join(names[g] for g in groups) + ":"
        lines.append(f"{label:<42} {numbers}")
    return lines


def artifact_text(artifact: dict[str, Any]) -> str:
    """'|corr(PC_j, ·)|: log freq a, position b, ‖x‖ c' for each tested principal direction."""
    absr = artifact["abs"]
    parts = [
        f"PC{j + 1}: log freq {fmt_num(absr['log_frequency'][j], 2)}, position {fmt_num(absr['position'][j], 2)}, "
        f"‖x‖ {fmt_num(absr['norm'][j], 2)}"
        for j in range(int(artifact["k"]))
    ]
    return "|corr| " + "; ".join(parts)


# =========================================================================== eval, train, cache, store, synth, run
def render_eval(result: Mapping[str, Any]) -> str:
    """The terminal summary of one `splice_eval` result."""
    lines = [
        f"saegeo eval: {result['sae']} spliced into {result['model']} at {result['hook']}",
        f"  {result['tokens']:,} tokens ({result['windows']} windows of ≤ {result['context']}, "
        f"{result['skipped_tokens']:,} corpus tokens skipped as training data), "
        f"{result['tokens_per_second']:,.0f} tok/s",
    ]
    if "ce_loss_clean" in result:
        rows = [
            ("CE loss clean", "ce_loss_clean"),
            ("CE loss spliced", "ce_loss_spliced"),
            ("CE loss zero ablation", "ce_loss_zero_ablation"),
            ("CE loss mean ablation", "ce_loss_mean_ablation"),
            ("CE loss recovered", "ce_loss_recovered"),
            ("KL(clean ‖ spliced)", "kl_div_spliced"),
            ("KL(clean ‖ zero)", "kl_div_zero_ablation"),
        ]
    else:
        lines.append(f"  measured: {result['measured']}")
        rows = [
            ("cosine spliced", "embedding_cosine_spliced"),
            ("cosine zero ablation", "embedding_cosine_zero_ablation"),
            ("cosine mean ablation", "embedding_cosine_mean_ablation"),
        ]
    rows += [("FVE (about the mean)", "fve"), ("L0", "l0")]
    lines += [f"  {label:<24} {result[key]:.4f}" for label, key in rows]
    pt = result["passed_through"]
    what = ", ".join(pt["special_positions"]) or "none"
    lines.append(
        f"  passed through unreplaced: {pt['positions']:,} positions (special: {what}"
        + (f"; {pt['norm_rule']}" if pt["norm_rule"] else "")
        + ")"
    )
    return "\n".join(lines)


def _passes(provenance: dict) -> str:
    passes, rows = provenance.get("passes_over_data"), provenance.get("training_rows")
    if passes is None:
        return "— (a stream: one pass, its length unknown)"
    return f"{passes:.1f} passes over the {rows:,} training rows" + (" (each reshuffled)" if passes > 1 else "")


def render_train(result: Any) -> str:
    """The trainer's summary of a ``saegeo.sae.train.TrainResult``: architecture, tokens, held-out metrics."""
    cfg, h = result.config, result.heldout
    live = result.history[-1] if result.history else {}
    rows = [
        ("architecture", f"{cfg.arch} {get_architecture(cfg.arch).option_summary(cfg)}"),
        ("d_in → d_sae", f"{result.sae.cfg.d_in} → {result.sae.cfg.d_sae}"),
        ("b_dec init", cfg.b_dec_init),
        ("tokens trained", f"{cfg.total_steps * cfg.batch_tokens:,} ({cfg.total_steps} steps of {cfg.batch_tokens})"),
        ("passes over the data", _passes(result.provenance)),
        ("throughput", f"{live.get('tok_s', float('nan')):,.0f} tokens/s"),
        (
            "held-out tokens",
            f"{h.get('tokens', 0):,}"
            + (f" ({h['nonfinite_rows_skipped']:,} non-finite rows skipped)" if "nonfinite_rows_skipped" in h else ""),
        ),
        ("held-out FVE", f"{h.get('fve', float('nan')):.4f}"),
        ("held-out MSE", f"{h.get('mse', float('nan')):.5g}"),
        ("held-out L0", f"{h.get('l0', float('nan')):.1f}"),
        ("dead latents", f"{h.get('dead_fraction', float('nan')):.2%} (never fire on held-out)"),
        ("dense latents", f"{h.get('dense_fraction', float('nan')):.2%} (fire on > 50% of held-out)"),
        ("max |cos(u_i, μ)|", f"{h.get('max_abs_cos_mean', float('nan')):.3f}"),
        (
            "‖b_dec − μ‖/‖μ‖",
            f"{h.get('b_dec_dist_to_mean', float('nan')):.3f} (‖μ‖ = {h.get('mean_norm', 0):.3g})",
        ),
        ("saved to", str(cfg.out_dir) if cfg.out_dir else "(not saved: give --out)"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def render_cache(result: Any) -> str:
    """A ``saegeo.activations.cache.CacheResult``: tokens, speed, where the forward pass stopped, each store."""
    stop = "whole model" if result.stop_layer is None else f"stopped after block {result.stop_layer}"
    lines = [
        f"cached {result.new_tokens:,} new tokens in {result.seconds:.1f} s "
        f"({result.tokens_per_second:,.0f} tokens/s, {stop})"
    ]
    for hook, path in result.stores.items():
        lines.append(
            f"  {hook:<32} {result.n_tokens[hook]:>12,} tokens  {result.bytes[hook] / 2**20:>9.1f} MiB  {path}"
        )
    return "\n".join(lines)


def render_store(store: Any, problems: list[str] | None = None) -> str:
    """`saegeo store info` (problems None) or `saegeo store verify` (the problems ``store.verify()`` found)."""
    state = "complete" if store.complete else "INCOMPLETE (interrupted; rerun the cache command to resume)"
    lines = [
        f"{store.path}: {store.n_tokens:,} tokens x d={store.d} {store.dtype} in {len(store.shards)} shards, {state}"
    ]
    if problems is None:
        lines.append(f"  model:  {store.model}\n  hook:   {store.hook}")
        lines += [f"  corpus.{key}: {value}" for key, value in store.corpus.items() if key != "files"]
        lines.append(f"  bytes:  {sum(s.bytes for s in store.shards):,}")
        return "\n".join(lines)
    lines += [f"  BAD {problem}" for problem in problems]
    lines.append(f"{len(problems)} problem(s)" if problems else "OK: all shards match their sha256 and row counts")
    return "\n".join(lines)


def render_synth(preset: str, n: int, cfg: Any, truth: Any, predicted: float, written: list[str]) -> str:
    """`saegeo synth`: the generator's truth (dictionary, codes, offset, noise) and the law's prediction."""
    t = truth
    return "\n".join(
        [
            f"saegeo synth: preset {preset}, {n:,} rows × d={cfg.d}, N={cfg.n_features} features, seed {cfg.seed}",
            f"  dictionary: tilt {t.tilt:.4f}, A_dict {t.a_dict:.5f}, ‖ū‖² {t.mean_sq_norm:.5f}",
            f"  codes:      {cfg.magnitude} magnitudes, r {t.r:.4f}, q {t.q:.4f}, K {t.K:.2f}",
            f"  offset ‖b‖ {float(t.offset.norm()):.4f}, noise sd {t.noise_std:.4g}, RMS signal norm {t.signal_rms:.4f}"
            + (", whitened" if t.whitening is not None else ""),
            f"  law: A of Σ a_i u_i ≈ {predicted:.4f} (exact-moment form)",
            f"  wrote {' and '.join(written)}",
        ]
    )


def render_run(result: Any, seconds: float) -> str:
    """`saegeo run`: the stages' times, then where the report's files went (the HTML page first)."""
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in result.seconds.items())
    lines = [f"done in {seconds:.0f} s ({stages})"]
    if "html" in result.files:
        lines.append(f"HTML report: {result.files['html']}")
    rest = {fmt: path for fmt, path in result.files.items() if fmt != "html"}
    return "\n".join(lines + ([render_files(rest)] if rest else []))


def render_files(paths: Mapping[str, Any]) -> str:
    """One '<format>: <path>' line per file written ({format: path})."""
    return "\n".join(f"{fmt:>8}: {path}" for fmt, path in paths.items())


def render_written(paths: Mapping[str, Any]) -> str:
    """'wrote a, b, c' for the files a writer returned ({format: path})."""
    return "wrote " + ", ".join(str(p) for p in paths.values())


def render_sweep_cache(cache: Mapping[str, Any]) -> str:
    """The line `saegeo sweep --model` prints once it has cached every hook in one pass."""
    return f"cached {len(cache['hooks'])} hook(s) in one pass: {cache['new_tokens']:,} new tokens in {cache['seconds']:.1f} s"
