"""Training that leaves a history: training_log.jsonl beside the SAE, written as the run goes,
continued by a resumed run without a missing or repeated step; the passes over the data said and recorded;
--dtype bf16/fp16/fp32 read by one parser wherever a dtype is taken; bfloat16 autocast training (CPU path) with
float32 master weights; optional W&B (offline)."""

import json

import pytest
import torch

from saegeo.config import parse_dtype
from saegeo.errors import BadInputError
from saegeo.sae.train import TRAINING_LOG, TrainConfig, read_training_log, train_sae

D = 12


def _rows(n=1200, seed=0):
    g = torch.Generator().manual_seed(seed)
    basis = torch.randn(24, D, generator=g)
    codes = torch.rand(n, 24, generator=g) * (torch.rand(n, 24, generator=g) < 0.15)
    return codes @ basis + 0.3 + 0.01 * torch.randn(n, D, generator=g)


def _cfg(out=None, **kw):
    base = dict(
        d_sae=32,
        arch_options={"topk": {"k": 3}},
        batch_tokens=64,
        total_tokens=64 * 10,
        log_every=3,
        b_dec_init_tokens=256,
        progress=False,
        num_threads=1,
        out_dir=str(out) if out else None,
    )
    arch_options = {**base.pop("arch_options"), **kw.pop("arch_options", {})}  # a caller's table joins the defaults
    return TrainConfig(**{**base, **kw}, arch_options=arch_options)


class _Stop(Exception):
    pass


# =========================================================================== the log
@pytest.mark.parametrize(
    "arch, aux_name", [("topk", "auxk_loss"), ("relu", "l1_loss"), ("batchtopk", "auxk_loss"), ("jumprelu", "l0_loss")]
)
def test_the_log_holds_every_logged_step_with_the_architectures_loss_terms(tmp_path, arch, aux_name):
    seen_mid_run = []

    def peek(step, _):  # written as the run goes, not at the end
        if step == 7:
            seen_mid_run.extend(r["step"] for r in read_training_log(tmp_path / "sae"))

    res = train_sae(
        _cfg(tmp_path / "sae", arch=arch, arch_options={"relu": {"l1_coefficient": 0.1}}), _rows(), on_step=peek
    )
    log = read_training_log(tmp_path / "sae")
    assert seen_mid_run == [3, 6]
    assert [r["step"] for r in log] == [3, 6, 9, 10]  # every log_every steps, and the last one
    assert log == json.loads(json.dumps(res.history))  # the file is the history
    for r in log:
        assert {"step", "tokens", "passes", "loss", aux_name, "mse", "fve", "l0", "dead", "lr", "tok_s"} <= set(r)
        assert r["tokens"] == r["step"] * 64
        assert 0 <= r["dead"] <= 1 and r["l0"] > 0 and r["lr"] > 0
    assert log[-1]["passes"] == pytest.approx(640 / 1080)  # 1080 training rows after holding out 120


def test_the_logged_loss_is_the_objective_of_the_interval(tmp_path):
    """ReLU: loss = SSE/n + l1·L1 per step, so with log_every 1 the record's loss = mse·d + l1·l1_loss."""
    res = train_sae(_cfg(arch="relu", arch_options={"relu": {"l1_coefficient": 0.25}}, log_every=1), _rows())
    for r in res.history:
        assert r["loss"] == pytest.approx(r["mse"] * D + 0.25 * r["l1_loss"], rel=1e-5)


def test_a_resumed_run_continues_the_log_without_missing_or_repeated_steps(tmp_path):
    """Killed after step 7 (the last checkpoint at step 4; the log had 3 and 6): the resumed run measures step 6
    again, and its log is the uninterrupted one."""
    x = _rows()
    whole = read_training_log(train_sae(_cfg(tmp_path / "whole", checkpoint_every=4), x).out_dir)

    def kill(step, _):
        if step == 7:
            raise _Stop

    with pytest.raises(_Stop):
        train_sae(_cfg(tmp_path / "cut", checkpoint_every=4), x, on_step=kill)
    assert [r["step"] for r in read_training_log(tmp_path / "cut")] == [3, 6]  # 6 came after the checkpoint at 4
    train_sae(_cfg(tmp_path / "cut", checkpoint_every=4), x)
    resumed = read_training_log(tmp_path / "cut")
    assert [r["step"] for r in resumed] == [3, 6, 9, 10]
    strip = lambda log: [{k: v for k, v in r.items() if k != "tok_s"} for r in log]  # noqa: E731
    assert strip(resumed) == strip(whole)  # bitwise: the accumulators were checkpointed mid-interval


