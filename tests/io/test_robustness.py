"""Nothing lost, nothing silently wrong: shard checksums on every read, checkpoints that know their
data and options, SAE directories never overwritten or mixed, one writer per store, strict JSON, clipped measures.
Fault tests kill real processes (SIGKILL) at random training steps and between the two files of an SAE save."""

import json
import multiprocessing as mp
import os
import random
import re
import signal
from pathlib import Path

import pytest
import torch

from saegeo.activations.store import ActivationStore, StoreWriter, write_store
from saegeo.cli import main
from saegeo.errors import BadInputError, FormatError, StoreError
from saegeo.sae.architectures import get_architecture
from saegeo.sae.model import SAE, SAEConfig
from saegeo.sae.train import TrainConfig, _state_digest, train_sae

D = 8


def _rows(n: int, seed: int = 0, offset: float = 0.0) -> torch.Tensor:
    return torch.randn(n, D, generator=torch.Generator().manual_seed(seed)) + offset


def _cfg(out=None, **kw) -> TrainConfig:
    base = dict(
        d_sae=16,
        arch_options={"topk": {"k": 2}},
        batch_tokens=32,
        total_tokens=32 * 12,
        b_dec_init_tokens=64,
        progress=False,
        log_every=2,
        warmup_steps=2,
        shuffle_buffer=64,
        out_dir=None if out is None else str(out),
    )
    arch_options = {**base.pop("arch_options"), **kw.pop("arch_options", {})}  # a caller's table joins the defaults
    return TrainConfig(**{**base, **kw}, arch_options=arch_options)


def _train_until(cfg: TrainConfig, data, step: int) -> None:
    """Train, interrupted by an exception after ``step`` steps: the checkpoints stay, no SAE is written."""

    class Stop(Exception):
        pass

    def stop(done, _):
        if done == step:
            raise Stop

    with pytest.raises(Stop):
        train_sae(cfg, data, on_step=stop)


def _flip_a_bit(store_path: Path, shard: int) -> None:
    """One bit of one float in the middle of the shard's data: the header stays valid, the file parses."""
    f = store_path / f"shard_{shard:05d}.safetensors"
    data = bytearray(f.read_bytes())
    data[len(data) - 4 * D * 3 + 3] ^= 0x40  # the sign/exponent byte of a float near the end
    f.write_bytes(bytes(data))


@pytest.fixture
def store(tmp_path):
    return write_store(tmp_path / "store", _rows(1024), shard_rows=256)


# =========================================================================== checksums on read
@pytest.mark.parametrize("shard", [0, 1, 3])
def test_a_flipped_bit_in_any_shard_is_refused_by_every_reader(store, tmp_path, capsys, shard):
    _flip_a_bit(store.path, shard)
    name = f"shard_{shard:05d}.safetensors"
    # store iteration and random access
    fresh = ActivationStore(store.path)
    with pytest.raises(StoreError, match=f"{name}.*sha256"):
        list(fresh.iter_batches(100))
    with pytest.raises(StoreError, match=name):
        fresh.read_rows(shard * 256, shard * 256 + 5)
    # every command that reads it: one line naming the shard and what to do, exit 2
    sae = SAE(SAEConfig(d_in=D, d_sae=16, activation="topk", k=2))
    sae.init_weights(torch.Generator().manual_seed(0))
    sae.save(tmp_path / "sae")
    commands = {
        "geometry": ["geometry", str(store.path), "--no-progress"],
        "report": ["report", "--acts", str(store.path), "--out", str(tmp_path / "rep"), "--no-progress"],
        "train": [
            "train",
            "--acts",
            str(store.path),
            "--d-sae",
            "16",
            "--topk.k",
            "2",
            "--batch-tokens",
            "32",
            "--total-tokens",
            "320",
            "--b-dec-init-tokens",
            "1024",
            "--shuffle-buffer",
            "64",
            "--no-progress",
        ],
        "check": ["check", str(tmp_path / "sae"), "--acts", str(store.path), "--no-progress"],
    }
    for command, argv in commands.items():
        capsys.readouterr()
        assert main(argv) == 2, command
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and name in err[0] and "store verify" in err[0], (command, err)
    assert not (tmp_path / "rep" / "report.json").exists()


def test_no_verify_reads_a_damaged_store_for_users_who_accept_the_risk(store, capsys):
    _flip_a_bit(store.path, 1)
    assert len(list(ActivationStore(store.path, verify=False).iter_batches(100))) == 11
    # the flipped exponent bit made one value ~1e38: no checksum stops it, its magnitude does, in one line
    assert main(["geometry", str(store.path), "--no-progress", "--no-verify"]) == 2
    err = capsys.readouterr().err.strip()
    assert "magnitude up to" in err and "shard 1" in err and "sha256" not in err and "\n" not in err, err


