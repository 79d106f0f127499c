"""The `saegeo` command line: geometry | sweep | cache | store | train | report | check | compare | latents | synth | run | eval.

Each subcommand has one `_add_<name>(parser)` function that declares its arguments and one `cmd_<name>(args)`
function that calls the library. Heavy imports happen inside these functions, never at the top of this module,
and only the invoked command's options are built (`saegeo --help` imports no torch). The options come from the
config dataclasses through saegeo.config (`add_options`): the dataclass is the one place for a name, default,
choice list, help and check; paths and positional arguments are declared here.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from saegeo.config import add_options, from_dict, old_spelling, passed, renamed_flag, resolve
from saegeo.errors import SaegeoError
from saegeo.sae.sae_source import refuse_missing_sae


class CLIError(SaegeoError):
    """A usage error found by the command line itself."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `saegeo train: error: <what>; see saegeo train --help` and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}; see `{self.prog} --help`\n")


def _add_overwrite(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--overwrite", action="store_true", help="replace output files that exist already (refused otherwise)"
    )


class _Formats(argparse.Action):
    """--format md,json: the renderings, one comma-separated list in every command. The space-separated form that
    `check` took (--format md json) is read for one release, with a warning."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None) -> None:
        from saegeo.render.common import FORMATS

        if len(values) > 1:
            old_spelling(namespace, f"--format {' '.join(values)} is now written --format {','.join(values)}")
        formats = [f.strip() for value in values for f in value.split(",") if f.strip()]
        if not formats or set(formats) - set(FORMATS):
            parser.error(f"--format {' '.join(values)!r}: give a comma-separated subset of {','.join(FORMATS)}")
        setattr(namespace, self.dest, formats)


def _add_format(p: argparse.ArgumentParser, what: str) -> None:
    from saegeo.render.common import FORMATS

    p.add_argument(
        "--format",
        nargs="+",
        action=_Formats,
        default=list(FORMATS),
        metavar="FORMATS",
        help=f"{what}: a comma-separated subset of {','.join(FORMATS)} (default: all)",
    )


# --------------------------------------------------------------------------- geometry
def _add_geometry(p: argparse.ArgumentParser) -> None:
    from saegeo.report.options import GeometryOptions

    p.add_argument("files", nargs="+", help="files (.safetensors, .npy, .pt) or store directories, streamed in order")
    add_options(p, GeometryOptions)


def cmd_geometry(args: argparse.Namespace) -> int:
    from saegeo.activations.options import rows_path_kind
    from saegeo.io import refuse_overwrite
    from saegeo.report.options import GeometryOptions

    opts = from_dict(GeometryOptions, passed(args, GeometryOptions))
    refuse_overwrite([opts.json], opts.overwrite)
    for path in args.files:
        rows_path_kind(path)
    from saegeo.render.text import render_geometry  # the work begins: torch from here on
    from saegeo.report.geometry import files_geometry

    result = files_geometry(args.files, opts)
    print(render_geometry(result))
    if opts.json:
        result.to_json(opts.json)
        print(f"wrote {opts.json}")
    return 0


# --------------------------------------------------------------------------- sweep
def _add_sweep(p: argparse.ArgumentParser) -> None:
    from saegeo.report.options import SweepOptions

    p.add_argument("stores", nargs="*", help="activation-store directories (one per layer)")
    add_options(p, SweepOptions)


def cmd_sweep(args: argparse.Namespace) -> int:
    from saegeo.activations.options import rows_path_kind
    from saegeo.io import refuse_overwrite
    from saegeo.render.common import rendering_paths
    from saegeo.report.options import SweepOptions

    opts = from_dict(SweepOptions, passed(args, SweepOptions))
    if opts.model and args.stores:
        raise CLIError("give stores or --model, not both")
    if not opts.model and not args.stores:
        raise CLIError(
            "saegeo sweep needs activation stores, or --model M (with --hooks all-resid) to cache them first"
        )
    for path in args.stores:
        rows_path_kind(path)
    from saegeo.render import SWEEP_FORMATS, render_sweep_cache, render_sweep_terminal, render_written, write_sweep
    from saegeo.report.layer_sweep import sweep_model, sweep_stores

    refuse_overwrite(
        [opts.json, *(rendering_paths(opts.out, SWEEP_FORMATS, "sweep") if opts.out else [])], opts.overwrite
    )
    if opts.out:  # a few fixed-size files (one row per layer), before the passes
        from saegeo.io import require_disk
        from saegeo.render.common import report_set_bytes

        require_disk(opts.out, report_set_bytes([]), "the sweep's files")
    if opts.model:
        sweep = sweep_model(opts)
        print(render_sweep_cache(sweep.cache))
    else:
        sweep = sweep_stores(args.stores, opts)
    print(render_sweep_terminal(sweep), end="")
    if opts.json:
        sweep.to_json(opts.json)
        print(f"wrote {opts.json}")
    if opts.out:
        print(render_written(write_sweep(sweep, opts.out)))
    return 0


# --------------------------------------------------------------------------- cache
def _add_cache(p: argparse.ArgumentParser) -> None:
    from saegeo.activations.options import CacheConfig

    add_options(p, CacheConfig)


def cmd_cache(args: argparse.Namespace) -> int:
    from saegeo.activations.options import CacheConfig

    cfg = from_dict(CacheConfig, passed(args, CacheConfig))
    from saegeo.activations.cache import cache_activations  # the work begins: torch from here on

    try:
        result = cache_activations(cfg)
    except KeyboardInterrupt:
        print("saegeo cache: interrupted; whole shards are kept. Rerun the same command to resume.", file=sys.stderr)
        raise
    from saegeo.render.text import render_cache

    print(render_cache(result))
    return 0


# --------------------------------------------------------------------------- store
def _add_store(p: argparse.ArgumentParser) -> None:
    ssub = p.add_subparsers(dest="store_command", required=True)
    v = ssub.add_parser("verify", help="re-hash every shard; name missing, truncated or corrupt shards")
    v.add_argument("path")
    i = ssub.add_parser("info", help="print a store's manifest summary")
    i.add_argument("path")


def cmd_store(args: argparse.Namespace) -> int:
    from saegeo.activations.options import require_store_dir

    require_store_dir(args.path)  # before torch
    from saegeo.activations.store import ActivationStore
    from saegeo.render.text import render_store

    store = ActivationStore(args.path, allow_incomplete=True, check_headers=False)
    problems = store.verify() if args.store_command == "verify" else None
    print(render_store(store, problems))
    return 1 if problems else 0


# --------------------------------------------------------------------------- synth
def _add_synth(p: argparse.ArgumentParser) -> None:
    from saegeo.synthetic.options import SyntheticConfig, SynthOptions

    add_options(p, SynthOptions)
    add_options(p, SyntheticConfig, show_defaults=False)  # unset: the preset's value


def cmd_synth(args: argparse.Namespace) -> int:
    from pathlib import Path

    from saegeo.synthetic.options import SyntheticConfig, SynthOptions, preset

    opts = from_dict(SynthOptions, passed(args, SynthOptions))
    cfg = preset(opts.preset, **passed(args, SyntheticConfig))
    out = Path(opts.out)
    single_file = out.suffix == ".safetensors"
    from saegeo.io import require_disk

    require_disk(out, opts.n * cfg.d * (4 if opts.dtype == "float32" else 2), f"{opts.n:,} rows of d={cfg.d}")
    if (out.exists() if single_file else (out / "manifest.json").exists()) and not opts.overwrite:
        raise CLIError(f"{opts.out} already exists; pass --overwrite to replace it or choose another --out")
    from saegeo.geometry.amplification import exact_moment_prediction  # the work begins: torch from here on
    from saegeo.synthetic import SuperpositionGenerator

    gen = SuperpositionGenerator(cfg)
    if single_file:
        truth_path = gen.write_safetensors(out, opts.n, dtype=opts.dtype)
    else:
        from saegeo.pipeline import write_synthetic_store

        write_synthetic_store(
            gen,
            out,
            opts.n,
            shard_rows=opts.shard_rows,
            dtype=opts.dtype,
            mode="overwrite" if opts.overwrite else "create",
            progress=sys.stderr.isatty(),
        )
        truth_path = out / "truth.safetensors"
    from saegeo.render.text import render_synth

    t = gen.truth
    predicted = exact_moment_prediction(t.K, t.q, t.r, t.mean_sq_norm)
    print(render_synth(opts.preset, opts.n, cfg, t, predicted, [opts.out, str(truth_path)]))
    return 0


# --------------------------------------------------------------------------- check
def _add_check(p: argparse.ArgumentParser) -> None:
    import dataclasses

    from saegeo.report.options import SEVERITIES, CheckOptions, ReportOptions

    p.add_argument(
        "path",
        help="dictionary file or directory, or a hub id read through the Hugging Face cache "
        "(gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71, org/repo[/subfolder])",
    )
    p.add_argument(
        "--acts", help="activation store (directory) or .safetensors/.npy file: adds the full geometry report"
    )
    p.add_argument("--out", help="directory for summary.txt, .md, .json, .html")
    _add_format(p, "renderings written to --out")
    _add_overwrite(p)
    p.add_argument(
        "--fail-on",
        choices=["never", *SEVERITIES[1:]],
        default="never",  # an info flag never fails
        help="exit with status 1 when a flag of this severity or worse is raised (for CI)",
    )
    add_options(p, CheckOptions)
    # with --acts the check runs the report: every report option, by the same path as `saegeo report` (those the
    # check shares with it, such as --device and --no-progress, set both)
    report = p.add_argument_group("with --acts", "the geometry report's options, as in `saegeo report`")
    add_options(report, ReportOptions, skip=tuple(f.name for f in dataclasses.fields(CheckOptions)))


def cmd_check(args: argparse.Namespace) -> int:
    from pathlib import Path

    from saegeo.activations.options import rows_path_kind
    from saegeo.io import refuse_overwrite
    from saegeo.render.common import rendering_paths
    from saegeo.report.options import CheckOptions, ReportOptions

    if args.out:
        refuse_overwrite(rendering_paths(args.out, args.format, "report" if args.acts else "check"), args.overwrite)
    opts = from_dict(CheckOptions, passed(args, CheckOptions))
    report_options = from_dict(ReportOptions, passed(args, ReportOptions))
    if args.acts:
        rows_path_kind(args.acts)
    refuse_missing_sae(args.path)
    from saegeo.render import render_check_terminal, render_terminal, render_written, write_report  # torch from here
    from saegeo.report.dictionary_check import check_dictionary, check_with_activations
    from saegeo.sae.model import SAE

    sae = SAE.load(args.path)
    name = Path(args.path).resolve().name
    if args.acts and args.out:  # the latent table's files, before the pass
        from saegeo.io import require_disk
        from saegeo.render.common import report_set_bytes

        require_disk(args.out, report_set_bytes([sae.cfg.d_sae]), f"the report of {sae.cfg.d_sae:,} latents")
    if args.acts:
        report, _ = check_with_activations(sae, args.acts, options=opts, name=name, report_options=report_options)
        print(render_terminal(report), end="")
        flags = report.flags
        if args.out:
            print(render_written(write_report(report, args.out, formats=tuple(args.format))))
    else:
        check = check_dictionary(sae, options=opts, name=name)
        print(render_check_terminal(check), end="")
        flags = check.flags
        if args.out:
            print(render_written(write_report(check, args.out, formats=tuple(args.format))))
    if args.fail_on == "never":
        return 0
    from saegeo.report.flags import SEVERITIES

    worst = SEVERITIES.index(args.fail_on)
    return 1 if any(SEVERITIES.index(f.severity) >= worst for f in flags) else 0


# --------------------------------------------------------------------------- compare
def _add_compare(p: argparse.ArgumentParser) -> None:
    from saegeo.config import CompareOptions

    p.add_argument("sae_a", help="first dictionary (any format `saegeo check` reads, or a hub id)")
    p.add_argument("sae_b", help="second dictionary, of the same activation space")
    p.add_argument("--acts", help="activation store or file: also match on the correlation of the latents' activations")
    p.add_argument("--out", help="directory for summary.txt and compare.json (the matched pairs)")
    add_options(p, CompareOptions)


def cmd_compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from saegeo.activations.options import rows_path_kind
    from saegeo.config import CompareOptions
    from saegeo.io import refuse_overwrite

    opts = from_dict(CompareOptions, passed(args, CompareOptions))
    if args.acts:
        rows_path_kind(args.acts)
    refuse_missing_sae(args.sae_a)
    refuse_missing_sae(args.sae_b)
    from saegeo.render.compare_text import COMPARE_FILES, render_compare, write_compare  # torch from here on
    from saegeo.render.text import render_written
    from saegeo.report.dictionary_compare import compare_dictionaries

    if args.out:
        refuse_overwrite([Path(args.out) / name for name in COMPARE_FILES], opts.overwrite)
    result = compare_dictionaries(args.sae_a, args.sae_b, opts, acts=args.acts, names=(args.sae_a, args.sae_b))
    print(render_compare(result), end="")
    if args.out:
        print(render_written(write_compare(result, args.out)))
    return 0


# --------------------------------------------------------------------------- report
def _add_report(p: argparse.ArgumentParser) -> None:
    from saegeo.config import int_arg
    from saegeo.report.options import ReportOptions

    p.add_argument("--acts", required=True, help="activation store directory (from `saegeo cache`)")
    p.add_argument(
        "--sae",
        action="append",
        default=[],
        metavar="[NAME=]DIR",
        help="SAE directory (SAELens layout); repeat for several, shown side by side",
    )
    p.add_argument("--out", required=True, help="output directory: summary.txt, report.md, report.json, report.html")
    _add_format(p, "renderings written to --out")
    _add_overwrite(p)
    p.add_argument(
        "--preprocessing-config",
        default=None,
        help="JSON/TOML preprocessing config to check (e.g. a SAELens cfg.json)",
    )
    renamed_flag(p, "--config", "--preprocessing-config", dest="preprocessing_config")
    add_options(p, ReportOptions)
    p.add_argument(
        "--model",
        default=None,
        help="also splice each SAE into this model (as `saegeo eval`): CE loss recovered and KL per SAE column",
    )
    p.add_argument(
        "--eval-tokens", type=int_arg, default=None, help="with --model: tokens evaluated (default: as saegeo eval)"
    )


def cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from saegeo.activations.options import rows_path_kind
    from saegeo.io import read_config, refuse_overwrite
    from saegeo.render.common import rendering_paths
    from saegeo.report.options import ReportOptions
    from saegeo.sae.options import EvalConfig

    formats = args.format
    refuse_overwrite(rendering_paths(args.out, formats, "report"), args.overwrite)

    saes = {}
    for spec in args.sae:
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        name = name or Path(path).name
        if name in saes:
            raise CLIError(f"two SAEs named {name!r}; give them names with --sae NAME=DIR")
        saes[name] = path
    opts = from_dict(ReportOptions, passed(args, ReportOptions))
    given = {} if args.eval_tokens is None else {"max_tokens": args.eval_tokens}  # checked before the pass
    try:
        ecfg = from_dict(
            EvalConfig,
            {"model": args.model, "device": opts.device, "progress": opts.progress, **given},
        )
    except SaegeoError as err:  # name the flag: --eval-tokens sets EvalConfig.max_tokens
        raise CLIError(f"--eval-tokens: {err}") from None
    config = read_config(args.preprocessing_config) if args.preprocessing_config else None
    rows_path_kind(args.acts)
    for path in saes.values():
        refuse_missing_sae(path)
    from saegeo.render import render_terminal, write_report  # the work begins: torch from here on
    from saegeo.render.text import render_files
    from saegeo.report import geometry_report

    if saes:  # read once: the splice, the verdict and the pass share each SAE
        from saegeo.sae.model import SAE

        saes = {name: SAE.load(path) for name, path in saes.items()}
    splice = None
    if args.model and saes:
        from saegeo.sae.evaluate import splice_eval_many

        splice = splice_eval_many(ecfg, saes)
    flags, notes, d_saes = [], [], []
    if saes:  # the verdict check --acts gives (same flags, same withheld metrics), once per SAE
        from saegeo.report.dictionary_check import sae_verdicts

        flags, notes, checks = sae_verdicts(saes, args.acts, stream=opts.stream(), thresholds=opts.thresholds)
        d_saes = [c.source["d_sae"] for c in checks]
    if args.out:  # the report's files (the latent tables), before the pass
        from saegeo.io import require_disk
        from saegeo.render.common import report_set_bytes

        require_disk(args.out, report_set_bytes(d_saes), f"the report of {sum(d_saes):,} latents")
    report = geometry_report(
        args.acts, saes or None, options=opts, config=config, splice=splice, flags=flags, notes=notes
    )
    from saegeo.distributed import current

    if (ctx := current()) is not None and not ctx.is_main:
        return 0  # under torchrun every rank holds the merged report; rank 0 renders it
    paths = write_report(report, args.out, formats)
    print(render_terminal(report))
    if paths:
        print(render_files(paths))
    return 0


# --------------------------------------------------------------------------- latents
def _add_latents(p: argparse.ArgumentParser) -> None:
    from saegeo.report.options import LatentsOptions

    p.add_argument("sae", help="SAE directory or file (any format `saegeo check` reads)")
    p.add_argument("--acts", required=True, help="activation store directory (or .safetensors/.npy file)")
    p.add_argument("--out", required=True, help="directory for summary.txt, latents.md/.json/.csv/.html")
    _add_overwrite(p)
    add_options(p, LatentsOptions)


def cmd_latents(args: argparse.Namespace) -> int:
    from pathlib import Path

    from saegeo.activations.options import rows_path_kind
    from saegeo.io import refuse_overwrite
    from saegeo.render.common import FORMATS, rendering_paths
    from saegeo.report.options import LatentsOptions

    given = passed(args, LatentsOptions)
    if given.get("latents") and ({"top", "by"} & set(given)):
        raise CLIError("give --latents IDS or --top N [--by COLUMN], not both")
    opts = from_dict(LatentsOptions, given)
    refuse_overwrite(rendering_paths(args.out, FORMATS, "latents"), args.overwrite)
    rows_path_kind(args.acts)
    refuse_missing_sae(args.sae)
    from saegeo.render import write_latents  # the work begins: torch from here on
    from saegeo.render.latents_page import render_latents_terminal
    from saegeo.render.text import render_files
    from saegeo.report.dictionary_check import sae_verdict
    from saegeo.report.geometry_report import latents_report
    from saegeo.report.options import CheckOptions

    name = Path(args.sae).resolve().name
    from saegeo.io import require_disk
    from saegeo.render.common import report_set_bytes
    from saegeo.sae.model import SAE

    sae = SAE.load(args.sae)  # read once: the disk check, the pass and the verdict share it
    d_sae = sae.cfg.d_sae
    require_disk(args.out, report_set_bytes([d_sae]), f"the latent table of {d_sae:,} latents")
    doc = latents_report(args.acts, sae, opts, name=name)
    vopts = CheckOptions(**{**opts.stream(), "progress": False}, thresholds=opts.thresholds)
    flags, notes, _ = sae_verdict(sae, args.acts, options=vopts, name=name)
    doc["flags"], doc["notes"] = [f.to_dict() for f in flags], notes  # the verdict check --acts gives
    print(render_latents_terminal(doc), end="")
    print(render_files(write_latents(doc, args.out)))
    return 0


# --------------------------------------------------------------------------- eval
def _add_eval(p: argparse.ArgumentParser) -> None:
    from saegeo.sae.options import EvalConfig

    add_options(p, EvalConfig)
    p.add_argument(
        "--replace-special",
        action="store_true",
        help="splice at BOS/[CLS]/[SEP] too (sets pass_special false; default: as in the SAE's training)",
    )
    p.add_argument("--json", default=None, help="write the result as JSON here")
    _add_overwrite(p)


def cmd_eval(args: argparse.Namespace) -> int:
    from saegeo.io import dump_json, refuse_overwrite
    from saegeo.sae.options import EvalConfig

    refuse_overwrite([args.json], args.overwrite)
    options = passed(args, EvalConfig)
    if args.replace_special:
        options["pass_special"] = False
    cfg = from_dict(EvalConfig, options)
    if not cfg.sae:
        raise CLIError("saegeo eval needs --sae DIR (an SAE directory or file in any supported format, or a hub id)")
    refuse_missing_sae(cfg.sae)
    from saegeo.render.text import render_eval  # the work begins: torch from here on
    from saegeo.sae.evaluate import splice_eval

    result = splice_eval(cfg)
    print(render_eval(result))
    if args.json:
        dump_json(result, args.json)
        print(f"wrote {args.json}")
    return 0


# --------------------------------------------------------------------------- run
def _add_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="TOML run config, e.g. configs/demo.toml")


def cmd_run(args: argparse.Namespace) -> int:
    import time

    from saegeo.io import read_config

    doc = read_config(args.config)  # a missing or malformed file is named before torch is imported
    from saegeo.pipeline import run_config, run_job
    from saegeo.render.text import render_run

    t0 = time.perf_counter()
    result = run_job(run_config(doc, where=args.config))
    print(render_run(result, time.perf_counter() - t0))
    return 0


# --------------------------------------------------------------------------- train
def _add_train(p: argparse.ArgumentParser) -> None:
    from saegeo.sae.options import TrainConfig

    p.add_argument("--acts", help="activation store directory (or `acts = ...` in the config)")
    p.add_argument(
        "--config",
        help="TOML file with TrainConfig keys (top level or a [train] table) and `acts`; "
        "flags override it, any other key is refused",
    )
    p.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint in --out")
    add_options(p, TrainConfig)


def _add_architecture_options(p: argparse.ArgumentParser) -> None:
    """Each registered architecture's own options as --ARCH.OPTION (its `Options` dataclass, TOML [train.ARCH]).
    They need the registry, and torch with it: built only for --help or when such a flag is given
    (`_wants_architecture_options`), so the other errors of `saegeo train` are still found before torch loads."""
    import dataclasses

    from saegeo.sae.architectures import architecture_names, get_architecture

    for name in architecture_names():
        options = get_architecture(name).Options
        if dataclasses.fields(options):
            group = p.add_argument_group(f"--arch {name}", (options.__doc__ or "").strip())
            add_options(group, options, prefix=name)


def _wants_architecture_options(argv: list[str] | None) -> bool:
    """--help, or an --ARCH.OPTION flag, among the arguments (None: the whole command line is built)."""
    if argv is None:
        return True
    return any(a in ("-h", "--help") or (a.startswith("--") and "." in a.partition("=")[0]) for a in argv)


def _architecture_tables(args: argparse.Namespace) -> dict[str, dict]:
    """The --ARCH.OPTION flags given, as {ARCH: {OPTION: value}} (TrainConfig reads them into arch_options)."""
    if not any("." in key for key in vars(args)):
        return {}
    from saegeo.sae.architectures import architecture_names, get_architecture

    tables = {name: passed(args, get_architecture(name).Options, prefix=name) for name in architecture_names()}
    return {name: table for name, table in tables.items() if table}


def cmd_train(args: argparse.Namespace) -> int:
    from saegeo.activations.options import rows_path_kind
    from saegeo.sae.options import TrainConfig

    if args.acts:  # before the config is resolved: its architecture check loads the registry (torch)
        rows_path_kind(args.acts)
    # the flags given > the --config file > the dataclass defaults; every key of the file is read or refused
    given = passed(args, TrainConfig) | _architecture_tables(args)
    cfg, extras = resolve(TrainConfig, given, args.config, table="train", extra=("acts",))
    acts = args.acts or extras.get("acts")
    if not acts:
        raise CLIError('saegeo train needs --acts STORE (or `acts = "..."` in the --config file)')
    rows_path_kind(acts)
    from saegeo.sae.train import train_sae  # the work begins

    result = train_sae(cfg, acts, resume=not args.no_resume)
    from saegeo.distributed import current

    if (ctx := current()) is not None and not ctx.is_main:
        return 0  # under torchrun rank 0 prints the summary (every rank holds the same SAE)
    from saegeo.render.text import render_train

    print(render_train(result))
    return 0


# name, what `saegeo --help` says of it, its description, the function adding its options, the one running it
_COMMANDS: list[tuple[str, str, str | None, Any, Any]] = [
    (
        "geometry",
        "geometry summary of (rows, d) or (batch, pos, d) tensors in .safetensors/.npy/.pt files or activation stores",
        "Stream the rows of one or more files (or activation-store directories) through one GeometryAccumulator and "
        "print the activation geometry: offset, A against the sign-aware null, mean vs spread, spectrum vs "
        "Marchenko-Pastur, IsoScore, rogue dimensions. Memory does not grow with rows.",
        _add_geometry,
        cmd_geometry,
    ),
    (
        "sweep",
        "one row per layer: the geometry, token-type decomposition, self-similarity and artifact test of each store",
        "One accumulator per store, one row per layer in the model's layer order. Give stores, or --model M "
        "--hooks all-resid to cache every residual hook in one forward pass first.",
        _add_sweep,
        cmd_sweep,
    ),
    (
        "cache",
        "run a model over a corpus and store hook activations (one resumable store per hook)",
        "Cache activations of one or more hooks from a single forward pass. Rerunning the same command resumes an "
        "interrupted run; the result is identical to an uninterrupted one.",
        _add_cache,
        cmd_cache,
    ),
    ("store", "inspect or verify an activation store", None, _add_store, cmd_store),
    (
        "synth",
        "write synthetic superposition activations with known truth (store + truth.safetensors)",
        "x = b + Σ a_i u_i + ε from a seeded generator; writes an activation store at --out and the ground truth "
        "(dictionary, offset, rates) to OUT/truth.safetensors. Options override the preset.",
        _add_synth,
        cmd_synth,
    ),
    (
        "check",
        "checks on a published or trained dictionary (any supported format), optionally with activations",
        "Load a dictionary (SAELens dir, sparsify dir, dictionary_learning ae.pt, Gemma Scope params.npz, OpenAI .pt; "
        "auto-detected) and check it: A_dict and spectrum, decoder norms, zero and near-duplicate rows, "
        "encoder-decoder alignment, b_dec vs the mean direction, config. With --acts, the full geometry report on "
        "those activations plus these checks.",
        _add_check,
        cmd_check,
    ),
    (
        "compare",
        "seed consistency of two dictionaries: optimal latent matching, pairwise MCC, shared fraction",
        "Match the latents of two dictionaries one to one (Hungarian on decoder cosines; with --acts also on the "
        "correlation of their activations): pairwise MCC (mean matched similarity, Song et al. 2025), the shared "
        "fraction at --threshold (Paulo & Belrose 2025), and the geometry of the unshared latents. Exact up to "
        "--exact-max-entries pairs; above it, matched on each latent's nearest candidates without the full matrix.",
        _add_compare,
        cmd_compare,
    ),
    (
        "report",
        "geometry report of an activation store, with SAEs side by side and flags",
        None,
        _add_report,
        cmd_report,
    ),
    (
        "latents",
        "latent cards: top activating contexts, histogram, geometry and neighbours of chosen latents",
        "One pass of the SAE over the activations: for each latent asked (--latents) or the top ones by a column "
        "(--top N --by COLUMN), its top activating rows with the token and its preceding context from the same "
        "window (decoded by the store's model tokenizer when one is found offline), its activation histogram, "
        "firing rate, E[a], E[a²], cos(decoder, μ), cone share, decoder norm and nearest latents by decoder "
        "cosine; the table of every latent as latents.csv / latents.json.",
        _add_latents,
        cmd_latents,
    ),
    ("run", "the main job from a TOML config: cache -> train SAEs -> report (idempotent)", None, _add_run, cmd_run),
    ("train", "train an SAE (b_dec := mean, unit-norm decoder) on an activation store", None, _add_train, cmd_train),
    (
        "eval",
        "splice an SAE into the model at its hook: CE loss recovered, KL, FVE, L0 on held-out text",
        "Replace the hook's activations by the SAE's reconstruction and run the rest of the model: CE loss clean / "
        "spliced / zero-ablated / mean-ablated, ce_loss_recovered = (zero - spliced)/(zero - clean), KL(clean || "
        "spliced) per token. Positions the SAE never saw in training (BOS) are passed through. For an encoder "
        "(MiniLM) the cosine of clean and spliced mean-pooled sentence embeddings is measured instead.",
        _add_eval,
        cmd_eval,
    ),
]


def build_parser(only: str | None = None, argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, the options of that command alone (the others are listed, so
    `saegeo --help` and `saegeo X ...` import nothing that the other commands need). `saegeo train`'s
    architecture options are built when ``argv`` asks for them (`_wants_architecture_options`)."""
    parser = _Parser(prog="saegeo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--debug", action="store_true", help="show the Python traceback of an error (accepted anywhere on the line)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_, description, add, func in _COMMANDS:
        p = sub.add_parser(name, help=help_, description=description)
        if only is None or only == name:
            add(p)
            if name == "train" and (only is None or _wants_architecture_options(argv)):
                _add_architecture_options(p)
        p.set_defaults(func=func)
    return parser


def _user_error(err: BaseException) -> str | None:
    """One line `<what>, <which file>, <what to do>` for an error a user can fix, None for a bug.

    saegeo's own errors already say all three; OSError and decoding errors from any layer are worded here."""
    if isinstance(err, SaegeoError):
        return " ".join(str(err).split())  # one line, whatever the message held
    if isinstance(err, MemoryError) or (isinstance(err, RuntimeError) and "allocate" in str(err)):
        # torch's CPU allocator and CUDA say "...can't allocate memory: you tried to allocate N bytes"
        what = " ".join(str(err).split()[:14]) or type(err).__name__
        return (
            f"out of memory ({what}); choose smaller sizes (d_sae, expansion, the batch options) or a machine "
            "with more memory"
        )
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


# --------------------------------------------------------------------------- what each command reads and writes
def _local(path: Any) -> str | None:
    """A path that exists on this machine (a hub id or a bundled model's name is not a path of ours)."""
    return str(path) if path and os.path.exists(os.path.expanduser(str(path))) else None


def _paths(args: argparse.Namespace) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
    """(inputs, output files, output directories, output-set directories) of a parsed command line: every path
    the command reads and writes, known before it runs (the config files are read; torch is not imported)."""
    from pathlib import Path

    from saegeo.render.common import FORMATS, rendering_paths

    def rendered(out: Any, formats: Any, stem: str, *extra: str) -> list[Any]:
        formats = FORMATS if formats is None else formats
        return [*rendering_paths(out, formats, stem), *(Path(out) / e for e in extra)] if out else []

    def figures(out: Any) -> list[Any]:
        return [Path(out) / "figures"] if out else []

    c, get = args.command, lambda name: getattr(args, name, None)
    if c == "geometry":
        return list(args.files), [get("json")], [], []
    if c == "sweep":
        from saegeo.report.options import SweepOptions

        o = from_dict(SweepOptions, passed(args, SweepOptions))
        caches = [o.cache_dir] if o.model else []
        return [*args.stores, _local(o.corpus)], [o.json, *rendered(o.out, None, "sweep", "sweep.png")], caches, [o.out]
    if c == "cache":
        from saegeo.activations.options import CacheConfig, store_dir

        cc = from_dict(CacheConfig, passed(args, CacheConfig))
        return [_local(cc.corpus), _local(cc.model)], [], [store_dir(cc.out, h) for h in cc.hooks], []
    if c == "synth":
        out = get("out")
        if out and out.endswith(".safetensors"):
            return [], [out, Path(out).with_name(Path(out).stem + ".truth.safetensors")], [], []
        return [], [Path(out) / "truth.safetensors"] if out else [], [out], []
    if c == "check":
        stem = "report" if args.acts else "check"
        return [_local(args.path), args.acts], rendered(args.out, args.format, stem), figures(args.out), [args.out]
    if c == "compare":
        from saegeo.render.compare_text import COMPARE_FILES

        files = [Path(args.out) / name for name in COMPARE_FILES] if args.out else []
        return [_local(args.sae_a), _local(args.sae_b), args.acts], files, [], [args.out]
    if c == "report":
        saes = [spec.rpartition("=")[2] for spec in args.sae]
        inputs = [args.acts, *saes, args.preprocessing_config, _local(args.model)]
        return inputs, rendered(args.out, args.format, "report"), figures(args.out), [args.out]
    if c == "latents":
        return [args.sae, args.acts], rendered(args.out, None, "latents"), [], [args.out]
    if c == "eval":
        from saegeo.sae.options import EvalConfig

        e = from_dict(EvalConfig, {k: v for k, v in passed(args, EvalConfig).items() if k != "sae"})
        return [_local(get("sae")), _local(e.model), _local(e.corpus)], [args.json], [], []
    if c == "train":
        from saegeo.io import read_config
        from saegeo.sae.options import TrainConfig

        # the two keys read as `resolve` reads them (flag > [train] table > top level), without building the
        # config: its checks load the architectures, and torch with them; the command checks the rest
        doc = read_config(args.config) if args.config else {}
        table = doc["train"] if isinstance(doc.get("train"), dict) else {}
        out_dir = passed(args, TrainConfig).get("out_dir") or table.get("out_dir") or doc.get("out_dir")
        acts = args.acts or table.get("acts") or doc.get("acts")
        return [acts, args.config], [], [out_dir], []
    if c == "run":
        from saegeo.activations.options import store_dir
        from saegeo.io import read_config
        from saegeo.pipeline import run_config  # the config's modules only: torch-free

        doc = read_config(args.config)

        rc = run_config(doc, where=args.config)
        out = Path(rc.out)
        stores = [rc.acts] if rc.acts else [store_dir(rc.cache.out, h) for h in rc.cache.hooks]
        inputs = [args.config, *stores, _local(rc.cache.corpus), _local(rc.cache.model)]
        report = rendered(out / "report", rc.formats, "report")
        saes = [Path(rc.sae_config(name).out_dir) for name in rc.saes]
        return inputs, [*report, out / "cache_config.json"], [*saes, *figures(out / "report")], [out / "report"]
    return [], [], [], []


def _check_paths(args: argparse.Namespace) -> None:
    """Before any command runs: no output is, contains or lies inside an input (or an activation store), every
    output can be written, and an output set an interruption left half moved is finished or discarded."""
    from saegeo.io import recover_output_set, refuse_outputs_over_inputs, require_writable

    inputs, files, directories, sets = _paths(args)
    refuse_outputs_over_inputs([*files, *directories], inputs)
    require_writable(files, directories)
    for out in sets:
        if out and os.path.isdir(out):
            recover_output_set(out)


# The commands whose time is the geometry pass: long single-threaded stretches (the fused loop over each chunk,
# LAPACK read-outs) between torch's parallel products.
SLEEPING_WORKER_COMMANDS = frozenset({"geometry", "report", "check", "sweep", "latents"})


def main(argv: list[str] | None = None) -> int:
    """Run one command. Every error a user can fix (saegeo's own, OSError, decoding) is one line on stderr,
    `saegeo: error: <what>, <which file>, <what to do>`, and exit status 2; --debug shows the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]  # a global flag, accepted before or after the command
    command = next((a for a in argv if not a.startswith("-")), "")  # the first word: the options built
    if command in SLEEPING_WORKER_COMMANDS:
        from saegeo.runtime import quiet_openmp_workers

        quiet_openmp_workers()
    args = build_parser(command, argv).parse_args(argv)
    old_spellings = getattr(args, "old_spellings", None) or []
    try:
        _check_paths(args)
        status = int(args.func(args) or 0)
        for note in old_spellings:
            print(f"saegeo {command}: warning: {note}", file=sys.stderr)
        return status
    except KeyboardInterrupt:
        print("saegeo: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of our output went away (`saegeo ... | head`): nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 0
    except Exception as err:
        message = _user_error(err)
        if message is None or debug:
            raise
        notes = "".join(f" (note: {note.split(';')[0]})" for note in old_spellings)
        print(f"saegeo: error: {message}{notes}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
