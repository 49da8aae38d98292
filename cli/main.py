"""`kubeon-gpu`: one entry point, one module per subcommand, imported only when used.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`.
Importing lazily keeps `kubeon-gpu dry-run` free of Flask and the Kubernetes
client, and keeps one subcommand's missing dependency from breaking the others.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

# name -> (module, one-line help). Order is the order `--help` lists them.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "dry-run": ("cli.dryrun", "show what the optimizer would do to a pod or workload, offline"),
    "webhook": ("webhook.command", "serve the mutating/validating admission webhook over TLS"),
    "extender": ("extender.command", "serve the kube-scheduler extender (filter, prioritize)"),
    "controller": ("controller.command", "run the side controller (status, right-sizing, scale to zero)"),
    "layout": ("cli.layout", "show the node layouts (time-slicing keys, MIG) the controller would plan, offline"),
    "simulate": ("cli.simulate", "replay an openb-format trace through a packing policy"),
    "certs": ("certs.command", "generate TLS material and patch caBundle into webhook configs"),
    "crd": ("cli.crd", "print the GpuPolicy CRD generated from the model"),
    "hub": ("hub.command", "the self-hostable hub: serve it, manage tokens, policies and approvals"),
}


def version() -> str:
    """The installed distribution's version; from pyproject.toml when run from a source tree."""
    try:
        return metadata.version("kubeon-gpu-optimizer")
    except metadata.PackageNotFoundError:
        import tomllib

        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"])
        except (OSError, KeyError, ValueError):
            return "unknown"


class Parser(argparse.ArgumentParser):
    """argparse, whose refusal of a flag is one line on stderr naming it (exit code 2): the usage block
    argparse prints first is `--help`'s to show. Subcommands' own subparsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _top_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kubeon-gpu", description="GPU optimizer for Kubernetes.",
                    epilog="`kubeon-gpu COMMAND --help` lists a command's options.")
    parser.add_argument("--version", action="version", version=f"kubeon-gpu {version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


class OutputError(OSError):
    """Standard output could not be written (a full disk, a file system gone read-only): `main` says so
    in one line, where a write deep in a command's output would have been a traceback."""


class _Stdout:
    """sys.stdout, whose write failures are OutputError (BrokenPipeError stays itself: `main` answers it)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(exc.errno, exc.strerror or str(exc)) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(exc.errno, exc.strerror or str(exc)) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    stdout = sys.stdout
    sys.stdout = _Stdout(stdout)
    try:
        code = _main(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # what is still buffered fails here, inside main, not at the interpreter's exit
        return code
    except KeyboardInterrupt:
        print("kubeon-gpu: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kubeon-gpu dry-run ... | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout.fileno())
        return 141
    except OutputError as exc:
        print(f"kubeon-gpu: cannot write the output: {exc.strerror}", file=sys.stderr)
        _discard_buffered(stdout)
        return 2
    finally:
        sys.stdout = stdout


def _discard_buffered(stdout: Any) -> None:
    """Point the descriptor at /dev/null, so the interpreter's own flush at exit has nowhere to fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's captured stream)
        pass


def parser_for(name: str) -> argparse.ArgumentParser:
    """The parser of one subcommand (imports its module)."""
    module = importlib.import_module(SUBCOMMANDS[name][0])
    parser = Parser(prog=f"kubeon-gpu {name}", description=SUBCOMMANDS[name][1])
    module.add_arguments(parser)
    return parser


def _main(args: list[str]) -> int:
    if not args or args[0].startswith("-") or args[0] not in SUBCOMMANDS:
        parser = _top_parser()
        if args and args[0].startswith("-"):
            parser.parse_args(args)  # --help, --version (exit inside) or an unknown option (exit 2)
        elif args:
            parser.error(f"unknown command {args[0]!r}; choose from {', '.join(SUBCOMMANDS)}")
        parser.print_help()
        return 0 if args else 2
    name, rest = args[0], args[1:]
    parsed = parser_for(name).parse_args(rest)
    return int(importlib.import_module(SUBCOMMANDS[name][0]).run(parsed) or 0)


if __name__ == "__main__":
    sys.exit(main())