def test_store_verify_recounts_rows_from_the_shard_headers(store, capsys):
    manifest = json.loads((store.path / "manifest.json").read_text())
    manifest["shards"][1]["rows"] -= 6  # edited consistently: the counts still add up to n_tokens
    manifest["n_tokens"] -= 6
    (store.path / "manifest.json").write_text(json.dumps(manifest))
    assert main(["store", "verify", str(store.path)]) == 1
    out = capsys.readouterr().out
    assert "shard 1 (shard_00001.safetensors): holds activations of shape [256, 8], manifest says (250, 8)" in out


def _hold_writer(path: str, ready, release) -> None:
    with StoreWriter(path, d=D):
        ready.set()
        release.wait(30)


def test_a_second_store_writer_is_refused_with_the_first_ones_pid(tmp_path):
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold_writer, args=(str(tmp_path / "s"), ready, release))
    p.start()
    try:
        assert ready.wait(30)
        with pytest.raises(StoreError, match=f"another process \\(pid {p.pid}\\) is writing this store"):
            StoreWriter(tmp_path / "s", d=D, mode="resume")
    finally:
        release.set()
        p.join(30)
    with StoreWriter(tmp_path / "s", d=D, mode="resume") as w:  # the lock went with the first writer
        w.append(_rows(4))


# =========================================================================== checkpoints and SAE directories
def test_resume_refuses_other_data_and_other_options_naming_them(tmp_path):
    a = write_store(tmp_path / "layer3", _rows(1024, seed=3), shard_rows=256)
    b = write_store(tmp_path / "layer1", _rows(1024, seed=1), shard_rows=256)

    _train_until(_cfg(tmp_path / "sae", checkpoint_every=2), a, 5)
    state_before = (tmp_path / "sae" / "checkpoint" / "state.json").read_bytes()
    with pytest.raises(BadInputError, match=r"holds a run with data='store:.*it cannot be resumed with data="):
        train_sae(_cfg(tmp_path / "sae", checkpoint_every=2), b)
    default_lr = get_architecture("topk").train_defaults["lr"]  # the checkpoint's lr: the one left unset
    with pytest.raises(
        BadInputError,
        match=re.escape(f"lr={default_lr}, warmup_steps=2; it cannot be resumed with lr=0.001, warmup_steps=3"),
    ):
        train_sae(_cfg(tmp_path / "sae", checkpoint_every=2, lr=1e-3, warmup_steps=3), a)
    with pytest.raises(BadInputError, match=r"total_tokens=384; it cannot be resumed with total_tokens=192"):
        train_sae(_cfg(tmp_path / "sae", checkpoint_every=2, total_tokens=32 * 6), a)  # a smaller budget
    assert (tmp_path / "sae" / "checkpoint" / "state.json").read_bytes() == state_before  # nothing rewritten
    assert not (tmp_path / "sae" / "cfg.json").exists()
    # options that cannot change the weights may differ; the run resumes and finishes
    done = train_sae(_cfg(tmp_path / "sae", checkpoint_every=4, log_every=3), a)
    assert done.provenance["data"]["path"] == str(a.path)


def test_a_checkpoint_from_before_the_clip_default_resumes_as_never_clipped(tmp_path):
    """Checkpoints written before grad_clip_norm had per-architecture defaults recorded None ("never"): TopK's
    default 0 resumes them; ReLU's default 1 is another run, refused by name, and --grad-clip-norm 0 resumes it."""
    data = write_store(tmp_path / "store", _rows(1024, seed=3), shard_rows=256)
    for arch, out in (("topk", tmp_path / "topk"), ("relu", tmp_path / "relu")):
        _train_until(_cfg(out, arch=arch, checkpoint_every=2), data, 5)
        state_path = out / "checkpoint" / "state.json"
        state = json.loads(state_path.read_text())
        state["config"]["grad_clip_norm"] = None  # as recorded then (and its digest with it, as saved then)
        state["state_sha256"] = _state_digest(state)
        state_path.write_text(json.dumps(state))
    assert train_sae(_cfg(tmp_path / "topk", checkpoint_every=2), data).config.grad_clip_norm == 0.0
    with pytest.raises(BadInputError, match=r"grad_clip_norm=0\.0; it cannot be resumed with grad_clip_norm=1\.0"):
        train_sae(_cfg(tmp_path / "relu", arch="relu", checkpoint_every=2), data)
    train_sae(_cfg(tmp_path / "relu", arch="relu", checkpoint_every=2, grad_clip_norm=0.0), data)


