"""The ``placer`` command line: one subcommand per module in ``placer/commands``.

Each command module defines ``HELP`` (one line), ``DESCRIPTION``, ``add_arguments(parser)``
and ``run(args) -> int``. A ``PlacerError`` (bad input, missing shape, infeasible plan)
prints one line on stderr (at most ``errors.MAX_MESSAGE_CHARS`` characters, cut in the
middle) and exits with code 2, as does running out of memory; ``--debug`` shows the traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from placer.errors import PlacerError, one_line

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
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
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
    except KeyboardInterrupt:
        print("placer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
