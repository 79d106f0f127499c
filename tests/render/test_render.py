"""Renderings: the HTML page is self-contained and its plots decode; terminal and Markdown put the flags first
and print the report's numbers; write_report writes every format."""

from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import pytest
import torch

from saegeo.errors import BadInputError
from saegeo.render import FIGURE_NAMES, render_html, render_markdown, render_terminal, write_report
from saegeo.report import GeometryReport, ReportOptions, geometry_report
from saegeo.sae.model import SAE, SAEConfig

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report() -> GeometryReport:
    """Offset data; SAE "planted" has b_dec = 0 and latent 0 = the mean direction firing on every token."""
    g = torch.Generator().manual_seed(0)
    d, n_lat = 16, 48
    offset = torch.randn(d, generator=g)
    offset = 6 * offset / offset.norm()
    x = torch.randn(4000, d, generator=g) + offset
    planted = SAE(SAEConfig(d_in=d, d_sae=n_lat, activation="relu")).init_weights(torch.Generator().manual_seed(1))
    clean = SAE(SAEConfig(d_in=d, d_sae=n_lat, activation="topk", k=4)).init_weights(
        torch.Generator().manual_seed(1), b_dec=x.mean(0)
    )
    with torch.no_grad():
        planted.W_dec[0] = offset / offset.norm()
        planted.W_enc[:, 0] = 0.0
        planted.b_enc[0] = 6.0
    return geometry_report(x, {"planted": planted, "clean": clean}, options=ReportOptions(progress=False))


@pytest.fixture(scope="module")
def written(report, tmp_path_factory) -> dict:
    """write_report of the module's report, done once (the figures are rendered once per call):
    {format: path}. The tests below read what it wrote instead of rendering the figures again."""
    return write_report(report, tmp_path_factory.mktemp("render") / "out")


def _embedded_pngs(page: str) -> list[tuple[str, bytes]]:
    images = re.findall(r'<img alt=\'(\w+)\' src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    return [(name, base64.b64decode(b64)) for name, b64 in images]


def test_html_is_self_contained_and_every_plot_decodes(report, written):
    page = written["html"].read_text()
    assert "http://" not in page and "https://" not in page  # nothing fetched when opened offline
    images = _embedded_pngs(page)
    assert [name for name, _ in images] == list(FIGURE_NAMES)
    import matplotlib.image as mpimg

    for name, png in images:
        assert png.startswith(PNG_MAGIC), name
        pixels = mpimg.imread(io.BytesIO(png), format="png")
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100, name
        assert pixels[..., :3].std() > 0.01, f"{name} is blank"
    # the flags and the side-by-side table are on the page
    for f in report.flags:
        assert f.name in page
    assert "planted" in page and "clean" in page


def test_terminal_summary_puts_flags_first_with_numbers(report):
    text = render_terminal(report)
    lines = text.splitlines()
    assert lines[0].startswith("saegeo report") and "4,000 tokens × d = 16" in lines[0]
    assert lines[2].startswith("FLAGS")
    flag_line = next(i for i, line in enumerate(lines) if "offset_not_absorbed" in line)
    assert flag_line < lines.index("ACTIVATIONS")
    first_flag = lines[3]
    assert report.flags[0].severity in first_flag  # most severe first
    assert "[planted]" in text and "mean_direction_features" in text
    assert "latents 0" in text  # the planted latent is named
    a = report.activations["anisotropy"]
    assert f"A = {a:.3f}" in text
    # side-by-side SAE table, FVE of each printed
    header = next(line for line in lines if "planted" in line and "clean" in line)
    assert header.index("planted") < header.index("clean")
    fve_line = next(line for line in lines if line.strip().startswith("FVE (all rows)"))
    assert f"{report.sae_named('planted').fve:.3f}" in fve_line and f"{report.sae_named('clean').fve:.3f}" in fve_line


def test_planted_case_flags_are_the_expected_ones(report):
    names = {(f.name, f.subject) for f in report.flags}
    assert ("mean_direction_features", "planted") in names
    assert ("offset_not_absorbed", "planted") in names
    assert not any(
        subject == "clean" and name in ("mean_direction_features", "offset_not_absorbed") for name, subject in names
    )
    [md] = [f for f in report.flags if f.name == "mean_direction_features"]
    assert md.latents[0] == 0


def test_write_report_writes_every_format(report, written, tmp_path):
    paths = written
    out = paths["md"].parent
    assert set(paths) == {"terminal", "md", "json", "html", "latents_csv", "latents_json"}
    assert GeometryReport.load(paths["json"]).to_dict() == report.to_dict()
    # beside report.json: the cards and the table of every latent, as in the report
    latents = json.loads(paths["latents_json"].read_text())
    assert [s["latents"] for s in latents["saes"]] == [s.latents for s in report.saes]
    csv_rows = paths["latents_csv"].read_text().splitlines()
    assert len(csv_rows) == 1 + sum(s.d_sae for s in report.saes) and csv_rows[0].startswith("sae,id,rate,")
    md = paths["md"].read_text()
    assert md.index("## Flags") < md.index("## Activations")
    for name in FIGURE_NAMES:
        assert f"figures/{name}.png" in md
        assert (out / "figures" / f"{name}.png").read_bytes().startswith(PNG_MAGIC)
    # the Markdown's figure files are the very plots embedded in the HTML page
    embedded = dict(_embedded_pngs(paths["html"].read_text()))
    assert {name: (out / "figures" / f"{name}.png").read_bytes() for name in FIGURE_NAMES} == embedded
    assert "| planted | clean |" in render_markdown(report)
    assert paths["terminal"].read_text() == render_terminal(report)
    with pytest.raises(BadInputError, match=r"unknown report format\(s\) \['pdf'\]"):
        write_report(report, tmp_path / "bad", ["pdf"])


def test_report_without_sae_renders(tmp_path):
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((500, 8)))
    rep = geometry_report(x, options=ReportOptions(progress=False))
    page = render_html(rep)
    assert page.count("data:image/png;base64,") == len(FIGURE_NAMES)
    assert "SAE" not in render_terminal(rep).split("ACTIVATIONS")[1]


