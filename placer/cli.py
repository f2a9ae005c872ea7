"""The ``placer`` command line: one subcommand per module in ``placer/commands``.

Each command module defines ``HELP`` (one line), ``DESCRIPTION``, ``add_arguments(parser)``
and ``run(args) -> int``. A ``PlacerError`` (bad input, missing shape, infeasible plan)
prints one line on stderr (at most ``errors.MAX_MESSAGE_CHARS`` characters, cut in the
middle) and exits with code 2, as does running out of memory; ``--debug`` shows the traceback.
SIGINT, SIGTERM and SIGHUP unwind the command like Ctrl-C (temporary files removed, no
output half-replaced; ``placer.fileio.command_scope``) and exit with 128 + the signal.
"""
from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from contextlib import contextmanager

from placer.errors import PlacerError, one_line
from placer.fileio import command_scope

# Subcommands in the order `placer --help` lists them.
COMMANDS = ["inspect", "convert", "train-net", "run", "profile", "plan", "shard", "report", "demo"]


def _command_modules() -> dict:
    # a command's module name is the command with "-" as "_" (train-net -> train_net.py)
    return {name: importlib.import_module(f"placer.commands.{name.replace('-', '_')}") for name in COMMANDS}


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors on one line (the usage it would print first is what
    ``--help`` shows): ``placer shard: error: argument --host-mem: ...``, exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(ValueError(message))} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="placer",
        description="Decide which operators of a Caffe2/Caffe net run on the CPU and which on "
                    "the GPU, with the PCIe copies between them paid for.")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in _command_modules().items():
        p = sub.add_parser(name, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the full traceback of an error")
        module.add_arguments(p)
        p.set_defaults(_run=module.run, _stage=getattr(module, "STAGE_OUTPUTS", True))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        with _signals_interrupt(), command_scope(stage=args._stage):
            try:
                return int(args._run(args) or 0)
            except BrokenPipeError:  # stdout closed early (| head): the files written still count
                return 0
    except PlacerError as e:
        if args.debug:
            raise
        print(f"placer: error: {one_line(e)}", file=sys.stderr)
        return 2
    except MemoryError:
        if args.debug:
            raise
        print("placer: error: out of memory: this step needed more than placer's memory check "
              "could price (try smaller shapes with --input; --debug shows where)", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print("placer: interrupted", file=sys.stderr)
        return 128 + getattr(e, "signum", signal.SIGINT)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the command is, to unwind as Ctrl-C does."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _terminate(signum, frame):
    raise Terminated(signum)


@contextmanager
def _signals_interrupt():
    """SIGTERM and SIGHUP raise ``Terminated`` while a command runs (main thread only; a
    signal already ignored, as under ``nohup``, stays ignored)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kinds = [s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None))
             if s and signal.getsignal(s) == signal.SIG_DFL]
    before = {s: signal.signal(s, _terminate) for s in kinds}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    sys.exit(main())
