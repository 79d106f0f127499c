"""The `saegeo` command line: geometry | cache | store | train | report | check | synth | run | eval.

Each subcommand has one `_add_<name>(subparsers)` function that declares its arguments and one
`cmd_<name>(args)` function that calls the library. Heavy imports happen inside the commands so that
`saegeo --help` is instant.
"""

from __future__ import annotations

import argparse
import sys


from saegeo.errors import SaegeoError


class CLIError(SaegeoError):
    """A usage error found by the command line itself."""


# --------------------------------------------------------------------------- geometry
def _add_geometry(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "geometry",
        help="geometry summary of 2-D tensors in .safetensors/.npy/.pt files or activation stores",
        description="Stream the rows of one or more files (or activation-store directories) through one "
        "GeometryAccumulator and print the activation geometry: offset, A against the sign-aware null, "
        "mean vs spread, spectrum vs Marchenko-Pastur, IsoScore, rogue dimensions. Memory does not grow with rows.",
    )
    p.add_argument("files", nargs="+", help="files (.safetensors, .npy, .pt) or store directories, streamed in order")
    p.add_argument("--key", default=None, help="tensor name in .safetensors/.pt files (default: 'activations' or the only 2-D tensor)")
    p.add_argument("--json", dest="json_out", default=None, help="write the full result (all eigenvalues, top eigenvectors) as JSON here")
    p.add_argument("--batch-size", type=int, default=8192, help="rows read per batch (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=10, help="top eigenvectors kept in the JSON (default: %(default)s)")
    p.add_argument("--skip-nonfinite", action="store_true", help="skip and count rows with NaN/inf instead of stopping")
    p.add_argument("--float64", action="store_true", help="form the batch grams in float64 (slower; default: float32 on shifted rows)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_geometry)


def cmd_geometry(args: argparse.Namespace) -> int:
    import json

    import torch
    from tqdm import tqdm

    from saegeo.activations.sources import open_rows
    from saegeo.io import dump_json
    from saegeo.geometry.accumulate import GeometryAccumulator
    from saegeo.geometry.measures import activation_geometry

    if args.batch_size < 1:
        raise CLIError(f"--batch-size must be ≥ 1, got {args.batch_size}")
    sources = [(path, open_rows(path, key=args.key)) for path in args.files]
    dims = {rows.d for _, rows in sources}
    if len(dims) > 1:
        raise CLIError("files disagree on d: " + ", ".join(f"{p}: d={rows.d}" for p, rows in sources))
    d = dims.pop()
    acc = GeometryAccumulator(
        d, skip_nonfinite=args.skip_nonfinite, gram_dtype=torch.float64 if args.float64 else None
    )
    total = sum(rows.n_rows for _, rows in sources)
    with tqdm(total=total, unit="row", unit_scale=True, disable=args.no_progress, desc="geometry") as bar:
        for path, rows in sources:
            for batch in rows.batches(args.batch_size)[0]:
                acc.add(batch, source=path)
                bar.update(len(batch))
    geo = activation_geometry(acc, top_k_eigvecs=args.top_k)
    print(f"saegeo geometry: {len(sources)} file(s)")
    print(geo.summary())
    from saegeo.activations.cache import describe_exclusions

    for path, rows in sources:  # stores cached with exclusions: what the left-out rows carried
        extra = rows.store.manifest.get("extra", {}) if rows.store is not None else {}
        for line in describe_exclusions(extra):
            print(f"{path}: {line}")
    if args.json_out:
        out = {"files": list(args.files), **geo.to_dict()}
        dump_json(out, args.json_out)
        print(f"wrote {args.json_out}")
    return 0


# --------------------------------------------------------------------------- cache
def _add_cache(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cache",
        help="run a model over a corpus and store hook activations (one resumable store per hook)",
        description="Cache activations of one or more hooks from a single forward pass. Rerunning the same "
        "command resumes an interrupted run; the result is identical to an uninterrupted one.",
    )
    p.add_argument("--model", default="minilm", help="'minilm' (bundled), a local HF dir, a cached hub name, or a .json HookedTransformerConfig")
    p.add_argument("--hooks", default="blocks.3.hook_resid_post", help="comma-separated hook names (default: %(default)s)")
    p.add_argument("--corpus", default="default", help="'default' (pydoc topics), files, dirs, globs, .jsonl; comma-separated")
    p.add_argument("--context", type=int, default=128, help="tokens per window, special tokens included (default: %(default)s)")
    p.add_argument("--out", default="artifacts/acts/minilm", help="output directory; each hook gets OUT/<hook>/ (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after this many stored tokens")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"], help="storage dtype")
    p.add_argument("--batch-size", type=int, default=32, help="windows per forward pass (default: %(default)s)")
    p.add_argument("--shard-rows", type=int, default=65536, help="rows per shard (default: %(default)s)")
    p.add_argument("--exclude-special", action="store_true", help="do not store [CLS]/[SEP]/BOS positions (the model still sees them)")
    p.add_argument("--exclude-norm-ratio", type=float, default=None, metavar="M",
                   help="do not store rows whose norm exceeds M x their window's median norm (attention sinks); counted in the manifest")
    p.add_argument("--text-field", default="text", help="JSONL field holding the text (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace existing stores instead of resuming them")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_cache)


def cmd_cache(args: argparse.Namespace) -> int:
    from saegeo.activations.cache import CacheConfig, cache_activations

    cfg = CacheConfig(
        model=args.model, hooks=tuple(h.strip() for h in args.hooks.split(",") if h.strip()), corpus=args.corpus,
        context=args.context, out=args.out, max_tokens=args.max_tokens, dtype=args.dtype,
        batch_size=args.batch_size, shard_rows=args.shard_rows, exclude_special=args.exclude_special,
        exclude_norm_ratio=args.exclude_norm_ratio, text_field=args.text_field, overwrite=args.overwrite, progress=not args.no_progress,
    )
    try:
        result = cache_activations(cfg)
    except KeyboardInterrupt:
        print("saegeo cache: interrupted; whole shards are kept. Rerun the same command to resume.", file=sys.stderr)
        raise
    stop = "whole model" if result.stop_layer is None else f"stopped after block {result.stop_layer}"
    print(f"cached {result.new_tokens:,} new tokens in {result.seconds:.1f} s "
          f"({result.tokens_per_second:,.0f} tokens/s, {stop})")
    for hook, path in result.stores.items():
        print(f"  {hook:<32} {result.n_tokens[hook]:>12,} tokens  {result.bytes[hook] / 2**20:>9.1f} MiB  {path}")
    return 0


# --------------------------------------------------------------------------- store
def _add_store(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("store", help="inspect or verify an activation store")
    ssub = p.add_subparsers(dest="store_command", required=True)
    v = ssub.add_parser("verify", help="re-hash every shard; name missing, truncated or corrupt shards")
    v.add_argument("path")
    v.set_defaults(func=cmd_store)
    i = ssub.add_parser("info", help="print a store's manifest summary")
    i.add_argument("path")
    i.set_defaults(func=cmd_store)


def cmd_store(args: argparse.Namespace) -> int:
    from saegeo.activations.store import ActivationStore

    store = ActivationStore(args.path, allow_incomplete=True)
    state = "complete" if store.complete else "INCOMPLETE (interrupted; rerun the cache command to resume)"
    print(f"{store.path}: {store.n_tokens:,} tokens x d={store.d} {store.dtype} in {len(store.shards)} shards, {state}")
    if args.store_command == "info":
        print(f"  model:  {store.model}\n  hook:   {store.hook}")
        for key, value in store.corpus.items():
            if key != "files":
                print(f"  corpus.{key}: {value}")
        print(f"  bytes:  {sum(s.bytes for s in store.shards):,}")
        return 0
    problems = store.verify()
    for problem in problems:
        print(f"  BAD {problem}")
    print(f"{len(problems)} problem(s)" if problems else "OK: all shards match their sha256")
    return 1 if problems else 0


# --------------------------------------------------------------------------- synth
def _add_synth(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth",
        help="write synthetic superposition activations with known truth (store + truth.safetensors)",
        description="x = b + Σ a_i u_i + ε from a seeded generator; writes an activation store at --out "
        "and the ground truth (dictionary, offset, rates) to OUT/truth.safetensors. Options override the preset.",
    )
    from saegeo.synthetic.superposition import MAGNITUDES, PRESETS

    p.add_argument("--preset", choices=sorted(PRESETS), default="isotropic", help="regime (default isotropic)")
    p.add_argument("--n", type=int, required=True, help="number of rows (tokens)")
    p.add_argument("--out", required=True, help="store directory to create, or FILE.safetensors for one file (rows held in memory)")
    p.add_argument("--d", type=int, help="activation dimension (default 512)")
    p.add_argument("--n-features", type=int, help="dictionary size N (default 4096)")
    p.add_argument("--tilt", type=float, help="cosine of every direction with the common one (A_dict ≈ tilt²)")
    p.add_argument("--target-a-dict", type=float, help="solve the tilt for this dictionary anisotropy")
    p.add_argument("--rate", type=float, help="mean firing rate q (default 0.02)")
    p.add_argument("--rate-law", choices=["uniform", "zipf"], help="per-feature rates")
    p.add_argument("--magnitude", choices=MAGNITUDES, help="magnitude law of active codes")
    p.add_argument("--offset", type=float, help="‖b‖ relative to the RMS signal norm")
    p.add_argument("--noise", type=float, help="RMS noise norm relative to the RMS signal norm")
    p.add_argument("--groups", type=int, dest="n_groups", help="number of co-firing groups")
    p.add_argument("--group-size", type=int, help="features per co-firing group")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32", help="storage dtype")
    p.add_argument("--shard-rows", type=int, default=65536)
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at --out")
    p.set_defaults(func=cmd_synth)


def cmd_synth(args: argparse.Namespace) -> int:
    from pathlib import Path

    from saegeo.geometry.amplification import exact_moment_prediction
    from saegeo.synthetic import SuperpositionGenerator, preset

    names = ("d", "n_features", "tilt", "target_a_dict", "rate", "rate_law", "magnitude", "offset", "noise",
             "n_groups", "group_size")
    cfg = preset(args.preset, seed=args.seed, **{k: getattr(args, k) for k in names})
    if args.n < 1:
        raise CLIError(f"--n must be at least 1, got {args.n}")
    out = Path(args.out)
    single_file = out.suffix == ".safetensors"
    if (out.exists() if single_file else (out / "manifest.json").exists()) and not args.overwrite:
        raise CLIError(f"{args.out} already exists; pass --overwrite to replace it or choose another --out")
    gen = SuperpositionGenerator(cfg)
    if single_file:
        truth_path = gen.write_safetensors(out, args.n, dtype=args.dtype)
    else:
        from saegeo.pipeline import write_synthetic_store

        write_synthetic_store(
            gen, out, args.n, shard_rows=args.shard_rows, dtype=args.dtype,
            mode="overwrite" if args.overwrite else "create", progress=sys.stderr.isatty(),
        )
        truth_path = out / "truth.safetensors"
    t = gen.truth
    predicted = exact_moment_prediction(t.K, t.q, t.r, t.mean_sq_norm)
    print(f"saegeo synth: preset {args.preset}, {args.n:,} rows × d={cfg.d}, N={cfg.n_features} features, seed {cfg.seed}")
    print(f"  dictionary: tilt {t.tilt:.4f}, A_dict {t.a_dict:.5f}, ‖ū‖² {t.mean_sq_norm:.5f}")
    print(f"  codes:      {cfg.magnitude} magnitudes, r {t.r:.4f}, q {t.q:.4f}, K {t.K:.2f}")
    print(f"  offset ‖b‖ {float(t.offset.norm()):.4f}, noise sd {t.noise_std:.4g}, RMS signal norm {t.signal_rms:.4f}"
          + (", whitened" if t.whitening is not None else ""))
    print(f"  law: A of Σ a_i u_i ≈ {predicted:.4f} (exact-moment form)")
    print(f"  wrote {args.out} and {truth_path}")
    return 0


# --------------------------------------------------------------------------- check
def _add_check(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check", help="checks on a published or trained dictionary (any supported format), optionally with activations",
        description="Load a dictionary (SAELens dir, sparsify dir, dictionary_learning ae.pt, Gemma Scope params.npz, "
                    "OpenAI .pt; auto-detected) and check it: A_dict and spectrum, decoder norms, zero and near-duplicate "
                    "rows, encoder-decoder alignment, b_dec vs the mean direction, config. With --acts, the full "
                    "geometry report on those activations plus these checks.",
    )
    p.add_argument("path", help="dictionary file or directory")
    p.add_argument("--acts", help="activation store (directory) or .safetensors/.npy file: adds the full geometry report")
    p.add_argument("--out", help="directory for summary.txt, .md, .json, .html")
    p.add_argument("--duplicate-cos", type=float, default=0.99, help="cosine above which two decoder rows are near-duplicates (0.99)")
    p.add_argument("--block-rows", type=int, default=4096, help="rows per block of the duplicate search (memory ~ block² floats)")
    p.add_argument("--max-tokens", type=int, default=None, help="with --acts: stop after this many tokens")
    p.add_argument("--format", nargs="+", default=["terminal", "md", "json", "html"], choices=["terminal", "md", "json", "html"],
                   help="renderings written to --out")
    p.add_argument("--fail-on", choices=["never", "warning", "error"], default="never",
                   help="exit with status 1 when a flag of this severity or worse is raised (for CI)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from pathlib import Path

    from saegeo.report.check import CheckOptions, check_dictionary, check_with_activations
    from saegeo.report.render import render_check_terminal, write_report
    from saegeo.sae.formats import load_dictionary

    sae = load_dictionary(args.path)
    opts = CheckOptions(duplicate_cos=args.duplicate_cos, block_rows=args.block_rows, progress=not args.no_progress)
    name = Path(args.path).resolve().name
    if args.acts:
        from saegeo.report.render import render_terminal
        from saegeo.report.report import ReportOptions

        report, _ = check_with_activations(
            sae, args.acts, options=opts, name=name,
            report_options=ReportOptions(max_tokens=args.max_tokens, progress=not args.no_progress),
        )
        print(render_terminal(report), end="")
        flags = report.flags
        if args.out:
            paths = write_report(report, args.out, formats=tuple(args.format))
            print(f"wrote {', '.join(str(p) for p in paths.values())}")
    else:
        check = check_dictionary(sae, options=opts, name=name)
        print(render_check_terminal(check), end="")
        flags = check.flags
        if args.out:
            paths = write_report(check, args.out, formats=tuple(args.format))
            print(f"wrote {', '.join(str(p) for p in paths.values())}")
    if args.fail_on == "never":
        return 0
    from saegeo.report.flags import SEVERITIES

    worst = SEVERITIES.index(args.fail_on)
    return 1 if any(SEVERITIES.index(f.severity) >= worst for f in flags) else 0


# --------------------------------------------------------------------------- report
def _add_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="geometry report of an activation store, with SAEs side by side and flags")
    p.add_argument("--acts", required=True, help="activation store directory (from `saegeo cache`)")
    p.add_argument("--sae", action="append", default=[], metavar="[NAME=]DIR",
                   help="SAE directory (SAELens layout); repeat for several, shown side by side")
    p.add_argument("--out", required=True, help="output directory: summary.txt, report.md, report.json, report.html")
    p.add_argument("--format", default="terminal,md,json,html", help="comma-separated subset of terminal,md,json,html")
    p.add_argument("--batch-size", type=int, default=8192)
    p.add_argument("--max-tokens", type=int, default=None, help="read at most this many rows")
    p.add_argument("--skip-nonfinite", action="store_true", help="skip and count NaN/inf rows instead of stopping")
    p.add_argument("--assumed-null", type=float, default=0.0,
                   help="baseline a reader compares A with (wrong-null flag); default 0")
    p.add_argument("--config", default=None, help="JSON/TOML preprocessing config to check (e.g. a SAELens cfg.json)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default=None,
                   help="also splice each SAE into this model (as `saegeo eval`): CE loss recovered and KL per SAE column")
    p.add_argument("--eval-tokens", type=int, default=None, help="with --model: tokens evaluated (default: as saegeo eval)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from saegeo.report import ReportOptions, geometry_report, render_terminal, write_report

    saes = {}
    for spec in args.sae:
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        name = name or Path(path).name
        if name in saes:
            raise CLIError(f"two SAEs named {name!r}; give them names with --sae NAME=DIR")
        saes[name] = path
    config = None
    if args.config:
        text = Path(args.config).read_text()
        if args.config.endswith(".toml"):
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib

            config = tomllib.loads(text)
        else:
            config = json.loads(text)
    opts = ReportOptions(batch_size=args.batch_size, max_tokens=args.max_tokens, skip_nonfinite=args.skip_nonfinite,
                         assumed_null=args.assumed_null, device=args.device, progress=not args.no_progress)
    report = geometry_report(args.acts, saes or None, options=opts, config=config)
    if args.model and saes:
        from saegeo.report.report import add_splice, compute_flags
        from saegeo.sae.splice import EvalConfig, splice_eval_many

        ecfg = EvalConfig(model=args.model, progress=not args.no_progress)
        if args.eval_tokens:
            ecfg.max_tokens = args.eval_tokens
        add_splice(report, splice_eval_many(ecfg, saes))
        report.flags = compute_flags(report, opts.thresholds)
    from saegeo.distributed import current

    if (ctx := current()) is not None and not ctx.is_main:
        return 0  # under torchrun every rank holds the merged report; rank 0 renders it
    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    paths = write_report(report, args.out, formats)
    print(render_terminal(report))
    for fmt, path in paths.items():
        print(f"{fmt:>8}: {path}")
    return 0


# --------------------------------------------------------------------------- eval
def _add_eval(sub: argparse._SubParsersAction) -> None:
    from saegeo.sae.splice import EvalConfig

    d = EvalConfig()
    p = sub.add_parser(
        "eval", help="splice an SAE into the model at its hook: CE loss recovered, KL, FVE, L0 on held-out text",
        description="Replace the hook's activations by the SAE's reconstruction and run the rest of the model: "
        "CE loss clean / spliced / zero-ablated / mean-ablated, ce_loss_recovered = (zero - spliced)/(zero - clean), "
        "KL(clean || spliced) per token. Positions the SAE never saw in training (BOS) are passed through. "
        "For an encoder (MiniLM) the cosine of clean and spliced mean-pooled sentence embeddings is measured instead.",
    )
    p.add_argument("--model", default=d.model, help="'smollm2' (bundled decoder), 'minilm', a local HF dir, ... (default: %(default)s)")
    p.add_argument("--sae", required=True, help="SAE directory or file in any supported format (native or published)")
    p.add_argument("--hook", default=None, help="hook to splice at (default: the hook named in the SAE's metadata)")
    p.add_argument("--corpus", default=d.corpus, help="text to evaluate on, as for `saegeo cache` (default: %(default)s)")
    p.add_argument("--context", type=int, default=None, help="tokens per window (default: the SAE's training context, else 128)")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="tokens evaluated (default: %(default)s)")
    p.add_argument("--skip-tokens", type=int, default=None,
                   help="skip this many corpus tokens first (default: the SAE's training-store size when it was trained on this corpus)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="windows per batch (default: %(default)s)")
    p.add_argument("--replace-special", action="store_true", help="splice at BOS/[CLS]/[SEP] too (default: as in the SAE's training)")
    p.add_argument("--pass-norm-ratio", type=float, default=None, metavar="M",
                   help="also pass through rows with norm > M x the window's median (default: as in the SAE's training store)")
    p.add_argument("--json", dest="json_out", default=None, help="write the result as JSON here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from saegeo.io import dump_json
    from saegeo.sae.splice import EvalConfig, render_eval, splice_eval

    cfg = EvalConfig(model=args.model, sae=args.sae, hook=args.hook, corpus=args.corpus, context=args.context,
                     max_tokens=args.max_tokens, skip_tokens=args.skip_tokens, batch_size=args.batch_size,
                     pass_special=False if args.replace_special else None, pass_norm_ratio=args.pass_norm_ratio,
                     progress=not args.no_progress)
    result = splice_eval(cfg)
    print(render_eval(result))
    if args.json_out:
        dump_json(result, args.json_out)
        print(f"wrote {args.json_out}")
    return 0


# --------------------------------------------------------------------------- run
def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="the main job from a TOML config: cache -> train SAEs -> report (idempotent)")
    p.add_argument("config", help="TOML run config, e.g. configs/demo.toml")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    import time

    from saegeo.pipeline import load_run_config, run_job

    t0 = time.perf_counter()
    result = run_job(load_run_config(args.config))
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in result.seconds.items())
    print(f"done in {time.perf_counter() - t0:.0f} s ({stages})")
    if "html" in result.files:
        print(f"HTML report: {result.files['html']}")
    for fmt, path in result.files.items():
        if fmt != "html":
            print(f"{fmt:>8}: {path}")
    return 0


# --------------------------------------------------------------------------- train
def _parse_tokens(text: str) -> int:
    """'2M' / '500k' / '1.5e6' / '737280' -> number of tokens."""
    t = str(text).strip().lower().replace("_", "")
    mult = {"k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}.get(t[-1:], 1)
    try:
        value = float(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise CLIError(f"cannot read a token count from {text!r}; write e.g. 2M, 500k or 737280") from None
    if value < 1:
        raise CLIError(f"token count must be positive, got {text!r}")
    return int(value)


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train an SAE (b_dec := mean, unit-norm decoder) on an activation store")
    p.add_argument("--acts", help="activation store directory (or `acts = ...` in the config)")
    p.add_argument("--config", help="TOML file with TrainConfig keys (top level or a [train] table); flags override it")
    p.add_argument("--out", help="output directory: SAE in the SAELens layout + checkpoint/")
    p.add_argument("--arch", choices=["topk", "relu"])
    p.add_argument("--k", type=int, help="active latents per token (topk)")
    p.add_argument("--expansion", type=int, help="d_sae = expansion x d_in (default 8)")
    p.add_argument("--d-sae", type=int, help="number of latents (overrides --expansion)")
    p.add_argument("--tokens", type=_parse_tokens, help="training tokens, e.g. 2M or 500k (default 2M)")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--l1", type=float, dest="l1_coefficient", help="L1 coefficient (relu)")
    p.add_argument("--b-dec-init", choices=["mean", "zeros", "geometric_median"])
    p.add_argument("--heldout-fraction", type=float)
    p.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (0: none)")
    p.add_argument("--seed", type=int)
    p.add_argument("--device")
    p.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint in --out")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    import tomllib

    from saegeo.sae.train import TrainConfig, train_sae

    options: dict = {}
    acts = None
    if args.config:
        try:
            with open(args.config, "rb") as f:
                doc = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise CLIError(f"{args.config}: cannot read the TOML config ({err})") from None
        table = dict(doc.get("train", doc))
        acts = table.pop("acts", None) or doc.get("acts")
        if "tokens" in table:
            table["total_tokens"] = _parse_tokens(table.pop("tokens"))
        if isinstance(table.get("total_tokens"), str):
            table["total_tokens"] = _parse_tokens(table["total_tokens"])
        if "out" in table:
            table["out_dir"] = table.pop("out")
        options.update({k: v for k, v in table.items() if not isinstance(v, dict)})
    flags = {
        "arch": args.arch, "k": args.k, "expansion": args.expansion, "d_sae": args.d_sae,
        "total_tokens": args.tokens, "batch_size": args.batch_size, "lr": args.lr,
        "l1_coefficient": args.l1_coefficient, "b_dec_init": args.b_dec_init,
        "heldout_fraction": args.heldout_fraction, "checkpoint_every": args.checkpoint_every,
        "seed": args.seed, "device": args.device, "out_dir": args.out,
    }
    options.update({k: v for k, v in flags.items() if v is not None})
    if args.no_progress:
        options["progress"] = False
    acts = args.acts or acts
    if not acts:
        raise CLIError("saegeo train needs --acts STORE (or `acts = \"...\"` in the --config file)")
    cfg = TrainConfig.from_dict(options)
    result = train_sae(cfg, acts, resume=not args.no_resume)
    from saegeo.distributed import current

    if (ctx := current()) is not None and not ctx.is_main:
        return 0  # under torchrun rank 0 prints the summary (every rank holds the same SAE)
    h, live = result.heldout, (result.history[-1] if result.history else {})
    rows = [
        ("architecture", f"{cfg.arch}" + (f" k={cfg.k}" if cfg.arch == "topk" else f" l1={cfg.l1_coefficient:g}")),
        ("d_in -> d_sae", f"{result.sae.cfg.d_in} -> {result.sae.cfg.d_sae}"),
        ("b_dec init", cfg.b_dec_init),
        ("tokens trained", f"{cfg.total_steps * cfg.batch_size:,} ({cfg.total_steps} steps of {cfg.batch_size})"),
        ("throughput", f"{live.get('tok_s', float('nan')):,.0f} tokens/s"),
        ("held-out tokens", f"{h.get('tokens', 0):,}"),
        ("held-out FVE", f"{h.get('fve', float('nan')):.4f}"),
        ("held-out MSE", f"{h.get('mse', float('nan')):.5g}"),
        ("held-out L0", f"{h.get('l0', float('nan')):.1f}"),
        ("dead latents", f"{h.get('dead_fraction', float('nan')):.2%} (never fire on held-out)"),
        ("dense latents", f"{h.get('dense_fraction', float('nan')):.2%} (fire on > 50% of held-out)"),
        ("max |cos(W_dec, mean)|", f"{h.get('max_abs_cos_mean', float('nan')):.3f}"),
        ("|b_dec - mean| / |mean|", f"{h.get('b_dec_dist_to_mean', float('nan')):.3f} (|mean| = {h.get('mean_norm', 0):.3g})"),
        ("saved to", str(cfg.out_dir) if cfg.out_dir else "(not saved: give --out)"),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="saegeo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_geometry, _add_cache, _add_store, _add_synth, _add_check, _add_report, _add_run, _add_train, _add_eval):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SaegeoError as err:
        print(f"saegeo: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("saegeo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
