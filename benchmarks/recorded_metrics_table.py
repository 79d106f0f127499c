"""The numbers behind the thresholds recorded_l0_factor and recorded_fve_tolerance
(saegeo.report.flags.recorded_metrics): for SAEs whose training recorded L0 (SAELens metadata) or held-out FVE
(saegeo provenance), the same quantities on row sets of the right store, and what the two hazards give (a threshold
zeroed, explained variance measured about zero).

    python benchmarks/recorded_metrics_table.py STORE [SAE_DIR ...]

STORE: MiniLM blocks.3.hook_resid_post rows (the SAELens fixtures trained on its rows 0..50,000). SAE_DIRs: extra
(saegeo-trained) SAEs. Rows: the first 4,096 (what the verdict reads), 4,096 from row 50,000 on (never trained on by
the fixtures), the last 4,096. Prints one Markdown table (docs/design.md keeps a run)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from saegeo.activations.store import ActivationStore
from saegeo.sae.model import SAE

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "published"
SAES = ("saelens_trained_topk", "saelens_trained_batchtopk", "saelens_trained_standard_norm")
ROWS = 4096


def rows(store: ActivationStore, start: int) -> torch.Tensor:
    out, at = [], 0
    for batch in store.iter_batches(8192):
        if at + batch.shape[0] > start:
            out.append(batch[max(start - at, 0) :])
        at += batch.shape[0]
        if sum(b.shape[0] for b in out) >= ROWS:
            break
    return torch.cat(out)[:ROWS].float()


def measures(sae: SAE, x: torch.Tensor) -> tuple[float, float, float]:
    """(L0, FVE about the mean, FVE about zero) on x."""
    with torch.no_grad():
        codes, x_hat = sae.encode(x), sae(x)
    sse = float((x - x_hat).double().pow(2).sum())
    xd = x.double()
    return (
        float((codes != 0).sum(1).double().mean()),
        1 - sse / float((xd - xd.mean(0)).pow(2).sum()),
        1 - sse / float(xd.pow(2).sum()),
    )


def main(store_path: str, extra: list[str]) -> None:
    store = ActivationStore(store_path)
    sets = {"first": rows(store, 0), "50k": rows(store, 50_000), "last": rows(store, store.n_tokens - ROWS)}
    print(
        "| SAE | recorded L0 / FVE | L0 on first / 50k / last rows | FVE on first / 50k / last | FVE about zero (first) "
        "| L0 with the threshold zeroed |"
    )
    print("|---|---|---|---|---|---|")
    t0, c0 = time.perf_counter(), time.process_time()
    for path in [*(str(FIXTURES / n) for n in SAES), *extra]:
        sae = SAE.load(path)
        rec = sae.format_info.recorded_metrics or {}
        cfg = json.loads((Path(path) / "cfg.json").read_text())
        held = ((cfg.get("saegeo") or {}).get("metrics") or {}).get("heldout") or {}
        got = {k: measures(sae, x) for k, x in sets.items()}
        zeroed = "—"
        if getattr(sae, "threshold", None) is not None:
            with torch.no_grad():
                kept = sae.threshold.clone()
                sae.threshold.zero_()
                zeroed = f"{measures(sae, sets['first'])[0]:.1f}"
                sae.threshold.copy_(kept)
        recorded = f"{rec.get('l0', held.get('l0', float('nan'))):.1f} / " + (
            f"{held['fve']:.3f}" if "fve" in held else "—"
        )
        print(
            f"| {Path(path).name} | {recorded} | "
            + " / ".join(f"{got[k][0]:.1f}" for k in sets)
            + " | "
            + " / ".join(f"{got[k][1]:.3f}" for k in sets)
            + f" | {got['first'][2]:.3f} | {zeroed} |"
        )
    print(f"\n{time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
