"""`kubeon-gpu`: one entry point, one module per subcommand, imported only when used.

Each subcommand module exposes `add_arguments(parser)` and `run(args) -> int`.
Importing lazily keeps `kubeon-gpu dry-run` free of Flask and the Kubernetes
client, and keeps one subcommand's missing dependency from breaking the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

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


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubeon-gpu", description="GPU optimizer for Kubernetes.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in SUBCOMMANDS:
        parser = _top_parser()
        if args and args[0] not in ("-h", "--help"):
            parser.error(f"unknown command {args[0]!r}; choose from {', '.join(SUBCOMMANDS)}")
        parser.print_help()
        return 0 if args else 2
    name, rest = args[0], args[1:]
    module = importlib.import_module(SUBCOMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"kubeon-gpu {name}", description=SUBCOMMANDS[name][1])
    module.add_arguments(parser)
    parsed = parser.parse_args(rest)
    return int(module.run(parsed) or 0)


if __name__ == "__main__":
    sys.exit(main())
