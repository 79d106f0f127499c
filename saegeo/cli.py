"""The `saegeo` command line: geometry | sweep | cache | store | train | report | check | synth | run | eval.

Each subcommand has one `_add_<name>(subparsers)` function that declares its arguments and one
`cmd_<name>(args)` function that calls the library. Heavy imports happen inside these functions, never at
the top of this module. The options of cache, train, report and check are generated from their config
dataclasses (`_add_config_options`): the dataclass is the one place for a name, default, choice list and help.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import sys
import textwrap
import tokenize
import types
import typing
from io import StringIO
from typing import Any, Literal, Mapping

from saegeo.errors import SaegeoError


class CLIError(SaegeoError):
    """A usage error found by the command line itself."""


# --------------------------------------------------------------------------- options from config dataclasses
# The config dataclasses (CacheConfig, TrainConfig, ReportOptions, CheckOptions) are the one statement of each
# option: its name, type, default, choices (Literal) and help (the field's trailing `# comment`). The commands'
# options are generated from them, so the CLI, the TOML keys and the Python API cannot drift apart.
@functools.cache
def _field_help(cls: type) -> dict[str, str]:
    """Field name -> the trailing `# comment` on its line in the class body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source shipped: generic help
        return {}
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    body = ast.parse(source).body[0].body
    return {
        node.target.id: comments[node.end_lineno]
        for node in body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.end_lineno in comments
    }


def _int_arg(text: str) -> int:
    """Whole numbers, size-aware: 4096, 0, 500k, 2M."""
    from saegeo.io import parse_int

    try:
        return parse_int(text)
    except SaegeoError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _list_arg(item: type) -> Any:
    """A comma-separated list ("a,b") as a tuple of ``item``."""

    def parse(text: str) -> tuple:
        try:
            return tuple(item(part.strip()) for part in text.split(",") if part.strip())
        except (ValueError, argparse.ArgumentTypeError) as err:
            raise argparse.ArgumentTypeError(f"cannot read a comma-separated list from {text!r} ({err})") from None

    return parse


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _add_config_options(parser: argparse.ArgumentParser, cls: type, *, names: Mapping[str, str] | None = None) -> None:
    """One ``--kebab-case`` option per field of config dataclass ``cls`` (nested dataclasses excepted).

    Options the user does not pass stay out of the namespace (default=SUPPRESS), so ``_passed`` returns only
    what was given: the dataclass default, or a config file's value, holds otherwise. ``names`` maps a field
    to its flag where the flag predates the field name (``total_tokens``: ``--tokens``). Booleans are flags:
    ``--overwrite`` where the default is False, ``--no-progress`` where it is True.
    """
    names, helps, hints = names or {}, _field_help(cls), typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):  # thresholds: a table in a config file, not flags
            continue
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))  # X | None: the None is the default
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        flag = names.get(f.name, f.name).replace("_", "-")
        text = helps.get(f.name, f"{cls.__name__}.{f.name}").replace("%", "%%")
        kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS}
        if tp is bool:
            if default:  # progress -> --no-progress: "no progress bar"
                parser.add_argument(f"--no-{flag}", action="store_false", help=f"no {text}", **kw)
            else:
                parser.add_argument(f"--{flag}", action="store_true", help=text, **kw)
            continue
        if typing.get_origin(tp) is Literal:
            kw["choices"] = typing.get_args(tp)
        elif typing.get_origin(tp) is tuple:
            item = typing.get_args(tp)[0]
            kw["type"] = _list_arg(_int_arg if item is int else item)
            text += "; comma-separated"
        else:
            kw["type"] = _int_arg if tp is int else tp
        if default is not None:  # a None default is explained by the comment ("None: all")
            text += f" (default: {_shown(default)})"
        if "choices" not in kw:  # --tokens TOKENS, not --tokens TOTAL_TOKENS
            kw["metavar"] = flag.upper().replace("-", "_")
        parser.add_argument(f"--{flag}", help=text, **kw)