def test_a_unit_norm_topk_checkpoint_from_before_the_free_default_is_refused_by_name(tmp_path):
    """TopK checkpoints from before decoder_norm had per-architecture defaults trained unit rows (recorded "unit",
    or no key at all in older ones): the free default is another run, refused by name; --decoder-norm unit resumes."""
    data = write_store(tmp_path / "store", _rows(1024, seed=3), shard_rows=256)
    for recorded in ("unit", None):
        out = tmp_path / f"topk-{recorded}"
        _train_until(_cfg(out, checkpoint_every=2, decoder_norm="unit"), data, 5)
        state_path = out / "checkpoint" / "state.json"
        state = json.loads(state_path.read_text())
        if recorded is None:
            del state["config"]["decoder_norm"]
        state["state_sha256"] = _state_digest(state)
        state_path.write_text(json.dumps(state))
        with pytest.raises(BadInputError, match=r"decoder_norm='unit'; it cannot be resumed with decoder_norm='free'"):
            train_sae(_cfg(out, checkpoint_every=2), data)
        assert train_sae(_cfg(out, checkpoint_every=2, decoder_norm="unit"), data).config.decoder_norm == "unit"


def test_a_finished_sae_is_never_overwritten_without_overwrite(tmp_path, store, capsys):
    first = train_sae(_cfg(tmp_path / "sae"), store)
    cfg_before = (tmp_path / "sae" / "cfg.json").read_bytes()
    with pytest.raises(BadInputError, match="already holds a trained SAE"):
        train_sae(_cfg(tmp_path / "sae", seed=1), store)
    with pytest.raises(BadInputError, match="already holds a trained SAE"):
        train_sae(_cfg(tmp_path / "sae", total_tokens=32 * 6), store)
    argv = [
        "train",
        "--acts",
        str(store.path),
        "--out",
        str(tmp_path / "sae"),
        "--d-sae",
        "16",
        "--topk.k",
        "2",
        "--batch-tokens",
        "32",
        "--total-tokens",
        "384",
        "--b-dec-init-tokens",
        "64",
        "--no-progress",
    ]
    assert main(argv) == 2 and "--overwrite" in capsys.readouterr().err
    assert (tmp_path / "sae" / "cfg.json").read_bytes() == cfg_before
    assert main(argv + ["--seed", "1", "--overwrite"]) == 0
    assert not torch.equal(SAE.load(tmp_path / "sae").W_dec, first.sae.W_dec)


def test_no_resume_does_not_silently_replace_a_checkpoint(tmp_path, store):
    _train_until(_cfg(tmp_path / "sae", checkpoint_every=2), store, 4)
    with pytest.raises(BadInputError, match="checkpoint at step 4 that a run without resume would replace"):
        train_sae(_cfg(tmp_path / "sae", checkpoint_every=2), store, resume=False)


def _train_then_sigkill(out: str, data_path: str, kill_at: int | None) -> None:
    def kill(step, _):
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # kill -9: no cleanup, no atexit, no flush

    train_sae(_cfg(out, checkpoint_every=3, num_threads=1), data_path, on_step=kill)


def test_sigkill_at_random_steps_then_resume_gives_bit_identical_weights(tmp_path, store):
    ctx = mp.get_context("fork")
    threads = torch.get_num_threads()
    try:  # one thread throughout: another thread count changes the weights bitwise (and a resume refuses it)
        _sigkill_runs(tmp_path, store, ctx)
    finally:
        torch.set_num_threads(threads)


def _sigkill_runs(tmp_path, store, ctx) -> None:
    full = train_sae(_cfg(tmp_path / "full", checkpoint_every=3, num_threads=1), store)
    steps = sorted({random.Random(seed).randint(1, 12) for seed in range(7)})
    assert len(steps) >= 5
    for kill_at in steps:
        out = tmp_path / f"killed_at_{kill_at}"
        p = ctx.Process(target=_train_then_sigkill, args=(str(out), str(store.path), kill_at))
        p.start()
        p.join(120)
        assert p.exitcode == -signal.SIGKILL, kill_at
        resumed = train_sae(_cfg(out, checkpoint_every=3, num_threads=1), store)
        for name, w in full.sae.state_dict().items():
            assert torch.equal(w, resumed.sae.state_dict()[name]), (kill_at, name)
        assert len(resumed.history) == len(full.history)
        assert resumed.history == [{**h, "tok_s": r["tok_s"]} for h, r in zip(full.history, resumed.history)]
        assert torch.equal(SAE.load(out).W_dec, full.sae.W_dec.detach())


