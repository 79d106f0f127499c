"""The pages as a person opens them: headless Chromium at 1400 px (tests/browser_helpers.py drives Debian's
chromedriver over HTTP). Every page fits the width (no horizontal scrolling) and logs no console error; a row of
the per-latent table opens its card; the table sorts, filters and renders its rows lazily."""

from __future__ import annotations

import json
import re

import pytest

from saegeo.render.latents_page import INITIAL_ROWS
from tests.browser_helpers import CARD, OPEN_FIRST_ROW, Browser, browser_missing, build_pages

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))
PAGES = ("report", "check", "sweep", "latents")


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    return build_pages(tmp_path_factory.mktemp("pages"))


@pytest.fixture(scope="module")
def browser():
    with Browser() as b:
        yield b


def _table(page_path, index: int = 0) -> dict:
    """The embedded JSON of the page's index-th latent table, read from the file (not through the browser)."""
    blobs = re.findall(r"<script type='application/json' class='lt-data'>(.*?)</script>", page_path.read_text())
    return json.loads(blobs[index].replace("<\\/", "</"))


@pytest.mark.parametrize("name", PAGES)
def test_page_fits_1400px_and_logs_no_error(pages, browser, name):
    browser.open(pages[name])
    width = browser.overflow()
    assert width["innerWidth"] == 1400
    assert width["scrollWidth"] <= width["innerWidth"], f"{name} scrolls sideways: {width}"
    assert browser.errors() == []
    # no figure or table is wider than the page either, and the images decoded
    broken = browser.js("return [...document.images].filter(i => !i.complete || i.naturalWidth === 0).length")
    assert broken == 0


@pytest.mark.parametrize("name", ("latents", "report"))
def test_a_row_opens_its_card_with_the_token_marked(pages, browser, name):
    browser.open(pages[name])
    assert browser.js(f"return document.querySelectorAll('{CARD}').length") == 0  # closed at first
    lid = browser.js(OPEN_FIRST_ROW)
    card = browser.js(
        f"const c = document.querySelector('{CARD}'); const r = c.getBoundingClientRect();"
        "return {visible: c.offsetParent !== null && r.height > 50 && r.width > 200, title: c.querySelector('h4')"
        ".textContent, marks: c.querySelectorAll('table.ctx td mark').length, rows: c.querySelectorAll('table.ctx tr').length - 1, svg: c.querySelectorAll('svg rect').length,"
        " right: r.right};"
    )
    assert card["visible"], card
    assert f"latent {lid}" in card["title"]
    assert card["marks"] == card["rows"] > 0 and card["svg"] > 0  # each context's token marked; a histogram
    assert card["right"] <= 1400
    assert (
        browser.js(
            "document.querySelector('.latents tr.lat.has-card').click();"
            f"return document.querySelectorAll('{CARD}').length"
        )
        == 0
    )
    assert browser.errors() == []


def test_a_latent_a_flag_names_links_to_its_card(pages, browser):
    browser.open(pages["report"])
    assert browser.wait_for("document.querySelector('.latents tbody tr.lat')")  # the tables' script has run
    link = browser.js(
        "const a = document.querySelector('.flag a.to-latent'); a.click();"
        "return {id: a.dataset.id, box: a.dataset.box};"
    )
    opened = browser.js(
        f"const box = document.getElementById(arguments[0]); const c = box.querySelector('{CARD}');"
        "return {rows: [...box.querySelectorAll('tbody tr.lat')].map(t => t.dataset.id),"
        " visible: !!c && c.offsetParent !== null, title: c ? c.querySelector('h4').textContent : ''};",
        link["box"],
    )
    if opened["rows"] != [link["id"]]:  # a page still busy when clicked: give it time, then the same assertion
        browser.wait_for(
            "document.getElementById(arguments[0]).querySelectorAll('tbody tr.lat').length === 1", link["box"]
        )
        opened["rows"] = browser.js(
            "return [...document.getElementById(arguments[0]).querySelectorAll('tbody tr.lat')].map(t => t.dataset.id)",
            link["box"],
        )
    assert opened["rows"] == [link["id"]]  # the table filtered to that latent
    assert opened["visible"] and f"latent {link['id']}" in opened["title"]
    assert browser.errors() == []


def test_the_table_sorts_filters_and_renders_lazily(pages, browser):
    page = pages["latents"]
    data = _table(page)
    rows = data["rows"]
    n = len(rows["id"])
    browser.open(page)
    box = "document.querySelector('.latents')"
    shown = f"return [...{box}.querySelectorAll('tbody tr.lat')].map(t => Number(t.dataset.id));"
    assert browser.js(shown) == rows["id"][:INITIAL_ROWS]  # lazily: the first page of rows only
    browser.js(f"{box}.querySelector('button.more').click()")
    assert len(browser.js(shown)) == min(n, 2 * INITIAL_ROWS)
    # sort by firing rate: highest first (numbers sort descending on the first click), ties in any order
    browser.js(f"{box}.querySelector(\"th[data-key='rate']\").click()")
    first = browser.js(shown)[:5]
    assert [rows["rate"][i] for i in first] == sorted(rows["rate"], reverse=True)[:5]
    browser.js(f"{box}.querySelector(\"th[data-key='rate']\").click()")  # again: ascending
    assert rows["rate"][browser.js(shown)[0]] == min(rows["rate"])
    # filter: a condition and a flag column together; the count says how many of how many
    set_filter = (
        f"const i = {box}.querySelector('input.filter'); i.value = arguments[0];i.dispatchEvent(new Event('input'));"
    )
    browser.js(set_filter, "dense cos_mu>0.2")
    want = [i for i in range(n) if rows["dense"][i] and rows["cos_mu"][i] > 0.2]
    assert sorted(browser.js(shown + "")) == sorted(rows["id"][i] for i in want[:INITIAL_ROWS])
    assert browser.js(f"return {box}.querySelector('.count').textContent").startswith(f"{len(want)} of {n} latents")
    browser.js(set_filter, "3, 5 17")
    assert sorted(browser.js(shown)) == [3, 5, 17]
    browser.js(set_filter, "rate>>1")  # not a filter: marked, the rows stay
    assert browser.js(f"return {box}.querySelector('input.filter').classList.contains('bad')")
    assert sorted(browser.js(shown)) == [3, 5, 17]
    assert browser.errors() == []