# =========================================================================== the pages a person reads
def _flag(name, subject, summary="s", advice="do this", severity="warning", latents=None):
    from saegeo.report.flags import Flag

    return Flag(name, severity, {"x": 1.0}, advice, summary=summary, latents=latents, subject=subject)


def test_a_flag_raised_at_many_layers_gives_its_advice_once():
    from saegeo.render.common import html_flags, md_flags, terminal_flags

    flags = [_flag("artifact_direction", f"blocks.{i}.hook_resid_post", summary=f"PC1 at {i}") for i in range(13)]
    flags.append(_flag("other", "activations", advice="something else", severity="info"))
    text = "\n".join(terminal_flags(flags))
    assert text.count("do this") == 1 and text.count("something else") == 1
    assert "artifact_direction ×13" in text and all(f"PC1 at {i}" in text for i in range(13))
    assert "13 subjects, each below" in text and all(f"[blocks.{i}.hook_resid_post]" in text for i in range(13))
    for block in (md_flags(flags), html_flags(flags)):
        joined = "\n".join(block)
        assert joined.count("do this") == 1 and "×13" in joined and all(f"PC1 at {i}" in joined for i in range(13))
        assert "blocks.0.hook_resid_post, blocks.1.hook_resid_post" in joined  # the layers it applies to, in order
    assert len(html_flags(flags)) == 2  # one block per kind
    # advice that differs (numbers in it) goes with each instance, still one block for the kind
    two = [_flag("amp", "a", advice="fix a"), _flag("amp", "b", advice="fix b")]
    assert len(html_flags(two)) == 1 and "\n".join(terminal_flags(two)).count("fix a") == 1


