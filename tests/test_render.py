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
    fve_line = next(line for line in lines if line.strip().startswith("FVE"))
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
