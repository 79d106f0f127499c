"""Bad invocations end in one line `saegeo: error: <what>, <which file>, <what to do>` and exit 2, never a traceback
(each of these once ended in a Python traceback). Run in-process through saegeo.cli.main."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from saegeo.activations.store import write_store
from saegeo.cli import main
from saegeo.sae.model import SAE, SAEConfig
from saegeo.sae.train import TrainConfig, train_sae

TINY = dict(
    d_model=16,
    n_layers=1,
    n_heads=2,
    d_head=8,
    d_mlp=32,
    n_ctx=32,
    d_vocab=30522,
    act_fn="gelu",
    normalization_type="LN",
    seed=0,
)
HOOK = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    """A store, a tiny model config, a corpus, a saved SAE and a training checkpoint, built once."""
    root = tmp_path_factory.mktemp("fx")
    g = torch.Generator().manual_seed(0)
    store = write_store(root / "store", torch.randn(1024, 8, generator=g), shard_rows=256)
    (root / "model.json").write_text(json.dumps({"hooked_transformer_config": TINY}))
    (root / "docs.txt").write_text("The quick brown fox jumps over the lazy dog. " * 40)
    (root / "a_file").write_text("not a directory")
    sae = SAE(SAEConfig(d_in=8, d_sae=16, activation="topk", k=2))
    sae.init_weights(torch.Generator().manual_seed(0))
    sae.save(root / "sae")

    class Stop(Exception):
        pass

    def stop(step, _):
        if step == 2:
            raise Stop

    cfg = TrainConfig(
        d_sae=16,
        arch_options={"topk": {"k": 2}},
        batch_tokens=64,
        total_tokens=64 * 6,
        checkpoint_every=2,
        progress=False,
        out_dir=str(root / "ckpt_run"),
        b_dec_init_tokens=64,
    )
    with pytest.raises(Stop):
        train_sae(cfg, store, on_step=stop)
    return root


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _npy_big_endian(tmp, fx):
    np.save(tmp / "big.npy", np.arange(12, dtype=">f4").reshape(3, 4))
    return ["geometry", str(tmp / "big.npy"), "--no-progress"], "big.npy"


def _npy_empty(tmp, fx):
    (tmp / "empty.npy").write_bytes(b"")
    return ["geometry", str(tmp / "empty.npy"), "--no-progress"], "empty.npy"


def _geometry_json_dir(tmp, fx):
    (tmp / "outdir").mkdir()
    return ["geometry", str(fx / "store"), "--no-progress", "--json", str(tmp / "outdir")], "outdir"


def _geometry_json_unwritable(tmp, fx):  # tests run as root: a path under a file is what no user can write
    return ["geometry", str(fx / "store"), "--no-progress", "--json", str(fx / "a_file" / "g.json")], "a_file"


def _cache(out: str) -> list[str]:
    return [
        "cache",
        "--model",
        "MODEL",
        "--hooks",
        HOOK,
        "--corpus",
        "CORPUS",
        "--context",
        "16",
        "--max-tokens",
        "64",
        "--out",
        out,
        "--no-progress",
    ]


def _cache_out_is_file(tmp, fx):
    return _cache(str(fx / "a_file")), "a_file"


def _cache_out_under_file(tmp, fx):
    return _cache(str(fx / "a_file" / "acts")), "a_file"


def _cache_store_dir_is_file(tmp, fx):
    (tmp / "acts").mkdir()
    (tmp / "acts" / HOOK).write_text("in the way")
    return _cache(str(tmp / "acts")), HOOK


def _cache_manifest_is_dir(tmp, fx):
    (tmp / "acts" / HOOK / "manifest.json").mkdir(parents=True)
    return _cache(str(tmp / "acts")), "manifest.json"


def _report(out: str) -> list[str]:
    return ["report", "--acts", "STORE", "--out", out, "--no-progress", "--format", "json"]


def _report_out_is_file(tmp, fx):
    return _report(str(fx / "a_file")), "a_file"


def _report_out_under_file(tmp, fx):
    return _report(str(fx / "a_file" / "rep")), "a_file"


def _config_missing(tmp, fx):
    return ["train", "--acts", str(fx / "store"), "--config", str(tmp / "nope.toml")], "nope.toml"


def _config_bad_json(tmp, fx):
    (tmp / "bad.json").write_text('{"k": 4,')
    return [
        "report",
        "--acts",
        str(fx / "store"),
        "--out",
        str(tmp / "r"),
        "--preprocessing-config",
        str(tmp / "bad.json"),
        "--no-progress",
    ], "bad.json"


def _config_bad_toml(tmp, fx):
    (tmp / "bad.toml").write_text("k = = 4\n")
    return ["train", "--acts", str(fx / "store"), "--config", str(tmp / "bad.toml")], "bad.toml"


def _train_resume(tmp, fx, damage) -> list[str]:
    run = _copy(fx / "ckpt_run", tmp / "run")
    damage(run / "checkpoint")
    return [
        "train",
        "--acts",
        str(fx / "store"),
        "--out",
        str(run),
        "--d-sae",
        "16",
        "--topk.k",
        "2",
        "--batch-tokens",
        "64",
        "--total-tokens",
        str(64 * 6),
        "--checkpoint-every",
        "2",
        "--b-dec-init-tokens",
        "64",
        "--no-progress",
    ]


def _state_corrupt(tmp, fx):
    return _train_resume(tmp, fx, lambda c: (c / "state.json").write_text('{"step": 2, "tens')), "state.json"


def _tensors_missing(tmp, fx):
    return _train_resume(tmp, fx, lambda c: next(c.glob("tensors_*")).unlink()), "tensors_"


def _tensors_truncated(tmp, fx):
    def cut(c):
        f = next(c.glob("tensors_*"))
        f.write_bytes(f.read_bytes()[:300])

    return _train_resume(tmp, fx, cut), "tensors_"


def _sae_cfg_edit(tmp, fx, edit):
    sae = _copy(fx / "sae", tmp / "sae")
    cfg = json.loads((sae / "cfg.json").read_text())
    edit(cfg["saegeo"]["sae_config"])
    (sae / "cfg.json").write_text(json.dumps(cfg))
    return ["check", str(sae), "--no-progress"], "cfg.json"


def _sae_block_lacks_d_in(tmp, fx):
    return _sae_cfg_edit(tmp, fx, lambda b: b.pop("d_in"))


def _sae_block_lacks_d_sae(tmp, fx):
    return _sae_cfg_edit(tmp, fx, lambda b: b.pop("d_sae"))


def _sae_block_unknown_key(tmp, fx):
    return _sae_cfg_edit(tmp, fx, lambda b: b.update(frobnicate=1))


CASES = [
    _npy_big_endian,
    _npy_empty,
    _geometry_json_dir,
    _geometry_json_unwritable,
    _cache_out_is_file,
    _cache_out_under_file,
    _cache_store_dir_is_file,
    _cache_manifest_is_dir,
    _report_out_is_file,
    _report_out_under_file,
    _config_missing,
    _config_bad_json,
    _config_bad_toml,
    _state_corrupt,
    _tensors_missing,
    _tensors_truncated,
    _sae_block_lacks_d_in,
    _sae_block_lacks_d_sae,
    _sae_block_unknown_key,
]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.strip("_") for c in CASES])
def test_bad_invocation_is_one_line_and_exit_2(case, fx, tmp_path, capsys):
    argv, names = case(tmp_path, fx)
    subs = {"MODEL": str(fx / "model.json"), "CORPUS": str(fx / "docs.txt"), "STORE": str(fx / "store")}
    argv = [subs.get(a, a) for a in argv]
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("saegeo: error: "), err
    assert names in lines[0], f"the message should name {names!r}: {lines[0]}"


def test_debug_shows_the_traceback(fx, tmp_path):
    (tmp_path / "empty.npy").write_bytes(b"")
    from saegeo.errors import FormatError

    with pytest.raises(FormatError, match="empty.npy"):
        main(["--debug", "geometry", str(tmp_path / "empty.npy"), "--no-progress"])
    with pytest.raises(FormatError):  # also after the command
        main(["geometry", str(tmp_path / "empty.npy"), "--no-progress", "--debug"])


def test_bad_sizes_are_refused(fx, tmp_path, capsys):
    for argv, what in [
        (["train", "--acts", str(fx / "store"), "--d-sae", "0"], "d_sae"),
        (["train", "--acts", str(fx / "store"), "--topk.k", "0"], "k must"),
        (["cache", "--batch-windows", "0", "--out", str(tmp_path / "c")], "batch_windows"),
        (["cache", "--shard-rows", "0", "--out", str(tmp_path / "c")], "shard_rows"),
        (["report", "--acts", str(fx / "store"), "--out", str(tmp_path / "r"), "--batch-rows", "0"], "batch_rows"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert what in err and len(err.strip().splitlines()) == 1, err


def test_bad_devices_are_refused_before_any_work(fx, tmp_path, capsys):
    """A device that is not a torch device, or one this machine lacks, is one line and exit 2 in every command
    that takes --device (it used to be a RuntimeError / AssertionError traceback from torch)."""
    missing = "cuda:64" if torch.cuda.is_available() else "cuda"  # more GPUs than any machine has / no CUDA build
    commands = [
        ["cache", "--model", str(fx / "model.json"), "--corpus", str(fx / "docs.txt"), "--out", str(tmp_path / "c")],
        ["train", "--acts", str(fx / "store"), "--d-sae", "16", "--topk.k", "2", "--out", str(tmp_path / "t")],
        ["report", "--acts", str(fx / "store"), "--out", str(tmp_path / "r")],
        ["eval", "--model", str(fx / "model.json"), "--sae", str(fx / "sae"), "--corpus", str(fx / "docs.txt")],
    ]
    for argv in commands:
        for device, what in (
            ("bogus", "is not a torch device"),
            (missing, "use --device cpu" if missing == "cuda" else "GPU(s) are visible"),
        ):
            assert main([*argv, "--device", device, "--no-progress"]) == 2, argv
            err = capsys.readouterr().err
            assert what in err and device in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "c").exists() and not (tmp_path / "t").exists() and not (tmp_path / "r").exists()


def test_existing_outputs_are_refused_before_any_work_without_overwrite(fx, tmp_path, capsys, monkeypatch):
    """report / check / sweep / geometry / eval never replace output files silently: a second run into the same
    place is one line and exit 2 naming the file, and leaves it as it was; --overwrite replaces it."""
    store, sae = str(fx / "store"), str(fx / "sae")
    runs = {
        "report": (
            ["report", "--acts", store, "--out", str(tmp_path / "r"), "--no-progress"],
            tmp_path / "r" / "summary.txt",
        ),
        "check": (["check", sae, "--out", str(tmp_path / "c")], tmp_path / "c" / "summary.txt"),
        "sweep": (["sweep", store, "--out", str(tmp_path / "s"), "--no-progress"], tmp_path / "s" / "summary.txt"),
        "geometry": (["geometry", store, "--json", str(tmp_path / "g.json"), "--no-progress"], tmp_path / "g.json"),
    }
    for name, (argv, first) in runs.items():
        assert main(argv) == 0, name
        first.write_text("kept")
        capsys.readouterr()
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        assert str(first) in err and "--overwrite" in err and len(err.strip().splitlines()) == 1, err
        assert first.read_text() == "kept", name
        assert main([*argv, "--overwrite"]) == 0, name
        assert first.read_text() != "kept", name
    # eval: refused before the model or the SAE is even loaded
    (tmp_path / "e.json").write_text("kept")
    from saegeo.sae import evaluate

    monkeypatch.setattr(evaluate, "splice_eval", lambda cfg: pytest.fail("eval ran"))
    assert main(["eval", "--sae", sae, "--json", str(tmp_path / "e.json"), "--no-progress"]) == 2
    assert "e.json already exists" in capsys.readouterr().err and (tmp_path / "e.json").read_text() == "kept"
