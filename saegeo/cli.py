"""The `saegeo` command line: geometry | cache | store | train | report | check | synth | run.

Each subcommand has one `_add_<name>(subparsers)` function that declares its arguments and one
`cmd_<name>(args)` function that calls the library. Heavy imports happen inside the commands so that
`saegeo --help` is instant.
"""

from __future__ import annotations

import argparse
import sys


from saegeo.errors import SaegeoError


class CLIError(SaegeoError):
    """A usage error found by the command line itself."""


# --------------------------------------------------------------------------- geometry
def _add_geometry(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("geometry", help="geometry summary of 2-D tensors in .safetensors/.npy/.pt files")
    p.add_argument("files", nargs="+", help="one or more files, streamed in order")
    p.set_defaults(func=cmd_geometry)


def cmd_geometry(args: argparse.Namespace) -> int:
    raise CLIError("saegeo geometry: not implemented yet")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="saegeo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_geometry,):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SaegeoError as err:
        print(f"saegeo: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("saegeo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
