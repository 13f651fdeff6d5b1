"""The ``dpnoise`` command line: one module per subcommand, each exposing ``register(subparsers)``.

Invalid input exits with status 2 and one line ``dpnoise <command>: error: ...`` naming the
parameter: argparse's own errors, and every :class:`~dpnoise.errors.DpnoiseError` (the package's
deliberate errors).  Anything else is a bug and shows its traceback.  After a
:class:`~dpnoise.errors.ProcessGroupLostError` (a distributed run lost a rank) the process ends at
once after that line, with status 2, without the interpreter's shutdown, which the broken process
group's threads may abort.

Registering a subcommand imports no torch, Opacus or matplotlib: the subcommand modules import
them inside their run functions, so ``dpnoise account``, ``dpnoise calibrate`` and ``--help`` start
fast.  A command line naming its subcommand first (``dpnoise account ...``) registers that
subcommand alone, so it does not import the other subcommands' modules either (the training
configuration behind ``train``'s options, for one).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from importlib import import_module
from typing import Optional, Sequence

from dpnoise.checks import OneLineErrorParser
from dpnoise.errors import DpnoiseError, ProcessGroupLostError

#: Subcommand modules (``dpnoise.cli.<name>``), in --help order.
SUBCOMMANDS = ["account", "calibrate", "walls", "audit", "train", "tune"]


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The ``dpnoise`` parser with every subcommand, or with subcommand ``only`` alone (one of
    :data:`SUBCOMMANDS`; enough to parse a command line that names it first)."""
    parser = OneLineErrorParser(
        prog="dpnoise",
        description="Differentially private deep learning with Lap2 (L2-clipped Laplace) and "
        "Dirichlet-mechanism training, with sound, cross-checked privacy accounting.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS if only is None else [only]:
        import_module(f"dpnoise.cli.{name}").register(sub)
    return parser


def _format_warning(message, category, filename, lineno, line=None) -> str:  # noqa: ANN001
    return f"WARNING: {message}\n"


def one_line(message: str) -> str:
    """``message`` on one line: its lines joined with "; " (just a space after a colon)."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    joined = ""
    for line in lines:
        joined += ("" if not joined else " " if joined.endswith(":") else "; ") + line
    return joined


def command_name(args: argparse.Namespace) -> str:
    """``dpnoise <command>`` (with the audit kind for ``dpnoise audit``), for error lines."""
    words = ["dpnoise", args.command]
    if getattr(args, "audit", None):
        words.append(args.audit)
    return " ".join(words)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # Anything else (--help, a mistyped command) needs every subcommand, to list them.
    named = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    args = build_parser(only=named).parse_args(argv)
    warnings.formatwarning = _format_warning
    try:
        return int(args.func(args) or 0)
    except DpnoiseError as err:
        print(f"{command_name(args)}: error: {one_line(str(err))}", file=sys.stderr)
        if isinstance(err, ProcessGroupLostError):
            end_process(2)
        return 2
    except BrokenPipeError:
        # the reader went away (`dpnoise account ... | head -1`): stop quietly, as a Unix filter does;
        # stdout goes to devnull so that the interpreter's final flush does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a filter ended this way


def end_process(status: int) -> None:
    """Flush stdout and stderr and end the process with ``status`` at once (``os._exit``): no atexit
    handlers, no destructors, so a lost process group's threads cannot turn ``status`` into an abort."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