def _passed(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` the user gave on the command line."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}


def _add_overwrite(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overwrite", action="store_true", help="replace output files that exist already (refused otherwise)")


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
    _add_overwrite(p)
    p.add_argument("--batch-size", type=int, default=8192, help="rows read per batch (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=10, help="top eigenvectors kept in the JSON (default: %(default)s)")
    p.add_argument("--skip-nonfinite", action="store_true", help="skip and count rows with NaN/inf instead of stopping")
    p.add_argument("--float64", action="store_true", help="form the batch grams in float64 (slower; default: float32 on shifted rows)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--pool", action="store_true",
                   help="pool stores of different models or hooks into one accumulator (refused without it)")
    p.add_argument("--no-verify", action="store_true", help="read store shards without checking their sha256")
    p.set_defaults(func=cmd_geometry)


def _refuse_mixed_stores(sources: list) -> None:
    """Stores of different models or hooks pooled into one accumulator give a number of neither: refuse."""
    stores = [(path, rows.store) for path, rows in sources if rows.store is not None]
    differ = [what for what in ("model", "hook") if len({getattr(s, what) for _, s in stores}) > 1]
    if differ:
        what = differ[-1]  # name the hook when both differ
        listing = "; ".join(f"{p}: {getattr(s, what)}" for p, s in stores)
        raise CLIError(f"refusing to pool stores of different {' and '.join(d + 's' for d in differ)} into one "
                       f"geometry ({listing}): the pooled numbers describe none of them; use `saegeo sweep` for one "
                       "row per layer, or pass --pool to pool them anyway")


def _refuse_repeated_sources(paths: list[str]) -> None:
    """One source given twice would count its rows twice: refused, naming both spellings."""
    from pathlib import Path

    seen: dict[Path, str] = {}
    for path in paths:
        key = Path(path).resolve()
        if key in seen:
            raise CLIError(f"{seen[key]} and {path} are the same source, given twice: its rows would be counted twice; "
                           "pass each file or store once")
        seen[key] = path


def cmd_geometry(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from saegeo.activations.sources import open_rows
    from saegeo.io import dump_json, refuse_overwrite
    from saegeo.geometry.accumulate import GeometryAccumulator
    from saegeo.geometry.measures import activation_geometry

    if args.batch_size < 1:
        raise CLIError(f"--batch-size must be ≥ 1, got {args.batch_size}")
    refuse_overwrite([args.json_out], args.overwrite)
    _refuse_repeated_sources(args.files)
    sources = [(path, open_rows(path, key=args.key, verify=not args.no_verify, skip_nonfinite=args.skip_nonfinite))
               for path in args.files]
    shards: dict[tuple[str, ...], str] = {}
    for path, rows in sources:  # a copy of a store counts its rows twice as surely as the store given twice
        key = tuple(s.sha256 for s in rows.store.shards) if rows.store is not None else ()
        if key and key in shards:
            raise CLIError(f"{shards[key]} and {path} hold the same shards (one store, copied): its rows would be "
                           "counted twice; pass it once")
        shards[key] = path
    dims = {rows.d for _, rows in sources}
    if len(dims) > 1:
        raise CLIError("files disagree on d: " + ", ".join(f"{p}: d={rows.d}" for p, rows in sources))
    d = dims.pop()
    if not args.pool:
        _refuse_mixed_stores(sources)
    # the reader screens every batch (its NaN policy, --skip-nonfinite); the accumulator sees finite rows only
    acc = GeometryAccumulator(d, gram_dtype=torch.float64 if args.float64 else None)
    total = sum(rows.n_rows for _, rows in sources)
    with tqdm(total=total, unit="row", unit_scale=True, disable=args.no_progress, desc="geometry") as bar:
        for path, rows in sources:
            for batch in rows.batches(args.batch_size)[0]:
                acc.add(batch, source=path)
                bar.update(len(batch))
    acc.n_nonfinite_skipped += sum(rows.n_nonfinite_skipped for _, rows in sources)
    geo = activation_geometry(acc, top_k_eigvecs=args.top_k)
    print(f"saegeo geometry: {len(sources)} file(s)")
    print(geo.summary())
    from saegeo.report.flags import activation_flags, artifact_flags, flag_inputs, sort_flags
    from saegeo.report.render import artifact_text, terminal_flags

    artifact = None
    if all(rows.store is not None for _, rows in sources) and geo.top_eigenvectors:  # needs ids and positions
        from saegeo.report.layers import artifact_pass

        artifact = artifact_pass([rows for _, rows in sources], geo, k=min(3, len(geo.top_eigenvectors)),
                                 batch_size=args.batch_size)  # the same Rows: --skip-nonfinite holds here too
        print(f"artifact:  {artifact_text(artifact)} ({artifact['source']})")
    else:
        print("note:      artifact test not run: it needs activation stores (token ids and positions) and --top-k ≥ 1")
    from saegeo.activations.cache import describe_exclusions

    for path, rows in sources:  # stores cached with exclusions: what the left-out rows carried
        extra = rows.store.manifest.get("extra", {}) if rows.store is not None else {}
        for line in describe_exclusions(extra):
            print(f"{path}: {line}")
    # the activation flags a report would raise from these numbers (without the report's row sample)
    first = (artifact or {}).get("first_position")  # what position 0 (BOS / attention sinks) carries
    if first:
        print(f"position 0: {first['rows']:,} rows ({100 * first['row_share']:.2f}%) carry {100 * first['mu_share']:.1f}% of "
              f"|mu|^2 and {100 * first['trace_share']:.1f}% of tr Sigma")
    flags = activation_flags(flag_inputs(geo.to_dict(), artifact)) + artifact_flags(artifact)
    print("\n".join(terminal_flags(sort_flags(flags))))
    if args.json_out:
        out = {"files": list(args.files), **geo.to_dict(), "artifact": artifact}
        dump_json(out, args.json_out)
        print(f"wrote {args.json_out}")
    return 0


# --------------------------------------------------------------------------- sweep
def _add_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="one row per layer: the geometry, token-type decomposition, self-similarity and artifact test of each store",
        description="One accumulator per store, one row per layer in the model's layer order. Give stores, or "
        "--model M --hooks all-resid to cache every residual hook in one forward pass first.",
    )
    p.add_argument("stores", nargs="*", help="activation-store directories (one per layer)")
    p.add_argument("--model", default=None, help="cache first: model to run (as in `saegeo cache --model`)")
    p.add_argument("--hooks", default="all-resid",
                   help="with --model: 'all-resid' (blocks.0.hook_resid_pre + every blocks.L.hook_resid_post) or a comma list")
    p.add_argument("--corpus", default="default", help="with --model: corpus (as in `saegeo cache`)")
    p.add_argument("--context", type=int, default=128, help="with --model: tokens per window (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per layer (with --model: tokens cached)")
    p.add_argument("--cache-dir", default="artifacts/acts/sweep", help="with --model: where the stores go (default: %(default)s)")
    p.add_argument("--max-types", type=int, default=None, help="keep the most frequent V token types, pool the rest (default: all)")
    p.add_argument("--artifact-k", type=int, default=3, help="principal directions in the artifact test (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=8192, help="rows per batch (default: %(default)s)")
    p.add_argument("--out", default=None, help="directory for summary.txt, sweep.json, sweep.md (+ sweep.png), sweep.html")
    p.add_argument("--json", dest="json_out", default=None, help="write the sweep JSON here")
    _add_overwrite(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--skip-nonfinite", action="store_true", help="skip and count rows with NaN/inf instead of stopping")
    p.add_argument("--no-verify", action="store_true", help="read store shards without checking their sha256")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from saegeo.io import refuse_overwrite
    from saegeo.report.render import rendering_paths
    from saegeo.report.sweep import SWEEP_FORMATS, render_sweep_terminal, sweep_stores, write_sweep

    if args.batch_size < 1:
        raise CLIError(f"--batch-size must be ≥ 1, got {args.batch_size}")
    refuse_overwrite([args.json_out, *(rendering_paths(args.out, SWEEP_FORMATS, "sweep") if args.out else [])], args.overwrite)
    stores, cache = list(args.stores), None
    if args.model:
        if stores:
            raise CLIError("give stores or --model, not both")
        from saegeo.activations.cache import CacheConfig, cache_activations, residual_hooks
        from saegeo.activations.models import load_model

        loaded = load_model(args.model)
        hooks = residual_hooks(loaded.n_layers) if args.hooks == "all-resid" else tuple(
            h.strip() for h in args.hooks.split(",") if h.strip())
        cfg = CacheConfig(model=args.model, hooks=hooks, corpus=args.corpus, context=args.context, out=args.cache_dir,
                          max_tokens=args.max_tokens, progress=not args.no_progress)
        result = cache_activations(cfg, loaded)
        cache = {"model": args.model, "hooks": list(hooks), "corpus": args.corpus, "context": args.context,
                 "out": args.cache_dir, "new_tokens": result.new_tokens, "seconds": result.seconds}
        print(f"cached {len(hooks)} hook(s) in one pass: {result.new_tokens:,} new tokens in {result.seconds:.1f} s")
        stores = [str(result.stores[h]) for h in hooks]
    if not stores:
        raise CLIError("saegeo sweep needs activation stores, or --model M (with --hooks all-resid) to cache them first")
    sweep = sweep_stores(stores, batch_size=args.batch_size, max_types=args.max_types, artifact_k=args.artifact_k,
                         max_tokens=None if args.model else args.max_tokens, progress=not args.no_progress, cache=cache,
                         verify=not args.no_verify, skip_nonfinite=args.skip_nonfinite)
    if args.model:  # name the listed token types
        for row in sweep.layers:
            tt = row["details"]["token_types"] or {}
            for entry in tt.get("most_context_specific", []) + tt.get("least_context_specific", []):
                entry["token"] = loaded.tokenizer.convert_ids_to_tokens(int(entry["id"]))
    print(render_sweep_terminal(sweep), end="")
    if args.json_out:
        sweep.to_json(args.json_out)
        print(f"wrote {args.json_out}")
    if args.out:
        paths = write_sweep(sweep, args.out)
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


# --------------------------------------------------------------------------- cache
def _add_cache(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cache",
        help="run a model over a corpus and store hook activations (one resumable store per hook)",
        description="Cache activations of one or more hooks from a single forward pass. Rerunning the same "
        "command resumes an interrupted run; the result is identical to an uninterrupted one.",
    )
    from saegeo.activations.cache import CacheConfig

    _add_config_options(p, CacheConfig)
    p.set_defaults(func=cmd_cache)


def cmd_cache(args: argparse.Namespace) -> int:
    from saegeo.activations.cache import CacheConfig, cache_activations

    cfg = CacheConfig.from_dict(_passed(args, CacheConfig))
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

    store = ActivationStore(args.path, allow_incomplete=True, check_headers=False)
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
    print(f"{len(problems)} problem(s)" if problems else "OK: all shards match their sha256 and row counts")
    return 1 if problems else 0


# --------------------------------------------------------------------------- synth
def _add_synth(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth",
        help="write synthetic superposition activations with known truth (store + truth.safetensors)",
        description="x = b + Σ a_i u_i + ε from a seeded generator; writes an activation store at --out "
        "and the ground truth (dictionary, offset, rates) to OUT/truth.safetensors. Options override the preset.",
    )
    from saegeo.activations.store import StorageDtype
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
    p.add_argument("--dtype", choices=typing.get_args(StorageDtype), default="float32", help="storage dtype")
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
    p.add_argument("path", help="dictionary file or directory, or a hub id read through the Hugging Face cache "
                                "(gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71, org/repo[/subfolder])")
    p.add_argument("--acts", help="activation store (directory) or .safetensors/.npy file: adds the full geometry report")
    p.add_argument("--out", help="directory for summary.txt, .md, .json, .html")
    p.add_argument("--max-tokens", type=_int_arg, default=None, help="with --acts: stop after this many tokens")
    from saegeo.report.check import CheckOptions
    from saegeo.report.flags import SEVERITIES
    from saegeo.report.render import FORMATS

    p.add_argument("--format", nargs="+", default=list(FORMATS), choices=FORMATS, help="renderings written to --out")
    _add_overwrite(p)
    p.add_argument("--fail-on", choices=["never", *SEVERITIES[1:]], default="never",  # an info flag never fails
                   help="exit with status 1 when a flag of this severity or worse is raised (for CI)")
    _add_config_options(p, CheckOptions)
    p.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from pathlib import Path

    from saegeo.io import refuse_overwrite
    from saegeo.report.check import CheckOptions, check_dictionary, check_with_activations
    from saegeo.report.render import render_check_terminal, rendering_paths, write_report
    from saegeo.sae.formats import load_dictionary

    if args.out:
        refuse_overwrite(rendering_paths(args.out, args.format, "report" if args.acts else "check"), args.overwrite)

    sae = load_dictionary(args.path)
    opts = CheckOptions.from_dict(_passed(args, CheckOptions))
    name = Path(args.path).resolve().name
    if args.acts:
        from saegeo.report.render import render_terminal
        from saegeo.report.report import ReportOptions

        report, _ = check_with_activations(
            sae, args.acts, options=opts, name=name,
            report_options=ReportOptions(max_tokens=args.max_tokens, progress=opts.progress, verify=opts.verify,
                                         skip_nonfinite=opts.skip_nonfinite),
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
    _add_overwrite(p)
    p.add_argument("--config", default=None, help="JSON/TOML preprocessing config to check (e.g. a SAELens cfg.json)")
    from saegeo.report.report import ReportOptions

    _add_config_options(p, ReportOptions)
    p.add_argument("--model", default=None,
                   help="also splice each SAE into this model (as `saegeo eval`): CE loss recovered and KL per SAE column")
    p.add_argument("--eval-tokens", type=int, default=None, help="with --model: tokens evaluated (default: as saegeo eval)")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from saegeo.io import read_config, refuse_overwrite
    from saegeo.report import ReportOptions, geometry_report, render_terminal, write_report
    from saegeo.report.render import rendering_paths

    refuse_overwrite(rendering_paths(args.out, [f.strip() for f in args.format.split(",")], "report"), args.overwrite)

    saes = {}
    for spec in args.sae:
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        name = name or Path(path).name
        if name in saes:
            raise CLIError(f"two SAEs named {name!r}; give them names with --sae NAME=DIR")
        saes[name] = path
    config = read_config(args.config) if args.config else None
    opts = ReportOptions.from_dict(_passed(args, ReportOptions))
    report = geometry_report(args.acts, saes or None, options=opts, config=config)
    if args.model and saes:
        from saegeo.report.report import add_splice, compute_flags
        from saegeo.sae.splice import EvalConfig, splice_eval_many

        ecfg = EvalConfig(model=args.model, device=opts.device, progress=opts.progress)
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

    p = sub.add_parser(
        "eval", help="splice an SAE into the model at its hook: CE loss recovered, KL, FVE, L0 on held-out text",
        description="Replace the hook's activations by the SAE's reconstruction and run the rest of the model: "
        "CE loss clean / spliced / zero-ablated / mean-ablated, ce_loss_recovered = (zero - spliced)/(zero - clean), "
        "KL(clean || spliced) per token. Positions the SAE never saw in training (BOS) are passed through. "
        "For an encoder (MiniLM) the cosine of clean and spliced mean-pooled sentence embeddings is measured instead.",
    )
    _add_config_options(p, EvalConfig)
    p.add_argument("--replace-special", action="store_true",
                   help="splice at BOS/[CLS]/[SEP] too (sets pass_special false; default: as in the SAE's training)")
    p.add_argument("--json", dest="json_out", default=None, help="write the result as JSON here")
    _add_overwrite(p)
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from saegeo.io import dump_json, refuse_overwrite
    from saegeo.sae.splice import EvalConfig, render_eval, splice_eval

    refuse_overwrite([args.json_out], args.overwrite)
    options = _passed(args, EvalConfig)
    if args.replace_special:
        options["pass_special"] = False
    cfg = EvalConfig.from_dict(options)
    if not cfg.sae:
        raise CLIError("saegeo eval needs --sae DIR (an SAE directory or file in any supported format, or a hub id)")
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
# Flags that predate the field names they set; a --config file may use either name.
_TRAIN_FLAG_NAMES = {"total_tokens": "tokens", "l1_coefficient": "l1", "out_dir": "out"}


def _add_train(sub: argparse._SubParsersAction) -> None:
    from saegeo.sae.train import TrainConfig

    p = sub.add_parser("train", help="train an SAE (b_dec := mean, unit-norm decoder) on an activation store")
    p.add_argument("--acts", help="activation store directory (or `acts = ...` in the config)")
    p.add_argument("--config", help="TOML file with TrainConfig keys (top level or a [train] table); flags override it")
    p.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint in --out")
    _add_config_options(p, TrainConfig, names=_TRAIN_FLAG_NAMES)
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from saegeo.io import read_config
    from saegeo.sae.train import TrainConfig, train_sae

    # dataclass defaults < the --config file < the flags given
    options: dict = {}
    acts = None
    if args.config:
        doc = read_config(args.config)
        table = dict(doc.get("train", doc))
        acts = table.pop("acts", None) or doc.get("acts")
        for key, flag in _TRAIN_FLAG_NAMES.items():
            if flag in table:  # `tokens = "2M"`, `out = "..."`: the names the flags use
                table[key] = table.pop(flag)
        options.update({k: v for k, v in table.items() if not isinstance(v, dict)})  # [train.saes] is for `run`
    options.update(_passed(args, TrainConfig))
    acts = args.acts or acts
    if not acts:
        raise CLIError("saegeo train needs --acts STORE (or `acts = \"...\"` in the --config file)")
    cfg = TrainConfig.from_dict(options, where=args.config)
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
        ("held-out tokens", f"{h.get('tokens', 0):,}"
                            + (f" ({h['nonfinite_rows_skipped']:,} non-finite rows skipped)" if "nonfinite_rows_skipped" in h else "")),
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
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of an error (accepted anywhere on the line)")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_geometry, _add_sweep, _add_cache, _add_store, _add_synth, _add_check, _add_report, _add_run, _add_train,
                _add_eval):
        add(sub)
    return parser


