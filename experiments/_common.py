"""Shared plumbing of the experiment scripts: output paths and CSV rows (no math lives here)."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "artifacts" / "experiments"


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for the CSV and PNG")
    p.add_argument("--seed", type=int, default=0)
    return p


def write_csv(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return path


def save_figure(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path