def _older_checkpoint(tmp_path, x, kw, version: int, edit) -> list[dict]:
    """A run killed after step 5 (its checkpoint at step 4) whose checkpoint is rewritten as an older release wrote
    it: `edit(state, tensors)` changes both, the digests are made again. Returns the uninterrupted run's log."""
    import hashlib

    from safetensors.torch import load_file, save

    from saegeo.sae.train import _state_digest

    whole = read_training_log(train_sae(_cfg(tmp_path / "whole", **kw), x).out_dir)

    def kill(step, _):
        if step == 5:
            raise _Stop

    with pytest.raises(_Stop):
        train_sae(_cfg(tmp_path / "old", **kw), x, on_step=kill)
    ckpt = tmp_path / "old" / "checkpoint"
    state = json.loads((ckpt / "state.json").read_text())
    tensors = load_file(ckpt / state["tensors"])
    edit(state, tensors)
    data = save(tensors)
    (ckpt / state["tensors"]).write_bytes(data)
    state |= {"version": version, "tensors_sha256": hashlib.sha256(data).hexdigest()}
    state["state_sha256"] = _state_digest(state)
    (ckpt / "state.json").write_text(json.dumps(state))
    return whole


def test_a_version_3_checkpoint_resumes_with_only_its_first_intervals_loss_unknown(tmp_path):
    """A checkpoint written before the loss was accumulated (no acc.loss, acc.steps): the resumed log's first
    record has loss None, its other numbers (the step count recovered as step mod log_every) are the whole run's."""
    x, kw = (
        _rows(),
        dict(arch="relu", arch_options={"relu": {"l1_coefficient": 0.1}}, checkpoint_every=4),
    )  # relu: its l1_loss is never 0
    whole = _older_checkpoint(
        tmp_path, x, kw, 3, lambda state, tensors: [tensors.pop(k) for k in ("acc.loss", "acc.steps")]
    )
    train_sae(_cfg(tmp_path / "old", **kw), x)
    resumed = read_training_log(tmp_path / "old")
    assert [r["step"] for r in resumed] == [3, 6, 9, 10]
    assert resumed[1]["loss"] is None and whole[1]["loss"] is not None
    strip = lambda r: {k: v for k, v in r.items() if k not in ("tok_s", "loss")}  # noqa: E731
    assert [strip(r) for r in resumed] == [strip(r) for r in whole]
    assert [r["loss"] for r in resumed[2:]] == [r["loss"] for r in whole[2:]]


def test_a_version_4_checkpoint_with_flat_options_resumes_bitwise(tmp_path):
    """Before each architecture had its own options (checkpoint version 4): the config held k, l1_coefficient, ...
    flat beside the others, and the one loss term was summed as acc.aux. Such a checkpoint resumes, its options
    read into the architecture's table, its term folded into the term the forward names, to the whole run's log."""
    x, kw = _rows(), dict(arch="relu", arch_options={"relu": {"l1_coefficient": 0.1}}, checkpoint_every=4)

    def flat(state, tensors):
        tensors["acc.aux"] = tensors.pop("acc.term.l1_loss")
        assert state["config"].pop("arch_options") == {"relu": {"l1_coefficient": 0.1, "l1_warmup_fraction": 0.0}}
        state["config"] |= dict(k=32, l1_coefficient=0.1, l1_warmup_fraction=0.0, aux_k=None, aux_coefficient=1 / 32)
        state["config"] |= dict(threshold_ema=0.05, l0_coefficient=1.0, bandwidth=0.05, threshold_lr_scale=10.0)

    whole = _older_checkpoint(tmp_path, x, kw, 4, flat)
    with pytest.raises(
        BadInputError, match=r"relu.l1_coefficient=0.1; it cannot be resumed with relu.l1_coefficient=0.2"
    ):
        train_sae(_cfg(tmp_path / "old", arch="relu", arch_options={"relu": {"l1_coefficient": 0.2}}), x)
    train_sae(_cfg(tmp_path / "old", **kw), x)
    strip = lambda log: [{k: v for k, v in r.items() if k != "tok_s"} for r in log]  # noqa: E731
    assert strip(read_training_log(tmp_path / "old")) == strip(whole)


