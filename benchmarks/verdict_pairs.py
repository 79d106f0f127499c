"""The numbers `activations_match_flags` decides from, on real (SAE, store) pairs: right and wrong layer, right and
wrong model, b_dec zeros (SAELens' default) and folded norm scaling, rows as cached and rescaled ×10.

    saegeo cache --model minilm --hooks blocks.1.hook_resid_post,blocks.3.hook_resid_post,blocks.5.hook_resid_post \
        --max-tokens 60000 --out ACTS
    python benchmarks/verdict_pairs.py ACTS [OTHER_MODEL_STORE ...]

SAEs: tests/fixtures/published/saelens_trained_* (SAELens' SAETrainer on ACTS' blocks.3 rows 0..50,000). For each pair
it prints FVE and mean cos(x, x̂) on the first 4,096 rows, ‖μ‖/‖b_dec‖, ‖b_dec − μ‖/‖μ‖, the FVE of x/ratio, and
the verdict. The table of one run is in docs/design.md ("Do an SAE and a store belong together")."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from saegeo.activations.sources import open_rows
from saegeo.report.dictionary_check import MatchOptions, _sample_fit, _store_measures, activations_match_flags
from saegeo.sae.model import SAE

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "published"
SAES = ("saelens_trained_topk", "saelens_trained_batchtopk", "saelens_trained_standard_norm")


def main(acts: str, others: list[str]) -> None:
    stores = {f"minilm {p.name.split('.hook')[0]}": str(p) for p in sorted(Path(acts).glob("blocks.*"))}
    stores.update({f"other model {Path(o).name}": o for o in others})
    opts = MatchOptions()
    print("| SAE | rows | FVE | cos(x, x̂) | ‖μ‖/‖b_dec‖ | ‖b_dec − μ‖/‖μ‖ | FVE of x/ratio | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    t0, c0 = time.perf_counter(), time.process_time()
    for name in SAES:
        sae = SAE.load(FIXTURES / name)
        b_dec = sae.b_dec.detach().double()
        for label, path in stores.items():
            m = _store_measures(open_rows(path), opts)
            variants = [(label, path, m["sample"])]
            if label.endswith("blocks.3"):
                x10 = m["sample"] * 10
                variants.append((f"{label} ×10", x10, x10))
            for shown, source, sample in variants:
                mu = sample.double().mean(0) if shown.endswith("×10") else m["mean"]
                fve, cos = _sample_fit(sae, sample)
                ratio = float(mu.norm() / b_dec.norm())
                fve_scaled = _sample_fit(sae, sample / ratio)[0]
                notes: list[str] = []
                flags = activations_match_flags(sae, source, subject=name, options=opts, notes=notes)
                verdict = "accepted" if not flags else f"{flags[0].severity}: {', '.join(flags[0].evidence['causes'])}"
                print(
                    f"| {name.removeprefix('saelens_trained_')} | {shown} | {fve:.3f} | {cos:.3f} | {ratio:.3g} | "
                    f"{float((b_dec - mu).norm() / mu.norm()):.3f} | {fve_scaled:.3f} | {verdict} |"
                )
    print(f"\n{time.perf_counter() - t0:.0f} s wall, {time.process_time() - c0:.0f} CPU s (shared 2-core machine)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
