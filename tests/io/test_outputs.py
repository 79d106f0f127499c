"""No output is an input, output sets are whole, no work is lost to a late error.

Every command that writes is given an output that is, contains or lies inside one of its inputs (or a store):
refused before any work, in one line naming both, the input untouched, --overwrite or not. A report's set of
files is killed (os._exit, as SIGKILL) or interrupted (KeyboardInterrupt, as Ctrl-C) at every rename and must be
whole afterwards: the old set or the new one, byte for byte."""

import errno
import hashlib
import multiprocessing as mp
import os
from pathlib import Path

import pytest
import torch

from saegeo import io
from saegeo.activations.store import write_store
from saegeo.cli import main
from saegeo.sae.model import SAE, SAEConfig

D = 8


def _tree(path: Path) -> dict[str, str]:
    """sha256 of every file under path (or of path itself): what 'untouched' means."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    root = tmp_path_factory.mktemp("io37")
    g = torch.Generator().manual_seed(0)
    write_store(root / "store", torch.randn(512, D, generator=g), shard_rows=128)
    write_store(root / "store2", torch.randn(512, D, generator=g) * 3 + 1, shard_rows=128)
    sae = SAE(SAEConfig(d_in=D, d_sae=16, activation="topk", k=2))
    sae.init_weights(torch.Generator().manual_seed(0))
    sae.save(root / "sae")
    (root / "docs.txt").write_text("The quick brown fox jumps over the lazy dog. " * 40)
    (root / "run.toml").write_text(
        f'out = "{root / "store"}"\nacts = "{root / "store"}"\n[saes.a]\ntopk = {{ k = 2 }}\n'
    )
    from safetensors.torch import save_file

    save_file({"activations": torch.randn(64, D, generator=g)}, str(root / "in.safetensors"))
    return root


def _cases(fx: Path) -> dict[str, tuple[list[str], str, str]]:
    """name -> (argv, the output named, the input named): each output is, contains or lies inside an input."""
    store, sae, file = str(fx / "store"), str(fx / "sae"), str(fx / "in.safetensors")
    return {
        "geometry --json is the input file": (["geometry", file, "--json", file], file, file),
        "geometry --json is a shard of the input store": (
            ["geometry", store, "--json", f"{store}/shard_00000.safetensors"],
            "shard_00000",
            store,
        ),
        "synth --out is a shard inside a store": (
            ["synth", "--n", "100", "--d", "8", "--out", f"{store}/shard_00000.safetensors"],
            "shard_00000",
            store,
        ),
        "synth --out is a new file inside a store": (
            ["synth", "--n", "100", "--d", "8", "--out", f"{store}/extra.safetensors"],
            "extra.safetensors",
            store,
        ),
        "sweep --out is the store": (["sweep", store, "--out", store], store, store),
        "sweep --json inside the store": (["sweep", store, "--json", f"{store}/manifest.json"], "manifest.json", store),
        "report --out is the store": (["report", "--acts", store, "--out", store], store, store),
        "report --out is the SAE directory": (
            ["report", "--acts", store, "--sae", sae, "--out", sae, "--format", "json"],
            sae,
            sae,
        ),
        "check --out is the SAE directory": (["check", sae, "--out", sae], sae, sae),
        "check --out is the acts store": (["check", sae, "--acts", store, "--out", store], store, store),
        "compare --out is the first SAE": (["compare", sae, sae, "--out", sae], sae, sae),
        "latents --out inside the store": (["latents", sae, "--acts", store, "--out", f"{store}/cards"], store, store),
        "eval --json is the SAE's weights": (
            ["eval", "--sae", sae, "--json", f"{sae}/sae_weights.safetensors"],
            "sae_weights",
            sae,
        ),
        "train --out is the store": (["train", "--acts", store, "--topk.k", "2", "--out", store], store, store),
        "train --out contains the store": (
            ["train", "--acts", store, "--topk.k", "2", "--out", str(fx)],
            str(fx),
            store,
        ),
        "cache --out holds the corpus where a store goes": (
            ["cache", "--corpus", str(fx / "blocks.3.hook_resid_post"), "--out", str(fx)],
            "blocks.3.hook_resid_post",
            "blocks.3.hook_resid_post",
        ),
        "run with out set to the store": (["run", str(fx / "run.toml")], store, store),
    }


@pytest.mark.parametrize("overwrite", [False, True])
def test_no_output_of_any_command_may_be_an_input(fx, capsys, monkeypatch, overwrite):
    (fx / "blocks.3.hook_resid_post").write_text("a corpus file where cache would put its store")
    before = _tree(fx)
    for name, (argv, out, inp) in _cases(fx).items():
        if overwrite and argv[0] not in ("run",):
            argv = [*argv, "--overwrite"]
        capsys.readouterr()
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2, (name, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("saegeo: error: output "), (name, err)
        assert out in lines[0] and inp in lines[0], (name, lines[0])
        assert _tree(fx) == before, name  # nothing written, nothing replaced


def test_links_and_dotdot_are_resolved(fx, tmp_path, capsys):
    file = fx / "in.safetensors"
    (tmp_path / "link").symlink_to(file)
    os.link(file, tmp_path / "hard.safetensors")
    (tmp_path / "dir").symlink_to(fx / "store")
    before = _tree(fx)
    for out, why in [
        (tmp_path / "link", "through links"),
        (tmp_path / "hard.safetensors", "hard links"),
        (fx / "store" / ".." / "in.safetensors", ""),
        (tmp_path / "dir" / "g.json", "through links"),
    ]:
        src = str(fx / "store") if "dir" in str(out) else str(file)
        assert main(["geometry", src, "--json", str(out), "--overwrite", "--no-progress"]) == 2, out
        err = capsys.readouterr().err
        assert why in err and len(err.strip().splitlines()) == 1, err
    assert _tree(fx) == before


# =========================================================================== whole output sets
@pytest.fixture(scope="module")
def reports(fx):
    """An old and a new report (two different stores, one SAE: latents files too), computed once."""
    from saegeo.report import ReportOptions, geometry_report

    opts = ReportOptions(progress=False)
    return [geometry_report(str(fx / s), {"a": str(fx / "sae")}, options=opts) for s in ("store", "store2")]


_FIGURES: dict[int, dict] = {}


@pytest.fixture
def fast_figures(monkeypatch):
    """Each report's figures drawn once (matplotlib takes seconds): the renames, not the drawing, are tested."""
    from saegeo.render import report_page as render_report

    draw = render_report.figures

    def drawn_once(page):
        if id(page) not in _FIGURES:
            _FIGURES[id(page)] = draw(page)
        return _FIGURES[id(page)]

    monkeypatch.setattr(render_report, "figures", drawn_once)