def test_a_finished_sae_keeps_its_log_and_a_run_killed_before_any_checkpoint_starts_a_new_one(tmp_path):
    x = _rows()
    train_sae(_cfg(tmp_path / "done"), x)
    before = (tmp_path / "done" / TRAINING_LOG).read_text()
    with pytest.raises(BadInputError, match="already holds a trained SAE.*--overwrite"):
        train_sae(_cfg(tmp_path / "done", seed=1), x)
    assert (tmp_path / "done" / TRAINING_LOG).read_text() == before
    train_sae(_cfg(tmp_path / "done", seed=1, overwrite=True), x)
    assert (tmp_path / "done" / TRAINING_LOG).read_text() != before

    def kill(step, _):
        if step == 7:
            raise _Stop

    with pytest.raises(_Stop):  # no checkpoint: nothing to resume, so the rerun starts again, log included
        train_sae(_cfg(tmp_path / "cut"), x, on_step=kill)
    assert [r["step"] for r in read_training_log(tmp_path / "cut")] == [3, 6]
    train_sae(_cfg(tmp_path / "cut"), x)
    assert [r["step"] for r in read_training_log(tmp_path / "cut")] == [3, 6, 9, 10]


def test_the_passes_over_the_store_are_said_and_recorded(tmp_path, capsys):
    """The issue's case: 20k tokens on 3,686 rows (3,317 training rows after the 10 % held out) is 6.0 passes
    of whole batches (78 steps of 256)."""
    from saegeo.render.text import render_train

    cfg = _cfg(tmp_path / "sae", batch_tokens=256, total_tokens=20_000, log_every=20, progress=True)
    res = train_sae(cfg, _rows(3686))
    printed = capsys.readouterr()
    assert "6.0 passes over the 3,317 training rows" in printed.out + printed.err
    assert res.provenance["passes_over_data"] == pytest.approx(78 * 256 / 3317)
    saved = json.loads((tmp_path / "sae" / "cfg.json").read_text())["saegeo"]
    assert saved["passes_over_data"] == pytest.approx(78 * 256 / 3317)
    assert "6.0 passes over the 3,317 training rows" in render_train(res)


# =========================================================================== dtypes
def test_one_dtype_parser_reads_every_spelling():
    for names, canonical in (
        (("fp32", "float32", "FP32", "torch.float32", torch.float32), "float32"),
        (("fp16", "float16", "half", torch.float16), "float16"),
        (("bf16", "bfloat16", "BF16", torch.bfloat16), "bfloat16"),
    ):
        assert {parse_dtype(n) for n in names} == {canonical}
    with pytest.raises(BadInputError, match="fp64.*bfloat16 \\(bf16\\)"):
        parse_dtype("fp64")


def test_every_dtype_option_takes_the_short_names(tmp_path):
    from saegeo.activations.cache import CacheConfig
    from saegeo.activations.store import StoreWriter
    from saegeo.config import from_dict
    from saegeo.pipeline import SynthOptions
    from saegeo.sae.evaluate import EvalConfig

    assert CacheConfig(dtype="bf16", model_dtype="fp16").dtype == "bfloat16"
    assert from_dict(CacheConfig, {"dtype": "fp16", "model_dtype": "bf16"}).model_dtype == "bfloat16"
    assert from_dict(EvalConfig, {"model_dtype": "bf16"}).model_dtype == "bfloat16"
    assert TrainConfig(dtype="bf16").dtype == "bfloat16" and TrainConfig(dtype="fp32").dtype == "float32"
    assert SynthOptions(n=4, out="x", dtype="fp16").dtype == "float16"
    w = StoreWriter(tmp_path / "s", d=4, dtype="bf16")
    assert w.manifest["dtype"] == "bfloat16"
    with pytest.raises(BadInputError, match="loss scaling"):
        TrainConfig(dtype="fp16")
    with pytest.raises(BadInputError, match="model_dtype"):
        from_dict(CacheConfig, {"model_dtype": "int8"})


def test_dtype_flags_parse_on_the_command_line(tmp_path, capsys):
    from saegeo.cli import main

    with pytest.raises(SystemExit) as err:
        main(["train", "--acts", str(tmp_path), "--dtype", "fp64"])
    assert err.value.code == 2
    message = capsys.readouterr().err
    assert "fp64" in message and "bf16" in message and len(message.strip().splitlines()) == 1
    # bf16 parses (the store is missing: the error is about the store, not the flag)
    assert main(["train", "--acts", str(tmp_path / "none"), "--dtype", "bf16", "--no-progress"]) == 2
    assert "--dtype" not in capsys.readouterr().err


