"""`import saegeo` is the public face: every name the README's Python section uses, imported on first use (so
`import saegeo` loads neither torch nor matplotlib), one loader for SAEs (`saegeo.SAE.load`), and the older
ways to get an SAE kept one release with a DeprecationWarning."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import saegeo


def test_import_saegeo_loads_nothing_heavy():
    code = textwrap.dedent(
        """
        import sys
        import saegeo
        heavy = [m for m in ("torch", "numpy", "matplotlib", "pandas", "transformers") if m in sys.modules]
        assert not heavy, heavy
        assert "SAE" in dir(saegeo) and "geometry_report" in saegeo.__all__
        saegeo.check  # one name: its own module and what it needs, nothing else
        assert "matplotlib" not in sys.modules
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_every_public_name_resolves_to_what_it_names():
    from saegeo.report.dictionary_check import check_dictionary
    from saegeo.report.geometry_report import GeometryReport, geometry_report
    from saegeo.sae.model import SAE

    for name in saegeo.__all__:
        assert getattr(saegeo, name) is not None, name
    assert saegeo.SAE is SAE and saegeo.check is check_dictionary and saegeo.geometry_report is geometry_report
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        saegeo.nothing  # noqa: B018
    assert isinstance(saegeo.load_report, type(geometry_report)) and GeometryReport


def test_one_loader_and_the_old_ones_warn(tmp_path):
    from saegeo.sae.formats import read_dictionary
    from saegeo.sae.model import SAE, SAEConfig, as_sae, load_dictionary

    sae = SAE(SAEConfig(d_in=8, d_sae=16, activation="topk", k=2)).init_weights(torch.Generator().manual_seed(0))
    sae.save(tmp_path / "s")
    loaded = saegeo.SAE.load(tmp_path / "s")
    assert torch.equal(loaded.W_dec, sae.W_dec) and saegeo.SAE.load(loaded) is loaded
    assert torch.equal(saegeo.SAE.load(read_dictionary(tmp_path / "s")).W_enc, sae.W_enc)  # a reader's result
    for old, arg in [(as_sae, tmp_path / "s"), (load_dictionary, tmp_path / "s")]:
        with pytest.warns(DeprecationWarning, match=r"SAE\.load"):
            assert torch.equal(old(arg).W_dec, sae.W_dec)
    with pytest.warns(DeprecationWarning, match=r"SAE\.load"):
        SAE.from_dictionary(read_dictionary(tmp_path / "s"))


def test_load_report_reads_a_written_report(tmp_path):
    x = torch.randn(400, 8, generator=torch.Generator().manual_seed(0)) + 1.0
    report = saegeo.geometry_report(x, options=saegeo.ReportOptions(progress=False))
    report.to_json(tmp_path / "report.json")
    for where in (tmp_path, tmp_path / "report.json"):
        assert saegeo.load_report(where).to_json() == report.to_json()


def test_the_reports_activation_geometry_is_the_dataclass(tmp_path):
    """One shape for one thing: the report's activations are the ActivationGeometry that activation_geometry()
    returns (made or loaded from report.json alike), read by attribute and, as report.json holds it, by key; a
    misspelt name fails naming the fields; the JSON is unchanged by the reading."""
    from saegeo.geometry import GeometryAccumulator, activation_geometry
    from saegeo.geometry.measures import ActivationGeometry

    x = torch.randn(600, 8, generator=torch.Generator().manual_seed(1)) + 0.5
    geo = activation_geometry(GeometryAccumulator(8).add(x))
    report = saegeo.geometry_report(x, options=saegeo.ReportOptions(progress=False))
    before = report.to_json()
    acts = report.activations
    report.to_json(tmp_path / "report.json")
    loaded = saegeo.load_report(tmp_path).activations
    assert isinstance(acts, ActivationGeometry) and isinstance(loaded, ActivationGeometry) and loaded == acts
    for name in ("anisotropy", "offset", "effective_rank", "n", "d", "top1_share", "null_z"):
        assert getattr(acts, name) == getattr(geo, name) == acts[name], name
    assert acts.sign.null == geo.sign.null == acts["sign"]["null"]
    assert acts.rogue.top_indices == geo.rogue.top_indices == acts["rogue"]["top_indices"]
    assert json.loads(before)["activations"] == {**acts} == dict(acts.to_dict())
    with pytest.raises(AttributeError, match="has no field 'anisotropyy'.*anisotropy"):
        acts.anisotropyy  # noqa: B018
    with pytest.raises(KeyError, match="has no field 'anisotropyy'"):
        acts["anisotropyy"]
    assert len(repr(acts)) < 200 and report.to_json() == before