def _write_and_crash(report, out: str, crash_at: str) -> None:
    os.environ[io.CRASH_ENV] = crash_at
    from saegeo.render import write_report

    write_report(report, out)


def _whole(out: Path, old: dict[str, bytes], new: dict[str, bytes]) -> str:
    """'old' or 'new' when every file of the set in ``out`` is that set's, byte for byte; fails on a mix."""
    have = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert not [n for n in have if n.endswith(".tmp") or io.STAGING in n or n == io.JOURNAL], sorted(have)
    if have == old:
        return "old"
    assert have == new, sorted(n for n in have if have[n] != new.get(n))
    return "new"


def _set(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_a_report_killed_at_every_rename_is_whole_after_the_rerun(fx, reports, fast_figures, tmp_path, capsys):
    from saegeo.render import write_report

    old_report, new_report = reports
    write_report(new_report, tmp_path / "ref")
    new = _set(tmp_path / "ref")
    write_report(old_report, tmp_path / "ref_old")
    old = _set(tmp_path / "ref_old")
    assert len(new) >= 8 and all(old[n] != new[n] for n in new), "the two sets differ in every file"
    for k in range(0, len(new) + 1):  # k = 0: killed with the set staged, before the journal
        out = tmp_path / f"out{k}"
        write_report(old_report, out)
        crash_at = f"output_set_rename:{k}" if k else "output_set_staged:1"
        p = mp.get_context("fork").Process(target=_write_and_crash, args=(new_report, str(out), crash_at))
        p.start()
        p.join(120)
        assert p.exitcode == 137, k
        capsys.readouterr()
        said = io.recover_output_set(out)  # what a rerun does first (saegeo's commands call it before any work)
        assert ("discarded" if k == 0 else "completed") in said, said
        assert _whole(out, old, new) == ("old" if k == 0 else "new"), k
        assert io.recover_output_set(out) is None  # nothing left pending


def test_a_rerun_of_the_command_says_which_set_and_recovers(fx, reports, fast_figures, tmp_path, capsys):
    old_report, new_report = reports
    from saegeo.render import write_report

    out = tmp_path / "r"
    write_report(old_report, out)
    p = mp.get_context("fork").Process(target=_write_and_crash, args=(new_report, str(out), "output_set_rename:3"))
    p.start()
    p.join(120)
    assert p.exitcode == 137
    assert (out / io.JOURNAL).exists()
    capsys.readouterr()
    rc = main(["report", "--acts", str(fx / "store2"), "--sae", f"a={fx / 'sae'}", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "an interrupted write was completed; its files are the new set" in err, err
    assert "already exists" in err.splitlines()[-1]
    assert not (out / io.JOURNAL).exists() and not (out / io.STAGING).exists()


@pytest.mark.parametrize("k", [1, 4])
def test_ctrl_c_between_two_renames_finishes_the_new_set(fx, reports, fast_figures, tmp_path, monkeypatch, k):
    from saegeo.render import write_report

    old_report, new_report = reports
    write_report(new_report, tmp_path / "ref")
    out = tmp_path / "out"
    write_report(old_report, out)
    old = _set(out)
    seen = []

    def interrupt(where):
        seen.append(where)
        if where == "output_set_rename" and seen.count(where) == k:
            raise KeyboardInterrupt

    monkeypatch.setattr(io, "crash_point", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_report(new_report, out)
    assert _whole(out, old, _set(tmp_path / "ref")) == "new"


def test_an_error_while_staging_leaves_the_old_set_and_no_temp_file(fx, reports, fast_figures, tmp_path, monkeypatch):
    from saegeo.render import report_page as render_report
    from saegeo.render import write_report

    old_report, new_report = reports
    out = tmp_path / "out"
    write_report(old_report, out)
    old = _set(out)
    monkeypatch.setattr(render_report, "render_html", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        write_report(new_report, out)
    assert _whole(out, old, {}) == "old"


def test_a_full_disk_names_the_file_and_leaves_no_temp_file(fx, tmp_path, capsys, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(io.os, "fsync", full)
    out = tmp_path / "g.json"
    rc = main(["geometry", str(fx / "store"), "--json", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "No space left on device" in err and str(out) in err, err
    assert list(tmp_path.iterdir()) == []


# =========================================================================== no work lost to a late error
def test_an_unwritable_output_is_refused_before_the_pass(fx, tmp_path, capsys, monkeypatch):
    """Tests run as root: a path under a file is what nobody can write. Found before the pass, not after it."""
    import importlib

    from saegeo.report import geometry as report_geometry

    report_report = importlib.import_module(
        "saegeo.report.geometry_report"
    )  # the module: the package exports a function of its name

    (tmp_path / "a_file").write_text("x")
    monkeypatch.setattr(report_geometry, "files_geometry", lambda *a, **k: pytest.fail("the pass ran"))
    monkeypatch.setattr(report_report, "geometry_report", lambda *a, **k: pytest.fail("the pass ran"))
    for argv in (
        ["geometry", str(fx / "store"), "--json", str(tmp_path / "a_file" / "g.json")],
        ["report", "--acts", str(fx / "store"), "--out", str(tmp_path / "a_file" / "r")],
        ["sweep", str(fx / "store"), "--out", str(tmp_path / "a_file" / "s")],
        ["train", "--acts", str(fx / "store"), "--topk.k", "2", "--out", str(tmp_path / "a_file" / "t")],
    ):
        assert main([*argv, "--no-progress"]) == 2, argv
        err = capsys.readouterr().err
        assert "a_file" in err and "is a file, not a directory" in err and len(err.strip().splitlines()) == 1, err


def test_synth_refuses_more_rows_than_the_disk_holds(tmp_path, capsys, monkeypatch):
    import collections

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(io.shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))  # 1000 bytes free
    assert main(["synth", "--n", "100", "--d", "8", "--out", str(tmp_path / "big")]) == 2  # 3,200 bytes of rows
    err = capsys.readouterr().err
    assert "free there" in err and str(tmp_path / "big") in err, err
    assert not (tmp_path / "big").exists()


def _train_holding(out: str, store: str, started, release) -> None:
    from saegeo.sae.train import TrainConfig, train_sae

    def hold(step, _):
        if step == 1:
            started.set()
            release.wait(60)

    cfg = TrainConfig(
        d_sae=16,
        arch_options={"topk": {"k": 2}},
        batch_tokens=32,
        total_tokens=32 * 3,
        progress=False,
        out_dir=out,
        num_threads=1,
    )
    train_sae(cfg, store, on_step=hold)


def test_a_second_training_into_one_out_dir_is_refused_with_the_first_ones_pid(fx, tmp_path, capsys):
    ctx = mp.get_context("fork")
    started, release = ctx.Event(), ctx.Event()
    out = tmp_path / "sae"
    p = ctx.Process(target=_train_holding, args=(str(out), str(fx / "store"), started, release))
    p.start()
    try:
        assert started.wait(120)
        capsys.readouterr()
        rc = main(["train", "--acts", str(fx / "store"), "--topk.k", "2", "--d-sae", "16", "--out", str(out)])
        err = capsys.readouterr().err
        assert rc == 2 and f"another process (pid {p.pid})" in err and len(err.strip().splitlines()) == 1, err
    finally:
        release.set()
        p.join(120)
    assert p.exitcode == 0
    assert (out / "cfg.json").is_file()  # the first run finished untouched


@pytest.mark.parametrize(
    "rows, reason",
    [
        (torch.zeros(256, D), "all zeros"),
        (torch.full((256, D), 3.0), "one and the same vector"),
        (torch.randn(256, D, generator=torch.Generator().manual_seed(0)) * 1e30, "overflow float32"),
        (torch.randn(256, D, generator=torch.Generator().manual_seed(0)).double() * 1e-30, "underflow float32"),
    ],
    ids=["zeros", "constant", "1e30", "1e-30"],
)
def test_untrainable_data_is_refused_up_front_with_the_reason(tmp_path, capsys, rows, reason):
    from safetensors.torch import save_file

    save_file({"activations": rows}, str(tmp_path / "x.safetensors"))
    argv = ["train", "--acts", str(tmp_path / "x.safetensors"), "--topk.k", "2", "--d-sae", "16"]
    rc = main([*argv, "--batch-tokens", "32", "--total-tokens", "320", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and reason in err and "learning rate" not in err and len(err.strip().splitlines()) == 1, err


def test_train_on_the_meta_device_is_one_line(fx, tmp_path, capsys):
    argv = ["train", "--acts", str(fx / "store"), "--topk.k", "2", "--out", str(tmp_path / "t"), "--device", "meta"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "'meta' holds no data" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "t").exists()


def test_cache_refuses_a_pass_the_disk_cannot_hold_before_it_runs(tmp_path, capsys, monkeypatch):
    import collections
    import json

    tiny = dict(d_model=16, n_layers=1, n_heads=2, d_head=8, d_mlp=32, n_ctx=32, d_vocab=30522, act_fn="gelu")
    (tmp_path / "model.json").write_text(json.dumps({"hooked_transformer_config": {**tiny, "seed": 0}}))
    (tmp_path / "docs.txt").write_text("The quick brown fox jumps over the lazy dog. " * 40)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(io.shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))  # 1000 bytes free
    argv = ["cache", "--model", str(tmp_path / "model.json"), "--corpus", str(tmp_path / "docs.txt")]
    rc = main([*argv, "--hooks", "blocks.0.hook_resid_post", "--context", "16", "--out", str(tmp_path / "acts")])
    err = capsys.readouterr().err
    assert rc == 2 and "free there" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "acts").exists()


def test_refuse_untrainable_on_rows_the_readers_pass():
    """Rows handed to train_sae as a tensor (float64 in memory): the bounds come from float32's finfo."""
    from saegeo.errors import BadInputError
    from saegeo.sae.train import refuse_untrainable

    g = torch.Generator().manual_seed(0)
    refuse_untrainable(torch.randn(64, D, generator=g).double() * 1e9, "ok")  # 1e18·8 < 3.4e38: trainable
    with pytest.raises(BadInputError, match="overflow float32"):
        refuse_untrainable(torch.randn(64, D, generator=g).double() * 1e19 + 7e18, "big")  # 7e18²·8 > 3.4e38
    with pytest.raises(BadInputError, match="underflow float32"):
        refuse_untrainable(torch.randn(64, D, generator=g).double() * 1e-21, "tiny spread")


@pytest.mark.parametrize("checkpoints", [False, True])
def test_train_refuses_an_sae_the_disk_cannot_hold_before_the_first_step(
    fx, tmp_path, capsys, monkeypatch, checkpoints
):
    """d 8 × d_sae 16 float32 W_enc + W_dec are 1,024 bytes (4,096 with a checkpoint's weights and Adam moments):
    1,000 bytes free refuses the first, 2,000 the second, before any step; the directory the run made is gone."""
    import collections

    usage = collections.namedtuple("usage", "total used free")
    free = 2000 if checkpoints else 1000
    monkeypatch.setattr(io.shutil, "disk_usage", lambda path: usage(10**6, 10**6 - free, free))
    out = tmp_path / "t"
    argv = ["train", "--acts", str(fx / "store"), "--topk.k", "2", "--d-sae", "16", "--out", str(out)]
    argv += ["--batch-tokens", "32", "--total-tokens", "96", "--no-progress"]
    rc = main([*argv, *(["--checkpoint-every", "1"] if checkpoints else [])])
    err = capsys.readouterr().err
    assert rc == 2 and "free there" in err and len(err.strip().splitlines()) == 1, err
    assert ("checkpoints" in err) == checkpoints and f"{free / 2**30:,.2f} GiB" in err
    assert not out.exists()
    monkeypatch.setattr(io.shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 5000, 5000))  # room: it trains
    assert main([*argv, *(["--checkpoint-every", "1"] if checkpoints else [])]) == 0


@pytest.mark.parametrize("command", ["check", "report", "latents", "sweep"])
def test_a_report_the_disk_cannot_hold_is_refused_before_the_pass(fx, tmp_path, capsys, monkeypatch, command):
    """report_set_bytes: 2 MiB + 1,500 B per latent; 1 MiB free refuses it before the pass (monkeypatched to fail):
    a report, check --acts and latents by their latents, a sweep by its fixed part."""
    import collections
    import importlib

    from saegeo.render.common import report_set_bytes

    pass_module = importlib.import_module("saegeo.report.geometry_report")  # the module, not its function

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(io.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 2**20, 2**20))
    monkeypatch.setattr(pass_module, "open_rows", lambda *a, **k: pytest.fail("the pass ran"))
    sweep_module = importlib.import_module("saegeo.report.store_measures")
    monkeypatch.setattr(sweep_module, "open_rows", lambda *a, **k: pytest.fail("the pass ran"))
    store, sae, out = str(fx / "store"), str(fx / "sae"), tmp_path / "out"
    argv, what = {
        "check": (["check", sae, "--acts", store], "the report of 16 latents"),
        "report": (["report", "--acts", store, "--sae", sae], "the report of 16 latents"),
        "latents": (["latents", sae, "--acts", store], "the latent table of 16 latents"),
        "sweep": (["sweep", store], "the sweep's files"),
    }[command]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert what in err and "free there" in err and len(err.strip().splitlines()) == 1, err
    assert report_set_bytes([16, 4]) == 2 * 2**20 + 1500 * 20
    assert not out.exists()
