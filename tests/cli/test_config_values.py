"""No option can poison a result: every numeric field of every config is checked where it is
declared, from a flag, a config file or Python alike, with one line naming the field, exit 2, nothing written;
`train --config` reads or refuses every key; the one dataclass -> TOML -> argv path."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from saegeo.activations.store import write_store
from saegeo.cli import main
from saegeo.config import BATCH_ROWS, check, option, resolve
from saegeo.errors import BadInputError
from saegeo.sae.train import TrainConfig, train_sae


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return str(write_store(tmp_path_factory.mktemp("acts") / "store", torch.randn(600, 8), shard_rows=200).path)


def _one_line_exit_2(argv, capsys, *names):
    """Run the CLI: exit 2, one line on stderr naming one of ``names``, no traceback."""
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert any(name in err for name in names), f"{err!r} names none of {names}"
    return err


# a run that would train: each bad value must be refused before anything is written
def _train(store, out, *extra):
    return [
        "train",
        "--acts",
        store,
        "--out",
        str(out),
        "--d-sae",
        "16",
        "--topk.k",
        "2",
        "--batch-tokens",
        "64",
        "--total-tokens",
        "128",
        "--no-progress",
        *extra,
    ]


@pytest.mark.parametrize(
    "extra,field",
    [
        (["--arch", "jumprelu", "--bandwidth", "0"], "bandwidth"),  # an all-NaN threshold, L0 0, 100 % dead
        (["--arch", "jumprelu", "--bandwidth", "-1"], "bandwidth"),
        (["--grad-clip-norm", "-1"], "grad_clip_norm"),  # reverses the gradients
        (["--lr", "1e308"], "lr"),
        (["--seed", "-1"], "seed"),
        (["--seed", str(2**70)], "seed"),
        (["--arch", "batchtopk", "--threshold-ema", "nan"], "threshold_ema"),
        (["--arch", "jumprelu", "--threshold-lr-scale", "nan"], "threshold_lr_scale"),
        (["--arch", "relu", "--l1-warmup-fraction", "nan"], "l1_warmup_fraction"),
        (["--adam-betas", "0.9,nan"], "adam_betas"),
        (["--heldout-fraction", "inf"], "heldout_fraction"),
    ],
)
def test_train_refuses_a_poisonous_option_before_writing(store, tmp_path, capsys, extra, field):
    _one_line_exit_2(_train(store, tmp_path / "sae", *extra), capsys, field)
    assert not (tmp_path / "sae").exists()


@pytest.mark.parametrize(
    "key,value",
    [
        ("threshold_ema", "nan"),
        ("threshold_lr_scale", "nan"),
        ("l1_warmup_fraction", "nan"),
        ("bandwidth", "0.0"),
        ("lr", "1e308"),
    ],
)
def test_a_config_file_value_is_checked_as_the_flag_is(store, tmp_path, capsys, key, value):
    cfg = tmp_path / "t.toml"
    cfg.write_text(f'acts = "{store}"\n[train]\n{key} = {value}\n')
    _one_line_exit_2(["train", "--config", str(cfg), "--out", str(tmp_path / "sae")], capsys, key)
    assert not (tmp_path / "sae").exists()


def test_python_construction_is_checked_too():
    for bad in (
        dict(bandwidth=0.0),
        dict(threshold_ema=math.nan),
        dict(grad_clip_norm=-1.0),
        dict(seed=-1),
        dict(lr=1e308),
        dict(l1_warmup_fraction=math.nan),
        dict(seed=2**70),
    ):
        with pytest.raises(BadInputError, match=next(iter(bad))):
            TrainConfig(**bad)


def test_an_sae_the_machine_cannot_hold_is_one_line_before_any_allocation(store, tmp_path, capsys):
    # 1e12 latents on d = 8: 2 · 8 · 1e12 float32 weights with gradients and Adam moments, ~ 0.5 PB
    _one_line_exit_2(_train(store, tmp_path / "sae", "--d-sae", str(10**12)), capsys, "d_sae")
    _one_line_exit_2(_train(store, tmp_path / "sae", "--d-sae", str(2**70)), capsys, "d_sae")
    argv = _train(store, tmp_path / "sae")
    argv.remove("--d-sae")
    argv.remove("16")
    _one_line_exit_2([*argv, "--expansion", str(10**12)], capsys, "d_sae")
    assert not (tmp_path / "sae").exists()


@pytest.mark.parametrize(
    "extra,field",
    [
        (["--noise", "nan"], "noise"),  # an all-NaN store marked complete
        (["--noise", "-1"], "noise"),
        (["--seed", "-1"], "seed"),
        (["--d", str(10**9), "--n-features", str(10**9)], "synthetic dictionary"),  # 1e18 entries
        (["--n", "0"], "n"),
        (["--rate", "inf"], "rate"),
    ],
)
def test_synth_refuses_before_writing(tmp_path, capsys, extra, field):
    argv = ["synth", "--n", "100", "--d", "8", "--n-features", "16", "--out", str(tmp_path / "s"), *extra]
    _one_line_exit_2(argv, capsys, field, "--" + field)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    "extra,field",
    [
        (["--pass-norm-ratio", "-1"], "pass_norm_ratio"),  # passed every position through: cosine 1.0000
        (["--batch-windows", "0"], "batch_windows"),
        (["--context", "0"], "context"),
        (["--skip-tokens", "-5"], "skip_tokens"),  # then evaluated on training text
        (["--max-tokens", "0"], "max_tokens"),
    ],
)
def test_eval_refuses_before_loading_anything(tmp_path, capsys, extra, field):
    _one_line_exit_2(["eval", "--sae", str(tmp_path / "no-sae"), *extra], capsys, field, "--" + field.replace("_", "-"))


def test_report_refuses_bad_options_before_the_pass(store, tmp_path, capsys):
    out = tmp_path / "r"
    base = ["report", "--acts", store, "--out", str(out), "--no-progress"]
    _one_line_exit_2([*base, "--format", ""], capsys, "--format")  # wrote nothing with exit 0
    _one_line_exit_2([*base, "--format", " , "], capsys, "--format")
    _one_line_exit_2([*base, "--eval-tokens", "0"], capsys, "--eval-tokens")  # silently replaced by the default
    _one_line_exit_2([*base, "--seed", "-1"], capsys, "seed")
    _one_line_exit_2([*base, "--assumed-null", "nan"], capsys, "assumed_null")
    _one_line_exit_2([*base, "--batch-rows", "0"], capsys, "batch_rows")
    assert not out.exists()


def test_check_block_rows_0_is_one_line(tmp_path, capsys):
    _one_line_exit_2(["check", str(tmp_path / "no-sae"), "--block-rows", "0"], capsys, "block_rows")
    _one_line_exit_2(["check", str(tmp_path / "no-sae"), "--duplicate-cos", "nan"], capsys, "duplicate_cos")


def test_geometry_artifact_components_negative_is_one_line(store, tmp_path, capsys):
    argv = ["geometry", store, "--artifact-components", "-1", "--json", str(tmp_path / "g.json")]
    _one_line_exit_2(argv, capsys, "artifact_components")
    _one_line_exit_2(["geometry", store, "--batch-rows", "0"], capsys, "batch_rows")
    assert not (tmp_path / "g.json").exists()


# --------------------------------------------------------------------------- train --config: every key read or refused
class _Captured(Exception):
    pass


@pytest.fixture
def captured_train(monkeypatch):
    seen = []

    def fake(cfg, data, **kw):
        seen.append((cfg, data))
        raise _Captured

    monkeypatch.setattr("saegeo.sae.train.train_sae", fake)
    return seen


def test_train_config_top_level_keys_are_honoured(store, tmp_path, captured_train):
    (tmp_path / "t.toml").write_text(f'acts = "{store}"\nd_sae = 64\nbatch_tokens = 32\n')
    with pytest.raises(_Captured):
        main(["train", "--config", str(tmp_path / "t.toml")])
    ((cfg, data),) = captured_train
    assert (cfg.d_sae, cfg.batch_tokens, data) == (64, 32, store)  # d_sae = 64 trained 3,072 latents before


def test_train_config_keys_beside_a_train_table_are_refused_naming_key_and_file(
    store, tmp_path, capsys, captured_train
):
    path = tmp_path / "t.toml"
    path.write_text(f'acts = "{store}"\nd_sae = 64\n[train]\nlr = 1e-3\n')
    err = _one_line_exit_2(["train", "--config", str(path)], capsys, "d_sae")
    assert str(path) in err
    path.write_text(f'acts = "{store}"\n[train]\nlr = 1e-3\nexpansoin = 2\n')  # a typo was accepted
    err = _one_line_exit_2(["train", "--config", str(path)], capsys, "expansoin")
    assert str(path) in err and not captured_train


def test_resolve_puts_flags_over_the_file_over_the_defaults(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('acts = "A"\n[train]\nlr = 1e-3\n[train.topk]\nk = 4\naux_k = 3\n')
    cfg, extras = resolve(TrainConfig, {"topk": {"k": 8}}, path, table="train", extra=("acts",))
    assert (cfg.options.k, cfg.options.aux_k, cfg.lr, cfg.arch, extras) == (8, 3, 1e-3, "topk", {"acts": "A"})
    assert resolve(TrainConfig, {"topk": {"k": 8}})[0] == TrainConfig(arch_options={"topk": {"k": 8}})


def test_the_overwrite_advice_names_the_config_key_that_run_accepts(store, tmp_path):
    """`saegeo run` has no --overwrite flag: the refusal must also name `overwrite = true`."""
    out = tmp_path / "sae"
    small = dict(
        d_sae=16,
        arch_options={"topk": {"k": 2}},
        batch_tokens=64,
        total_tokens=128,
        b_dec_init_tokens=64,
        progress=False,
        out_dir=str(out),
    )
    train_sae(TrainConfig(**small), store)
    with pytest.raises(BadInputError, match=r"overwrite = true"):
        train_sae(TrainConfig(**{**small, "arch_options": {"topk": {"k": 3}}}), store)
    run = tmp_path / "run.toml"
    run.write_text(
        f'out = "{tmp_path / "r"}"\nacts = "{store}"\n[train]\nd_sae = 16\nbatch_tokens = 64\n'
        "total_tokens = 128\nb_dec_init_tokens = 64\nprogress = false\n[train.topk]\nk = 2\n"
    )
    (tmp_path / "r" / "saes" / "sae").mkdir(parents=True)
    (tmp_path / "r" / "saes" / "sae" / "cfg.json").write_text("{}")  # an SAE from elsewhere
    with pytest.raises(BadInputError, match=r"overwrite = true"):
        from saegeo.pipeline import load_run_config, run_job

        run_job(load_run_config(run), log=lambda *a: None)


# --------------------------------------------------------------------------- the generator itself
def test_check_covers_every_numeric_type_and_bound():
    @dataclasses.dataclass
    class C:
        a: int = option(1, "count", low=1)
        b: float = option(0.5, "fraction", above=0, below=1)
        c: float | None = option(None, "ratio", above=1)
        d: tuple[float, float] = option((0.1, 0.2), "pair", low=0, high=1)
        e: int = option(0, "seed")

        def __post_init__(self):
            check(self)

    C()
    for bad, message in [
        (dict(a=0), "a must be >= 1, got 0"),
        (dict(b=1.0), r"b must be in \(0, 1\), got 1.0"),
        (dict(b=math.nan), "b must be a finite number, got nan"),
        (dict(c=1.0), "c must be > 1"),
        (dict(d=(0.1, 2.0)), r"d must be in \[0, 1\], got 2.0"),
        (dict(e=2**63), "e must fit in 64 bits"),
        (dict(a=1.5), "a must be a whole number"),
        (dict(e=True), "e must be a whole number"),
    ]:
        with pytest.raises(BadInputError, match=message):
            C(**bad)
    assert C(c=None).c is None


def test_one_default_literal_for_rows_per_batch():
    """BATCH_ROWS is the default of every rows-per-batch option (report, geometry, sweep, the artifact pass)."""
    import inspect

    from saegeo.report.geometry_report import ReportOptions
    from saegeo.report.layer_sweep import SweepOptions
    from saegeo.report.options import GeometryOptions
    from saegeo.report.store_measures import artifact_pass, measure_store

    assert ReportOptions().batch_rows == GeometryOptions().batch_rows == SweepOptions().batch_rows == BATCH_ROWS
    for fn in (artifact_pass, measure_store):
        assert inspect.signature(fn).parameters["batch_rows"].default == BATCH_ROWS
    root = Path(__file__).resolve().parents[2] / "saegeo"
    hits = [f"{p.relative_to(root)}" for p in root.rglob("*.py") if "8192" in p.read_text() and p.name != "config.py"]
    assert not [h for h in hits if not h.startswith("geometry/")], hits  # geometry: its own chunk sizes


def test_run_config_tables_are_the_dataclasses(tmp_path):
    from saegeo.activations.cache import CacheConfig
    from saegeo.pipeline import load_run_config
    from saegeo.report.geometry_report import ReportOptions
    from saegeo.sae.evaluate import EvalConfig

    path = tmp_path / "run.toml"
    path.write_text(
        'out = "o"\nformats = ["json"]\n[cache]\nmodel = "smollm2"\nbatch_windows = 3\n[train]\n'
        "[train.topk]\nk = 5\n[saes]\na = { topk = { k = 7 } }\nb = {}\n[report]\nbatch_rows = 100\n[eval]\n"
        "batch_windows = 2\n"
    )
    cfg = load_run_config(path)
    assert isinstance(cfg.cache, CacheConfig) and cfg.cache.batch_windows == 3
    assert isinstance(cfg.report, ReportOptions) and cfg.report.batch_rows == 100
    assert isinstance(cfg.eval, EvalConfig) and (cfg.eval.model, cfg.eval.batch_windows) == ("smollm2", 2)
    a, b = cfg.sae_config("a"), cfg.sae_config("b")
    assert (a.options.k, b.options.k, a.out_dir) == (7, 5, "o/saes/a")
    path.write_text('out = "o"\n[saes]\na = { kk = 7 }\n')
    with pytest.raises(BadInputError, match=r"\[saes\] a: unknown key\(s\) \['kk'\]"):
        load_run_config(path)
    path.write_text('out = "o"\nformats = []\n')
    with pytest.raises(BadInputError, match="formats"):
        load_run_config(path)


@pytest.mark.parametrize(
    "error",
    [
        MemoryError(),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. "
            "DefaultCPUAllocator: not enough memory: you tried to "
            "allocate 80000000000000 bytes."
        ),
    ],
)
def test_a_failed_allocation_is_one_line(store, monkeypatch, capsys, error):
    """What no option check foresees (a store or a published SAE too large for this machine) is still one line."""

    def fail(*a, **kw):
        raise error

    monkeypatch.setattr("saegeo.activations.store.ActivationStore.verify", fail)
    assert main(["store", "verify", store]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("saegeo: error: out of memory") and err.count("\n") == 0
