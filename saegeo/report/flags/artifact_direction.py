"""artifact_direction: a top principal direction that is token frequency, position or ‖x‖."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saegeo.config import option
from saegeo.report.flags import ARTIFACT, Flag, flag, rounded

_COVARIATE_WORDS = {
    "log_frequency": "log token frequency",
    "position": "position in the window",
    "norm": "the row norm ‖x‖",
}


@dataclass
class Options:
    artifact_min_abs_corr: float = option(
        0.5, "a top principal direction with |corr| > this with log token frequency, position or ‖x‖", low=0
    )


@flag(
    ARTIFACT,
    stage="artifact",
    reads=("abs", "k", "n"),
    options=Options,
    bands={"warning": "one flag per such direction"},
    when="a top principal direction has \\|corr\\| > 0.5 with log token frequency, position or ‖x‖",
    order=10,
)
def artifact_direction(q: dict[str, Any], t: Any) -> list[Flag]:
    """One flag per principal direction j whose projection has |corr| > artifact_min_abs_corr with a covariate,
    naming its strongest covariate and listing every covariate's |r| as evidence."""
    artifact = q.get("artifact")
    if not artifact:
        return []
    flags = []
    absr = artifact.get("abs") or {}
    for j in range(int(artifact.get("k", 0))):
        values = {name: absr.get(name, [None] * (j + 1))[j] for name in _COVARIATE_WORDS}
        hits = {name: v for name, v in values.items() if v is not None and v > t.artifact_min_abs_corr}
        if not hits:
            continue
        worst = max(hits, key=hits.get)
        flags.append(
            Flag(
                ARTIFACT,
                "warning",
                {
                    "component": j + 1,
                    **{f"abs_corr_{name}": rounded(v) for name, v in values.items()},
                    "threshold": t.artifact_min_abs_corr,
                    "n": artifact.get("n"),
                },
                "For similarity use, removing this direction (all-but-the-top) is justified; for interpretability it is "
                "evidence about what the model encodes, not noise to discard.",
                summary=(
                    f"PC{j + 1} tracks {_COVARIATE_WORDS[worst]}: |corr| = {hits[worst]:.2f}"
                    + "".join(f", {_COVARIATE_WORDS[o]} {v:.2f}" for o, v in hits.items() if o != worst)
                ),
                subject=q.get("subject", "activations"),
            )
        )
    return flags