def test_cache_and_eval_take_a_model_dtype(tmp_path):
    from saegeo.activations.cache import CacheConfig, cache_activations
    from saegeo.activations.store import ActivationStore
    from tests.activations.test_cache import TINY

    cfg_file = tmp_path / "tiny.json"
    cfg_file.write_text(json.dumps({"hooked_transformer_config": TINY}))
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    hook = "blocks.1.hook_resid_post"
    stores = {}
    for dt in ("fp32", "bf16"):
        cfg = CacheConfig(
            model=str(cfg_file), hooks=(hook,), corpus=str(text), context=32, out=str(tmp_path / dt),
            max_tokens=200, model_dtype=dt, progress=False,
        )  # fmt: skip
        stores[dt] = ActivationStore(cache_activations(cfg).stores[hook])
    a, b = (stores[k].read_rows(0, 200) for k in ("fp32", "bf16"))
    assert stores["bf16"].corpus["model_dtype"] == "bfloat16" and "model_dtype" not in stores["fp32"].corpus
    # a bf16 forward: the rows differ (it ran in bf16) but by bf16's rounding, 2^-8 relative, through 2 blocks
    rel = (a - b).norm(dim=1) / a.norm(dim=1)
    assert 0 < rel.max() < 0.05


def test_eval_runs_the_model_in_the_model_dtype(tmp_path):
    """An exact identity SAE spliced into the tiny decoder in bf16: the clean CE moves by bf16's rounding (the
    model did run in bf16) and the spliced one equals it (KL ~ 0), as in float32."""
    from saegeo.sae.evaluate import EvalConfig, splice_eval
    from tests.activations.test_cache import TINY
    from tests.splice_helpers import identity_sae

    (tmp_path / "tiny.json").write_text(json.dumps({"hooked_transformer_config": TINY}))
    (tmp_path / "t.txt").write_text("The quick brown fox jumps over the lazy dog. " * 100)
    sae = identity_sae(32)
    sae.format_info.hook_name = "blocks.1.hook_resid_post"
    sae.save(tmp_path / "id")
    ce = {}
    for dt in ("fp32", "bf16"):
        r = splice_eval(
            EvalConfig(
                model=str(tmp_path / "tiny.json"), sae=str(tmp_path / "id"), hook="blocks.1.hook_resid_post",
                corpus=str(tmp_path / "t.txt"), context=32, max_tokens=128, skip_tokens=0, model_dtype=dt,
                progress=False,
            )
        )  # fmt: skip
        ce[dt] = r["ce_loss_clean"]
        assert abs(r["kl_div_spliced"]) < 1e-5 and r["ce_loss_spliced"] == pytest.approx(r["ce_loss_clean"], abs=1e-5)
    assert ce["bf16"] != ce["fp32"] and ce["bf16"] == pytest.approx(ce["fp32"], rel=1e-3)


# =========================================================================== autocast
@pytest.mark.parametrize("arch", ["topk", "relu", "batchtopk", "jumprelu"])
def test_bf16_autocast_training_keeps_float32_weights_and_fp32_quality(tmp_path, arch):
    x = _rows(2000)
    kw = dict(
        arch=arch,
        arch_options={"relu": {"l1_coefficient": 0.05}},
        total_tokens=64 * 40,
        log_every=10,
        checkpoint_every=40,
    )
    full = train_sae(_cfg(tmp_path / "fp32", **kw), x)
    low = train_sae(_cfg(tmp_path / "bf16", dtype="bf16", **kw), x)
    assert all(p.dtype == torch.float32 for p in low.sae.parameters())
    from safetensors.torch import load_file

    ckpt = next((tmp_path / "bf16" / "checkpoint").glob("tensors_*.safetensors"))
    moments = {k: v.dtype for k, v in load_file(ckpt).items() if k.startswith("adam.") and "exp_avg" in k}
    assert moments and set(moments.values()) == {torch.float32}  # Adam's moments are float32 too
    assert low.sae.W_enc.detach().ne(full.sae.W_enc.detach()).any()  # the matmuls did run in bfloat16
    # bfloat16 keeps 8 bits of mantissa: the run ends where the float32 one does, to about 1 % of the FVE
    assert low.heldout["fve"] == pytest.approx(full.heldout["fve"], abs=0.02)


def test_relu_kernel_under_autocast_matches_float32_autograd_to_bf16_rounding():
    """The hand-written ReLU backward under autocast: its gradients against plain float32 autograd of the same
    objective, to bfloat16's relative rounding (2^-8 per operand, a few units over the sums)."""
    from saegeo.sae.model import SAE, SAEConfig

    torch.manual_seed(0)
    sae = SAE(SAEConfig(d_in=D, d_sae=32, activation="relu")).init_weights(torch.Generator().manual_seed(1))
    x = _rows(256)

    def grads(fn):
        sae.zero_grad()
        fn().backward()
        return {n: p.grad.clone() for n, p in sae.named_parameters() if p.grad is not None}

    def reference():
        codes = torch.relu((x - sae.b_dec) @ sae.W_enc + sae.b_enc)
        x_hat = codes @ sae.W_dec + sae.b_dec
        return (x - x_hat).pow(2).sum() / x.shape[0] + 0.1 * (codes.sum(0) @ sae.W_dec.norm(dim=1)) / x.shape[0]

    def autocast():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return sae.forward_train(x, l1_coefficient=0.1).loss

    ref, low = grads(reference), grads(autocast)
    assert set(ref) == set(low)
    for name in ref:
        assert low[name].dtype == torch.float32
        err = (low[name] - ref[name]).norm() / ref[name].norm()
        assert 0 < err < 0.03, (name, float(err))


