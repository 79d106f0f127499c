"""Headless Chromium for the page tests and `make screenshots`: a tiny W3C WebDriver client over HTTP (urllib,
no Python dependency) driving Debian's chromedriver, and the pages it opens, built from real computations on
small synthetic data (a report with two SAEs and their latents, a dictionary check, a layer sweep, a latents page).

    python tests/browser_helpers.py docs/screenshots    # `make screenshots`: one PNG per page + a latent card
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WIDTH, HEIGHT = 1400, 900  # the page width every page must fit
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    f"--window-size={WIDTH},{HEIGHT}",
]
# installed before any page script runs: every console error and uncaught exception, kept for the test to read
ERROR_TRAP = """window.__errors = [];
window.addEventListener('error', e => window.__errors.push('uncaught: ' + (e.message || e.type)), true);
const __err = console.error.bind(console);
console.error = (...a) => { window.__errors.push('console.error: ' + a.map(String).join(' ')); __err(...a); };"""


def browser_missing() -> str | None:
    """Why the browser tests cannot run here (None when chromium and chromedriver are installed)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} not installed (Debian: apt-get install -y chromium chromium-driver)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """One headless Chromium session through chromedriver (W3C WebDriver over HTTP on localhost).

    with Browser() as b: b.open(path); b.js("return 1")
    """

    def __init__(self, timeout: float = 30.0):
        self.timeout = timeout
        self.port = _free_port()
        self.profile = tempfile.mkdtemp(prefix="saegeo-chromium-")
        self.driver = subprocess.Popen(
            [CHROMEDRIVER, f"--port={self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + timeout
        while True:  # chromedriver answers /status once it listens
            try:
                self._call("GET", "/status")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline or self.driver.poll() is not None:
                    self.close()
                    raise RuntimeError("chromedriver did not start") from None
                time.sleep(0.1)
        caps = {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": [*CHROMIUM_FLAGS, f"--user-data-dir={self.profile}"]},
            "goog:loggingPrefs": {"browser": "ALL"},
        }
        try:
            self.session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]
        except Exception:
            self.close()
            raise
        # a viewport of exactly WIDTH × HEIGHT CSS pixels (the window's frame would otherwise take some),
        # and the error trap in every document before its own scripts
        self.cdp("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)
        self.cdp("Page.addScriptToEvaluateOnNewDocument", source=ERROR_TRAP)

    # ------------------------------------------------------------------ protocol
    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"{}").get("value")
        except urllib.error.HTTPError as err:  # WebDriver errors come back as JSON with a message
            detail = err.read().decode(errors="replace")[:500]
            raise RuntimeError(f"WebDriver {method} {path}: {err.code} {detail}") from None

    def _s(self, method: str, path: str, body: dict | None = None) -> Any:
        return self._call(method, f"/session/{self.session}{path}", body)

    def cdp(self, cmd: str, **params: Any) -> Any:
        """A Chrome DevTools Protocol command through chromedriver."""
        return self._s("POST", "/goog/cdp/execute", {"cmd": cmd, "params": params})

    # ------------------------------------------------------------------ what the tests use
    def open(self, path: str | os.PathLike) -> None:
        """A file, or a URL (http://127.0.0.1:… of a local server)."""
        url = str(path) if str(path).startswith("http://") else Path(path).resolve().as_uri()
        self._s("POST", "/url", {"url": url})

    def js(self, script: str, *args: Any) -> Any:
        return self._s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait_for(self, condition: str, *args: Any, timeout: float = 10.0) -> bool:
        """Poll the JS expression ``condition`` (``arguments`` usable) until it is true or ``timeout`` seconds pass;
        its last value. For what a page does after load (its tables are built by its scripts)."""
        end = time.monotonic() + timeout
        while True:
            ok = bool(self.js(f"return !!({condition})", *args))
            if ok or time.monotonic() > end:
                return ok
            time.sleep(0.05)

    def errors(self) -> list[str]:
        """Console errors and uncaught exceptions of the page (the trap's and the browser log's SEVERE)."""
        trapped = self.js("return window.__errors || []")
        try:
            logged = self._s("POST", "/se/log", {"type": "browser"}) or []
        except RuntimeError:
            logged = []
        return list(trapped) + [e["message"] for e in logged if e.get("level") == "SEVERE"]

    def overflow(self) -> dict[str, int]:
        """The page's width against the viewport's, and the widest elements sticking out (for the message)."""
        return self.js(
            "const d = document.documentElement, w = window.innerWidth;"
            "const out = [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > w + 0.5)"
            ".slice(0, 3).map(e => e.tagName + (e.className ? '.' + e.className : '') + ' right='"
            " + Math.round(e.getBoundingClientRect().right));"
            "return {scrollWidth: d.scrollWidth, innerWidth: w, bodyScrollWidth: document.body.scrollWidth,"
            " offenders: out.join('; ')};"
        )

    def screenshot(self, path: str | os.PathLike, *, full_page: bool = True) -> None:
        """A PNG of the page (the whole length when full_page) at WIDTH CSS pixels."""
        shot = self.cdp("Page.captureScreenshot", format="png", captureBeyondViewport=full_page)
        Path(path).write_bytes(base64.b64decode(shot["data"]))

    def element_screenshot(self, css: str, path: str | os.PathLike) -> None:
        """A PNG of one element, whole even where it is taller than the viewport."""
        r = self.js(
            f"const r = document.querySelector({json.dumps(css)}).getBoundingClientRect();"
            "return {x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height};"
        )
        clip = {**{k: float(v) for k, v in r.items()}, "scale": 1}
        shot = self.cdp("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)
        Path(path).write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            if getattr(self, "session", None):
                self._s("DELETE", "")
        except Exception:
            pass
        self.driver.terminate()
        try:
            self.driver.wait(10)
        except subprocess.TimeoutExpired:
            self.driver.kill()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class JupyterLab:
    """A real JupyterLab server on localhost serving ``root`` (its kernels run this Python, with ``env`` added):
    no token, no browser of its own, the app exposed to page scripts as ``window.jupyterapp``; its settings,
    workspaces and runtime files in a temporary folder (the user's own are not read), notebooks drawn whole
    (windowingMode "none": every cell's output is in the DOM), no news or update checks, no extension manager.

    with JupyterLab(root, env) as lab: browser.open(lab.url("quickstart.ipynb"))
    """

    def __init__(self, root: Path, env: dict[str, str] | None = None, timeout: float = 180.0):
        self.home = Path(tempfile.mkdtemp(prefix="saegeo-jupyterlab-"))
        settings = self.home / "settings" / "@jupyterlab"
        for plugin, values in (
            ("notebook-extension/tracker", {"windowingMode": "none"}),
            ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False}),
        ):
            path = settings / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        self.port = _free_port()
        folders = {"JUPYTERLAB_SETTINGS_DIR": "settings", "JUPYTERLAB_WORKSPACES_DIR": "workspaces"}
        folders |= {"JUPYTER_RUNTIME_DIR": "runtime", "JUPYTER_CONFIG_DIR": "config", "JUPYTER_DATA_DIR": "data"}
        full_env = {**os.environ, **(env or {}), **{k: str(self.home / v) for k, v in folders.items()}}
        self.log = open(self.home / "server.log", "w")  # noqa: SIM115 (closed in close())
        self.server = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={self.port}", "--ServerApp.ip=127.0.0.1",
             "--IdentityProvider.token=", "--ServerApp.password=", f"--ServerApp.root_dir={root}",
             "--expose-app-in-browser", "--allow-root", "--LabApp.extension_manager=readonly",
             "--ServerApp.terminals_enabled=False"],
            env=full_env, stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:  # the server answers /api/status once it listens
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/status", timeout=5).close()
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline or self.server.poll() is not None:
                    self.close()
                    raise RuntimeError("JupyterLab did not start") from None
                time.sleep(0.5)

    def url(self, notebook: str) -> str:
        return f"http://127.0.0.1:{self.port}/lab/tree/{notebook}"

    def close(self) -> None:
        self.server.terminate()
        try:
            self.server.wait(30)
        except subprocess.TimeoutExpired:
            self.server.kill()
        self.log.close()
        shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> JupyterLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# =========================================================================== the pages
WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()


def _store(path: Path, x, *, hook: str, seed: int, extra_meta: dict | None = None):
    """A store of ``x`` with token ids and positions (windows of 32), as `saegeo cache` writes one; with
    ``extra_meta`` (exclusions: each window's first token left out) positions 1 … 31. Its model is the bundled
    MiniLM and its tokens are WORDS in MiniLM's vocabulary, so the cards' contexts decode to text as a real store's
    do."""
    import torch

    from saegeo.activations.models import BUNDLED, tokenizer_for
    from saegeo.activations.store import ActivationStore, StoreWriter

    n = x.shape[0]
    vocab = torch.tensor(tokenizer_for(BUNDLED["minilm"]).convert_tokens_to_ids(WORDS))
    ids = vocab[torch.randint(0, len(WORDS), (n,), generator=torch.Generator().manual_seed(seed))]
    positions = torch.arange(n) % 31 + 1 if extra_meta else torch.arange(n) % 32
    model = BUNDLED["minilm"]
    with StoreWriter(path, d=x.shape[1], hook=hook, model=model, shard_rows=1000, extra_meta=extra_meta) as w:
        for lo in range(0, n, 500):
            w.append(x[lo : lo + 500], token_ids=ids[lo : lo + 500], positions=positions[lo : lo + 500])
    return ActivationStore(path)


