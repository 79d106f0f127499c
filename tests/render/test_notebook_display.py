"""Every result shows itself in a notebook: IPython's display formatter gives a one-line text repr under 2,000
characters and (for the report, one SAE's section, a check, a sweep, a latent card, an SAE and a store) an HTML
block that carries the flags with their advice and the headline numbers, read back from the result's JSON; the
block is self-contained and styles nothing outside itself. Tables come as pandas DataFrames."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import sys

import pytest
import torch

pytest.importorskip("IPython")
from IPython.core.formatters import DisplayFormatter  # noqa: E402

from saegeo.activations.store import write_store  # noqa: E402
from saegeo.geometry import GeometryAccumulator, activation_geometry  # noqa: E402
from saegeo.report import ReportOptions, geometry_report  # noqa: E402
from saegeo.report.dictionary_check import check_dictionary  # noqa: E402
from saegeo.report.layer_sweep import sweep_stores  # noqa: E402
from saegeo.sae.model import SAE, SAEConfig  # noqa: E402

MAX_REPR = 2000


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    """A report of offset data with an SAE whose latent 0 is the mean direction on every token (flags with
    latents and cards), its check, a two-layer sweep, the store the report read."""
    g = torch.Generator().manual_seed(0)
    d, n_lat = 16, 48
    offset = torch.randn(d, generator=g)
    offset = 6 * offset / offset.norm()
    x = torch.randn(3000, d, generator=g) + offset
    sae = SAE(SAEConfig(d_in=d, d_sae=n_lat, activation="relu")).init_weights(torch.Generator().manual_seed(1))
    with torch.no_grad():
        sae.W_dec[0] = offset / offset.norm()
        sae.W_enc[:, 0] = 0.0
        sae.b_enc[0] = 6.0
    store = write_store(tmp_path_factory.mktemp("nb") / "store", x, hook="blocks.2.hook_resid_post", model="toy")
    report = geometry_report(store, {"planted": sae}, options=ReportOptions(progress=False, verify=False))
    check = check_dictionary(sae, name="planted")
    shallow = write_store(store.path.parent / "shallow", x[:, torch.randperm(d, generator=g)] - offset, model="toy",
                          hook="blocks.1.hook_resid_post")  # fmt: skip
    sweep = sweep_stores([store, shallow])
    sweep = dataclasses.replace(sweep, flags=report.flags[:2])  # flags to show (the sweep of plain stores has none)
    return {"report": report, "check": check, "sweep": sweep, "sae": sae, "store": store, "x": x}


def shown(obj) -> tuple[str, str | None]:
    data, _ = DisplayFormatter().format(obj)
    return data["text/plain"], data.get("text/html")


def assert_self_contained_block(block: str) -> None:
    assert block.startswith("<div class='saegeo-out'><style>"), block[:80]
    assert "<html" not in block and "<body" not in block and "<h1" not in block
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", block)  # nothing fetched
    style = re.search(r"<style>(.*?)</style>", block, re.S).group(1)
    selectors = [sel.strip() for rule in re.findall(r"([^{}]+)\{", style) for sel in rule.split(",")]
    assert selectors and all(sel.startswith(".saegeo-out") for sel in selectors), selectors


def assert_flags_shown(block: str, flags) -> None:
    """Each flag's name, and each distinct advice sentence, is in the block (HTML-escaped)."""
    assert flags, "the fixture must raise flags"
    for f in flags:
        assert f"<code>{html.escape(f.name)}</code>" in block, f.name
        assert html.escape(f.advice) in block, f.advice


def test_the_report_shows_its_flags_and_headline_numbers(results):
    report = results["report"]
    saved = json.loads(report.to_json())  # the numbers a reader of report.json sees
    text, block = shown(report)
    assert len(text) < MAX_REPR and "\n" not in text
    a = saved["activations"]["anisotropy"]
    assert f"A = {a:.3f}" in text and f"null {saved['activations']['sign']['null']:.3f}" in text
    assert "planted" in text and "3,000 tokens × d=16" in text
    assert_self_contained_block(block)
    assert_flags_shown(block, report.flags)
    assert f"A = {a:.3f}" in block
    fve = saved["saes"][0]["fve"]
    assert f"<td class='l'>FVE (all rows)</td><td>{fve:.3f}</td>" in block  # the side-by-side table
    assert "<img alt='spectrum' src=\"data:image/png;base64," in block  # figures embedded
    assert "class='latents'" in block and "<mark" in block  # the per-latent table and cards, contexts marked


