"""A new architecture is one module: the file below (TOY_MODULE) is all of it -- an option, an extra parameter and
an extra loss term -- dropped into the architectures package's folder, found there by discovery, then trained by
train_sae (its option from Python, TOML and the command line, its loss term in the training log), saved by SAE.save,
loaded by SAE.load, read back from the bare SAELens layout and reported by geometry_report and `saegeo report
--sae`, with no other file of saegeo touched.

The toy: codes = relu(pre)² · gain_i, `gain` a trained per-latent parameter kept in the weights file; loss = FVU +
sparsity · mean_rows Σ codes, the term "code_sum". Its references are written out here from the formula, not
through saegeo's encode."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch

import saegeo.sae.architectures as architectures
from saegeo.activations.store import write_store
from saegeo.cli import build_parser, main
from saegeo.config import resolve
from saegeo.errors import BadInputError, FormatError
from saegeo.report.geometry_report import ReportOptions, geometry_report
from saegeo.sae.model import SAE, SAEConfig
from saegeo.sae.train import TrainConfig, read_training_log, train_sae

TOY_MODULE = '''
"""GainedReLU² (a test's toy): codes = relu(pre)² · gain_i; loss = FVU + sparsity · mean_rows Σ codes."""

from dataclasses import dataclass

import torch.nn.functional as F

from saegeo.config import check, option
from saegeo.sae.architectures.base import Architecture, ExtraTensor, TrainOutput, register_architecture


@dataclass
class GainedOptions:
    """The weight of the code-sum penalty."""

    sparsity: float = option(1e-3, "weight of the penalty mean_rows Σ codes", low=0)

    def __post_init__(self) -> None:
        check(self)


class Gained(Architecture):
    Options = GainedOptions
    saved_names = {"saelens": "gained_relu2"}
    extra_tensors = {
        **Architecture.extra_tensors,
        "gain": ExtraTensor(lambda cfg: (cfg.d_sae,), trained=True, in_file=True),
    }
    init_encoder_scale = 0.5

    def encode(self, sae, pre):
        return F.relu(pre).square() * sae.gain

    def init_training(self, sae, tcfg, sample_rows):
        sae.gain.data.fill_(1.0)

    def forward_train(self, sae, x, *, centred_ss, centred_ss_fn, dead_mask, sparsity=0.0, **_):
        codes = self.encode(sae, sae.centre(x) @ sae.W_enc + sae.b_enc)
        sse = (x - (codes @ sae.W_dec + sae.b_dec)).pow(2).sum()
        code_sum = codes.sum() / x.shape[0]
        fire_count = (codes.detach() > 0).sum(dim=0).float()
        loss = sse / centred_ss + sparsity * code_sum
        terms = {"code_sum": code_sum.detach()}
        return TrainOutput(loss, sse.detach(), centred_ss, fire_count.sum(), fire_count > 0, fire_count, terms)

    def step_options(self, tcfg, step, d_in):
        return {"sparsity": self.options(tcfg).sparsity}


register_architecture("gained", Gained)
'''


@pytest.fixture
def toy(tmp_path):
    """TOY_MODULE as a module file in a folder of the architectures package, for one test only."""
    folder = tmp_path / "more_architectures"
    folder.mkdir()
    (folder / "gained.py").write_text(TOY_MODULE)
    architectures.__path__.append(str(folder))
    try:
        architectures.discover()  # what importing the package does: every module in its folders
        yield architectures.get_architecture("gained")
    finally:
        architectures.__path__.remove(str(folder))
        architectures.unregister_architecture("gained")
        sys.modules.pop("saegeo.sae.architectures.gained", None)


def _data(n=4000, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    basis = torch.randn(48, d, generator=g)
    codes = (torch.rand(n, 48, generator=g) < 0.06).float() * torch.rand(n, 48, generator=g)
    return codes @ basis + 0.05 * torch.randn(n, d, generator=g) + 2.0


def _by_formula(sae: SAE, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    W_enc, b_enc, W_dec, b_dec, gain = (t.detach() for t in (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec, sae.gain))
    codes = ((x - b_dec) @ W_enc + b_enc).clamp_min(0) ** 2 * gain
    return codes, codes @ W_dec + b_dec


def test_a_toy_architecture_module_is_found_trained_saved_read_and_reported(toy, tmp_path, capsys):
    assert "gained" in architectures.architecture_names()  # found by discovery: nothing lists it
    assert type(toy).__module__ == "saegeo.sae.architectures.gained"
    assert architectures.by_saved_name("saelens", "gained_relu2") is toy

    # its option: from Python, from a TOML [train.gained] table, from the generated flag --gained.sparsity
    (tmp_path / "train.toml").write_text('[train]\narch = "gained"\n[train.gained]\nsparsity = 0.004\n')
    from_toml, _ = resolve(TrainConfig, {}, tmp_path / "train.toml", table="train")
    assert from_toml.options.sparsity == 0.004 and from_toml.options == toy.Options(sparsity=0.004)
    flags = build_parser("train", ["--help"])._subparsers._group_actions[0].choices["train"]
    args = flags.parse_args(["--arch", "gained", "--gained.sparsity", "0.003"])
    assert getattr(args, "gained.sparsity") == 0.003
    with pytest.raises(BadInputError, match=r"sparsity must be >= 0"):
        TrainConfig(arch="gained", arch_options={"gained": {"sparsity": -1.0}})

    x = _data()
    cfg = TrainConfig(
        arch="gained",
        arch_options={"gained": {"sparsity": 2e-3}},
        d_sae=48,
        batch_tokens=250,
        total_tokens=250 * 80,
        lr=3e-3,
        seed=1,
        heldout_fraction=0.1,
        log_every=8,
        progress=False,
        out_dir=str(tmp_path / "toy"),
    )
    res = train_sae(cfg, x)
    sae = res.sae
    assert sae.cfg.activation == "gained" and sae.architecture is toy
    first, last = res.history[0]["fve"], res.heldout["fve"]
    assert last > 0.5 and last > first + 0.2, (first, last)  # it learned, through the trainer's own loop
    assert not torch.equal(sae.gain.detach(), torch.ones(48))  # the extra parameter was trained
    # its loss term, logged by the name the forward gave it (the mean per step over each interval)
    logged = read_training_log(tmp_path / "toy")
    assert [r["step"] for r in logged] == list(range(8, 81, 8))
    assert all(r["code_sum"] > 0 for r in logged) and logged == json.loads(json.dumps(res.history))

    saved = json.loads((tmp_path / "toy" / "cfg.json").read_text())
    assert saved["architecture"] == "gained_relu2" and saved["saegeo"]["sae_config"]["activation"] == "gained"
    assert saved["saegeo"]["train_config"]["arch_options"] == {"gained": {"sparsity": 2e-3}}
    loaded = SAE.load(tmp_path / "toy")
    codes, x_hat = _by_formula(sae, x)
    with torch.no_grad():
        assert torch.equal(loaded.gain, sae.gain)
        assert torch.equal(loaded.encode(x), sae.encode(x))
        torch.testing.assert_close(loaded.encode(x), codes)
        torch.testing.assert_close(loaded(x), x_hat)

    # the bare SAELens layout (no saegeo block): read by its SAELens name, the gain from the weights file
    bare = tmp_path / "bare"
    shutil.copytree(tmp_path / "toy", bare, ignore=shutil.ignore_patterns("checkpoint", "*.jsonl"))
    (bare / "cfg.json").write_text(json.dumps({k: v for k, v in saved.items() if k != "saegeo"}))
    from_saelens = SAE.load(bare)
    assert from_saelens.format_info.format == "saelens" and from_saelens.cfg.activation == "gained"
    with torch.no_grad():
        torch.testing.assert_close(from_saelens.encode(x), codes)

    rep = geometry_report(x, {"toy": loaded}, options=ReportOptions(progress=False))
    (s,) = rep.saes
    fve = 1 - (x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum()
    assert s.architecture == "gained" and s.d_sae == 48
    assert s.fve == pytest.approx(float(fve), rel=1e-4)
    assert s.mean_l0 == pytest.approx(float((codes > 0).sum(1).float().mean()), rel=1e-5)

    write_store(tmp_path / "store", x, shard_rows=2000)
    out = tmp_path / "report"
    argv = ["report", "--acts", str(tmp_path / "store"), "--sae", f"toy={tmp_path / 'toy'}", "--out", str(out)]
    assert main([*argv, "--format", "json", "--no-progress", "--no-latent-cards"]) == 0
    (entry,) = json.loads((out / "report.json").read_text())["saes"]
    assert entry["architecture"] == "gained" and entry["fve"] == pytest.approx(float(fve), rel=1e-4)


def test_an_unregistered_architecture_is_refused_in_one_line():
    with pytest.raises(
        BadInputError, match=r"arch = 'gained': expected one of \['abstopk', 'batchtopk', .*'relu', 'topk'\]"
    ):
        TrainConfig(arch="gained")
    with pytest.raises(
        FormatError, match="unknown SAE architecture 'gained'; registered: abstopk, batchtopk, .*relu, topk"
    ):
        SAEConfig(8, 16, activation="gained")
    with pytest.raises(BadInputError, match=r"arch_options: \['gained'\] name no registered architecture"):
        TrainConfig(arch="topk", arch_options={"gained": {"sparsity": 1.0}})