def _save_and_crash(path: str, seed: int, crash_at: str) -> None:
    os.environ["SAEGEO_CRASH_AT"] = crash_at
    sae = SAE(SAEConfig(d_in=D, d_sae=16, activation="topk", k=2))
    sae.init_weights(torch.Generator().manual_seed(seed))
    sae.save(path)


@pytest.mark.parametrize("crash_at, survivor", [("sae_before_commit:1", "old"), ("sae_mid_commit:1", "new")])
def test_a_save_killed_between_the_two_files_leaves_one_whole_sae(tmp_path, crash_at, survivor):
    old = SAE(SAEConfig(d_in=D, d_sae=16, activation="topk", k=2))
    old.init_weights(torch.Generator().manual_seed(0))
    old.save(tmp_path / "sae")
    p = mp.get_context("fork").Process(target=_save_and_crash, args=(str(tmp_path / "sae"), 1, crash_at))
    p.start()
    p.join(60)
    assert p.exitcode == 137  # crash_point's os._exit: killed mid-save
    new = SAE(SAEConfig(d_in=D, d_sae=16, activation="topk", k=2))
    new.init_weights(torch.Generator().manual_seed(1))
    loaded = SAE.load(tmp_path / "sae")
    want = old if survivor == "old" else new
    for name, w in want.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], w), name
    assert not (tmp_path / "sae" / "saegeo_commit.json").exists()
    new.save(tmp_path / "sae")  # the next save clears an interrupted one's debris
    assert sorted(f.name for f in (tmp_path / "sae").iterdir()) == ["cfg.json", "sae_weights.safetensors"]


def test_weights_of_another_save_are_refused(tmp_path):
    for seed in (0, 1):
        sae = SAE(SAEConfig(d_in=D, d_sae=16, activation="topk", k=2))
        sae.init_weights(torch.Generator().manual_seed(seed))
        sae.save(tmp_path / str(seed))
    (tmp_path / "0" / "sae_weights.safetensors").write_bytes((tmp_path / "1" / "sae_weights.safetensors").read_bytes())
    with pytest.raises(FormatError, match="does not match the sha256 recorded in cfg.json"):
        SAE.load(tmp_path / "0")


# =========================================================================== cfg.json consistency
@pytest.mark.parametrize(
    "key, value", [("d_in", 9), ("d_sae", 32), ("architecture", "standard"), ("k", 3), ("apply_b_dec_to_input", False)]
)
def test_saelens_fields_that_disagree_with_the_saegeo_block_are_refused(tmp_path, key, value):
    sae = SAE(SAEConfig(d_in=D, d_sae=16, activation="topk", k=2))
    sae.init_weights(torch.Generator().manual_seed(0))
    sae.save(tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    cfg[key] = value
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match=f"SAELens fields disagree with the saegeo block \\({key}={value!r}"):
        SAE.load(tmp_path)


def test_an_empty_cfg_json_is_refused(tmp_path):
    sae = SAE(SAEConfig(d_in=D, d_sae=16, activation="relu"))
    sae.save(tmp_path)
    (tmp_path / "cfg.json").write_text("{}")
    with pytest.raises(FormatError, match=r"lacks \['d_in', 'd_sae'\]"):
        SAE.load(tmp_path)


# =========================================================================== held-out rows, strict JSON
def test_a_non_finite_held_out_row_is_named_or_skipped_and_counted(tmp_path):
    x = _rows(640)
    x[600, 3] = float("nan")  # held out: the last 64 rows (10%) are rows 576..639
    with pytest.raises(
        BadInputError, match=r"non-finite value \(NaN or inf\) in the tensor \(global row 600\), a held-out row"
    ):
        train_sae(_cfg(), x)
    res = train_sae(_cfg(tmp_path / "sae", skip_nonfinite=True), x)
    assert res.heldout["nonfinite_rows_skipped"] == 1 and res.heldout["tokens"] == 63


def test_every_json_written_is_strict(tmp_path):
    x = _rows(640)
    x[576:] = x[576]  # identical held-out rows: centred SS = 0, so the FVE is not a number
    train_sae(_cfg(tmp_path / "sae"), x)

    def refuse(constant):
        raise AssertionError(f"non-strict JSON constant {constant}")

    raw = json.loads((tmp_path / "sae" / "cfg.json").read_text(), parse_constant=refuse)
    assert raw["saegeo"]["metrics"]["heldout"]["fve"] is None


