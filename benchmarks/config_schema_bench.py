"""Choosing the validation library of the typed foreign configs: import time in a fresh process, the
time to check one SAELens cfg.json, and the message each gives for the same wrong fields.

  stdlib     json + dataclasses, no checking (the floor)
  pydantic   2.x, strict mode (already installed: wandb and typer, which transformer-lens brings, need it)
  msgspec    if importable (not a dependency of saegeo: `pip install msgspec` or PYTHONPATH to a copy to compare)

Usage: python benchmarks/config_schema_bench.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SCHEMAS = {
    "stdlib": "import json, dataclasses",
    "pydantic": (
        "from pydantic import BaseModel, ConfigDict\n"
        "class C(BaseModel):\n model_config = ConfigDict(strict=True, extra='allow')\n d_in: int\n"
        " apply_b_dec_to_input: bool | None = None\n metadata: dict | None = None"
    ),
    "msgspec": (
        "import msgspec\n"
        "class C(msgspec.Struct):\n d_in: int\n apply_b_dec_to_input: bool | None = None\n metadata: dict | None = None"
    ),
}
BAD = [{"d_in": "abc"}, {"d_in": 8, "apply_b_dec_to_input": "false"}, {"d_in": 8, "metadata": "gpt2"}]


def import_ms(code: str, runs: int) -> float | None:
    """Median wall ms of a fresh interpreter importing the library and declaring one schema."""
    times = []
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-c", f"import time; t = time.perf_counter()\n{code}\nprint(time.perf_counter() - t)"],
            capture_output=True,
            text=True,
            env=os.environ,
        )
        if done.returncode:
            return None
        times.append(float(done.stdout.split()[-1]) * 1000)
    return statistics.median(times)


def messages() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    from saegeo.errors import FormatError
    from saegeo.sae.formats.reader_checks import check_config
    from saegeo.sae.formats.saelens import saelens_schema

    said = []
    for bad in BAD:
        try:
            check_config("cfg.json", bad, saelens_schema())
        except FormatError as err:
            said.append(str(err))
    out["saegeo (pydantic, formatted)"] = said
    from pydantic import BaseModel, ConfigDict, ValidationError

    class C(BaseModel):
        model_config = ConfigDict(strict=True, extra="allow")
        d_in: int
        apply_b_dec_to_input: bool | None = None
        metadata: dict | None = None

    said = []
    for bad in BAD:
        try:
            C.model_validate(bad)
        except ValidationError as err:
            said.append(str(err).replace("\n", " | "))
    out["pydantic (as raised)"] = said
    try:
        import msgspec
    except ImportError:
        return out

    class M(msgspec.Struct):
        d_in: int
        apply_b_dec_to_input: bool | None = None
        metadata: dict | None = None

    said = []
    for bad in BAD:
        try:
            msgspec.json.decode(json.dumps(bad), type=M)
        except msgspec.ValidationError as err:
            said.append(str(err))
    out["msgspec (as raised)"] = said
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    print(f"import + one schema, fresh process, median of {args.runs} (machine: {os.cpu_count()} cores, shared)")
    for name, code in SCHEMAS.items():
        ms = import_ms(code, args.runs)
        print(f"  {name:<10} {'not installed' if ms is None else f'{ms:6.1f} ms'}")
    from saegeo.sae.formats.reader_checks import check_config
    from saegeo.sae.formats.saelens import saelens_schema

    cfg = {"architecture": "topk", "d_in": 768, "d_sae": 24576, "k": 32, "apply_b_dec_to_input": True}
    cfg["metadata"] = {"model_name": "gpt2", "hook_name": "blocks.8.hook_resid_post", "context_size": 128}
    start = time.perf_counter()
    saelens_schema()
    built = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(1000):
        check_config("cfg.json", cfg, saelens_schema())
    print(
        f"saegeo's SAELens schema: built once in {built * 1000:.1f} ms, checks a cfg.json in "
        f"{(time.perf_counter() - start):.3f} ms"
    )  # 1000 checks: seconds -> ms per check
    for who, said in messages().items():
        print(who)
        for line in said:
            print("   ", line)


if __name__ == "__main__":
    main()