def test_identical_exclusion_groups_read_as_one_line():
    """BOS only: all excluded rows = the special positions = position 0 (the same rows): one line, not three;
    a norm rule that drops other rows keeps its own line. The shares are group_shares' of float64 sums. Each line
    reads "label: numbers" without the terminal's padding (a page collapses it), the total said once."""
    from saegeo.render.text import exclusion_lines

    d = 4
    total = {"n": 100, "sum": [50.0] * d, "sum_sq": 400.0}
    bos = {"n": 10, "sum": [20.0] * d, "sum_sq": 200.0}
    rule = {"special_positions": {"prefix": ["<s>"], "suffix": []}, "norm_rule": None}
    extra = {
        "exclusion_rule": rule,
        "excluded": {"all": total, "excluded": bos, "excluded_special": bos, "first_position": bos},
    }
    lines = exclusion_lines(extra)
    assert len(lines) == 2, lines
    assert lines[1].startswith("all excluded rows = special positions = first position (stored or not): ")
    # (Σ_G x)·μ/(N‖μ‖²) = 20·0.5·4 / (100·0.25·4) = 0.4
    assert "10 rows (10.00%), 40.0% of ‖μ‖²" in lines[1]
    assert "of all 100 rows, stored + excluded" in lines[0] and "100 rows" not in lines[1]  # said once
    norm = {"n": 5, "sum": [1.0] * d, "sum_sq": 300.0}
    both = {"n": 15, "sum": [21.0] * d, "sum_sq": 500.0}
    rule2 = {**rule, "norm_rule": "norm > 3× median"}
    extra2 = {
        "exclusion_rule": rule2,
        "excluded": {
            "all": total,
            "excluded": both,
            "excluded_special": bos,
            "first_position": bos,
            "excluded_norm": norm,
        },
    }
    lines2 = exclusion_lines(extra2)
    assert len(lines2) == 4 and lines2[1].startswith("all excluded rows: ")
    # a page collapses the terminal's indent: a subgroup says so in words, each label ends in a colon
    assert lines2[2].startswith("  of which special positions = first position (stored or not): ")
    assert lines2[3].startswith("  of which norm outliers: ")
    assert " ".join(lines2[3].split()).startswith("of which norm outliers: 5 rows (5.00%), 2.0% of ‖μ‖²")


def test_every_rendering_uses_the_reports_symbols(report):
    """‖m̂‖, ‖μ‖², tr Σ, x̂, σ², α — never the ASCII |m^|, |mu|^2, sigma^2 — in terminal, Markdown and HTML."""
    from saegeo.geometry.measures import ActivationGeometry
    from saegeo.render.sweep_page import OPTIONAL_COLUMNS, TABLE, sweep_tables
    from saegeo.render.text import geometry_summary
    from saegeo.report.layer_sweep import LayerSweep

    ascii_forms = ("|m^|", "|mu|", "sigma^2", "x^", "alpha", "|x|", "Sigma")
    texts = [" ".join(h for h, _ in TABLE), geometry_summary(ActivationGeometry.from_dict(report.activations))]
    for text in texts:
        assert not [a for a in ascii_forms if a in text], text
    assert "‖m̂‖" in texts[0] and "‖μ‖²" in texts[0] and "tr Σ" in texts[0]
    # the sweep's columns split into tables that each fit a page, the layer and hook leading each
    row = {k: None for k in ("A", "A_null", "offset", "mean_sq_norm", "total_variance", "isoscore")}
    row.update(layer=0, hook="h", mean_share=0.1, erank=1.0, noise_erank=2.0, top1=0.1, top10=0.2, mp_spikes=None)
    row.update(mp_power_law_alpha=1.2, rogue_50=3, between_share=0.5)
    sweep = LayerSweep(1, "m", [row], [], 0.0, {})
    tables = sweep_tables(sweep)
    assert len(tables) == 3 and all(h[:2] == ["layer", "hook"] for _, h, _ in tables)
    assert all(len(h) <= 8 for _, h, _ in tables)
    # a column of `sweep --saes` (OPTIONAL_COLUMNS) only when a row has its key
    assert sum(len(h) - 2 for _, h, _ in tables) == len(TABLE) - 2 - len(OPTIONAL_COLUMNS)
    row.update({key: 1.5 for key in OPTIONAL_COLUMNS.values()})
    assert sum(len(h) - 2 for _, h, _ in sweep_tables(sweep)) == len(TABLE) - 2