def _exclusions(x, generator) -> dict:
    """The manifest's exclusion record of a store of ``x`` cached as SmolLM2's is (`saegeo cache --exclude-special
    --exclude-norm-ratio`): each window's first token, a special one, left out (so the special positions and the
    first position are the same rows) and a few norm outliers; their float64 sums beside those of all rows."""
    import torch

    n_windows, d = -(-x.shape[0] // 31), x.shape[1]  # 31 stored rows a window
    first = 8 * x.mean(0) + torch.randn(n_windows, d, generator=generator)  # BOS: far out along the mean
    outliers = 20 * torch.randn(5, d, generator=generator)

    def sums(rows) -> dict:
        r = rows.double()
        return {"n": r.shape[0], "sum": r.sum(0).tolist(), "sum_sq": float(r.square().sum())}

    excluded = torch.cat([first, outliers])
    return {
        "exclusion_rule": {
            "special_positions": {"prefix": ["<|im_start|>"], "prefix_ids": [1], "suffix": [], "suffix_ids": []},
            "first_position_excluded": True,
            "norm_ratio": 4.0,
            "norm_rule": "rows with ‖x‖ > 4 × the median ‖x‖ of their window (non-special rows), at any cached hook",
        },
        "excluded": {
            "finished": True,
            "all": sums(torch.cat([x, excluded])),
            "excluded": sums(excluded),
            "excluded_special": sums(first),
            "excluded_norm": sums(outliers),
            "first_position": sums(first),
        },
    }


def build_pages(out: Path) -> dict[str, Path]:
    """The four pages from real computations on small synthetic stores: report.html (two SAEs, the table and cards
    of the latents its flags name; its store cached with exclusions), check.html, sweep.html (four layers) and latents.html (`saegeo latents`' own
    run: the cards of four latents, contexts read from the store and decoded). {page: path}."""
    import math

    import torch

    from saegeo.render import write_report, write_sweep
    from saegeo.render.latents_page import write_latents
    from saegeo.report import ReportOptions, geometry_report
    from saegeo.report.dictionary_check import CheckOptions, check_dictionary
    from saegeo.report.geometry_report import latents_report
    from saegeo.report.latent_cards import LatentsOptions
    from saegeo.report.layer_sweep import SweepOptions, sweep_stores
    from saegeo.sae.model import SAE, SAEConfig

    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    d, n_lat, n = 32, 256, 3000
    offset = torch.randn(d, generator=g)
    offset = 6 * offset / offset.norm()
    x = torch.randn(n, d, generator=g) * torch.linspace(0.3, 2.0, d) + offset
    store = _store(out / "acts", x, hook="blocks.3.hook_resid_post", seed=1, extra_meta=_exclusions(x, g))
    planted = SAE(SAEConfig(d_in=d, d_sae=n_lat, activation="relu")).init_weights(torch.Generator().manual_seed(1))
    clean = SAE(SAEConfig(d_in=d, d_sae=n_lat, activation="topk", k=8)).init_weights(
        torch.Generator().manual_seed(2), b_dec=x.mean(0)
    )
    with torch.no_grad():  # latent 0 is the mean direction, firing on every token
        planted.W_dec[0] = offset / offset.norm()
        planted.W_enc[:, 0] = 0.0
        planted.b_enc[0] = 6.0
    report = geometry_report(store, {"b_dec=0": planted, "b_dec=mean": clean}, options=ReportOptions(progress=False))
    for s in report.saes:  # the report's own cards: a page without them would test nothing
        assert s.latent_table and s.latents, f"the report has no latent cards for {s.name}"
    pages = {"report": write_report(report, out / "report", formats=("html",))["html"]}
    check = check_dictionary(planted, name="b_dec=0", options=CheckOptions(progress=False))
    pages["check"] = write_report(check, out / "check", formats=("html",))["html"]
    c = torch.randn(d, generator=g)
    c = c / c.norm() * math.sqrt(d)
    stores = [
        _store(
            out / f"L{L}",
            L * c + math.sqrt(L) * torch.randn(800, d, generator=g),
            hook=f"blocks.{L - 1}.hook_resid_post",
            seed=L,
        )
        for L in (1, 2, 3, 4)
    ]
    sweep = sweep_stores(stores, SweepOptions(artifact_components=2, progress=False))
    pages["sweep"] = write_sweep(sweep, out / "sweep", formats=("html",))["html"]
    # the cards of latents firing on most tokens with spread activations first (the card the README shows), then
    # latent 0, the planted mean direction (6.0 on every token: one histogram bar, 20 tied contexts)
    latents = latents_report(store, planted, LatentsOptions(latents=(8, 4, 15, 0), progress=False), name="b_dec=0")
    pages["latents"] = write_latents(latents, out / "latents", formats=("html",))["html"]
    return pages


# the latent card the README shows: the first row of the latents page's first table, opened
OPEN_FIRST_ROW = "const tr = document.querySelector('.latents tr.lat.has-card'); tr.click(); return tr.dataset.id;"
CARD = ".latents tr.card-row .card"
# the first card in the cards' order (the latents the flags name first), through its link above the table
OPEN_FIRST_CARD = "document.querySelector('.latents a.open-latent').click();"


def screenshots(out: Path, pages: dict[str, Path]) -> list[Path]:
    """A full-page PNG of each page at WIDTH px, and latent-card.png: the first card of the first page (latents
    page first) with a per-latent table, opened."""
    out.mkdir(parents=True, exist_ok=True)
    written, card_done = [], False
    with Browser() as b:
        for name, page in sorted(pages.items(), key=lambda kv: kv[0] != "latents"):
            b.open(page)
            b.screenshot(out / f"{name}.png")
            written.append(out / f"{name}.png")
            if not card_done and b.js("return !!document.querySelector('.latents tr.lat.has-card')"):
                b.js("document.querySelectorAll('.latents .scroll').forEach(e => e.style.maxHeight = 'none');")
                b.js(OPEN_FIRST_CARD)  # the card whole: the table's box unbounded
                b.element_screenshot(CARD, out / "latent-card.png")
                written.append(out / "latent-card.png")
                card_done = True
    return written


if __name__ == "__main__":  # make screenshots [PAGES="run/report/report.html run/latents/latents.html"]
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screenshots")
    given = {Path(p).stem: Path(p) for p in sys.argv[2:]}
    with tempfile.TemporaryDirectory() as tmp:
        for path in screenshots(target, given or build_pages(Path(tmp))):
            print(path)