def test_one_sae_section_shows_its_own_flags(results):
    report = results["report"]
    section = report.saes[0]
    text, block = shown(section)
    assert len(text) < MAX_REPR and "\n" not in text
    own = [f for f in report.flags if f.subject == "planted"]
    assert section.flags == own and own
    assert_self_contained_block(block)
    assert_flags_shown(block, own)
    others = [f for f in report.flags if f.subject != "planted"]
    assert all(f"<code>{f.name}</code>" not in block for f in others if f.name not in {g.name for g in own})
    assert f"FVE {section.fve:.3f}" in text and f"<td>{section.fve:.3f}</td>" in block


def test_a_latent_card_shows_its_contexts_marked(results):
    section = results["report"].saes[0]
    card = section.card(0)  # the mean direction: named by mean_direction_features
    text, block = shown(card)
    assert len(text) < MAX_REPR and "latent 0" in text and "mean_direction_features" in text
    assert_self_contained_block(block)
    assert block.count("<mark title=") == len(card["top_contexts"]) > 0
    with pytest.raises(KeyError, match="no card for latent"):
        section.card(10**6)


def test_check_sweep_sae_store_and_geometry_show_themselves(results):
    check, sweep, sae, store, x = (results[k] for k in ("check", "sweep", "sae", "store", "x"))
    for obj, heading in [(check, "Dictionary"), (sweep, "Each quantity against depth")]:
        text, block = shown(obj)
        assert len(text) < MAX_REPR and "\n" not in text
        assert_self_contained_block(block)
        assert_flags_shown(block, obj.flags)
        assert f"<h2>{heading}</h2>" in block
    saved = json.loads(check.to_json())
    assert f"A_dict {saved['a_dict']:.4f}" in shown(check)[0]
    text, block = shown(sae)
    assert text == "SAE(d_in=16, d_sae=48, activation='relu', dtype='float32', format='saegeo')"
    assert_self_contained_block(block)
    assert "d_in 16 → d_sae 48 latents" in block
    text, block = shown(store)
    assert len(text) < MAX_REPR and "n_tokens=3000" in text
    assert_self_contained_block(block)
    assert "3,000 tokens × d = 16" in block and "blocks.2.hook_resid_post" in block
    geometry = activation_geometry(GeometryAccumulator(16).add(x))
    text, block = shown(geometry)
    assert len(text) < MAX_REPR and f"A = {geometry.anisotropy:.4f}" in text and block is None
    text, _ = shown(sae.architecture)
    assert text == "<architecture 'relu' (ReLU), saved as 'standard'>"


def test_tables_come_as_dataframes(results):
    pd = pytest.importorskip("pandas")
    report = results["report"]
    section = report.saes[0]
    frame = report.latents("planted")
    assert isinstance(frame, pd.DataFrame) and len(frame) == section.d_sae and frame.index.name == "latent"
    by_share = frame.sort_values("cone_share", ascending=False).index[:5].tolist()
    shares = section.cone_shares
    assert by_share == sorted(range(len(shares)), key=lambda i: -shares[i])[:5]  # brute force over the list
    assert frame.loc[0, "rate"] == section.firing_frequency[0] == 1.0
    side = report.to_pandas()
    assert side.loc["planted", "fve"] == section.fve and side.loc["planted", "n_dead"] == section.n_dead
    flags = report.flags_frame()
    assert flags["name"].tolist() == report.flag_names() and "advice" in flags
    sweep = results["sweep"]
    rows = sweep.to_pandas()
    assert rows["A"].tolist() == [r["A"] for r in sweep.layers] and rows["layer"].tolist() == [2, 3]  # blocks applied
    assert results["check"].flags_frame()["name"].tolist() == results["check"].flag_names()


def test_without_pandas_a_dataframe_asks_for_the_extra(results, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` raises ImportError
    with pytest.raises(ImportError, match=r"saegeo\[notebook\]"):
        results["report"].latents()
