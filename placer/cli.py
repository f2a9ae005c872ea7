"""The ``placer`` command line: one subcommand per module in ``placer/commands``.

``COMMANDS`` lists the subcommands with the one line ``placer --help`` shows for each; a
command's module (``placer/commands/<name>.py``, "-" as "_") is imported only when that
command is given, so ``placer --help`` loads none of them. Each command module defines
``DESCRIPTION`` (else its ``COMMANDS`` line is shown), ``add_arguments(parser)`` and
``run(args) -> int``. A ``PlacerError`` (bad input, missing shape, infeasible plan)
prints one line on stderr (at most ``errors.MAX_MESSAGE_CHARS`` characters, cut in the
middle) and exits with code 2; ``--debug`` shows the traceback. SIGINT, SIGTERM and SIGHUP
unwind the command like Ctrl-C (temporary files removed, no output half-replaced;
``placer.fileio.command_scope``) and exit with 128 + the signal. Standard output that
cannot be written (a full disk, ``> /dev/full``) and running out of memory (an allocation
the memory checks did not foresee) are one line and exit code 2 too; any other exception
is a bug in placer: one line naming its type and ``--debug``, exit code 1, never a
traceback unless asked for.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from contextlib import contextmanager

from placer.errors import ESCAPED, PlacerError, one_line
from placer.fileio import command_scope

# Subcommands in the order `placer --help` lists them, with the line it shows for each.
COMMANDS = {
    "inspect": "show a net's ops, shapes, FLOPs, bytes and parameters",
    "convert": "convert a Caffe .prototxt (+ .caffemodel) to Caffe2 predict_net and init_net",
    "train-net": "make a Caffe2 train net (gradients + optimizer) and its init net from a net",
    "run": "run a net on numpy (CPU) / cupy (GPU) and time every op",
    "profile": "time a net's ops, the host CPU or the PCIe link into a device profile",
    "plan": "find the best placement over the CPU and GPUs and write the placed net",
    "shard": "plan data parallelism and embedding-table sharding of a train net over the GPUs",
    "report": "write the HTML report (and Chrome trace) of a plan, optionally with a measured run",
    "demo": "profile this CPU, then plan, run and report the bundled example nets (no GPU needed)",
}
# An unexpected exception's message is cut to this many characters: the line stays readable.
INTERNAL_MESSAGE_CHARS = 200


class StdoutError(Exception):
    """Writing standard output failed (disk full, pipe closed): the output is lost, not the input."""

    def __init__(self, error: OSError):
        super().__init__(error.strerror or str(error))
        self.error = error


class _GuardedStdout:
    """Standard output whose write errors are told apart from the command's own OSErrors."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            raise StdoutError(e) from e

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            raise StdoutError(e) from e

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def command_module(name: str):
    """The module of command ``name``: the command with "-" as "_" (train-net -> train_net.py)."""
    return importlib.import_module(f"placer.commands.{name.replace('-', '_')}")


def chosen_command(argv: list[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (the top-level
    options take no value), where that is a command; argparse reads it the same way."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its errors on one line (the usage it would print first is what
    ``--help`` shows): ``placer shard: error: argument --host-mem: ...``, exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(ValueError(message))} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``placer``: every command listed with its line, and ``command``'s own
    arguments (its module imported); the other commands' parsers are left empty."""
    parser = OneLineParser(
        prog="placer",
        description="Decide which operators of a Caffe2/Caffe net run on the CPU and which on "
                    "the GPU, with the PCIe copies between them paid for.")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, line in COMMANDS.items():
        p = sub.add_parser(name, help=line, formatter_class=argparse.RawDescriptionHelpFormatter)
        if name == command:
            _add_command(p, command_module(name), line)
    return parser


def _add_command(p: argparse.ArgumentParser, module, line: str) -> None:
    p.description = getattr(module, "DESCRIPTION", line)
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the full traceback of an error")
    module.add_arguments(p)
    p.set_defaults(_run=module.run, _stage=getattr(module, "STAGE_OUTPUTS", True))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(chosen_command(argv))
    try:  # an option's converter raises a PlacerError naming the option (argparse passes it on)
        args = parser.parse_args(argv)
    except PlacerError as e:
        if "--debug" in argv:
            raise
        _error(f"error: {one_line(e)}")
        return 2
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    real_stdout, sys.stdout = sys.stdout, _GuardedStdout(sys.stdout)
    try:
        with _signals_interrupt(), command_scope(stage=args._stage):
            try:
                rc = int(args._run(args) or 0)
                sys.stdout.flush()  # a failed write shows here, not at the interpreter's exit
            except StdoutError as e:
                if not isinstance(e.error, BrokenPipeError):
                    raise
                _detach(real_stdout)   # `placer inspect net | head`: the reader has enough,
                return 0               # and the files written still count
        return rc
    except PlacerError as e:
        if args.debug:
            raise
        _error(f"error: {one_line(e)}")
        return 2
    except KeyboardInterrupt as e:
        _error("interrupted")
        return 128 + getattr(e, "signum", signal.SIGINT)
    except StdoutError as e:
        _detach(real_stdout)
        if args.debug:
            raise
        _error(f"error: cannot write the output to standard output: {e} (redirect it to a file or "
               "device with room)")
        return 2
    except MemoryError:
        if args.debug:
            raise
        _error("error: out of memory: this step needed more than placer's memory check could price "
               "(give smaller shapes with --input, or fewer devices; --debug shows where)")
        return 2
    except Exception as e:  # noqa: BLE001 - the last line of defence: a bug, told in one line
        if args.debug:
            raise
        message = one_line(e, INTERNAL_MESSAGE_CHARS) or "(no message)"
        _error(f"internal error: {type(e).__name__}: {message} (a bug in placer; run again with "
               "--debug for the traceback and report it)")
        return 1
    finally:
        sys.stdout = real_stdout


def _error(line: str) -> None:
    """One line on stderr; a stderr that cannot be written either is left alone."""
    try:
        print(f"placer: {line.translate(ESCAPED)}", file=sys.stderr)
        sys.stderr.flush()
    except OSError:
        pass


def _detach(stream) -> None:
    """Point the stdout file descriptor at the null device, so the interpreter's own flush at
    exit does not fail again on what is still buffered (a captured stream has no descriptor)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


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