# =========================================================================== measures in their ranges
def test_offset_and_a_are_clipped_to_their_ranges_with_a_note():
    from saegeo.geometry.accumulate import GeometryAccumulator, anisotropy_from_unit_mean
    from saegeo.geometry.measures import activation_geometry

    # two equal rows: their sum is exact, so only the (float64) normalisation rounds; take the first row whose
    # ‖x̂‖ rounds above 1 (by one unit in the last place)
    for seed in range(100):
        acc = GeometryAccumulator(16)
        acc.add(torch.randn(1, 16, generator=torch.Generator().manual_seed(seed)).repeat(2, 1))
        if float(acc.unit_mean.norm()) > 1:
            break
    assert float(acc.unit_mean.norm()) > 1 and anisotropy_from_unit_mean(acc.unit_mean, acc.n_unit) > 1  # rounding
    geo = activation_geometry(acc)
    assert geo.offset == 1.0 and geo.anisotropy == 1.0  # identical directions: exactly 1 in exact arithmetic
    assert any(n.startswith("‖m̂‖ = 1 from rounding") for n in geo.notes), geo.notes
    assert any(n.startswith("A = 1 from rounding") for n in geo.notes), geo.notes


# =========================================================================== commits that cannot lie
def _overwrite_then_sigkill(out: str, data_path: str, kill_at: int) -> None:
    torch.set_num_threads(1)

    def kill(step, _):
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    train_sae(_cfg(out, seed=1, overwrite=True, checkpoint_every=2), data_path, on_step=kill)


def test_overwrite_killed_mid_run_leaves_the_old_sae_and_a_finished_one_replaces_it(tmp_path, store):
    first = train_sae(_cfg(tmp_path / "sae"), store)
    p = mp.get_context("fork").Process(target=_overwrite_then_sigkill, args=(str(tmp_path / "sae"), str(store.path), 5))
    p.start()
    p.join(120)
    assert p.exitcode == -signal.SIGKILL
    assert (tmp_path / "sae" / "checkpoint" / "state.json").is_file()  # the new run got under way
    old = SAE.load(tmp_path / "sae")
    for name, w in first.sae.state_dict().items():
        assert torch.equal(old.state_dict()[name], w), name
    second = train_sae(_cfg(tmp_path / "sae", seed=1, overwrite=True), store)
    new = SAE.load(tmp_path / "sae")
    assert torch.equal(new.W_dec, second.sae.W_dec.detach()) and not torch.equal(new.W_dec, first.sae.W_dec)


@pytest.mark.parametrize("tensor", ["W_dec", "b_enc", "threshold"])
def test_save_refuses_non_finite_weights_and_writes_nothing(tmp_path, tensor):
    good = SAE(SAEConfig(d_in=D, d_sae=16, activation="jumprelu"))
    good.init_weights(torch.Generator().manual_seed(0))
    good.save(tmp_path / "sae")
    before = {f.name: f.read_bytes() for f in (tmp_path / "sae").iterdir()}
    bad = SAE(SAEConfig(d_in=D, d_sae=16, activation="jumprelu"))
    bad.init_weights(torch.Generator().manual_seed(1))
    with torch.no_grad():
        getattr(bad, tensor).view(-1)[3] = float("nan")
        getattr(bad, tensor).view(-1)[5] = float("inf")
    for path in (tmp_path / "sae", tmp_path / "fresh"):
        with pytest.raises(BadInputError, match=rf"{path}: not saved: {tensor} has 2 non-finite value\(s\)") as err:
            bad.save(path)
        assert "\n" not in str(err.value)
    assert {f.name: f.read_bytes() for f in (tmp_path / "sae").iterdir()} == before
    assert not (tmp_path / "fresh").exists()


# =========================================================================== SAE names on disk
@pytest.mark.parametrize(
    "names, message",
    [
        (["a=b", "a_b"], r"SAE names 'a=b' and 'a_b' both map to the directory .*saes/a_b; rename one"),
        (["x y", "x  y"], r"SAE names 'x y' and 'x  y' both map"),
        ([".."], r"SAE name '\.\.' would be written to .*saes/\.\., outside .*saes; rename it"),
        (["."], r"SAE name '\.' would be written"),
    ],
)
def test_sae_names_that_collide_or_leave_saes_are_refused_before_anything_is_written(tmp_path, names, message):
    from saegeo.pipeline import run_job

    cfg = {
        "out": str(tmp_path / "run"),
        "acts": str(tmp_path / "no_store"),
        "saes": {name: {"seed": i} for i, name in enumerate(names)},
    }
    with pytest.raises(BadInputError, match=message):
        run_job(cfg, log=lambda *a: None)
    assert not (tmp_path / "run").exists()
