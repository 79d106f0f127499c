"""The main job: cache -> train SAEs -> [eval] -> one report with every SAE side by side, from one TOML config.

``RunConfig``                 the config (see configs/demo.toml for every key; configs/demo_smollm2.toml for [eval]).
``load_run_config(path)``     read and check a TOML/JSON run config.
``run_job(config) -> RunResult``   idempotent: a complete store is reused, an SAE whose saved training
                              config and data checksums match is not retrained, the report is recomputed.
``write_synthetic_store(gen, path, n)``   synthetic rows as an activation store, with their truth beside them.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

# torch-free imports only: `saegeo run` checks its config and the paths it names before torch is loaded (the work's
# modules are imported where the work begins)
from saegeo.activations.options import CacheConfig, store_dir
from saegeo.config import BATCH_ROWS, check, from_dict, option
from saegeo.errors import BadInputError, StoreError
from saegeo.io import dump_json, json_safe, read_config, same_json
from saegeo.render.common import FORMATS
from saegeo.report.options import ReportOptions
from saegeo.sae.options import EvalConfig, TrainConfig, recorded_options
from saegeo.synthetic.options import SynthOptions  # noqa: F401  (re-exported: its old home)

if TYPE_CHECKING:
    from saegeo.activations.store import ActivationStore
    from saegeo.report.geometry_report import GeometryReport
    from saegeo.synthetic import SuperpositionGenerator


@dataclass
class RunConfig:
    """One main job: each table of its TOML is one config dataclass. Relative paths stay relative to the
    working directory."""

    out: str = option("artifacts/runs/run", "SAEs go to OUT/saes/<name>, the report to OUT/report")
    acts: str | None = option(None, "an existing activation store: skip caching")
    hook: str | None = option(None, "which cached hook the SAEs are trained on (default: the first of cache.hooks)")
    cache: CacheConfig = option(factory=CacheConfig, help="[cache]: how the activations are cached")
    train: TrainConfig = option(factory=TrainConfig, help="[train]: the training options every SAE shares")
    saes: dict[str, dict[str, Any]] = option(
        factory=lambda: {"sae": {}}, help="[saes]: one SAE per entry, name = {TrainConfig overrides}"
    )
    report: ReportOptions = option(factory=ReportOptions, help="[report]: the report's pass")
    formats: tuple[str, ...] = option(FORMATS, "renderings of the report written to OUT/report")
    eval: EvalConfig | None = option(
        None, "[eval]: splice every SAE into the model (model: cache.model unless given); absent: no spliced evaluation"
    )
    name: str = option("", "a label for this run (free text)")
    description: str = option("", "what this run is for (free text)")

    def __post_init__(self) -> None:
        check(self)
        if not self.formats or set(self.formats) - set(FORMATS):
            raise BadInputError(f"formats = {list(self.formats)}: name one or more of {list(FORMATS)}")
        sae_directories(self.out, self.saes)  # names that collide on disk or leave saes/: refused before any work
        for name in self.saes:  # each SAE's config, refused here rather than after caching
            self.sae_config(name)

    def sae_config(self, name: str) -> TrainConfig:
        """The TrainConfig of SAE ``name``: [train] with its [saes] overrides, saved under OUT/saes/<name>."""
        overrides = self.saes[name]
        if not isinstance(overrides, Mapping):
            raise BadInputError(f"[saes] {name} = {overrides!r}: expected a table of TrainConfig keys")
        given = {**asdict(self.train), **overrides, "out_dir": str(sae_directories(self.out, self.saes)[name])}
        return from_dict(TrainConfig, given, where=f"[saes] {name}")


@dataclass
class RunResult:
    """What ``run_job`` produced: the store, the SAE directories, the report and its files."""

    store: str
    saes: dict[str, str]
    report: GeometryReport
    files: dict[str, str]
    seconds: dict[str, float]
    reused: dict[str, bool]


def load_run_config(path: str | os.PathLike) -> RunConfig:
    """Read a TOML (or JSON) run config; an unknown key is an error naming it and the file."""
    return run_config(read_config(path), where=str(path))


def run_config(d: Mapping[str, Any], where: str | None = None) -> RunConfig:
    """A RunConfig from its tables; [eval] runs on cache.model unless it names a model."""
    d = dict(d)
    if isinstance(d.get("eval"), Mapping) and "model" not in d["eval"]:
        cache = d.get("cache")
        model = cache.get("model", CacheConfig.model) if isinstance(cache, Mapping) else CacheConfig.model
        d["eval"] = {"model": model, **d["eval"]}
    return from_dict(RunConfig, d, where)


def run_job(config: RunConfig | Mapping[str, Any], *, log: Any = print) -> RunResult:
    """cache -> train (one SAE per entry of [saes]) -> one report over all of them, side by side.

    Idempotent: a complete store with the requested tokens is reused (the cache itself resumes an
    interrupted run), an SAE whose saved training config and data checksums match is not retrained,
    and the report is recomputed (one pass). Every stage's time is returned and logged.
    """
    from saegeo.activations.cache import cache_activations
    from saegeo.activations.store import ActivationStore
    from saegeo.render import render_terminal, write_report
    from saegeo.report.dictionary_check import sae_verdicts
    from saegeo.report.geometry_report import geometry_report
    from saegeo.sae.architectures import get_architecture
    from saegeo.sae.train import train_sae

    cfg = config if isinstance(config, RunConfig) else run_config(config)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    reused: dict[str, bool] = {}

    # ---- 1. activations: an existing store, or cache them
    t0 = time.perf_counter()
    if cfg.acts:
        store_path = Path(cfg.acts)
        reused["cache"] = True
    else:
        cache_cfg = replace(cfg.cache, progress=True)
        hook = cfg.hook or cache_cfg.hooks[0]
        if hook not in cache_cfg.hooks:
            raise BadInputError(f"hook {hook!r} is not among the cached hooks {list(cache_cfg.hooks)}")
        store_path = store_dir(cache_cfg.out, hook)
        stamp = out / "cache_config.json"
        wanted = asdict(cache_cfg) | {"progress": None}
        done = all(_store_complete(store_dir(cache_cfg.out, h), cache_cfg.max_tokens) for h in cache_cfg.hooks)
        if done and stamp.is_file() and same_json(json.loads(stamp.read_text()), wanted):
            log(f"cache: reusing {store_path} (complete; delete it to re-cache)")
            reused["cache"] = True
        else:
            log(
                f"cache: {cache_cfg.model} {','.join(cache_cfg.hooks)} on corpus {cache_cfg.corpus!r} -> {cache_cfg.out}"
            )
            result = cache_activations(cache_cfg)
            log(
                f"cache: {result.n_tokens[hook]:,} tokens in the store ({result.new_tokens:,} new, "
                f"{result.tokens_per_second:,.0f} tok/s)"
            )
            dump_json(wanted, stamp)
            reused["cache"] = False
    store = ActivationStore(store_path)
    seconds["cache"] = time.perf_counter() - t0

    # ---- 2. SAEs: one per [saes] entry (shared [train] options, per-SAE overrides)
    sae_dirs: dict[str, str] = {}
    t0 = time.perf_counter()
    for name in cfg.saes:
        tcfg = cfg.sae_config(name)
        sae_dir = Path(tcfg.out_dir)
        if _trained(sae_dir, tcfg, store):
            log(f"train {name}: reusing {sae_dir} (same config and data; delete it to retrain)")
            reused[f"train:{name}"] = True
        else:
            log(
                f"train {name}: {tcfg.arch} {get_architecture(tcfg.arch).option_summary(tcfg)} "
                f"d_sae={tcfg.d_sae or tcfg.expansion * store.d} "
                f"b_dec := {tcfg.b_dec_init}, {tcfg.total_tokens:,} tokens"
            )
            res = train_sae(tcfg, store)
            h = res.heldout
            log(
                f"train {name}: held-out FVE {h.get('fve', float('nan')):.3f}, L0 {h.get('l0', float('nan')):.1f}, "
                f"dead {100 * h.get('dead_fraction', float('nan')):.1f}%"
            )
            reused[f"train:{name}"] = False
        sae_dirs[name] = str(sae_dir)
    seconds["train"] = time.perf_counter() - t0

    # ---- 3. [eval]: every SAE spliced into the model (shared prefix and ablations), reused when unchanged
    splice: dict[str, dict[str, Any]] = {}
    if cfg.eval is not None:
        t0 = time.perf_counter()
        splice = _spliced_eval(cfg, sae_dirs, reused, log)
        seconds["eval"] = time.perf_counter() - t0

    # ---- 4. the report: one pass over the store with every SAE side by side
    t0 = time.perf_counter()
    opts = cfg.report
    job = json_safe(
        {
            "cache": cfg.cache,
            "train": cfg.train,
            "saes": cfg.saes,
            "report": cfg.report,
            "acts": cfg.acts,
            "hook": cfg.hook,
            "eval": cfg.eval,
        }
    )
    # the SAE directories, not the loaded SAEs: each one's cfg.json is its provenance (b_dec init, data)
    # the verdict `check --acts` and `report --sae` give, so a run withholds what they would
    flags, notes, _ = sae_verdicts(sae_dirs, store, stream=opts.stream(), thresholds=opts.thresholds)
    report = geometry_report(store, sae_dirs, options=opts, config=job, splice=splice, flags=flags, notes=notes)
    files = {k: str(v) for k, v in write_report(report, out / "report", cfg.formats).items()}
    seconds["report"] = time.perf_counter() - t0
    log("")
    log(render_terminal(report))
    return RunResult(store=str(store_path), saes=sae_dirs, report=report, files=files, seconds=seconds, reused=reused)


def _spliced_eval(
    cfg: RunConfig, sae_dirs: dict[str, str], reused: dict[str, bool], log: Any
) -> dict[str, dict[str, Any]]:
    """splice_eval_many over the SAEs whose OUT/saes/<name>/eval.json does not match (config + weights)."""
    import hashlib

    from saegeo.sae.evaluate import splice_eval_many
    from saegeo.sae.formats import WEIGHTS_FILENAME

    ecfg = replace(cfg.eval, progress=True)
    wanted = {k: v for k, v in asdict(ecfg).items() if k != "device"} | {"progress": None}  # where it ran is not what
    results, todo = {}, {}
    for name, path in sae_dirs.items():
        sha = hashlib.sha256((Path(path) / WEIGHTS_FILENAME).read_bytes()).hexdigest()
        stamp = Path(path) / "eval.json"
        try:
            saved = json.loads(stamp.read_text()) if stamp.is_file() else {}
        except json.JSONDecodeError:
            saved = {}
        if saved.get("weights_sha256") == sha and same_json(saved.get("eval_config"), wanted):
            log(f"eval {name}: reusing {stamp} (same SAE weights and eval config)")
            results[name] = saved["result"]
            reused[f"eval:{name}"] = True
        else:
            todo[name] = (sha, stamp)
    if todo:
        log(f"eval: splicing {', '.join(todo)} into {ecfg.model} ({ecfg.max_tokens:,} tokens)")
        fresh = splice_eval_many(ecfg, {name: sae_dirs[name] for name in todo})
        for name, (sha, stamp) in todo.items():
            r = fresh[name]
            log(
                f"eval {name}: CE loss recovered {r.get('ce_loss_recovered', float('nan')):.4f}, "
                f"KL {r.get('kl_div_spliced', float('nan')):.4f}, spliced FVE {r['fve']:.4f}"
            )
            dump_json({"weights_sha256": sha, "eval_config": wanted, "result": r}, stamp)
            results[name] = r
            reused[f"eval:{name}"] = False
    return {name: results[name] for name in sae_dirs}


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "sae"


def sae_directories(out: str | os.PathLike, names: Any) -> dict[str, Path]:
    """OUT/saes/<slug> for each SAE name (characters other than letters, digits, "_", "." and "-" become "_").
    Refused, naming them: two names with one directory ("a=b" and "a_b" would share, and overwrite, one SAE),
    and a name whose directory is not inside OUT/saes ("." or "..")."""
    saes = Path(out) / "saes"
    by_slug: dict[str, str] = {}
    for name in names:
        slug = _slug(str(name))
        if slug in (".", ".."):
            raise BadInputError(f"SAE name {name!r} would be written to {saes / slug}, outside {saes}; rename it")
        if slug in by_slug:
            raise BadInputError(
                f"SAE names {by_slug[slug]!r} and {name!r} both map to the directory {saes / slug}; rename one of them"
            )
        by_slug[slug] = str(name)
    return {name: saes / slug for slug, name in by_slug.items()}


def _store_complete(path: Path, max_tokens: int | None) -> bool:
    from saegeo.activations.store import ActivationStore

    try:
        store = ActivationStore(path)
    except (StoreError, OSError, KeyError, ValueError):
        return False
    return max_tokens is None or store.n_tokens >= max_tokens


def _trained(sae_dir: Path, tcfg: TrainConfig, store: ActivationStore) -> bool:
    """An SAE directory written by the trainer from this exact config and these exact shards."""
    from saegeo.sae.formats import CFG_FILENAME, WEIGHTS_FILENAME
    from saegeo.sae.train import NOT_IN_WEIGHTS

    cfg_file = sae_dir / CFG_FILENAME
    if not cfg_file.is_file() or not (sae_dir / WEIGHTS_FILENAME).is_file():
        return False
    try:
        saved = json.loads(cfg_file.read_text()).get("saegeo", {})
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    data = saved.get("data", {})
    strip = lambda c: {k: v for k, v in (c or {}).items() if k not in NOT_IN_WEIGHTS}  # noqa: E731
    recorded = recorded_options(saved.get("train_config") or {})  # a record of any release, as recorded now
    return same_json(strip(recorded), strip(tcfg.resolved().record())) and data.get("shard_sha256") == [
        s.sha256 for s in store.shards
    ]


def write_synthetic_store(
    gen: SuperpositionGenerator,
    path: str | os.PathLike,
    n: int,
    *,
    batch_rows: int = BATCH_ROWS,
    shard_rows: int = 65536,
    dtype: str = "float32",
    mode: str = "create",
    progress: bool = False,
) -> ActivationStore:
    """Write n rows of ``gen`` as an activation store at ``path`` plus ``path/truth.safetensors``.

    The manifest records the generator's config (as the store's corpus identity) and the truth file.
    """
    from saegeo.activations.store import write_store

    path = Path(path)
    config = asdict(gen.config)
    store = write_store(
        path,
        gen.activations(n, batch_rows, progress=progress),
        hook="synthetic",
        model=f"saegeo.synthetic(seed={gen.config.seed})",
        dtype=dtype,
        corpus={"synthetic": config},
        shard_rows=shard_rows,
        extra_meta={"synthetic": config, "truth": "truth.safetensors"},
        mode=mode,
    )
    gen.truth.save(path / "truth.safetensors")
    return store
