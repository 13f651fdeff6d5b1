"""The ``dpnoise`` command line: one module per subcommand, each exposing ``register(subparsers)``.

Invalid input exits with status 2 and one line naming the parameter.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from importlib import import_module
from typing import Optional, Sequence

from dpnoise.accounting.validation import InvalidParameterError

#: Subcommand modules (``dpnoise.cli.<name>``), in --help order.
SUBCOMMANDS = ["account", "calibrate", "walls", "audit", "train", "reproduce"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpnoise",
        description="Differentially private deep learning with Lap2 (L2-clipped Laplace) and "
        "Dirichlet-mechanism training, with sound, cross-checked privacy accounting.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        import_module(f"dpnoise.cli.{name}").register(sub)
    return parser


def _format_warning(message, category, filename, lineno, line=None) -> str:  # noqa: ANN001
    return f"WARNING: {message}\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.formatwarning = _format_warning
    try:
        return int(args.func(args) or 0)
    except (InvalidParameterError, ValueError) as err:
        print(f"dpnoise {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
