"""Where a saegeo command's memory goes: peak resident memory per part of the run, in one process.

    python benchmarks/memory_parts.py [--every-ms 2] -- check DIR --acts STORE --out OUT ...

runs `saegeo <args>` in this process with a thread that reads /proc/self/status (VmRSS, RssAnon, RssFile) every
few milliseconds. The parts are the functions in PARTS, each wrapped where it is looked up (its class, or every
saegeo module that imported it by name); a sample counts towards every part open at that moment, so a part's
peak includes its children's. Printed per part: calls, wall seconds, the resident memory when it was entered
(largest over calls), the peak while it ran (anonymous and file-backed: a mapped W_dec is file pages), and what
it kept (resident after − before, summed over calls). Linux only; the polling thread costs ~1 % of a core.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
import threading
import time

# (module, attribute path): the parts of a `check --acts` / `report --acts` run, outermost first
PARTS = [
    ("saegeo.sae.model", "SAE.load"),
    ("saegeo.report.dictionary_check", "check_dictionary"),
    ("saegeo.report.dictionary_check", "activations_match_flags"),
    ("saegeo.report.geometry_report", "_SAEPass.__init__"),
    ("saegeo.geometry.dictionary", "dictionary_geometry"),
    ("saegeo.geometry.accumulate", "GeometryAccumulator.add"),
    ("saegeo.geometry.accumulate", "chunk_sums"),
    ("saegeo.geometry.accumulate", "symmetric_gram"),
    ("saegeo.geometry.sample", "RowReservoir.add"),
    ("saegeo.sae.metrics", "SAEMetrics.add"),
    ("saegeo.sae.metrics", "SAEMetrics._encode_group"),
    ("saegeo.sae.metrics", "SAEMetrics._add_rows"),
    ("saegeo.sae.metrics", "SAEMetrics._add_codes"),
    ("saegeo.geometry.measures", "activation_geometry"),
    ("saegeo.geometry.measures", "centred_spectrum"),
    ("saegeo.geometry.measures", "symmetric_eigh"),
    ("saegeo.geometry.measures", "null_test"),
    ("saegeo.geometry.nulls", "calibrated_mp_bulk"),
    ("saegeo.geometry.accumulate", "GeometryAccumulator._unit_sample"),
    ("saegeo.geometry.diagnosis", "sample_diagnostics"),
    ("saegeo.report.geometry_report", "_SAEPass.finish"),
    ("saegeo.sae.metrics", "SAEMetrics.sample_codes"),
    ("saegeo.geometry.amplification", "cone_shares"),
    ("saegeo.geometry.amplification", "heterogeneous_moment_prediction"),
    ("saegeo.geometry.amplification", "independent_second_moment"),
    ("saegeo.geometry.amplification", "cofiring_share"),
    ("saegeo.geometry.amplification", "independent_codes_anisotropy"),
    ("saegeo.geometry.amplification", "cofiring_pairs"),
    ("saegeo.report.geometry_report", "_artifact_test"),
    ("saegeo.report.store_measures", "artifact_pass"),
    ("saegeo.report.geometry_report", "cosine_histogram"),
    ("saegeo.report.geometry_report", "compute_flags"),
    ("saegeo.report.latent_cards", "LatentCollector.fill"),
    ("saegeo.render.report_page", "write_report"),
    ("saegeo.render.common", "write_renderings"),
]


class Poller(threading.Thread):
    """Reads /proc/self/status every `every` seconds and charges each sample to the open parts."""

    def __init__(self, every: float, trace: str | None = None):
        super().__init__(daemon=True)
        self.every, self.open, self.stop = every, [], threading.Event()
        self.trace, self.t0, self.last = (open(trace, "w") if trace else None), time.perf_counter(), 0
        self.peak: dict[str, tuple[int, int, int]] = {}  # part -> (rss, anon, file) at its largest rss
        self.overall = (0, 0, 0)

    @staticmethod
    def read() -> tuple[int, int, int]:
        got = {}
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    got[key] = int(value.split()[0]) * 1024
        return got["VmRSS"], got["RssAnon"], got["RssFile"]

    def sample(self) -> tuple[int, int, int]:
        now = self.read()
        if now[0] > self.overall[0]:
            self.overall = now
        for name in list(self.open):
            if now[0] > self.peak.get(name, (0, 0, 0))[0]:
                self.peak[name] = now
        if self.trace is not None and abs(now[0] - self.last) > 4e6:  # a line per 4 MB of change
            self.last = now[0]
            t = time.perf_counter() - self.t0
            self.trace.write(
                f"{t:8.2f} {now[0] / 1e9:6.3f} {now[1] / 1e9:6.3f} {now[2] / 1e9:6.3f} {'/'.join(self.open)}\n"
            )
        return now

    def run(self) -> None:
        while not self.stop.wait(self.every):
            self.sample()


def _resolve(module: str, path: str):
    obj = importlib.import_module(module)
    *owners, attr = path.split(".")
    for o in owners:
        obj = getattr(obj, o)
    return obj, attr


def install(poller: Poller, stats: dict) -> None:
    """Wrap every part where it is looked up: on its class, or in each loaded saegeo module holding it."""
    for module, path in PARTS:
        try:
            owner, attr = _resolve(module, path)
            fn = getattr(owner, attr)
        except (ImportError, AttributeError):  # a part this version does not have
            continue
        name = path

        def wrapped(*args, __fn=fn, __name=name, **kwargs):
            entry = poller.sample()
            poller.open.append(__name)
            t0 = time.perf_counter()
            try:
                return __fn(*args, **kwargs)
            finally:
                poller.open.remove(__name)
                after = poller.sample()
                s = stats.setdefault(__name, {"calls": 0, "wall_s": 0.0, "entry": 0, "kept": 0})
                s["calls"] += 1
                s["wall_s"] += time.perf_counter() - t0
                s["entry"] = max(s["entry"], entry[0])
                s["kept"] += after[0] - entry[0]

        functools.update_wrapper(wrapped, fn)
        if isinstance(owner, type):
            setattr(owner, attr, wrapped)
        else:
            for mod in list(sys.modules.values()):
                if getattr(mod, "__name__", "").startswith("saegeo") and getattr(mod, attr, None) is fn:
                    setattr(mod, attr, wrapped)


def table(poller: Poller, stats: dict) -> str:
    gb = 1e9
    lines = [
        f"{'part':<44} {'calls':>5} {'wall s':>7} {'entry GB':>9} {'peak GB':>8} {'(anon':>6} {'file)':>6} "
        f"{'kept GB':>8}"
    ]
    for _, name in PARTS:
        if name not in stats:
            continue
        s, (rss, anon, file) = stats[name], poller.peak.get(name, (0, 0, 0))
        lines.append(
            f"{name:<44} {s['calls']:>5} {s['wall_s']:>7.1f} {s['entry'] / gb:>9.3f} {rss / gb:>8.3f} "
            f"{anon / gb:>6.3f} {file / gb:>6.3f} {s['kept'] / gb:>8.3f}"
        )
    rss, anon, file = poller.overall
    lines.append(
        f"{'whole run (polled)':<44} {'':>5} {'':>7} {'':>9} {rss / gb:>8.3f} {anon / gb:>6.3f} {file / gb:>6.3f}"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every-ms", type=float, default=2.0)
    ap.add_argument("--trace", default=None, help="also write (seconds, rss, anon, file GB, open parts) to this file")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the saegeo command line")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    import saegeo.cli
    import saegeo.render.common  # noqa: F401  (the parts are wrapped once their modules are loaded)
    import saegeo.render.report_page  # noqa: F401
    import saegeo.report.dictionary_check  # noqa: F401
    import saegeo.report.geometry_report  # noqa: F401

    poller, stats = Poller(a.every_ms / 1000, a.trace), {}
    install(poller, stats)
    poller.start()
    try:
        rc = saegeo.cli.main(args)
    finally:
        poller.stop.set()
        poller.sample()
        print("PARTS\n" + table(poller, stats), file=sys.stderr, flush=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