def test_latent_table_and_cards_embed_escaped_and_complete():
    """The per-latent table travels as JSON (every latent, 4 significant digits, NaN → null) and each card
    as a template: contexts highest first with the token marked and escaped, its histogram, its neighbours."""
    import html as html_lib
    import json as json_lib

    from saegeo.render.latents_page import latent_section_html, render_latents_html

    n = 1000
    table = {
        "id": list(range(n)),
        "rate": [i / n for i in range(n)],
        "cos_mu": [float("nan")] + [0.123456] * (n - 1),
        "dead": [i == 0 for i in range(n)],
        "nn_id": [-1] + list(range(n - 1)),
    }
    card = {
        "id": 7,
        "why": ["dense_latents", "asked"],
        "firing_rate": 0.5,
        "histogram": {"edges": [0.0, 1.0, 2.0], "counts": [3, 0]},
        "neighbours": [{"id": 8, "cos": 0.9}],
        "top_contexts": [
            {"row": 11, "activation": 9.5, "token_id": 5, "position": 3, "text": "<b>", "context": ["a", " </script>"]},
            {"row": 12, "activation": 2.0, "token_id": 6, "position": 4, "text": None, "context": []},
        ],
    }
    part = "\n".join(latent_section_html("sae <1>", table, [card]))
    blob = re.search(r"<script type='application/json' class='lt-data'>(.*?)</script>", part, re.S).group(1)
    data = json_lib.loads(blob.replace("<\\/", "</"))
    assert data["rows"]["id"] == list(range(n)) and data["rows"]["cos_mu"][:2] == [None, 0.1235]
    assert [c["key"] for c in data["columns"]] == ["id", "rate", "cos_mu", "dead", "nn_id"]  # only the given columns
    [tpl] = re.findall(r"<template class='lt-card' data-id='7'>(.*?)</template>", part, re.S)
    assert "<mark title='token id 5'>&lt;b&gt;</mark>" in tpl and "<span class='tok'> &lt;/script&gt;</span>" in tpl
    assert "<mark title='token id 6'>#6</mark>" in tpl  # no decoded text: the token id
    contexts = tpl.split("<table class='ctx'>")[1]
    assert contexts.index(">9.500<") < contexts.index(">2.000<")  # highest first, as given
    assert tpl.count("<rect") == 1 and "dense_latents, asked" in tpl and ">8<" in tpl
    assert "sae &lt;1&gt;: latent 7" in tpl and "sae <1>" not in part
    doc = {"source": {"model": "m"}, "saes": [{"name": "s", "d_sae": n, "latent_table": table, "latents": [card]}]}
    page = render_latents_html(doc)
    assert page.count("class='latents'") == 1 and "<script>" in page
    assert "http://" not in page and "https://" not in page
    assert html_lib.escape("1,000 latents") in page


def test_the_sweep_figure_marks_whole_layers_only(monkeypatch):
    """Depth is a count of blocks: the x ticks of every panel are whole numbers (not 1.5, 2.5 between layers)."""
    from saegeo.render import sweep_page as render_sweep
    from saegeo.report.layer_sweep import LayerSweep

    figures = []
    monkeypatch.setattr(render_sweep, "png", lambda fig, dpi: figures.append(fig) or b"")
    rows = [{"layer": L, "hook": f"b{L}", "n": 10, "A": 0.1 * L, "A_null": 0.01, "offset": 0.5} for L in (1, 2, 3, 4)]
    render_sweep.sweep_figure(LayerSweep(1, "m", rows, [], 0.0, {}))
    plotted = [ax for ax in figures[0].axes if any(len(line.get_xdata()) for line in ax.get_lines())]
    assert len(plotted) >= 2  # A with its null, the offset
    figures[0].canvas.draw()  # the ticks of the laid-out figure
    for ax in plotted:
        ticks = [t for t in ax.get_xticks() if 1 <= t <= 4]
        assert ticks and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)


@pytest.mark.parametrize("rate, shown", [(1 / 4096, "0.024%"), (0.0, "0.0%"), (0.5, "50.0%"), (None, "—")])
def test_a_card_never_shows_a_latent_that_fired_as_zero_percent(rate, shown):
    """One firing in 4,096 tokens read "0.0%" on the card; below 0.1 % the rate keeps two significant digits."""
    from saegeo.render.latents_page import latent_card_html

    page = latent_card_html({"id": 0, "why": ["asked"], "firing_rate": rate, "top_contexts": []})
    assert re.search(r"firing rate</t[dh]><td[^>]*>([^<]*)<", page).group(1) == shown
