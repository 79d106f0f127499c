"""Run in the SAELens venv: PYTHONPATH=. .venv-saelens/bin/python benchmarks/saelens_objects.py

Real SAELens objects of every architecture through saegeo.SAE.load (codes against SAELens' own encode, or
for a training SAE the inference SAE SAELens saves and loads back), and saegeo's release table and the installed
registry against SAELens' own lookup (get_repo_id_and_folder_name, get_config_overrides). No network, no timing."""

import importlib
import tempfile
import warnings

import sae_lens
import torch
from sae_lens import saes as S
from sae_lens.loading.pretrained_saes_directory import (
    get_config_overrides,
    get_pretrained_saes_directory,
    get_repo_id_and_folder_name,
)

from saegeo.report import geometry_report
from saegeo.report.geometry_report import ReportOptions
from saegeo.sae.formats import hub
from saegeo.sae.model import SAE

warnings.simplefilter("ignore")
torch.manual_seed(0)
d_in, d_sae = 16, 48
x = torch.randn(200, d_in)


def rnd(sae):
    with torch.no_grad():
        for n, p in sae.named_parameters():
            p.copy_(torch.randn_like(p) * 0.5)
            if "threshold" in n:
                p.abs_()
    return sae


cases = {
    "StandardSAE": S.StandardSAE(S.StandardSAEConfig(d_in=d_in, d_sae=d_sae)),
    "TopKSAE": S.TopKSAE(S.TopKSAEConfig(d_in=d_in, d_sae=d_sae, k=5)),
    "JumpReLUSAE": S.JumpReLUSAE(S.JumpReLUSAEConfig(d_in=d_in, d_sae=d_sae)),
    "StandardTrainingSAE": S.StandardTrainingSAE(S.StandardTrainingSAEConfig(d_in=d_in, d_sae=d_sae)),
    "TopKTrainingSAE": S.TopKTrainingSAE(S.TopKTrainingSAEConfig(d_in=d_in, d_sae=d_sae, k=5)),
    "JumpReLUTrainingSAE": S.JumpReLUTrainingSAE(S.JumpReLUTrainingSAEConfig(d_in=d_in, d_sae=d_sae)),
    "BatchTopKTrainingSAE": S.BatchTopKTrainingSAE(S.BatchTopKTrainingSAEConfig(d_in=d_in, d_sae=d_sae, k=5)),
    "MatryoshkaBatchTopKTrainingSAE": S.MatryoshkaBatchTopKTrainingSAE(
        S.MatryoshkaBatchTopKTrainingSAEConfig(d_in=d_in, d_sae=d_sae, k=5, matryoshka_widths=[16, 48])
    ),
    "GatedSAE": S.GatedSAE(S.GatedSAEConfig(d_in=d_in, d_sae=d_sae)),
    "GatedTrainingSAE": S.GatedTrainingSAE(S.GatedTrainingSAEConfig(d_in=d_in, d_sae=d_sae)),
}
for name, obj in cases.items():
    rnd(obj)
    if hasattr(obj, "topk_threshold"):
        obj.topk_threshold.fill_(0.8)
    try:
        sae = SAE.load(obj)
    except Exception as err:
        print(f"{name:32s} refused: {type(err).__name__}: {str(err)[:150]}")
        continue
    with torch.no_grad():
        ours = sae.encode(x)
        if "Training" in name and hasattr(obj, "process_state_dict_for_saving_inference"):
            # the inference SAE SAELens saves for it, loaded back by SAELens
            with tempfile.TemporaryDirectory() as tmp:
                obj.save_inference_model(tmp)
                ref_sae = sae_lens.SAE.load_from_disk(tmp)
            ref = ref_sae.encode(x)
        else:
            ref = obj.encode(x)
        err = float((ours - ref).abs().max())
    print(f"{name:32s} -> saegeo {sae.cfg.activation:10s} max|codes - SAELens codes| = {err:.2e}")

# saegeo's table against SAELens' registry, the installed yaml hidden
directory = get_pretrained_saes_directory()
hub.installed_saelens_registry = lambda: None
checked = mismatched = missing = 0
for release in hub.SAELENS_RELEASES:
    if release not in directory:
        missing += 1
        continue
    lookup = directory[release]
    for sae_id in list(lookup.saes_map)[:200]:
        repo, folder = get_repo_id_and_folder_name(release, sae_id)
        ours = hub.resolve_hub_id(f"{release}/{sae_id}")
        over = {k: v for k, v in get_config_overrides(release, sae_id).items() if k != "neuronpedia_id"}
        checked += 1
        if (
            (ours.repo_id, ours.subfolder) != (repo, folder)
            or ours.config_overrides != over
            or ours.conversion != lookup.conversion_func
        ):
            mismatched += 1
            if mismatched < 8:
                print(
                    "MISMATCH",
                    release,
                    sae_id,
                    (ours.repo_id, ours.subfolder, ours.conversion, ours.config_overrides),
                    (repo, folder, lookup.conversion_func, over),
                )
print(
    f"table vs SAELens {sae_lens.__version__} registry: {checked} (release, sae_id) pairs checked, {mismatched} differ; {missing} table releases absent from its registry"
)
gs2 = sorted(r for r in directory if r.startswith("gemma-scope-2"))
print("absent:", [r for r in hub.SAELENS_RELEASES if r not in directory])

# the installed registry itself: every release of SAELens' yaml resolved by saegeo as SAELens resolves it
importlib.reload(hub)
ok = bad = refused = 0
for release, lookup in directory.items():
    for sae_id in list(lookup.saes_map)[:3]:
        try:
            ours = hub.resolve_hub_id(f"{release}/{sae_id}")
        except Exception as err:
            refused += 1
            continue
        if ours is None:
            bad += 1
            print("NONE", release, sae_id)
            continue
        repo, folder = get_repo_id_and_folder_name(release, sae_id)
        over = {k: v for k, v in get_config_overrides(release, sae_id).items() if k != "neuronpedia_id"}
        if (ours.repo_id, ours.subfolder, ours.config_overrides) == (repo, folder, over) and ours.registry.endswith(
            "pretrained_saes.yaml"
        ):
            ok += 1
        else:
            bad += 1
            if bad < 5:
                print("DIFF", release, sae_id, ours, repo, folder, over)
print(
    f"installed registry: {len(directory)} releases, {ok} ids as SAELens resolves them, {bad} differ, {refused} refused by conversion function"
)

# the report takes every one of them

report = geometry_report(x, {name: obj for name, obj in cases.items()}, options=ReportOptions(progress=False))
print("report FVE:", {s.name: round(s.fve, 4) for s in report.saes})