# =========================================================================== W&B
def test_wandb_offline_logs_the_records(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    res = train_sae(_cfg(tmp_path / "sae", wandb=True, wandb_project="saegeo-test"), _rows())
    info = res.provenance["wandb"]
    assert info["project"] == "saegeo-test" and info["id"]
    runs = list((tmp_path / "sae" / "wandb").glob(f"offline-run-*-{info['id']}"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))


def test_wandb_missing_is_one_clear_line(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(BadInputError, match="pip install wandb"):
        train_sae(_cfg(tmp_path / "sae", wandb=True), _rows())


# =========================================================================== the curves in the report
def test_the_report_draws_the_training_curves_of_an_sae_with_a_log(tmp_path):
    from saegeo.render.report_page import TRAINING_FIGURE, figures, render_markdown
    from saegeo.report import GeometryReport, ReportOptions, geometry_report
    from saegeo.sae.model import SAE

    x = _rows()
    train_sae(_cfg(tmp_path / "logged"), x)
    bare = SAE.load(tmp_path / "logged")
    bare.format_info.source = None  # the same SAE, as an object with no directory: no log to read
    rep = geometry_report(x, {"logged": str(tmp_path / "logged"), "bare": bare}, options=ReportOptions(progress=False))
    logged, other = rep.saes
    log = read_training_log(tmp_path / "logged")
    assert logged.training_curve == {k: [r[k] for r in log] for k in ("tokens", "loss", "fve", "l0", "dead")}
    assert other.training_curve is None
    pngs = figures(rep)
    assert pngs[TRAINING_FIGURE].startswith(b"\x89PNG")
    assert f"figures/{TRAINING_FIGURE}.png" in render_markdown(rep, figure_dir="figures")
    assert GeometryReport.from_dict(json.loads(rep.to_json())).saes[0].training_curve == logged.training_curve
    no_log = geometry_report(x, {"bare": bare}, options=ReportOptions(progress=False))
    assert TRAINING_FIGURE not in figures(no_log)
    assert TRAINING_FIGURE not in render_markdown(no_log, figure_dir="figures")


def test_a_long_log_is_thinned_to_at_most_200_points_keeping_the_last(tmp_path):
    from saegeo.report.geometry_report import training_curve

    records = [{"step": s, "tokens": 10 * s, "loss": 1 / s, "fve": 0.5, "l0": 3.0, "dead": 0.0} for s in range(1, 1002)]
    (tmp_path / TRAINING_LOG).write_text("".join(json.dumps(r) + "\n" for r in records))
    curve = training_curve(tmp_path)
    assert len(curve["tokens"]) <= 200 and curve["tokens"][0] == 10 and curve["tokens"][-1] == 10010
    assert training_curve(tmp_path / "missing") is None


@pytest.mark.parametrize(
    "arch, shown",
    [
        ("relu", "relu l1=0.5"),
        ("topk", "topk k=7"),
        ("batchtopk", "batchtopk k=7"),
        ("jumprelu", "jumprelu L0 target=7, l0_coefficient=1"),
    ],
)
def test_the_summary_names_each_architectures_own_sparsity_option(arch, shown):
    """A BatchTopK or JumpReLU run printed `l1=1` (the summary tested the name "topk"); each architecture now says
    which option sets its sparsity."""
    from types import SimpleNamespace

    from saegeo.render.text import render_train
    from saegeo.sae.train import TrainConfig

    cfg = TrainConfig(
        arch=arch,
        arch_options={
            "relu": {"l1_coefficient": 0.5},
            "topk": {"k": 7},
            "batchtopk": {"k": 7},
            "jumprelu": {"l0_target": 7},
        },
    )
    result = SimpleNamespace(
        config=cfg, sae=SimpleNamespace(cfg=SimpleNamespace(d_in=4, d_sae=8)), heldout={}, history=[], provenance={}
    )
    line = next(ln for ln in render_train(result).splitlines() if ln.startswith("architecture"))
    assert line.split(None, 1)[1] == shown