def _user_error(err: BaseException) -> str | None:
    """One line `<what>, <which file>, <what to do>` for an error a user can fix, None for a bug.

    saegeo's own errors already say all three; OSError and decoding errors from any layer are worded here."""
    if isinstance(err, SaegeoError):
        return " ".join(str(err).split())  # one line, whatever the message held
    if isinstance(err, OSError):
        name = err.filename2 if err.filename2 is not None else err.filename  # os.replace(tmp, target): the target
        file = str(name).removesuffix(".tmp") if name is not None else "a file"
        what = err.strerror or type(err).__name__
        advice = {
            IsADirectoryError: "give a file path, not a directory",
            NotADirectoryError: "a part of the path is a file, not a directory; choose another path",
            FileExistsError: "a file is in the way; remove it or choose another path",
            FileNotFoundError: "check the path",
            PermissionError: "fix its permissions or choose another path",
        }.get(type(err), "check the path, its permissions and the free disk space")
        return f"{what}, {file}, {advice}"
    import json

    if isinstance(err, (UnicodeDecodeError, json.JSONDecodeError)) or type(err).__name__ == "TOMLDecodeError":
        # a reader that did not name its file: say what failed
        return f"cannot decode a file ({type(err).__name__}: {' '.join(str(err).split())}), rerun with --debug to see which, fix or replace it"
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one command. Every error a user can fix (saegeo's own, OSError, decoding) is one line on stderr,
    `saegeo: error: <what>, <which file>, <what to do>`, and exit status 2; --debug shows the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]  # a global flag, accepted before or after the command
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("saegeo: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of our output went away (`saegeo ... | head`): nothing to report
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 0
    except Exception as err:
        message = _user_error(err)
        if message is None or debug:
            raise
        print(f"saegeo: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
