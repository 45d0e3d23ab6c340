"""The ``gpuwarden`` subcommands: one module each (``add_parser`` and ``run``), registered in ``COMMANDS`` and imported
only when chosen, so that no command pays for another's imports (pip's ``commands_dict`` / ``create_command``)."""

from __future__ import annotations

import argparse
import importlib
import sys
import threading
from dataclasses import dataclass
from types import ModuleType

#: What ``ArgumentParser.add_subparsers`` returns: each command's ``add_parser`` registers itself on it.
Subparsers = argparse._SubParsersAction  # noqa: SLF001 - argparse's own (typeshed-typed) name for it


EXIT_USAGE = 2
EXIT_RUNTIME = 1

#: Set by the SIGHUP handler that ``gpuwarden.cli.main`` installs before anything else: a reload asked for while
#: ``serve`` starts is applied once it serves, instead of ending the process (SIGHUP's default action).
HUP_PENDING = threading.Event()


@dataclass(frozen=True)
class Command:
    """One subcommand: the module that holds its ``add_parser(subparsers) -> ArgumentParser`` and
    ``run(args) -> int``, and its one-line help (shown by ``gpuwarden --help`` without importing the module)."""

    module: str
    help: str


COMMANDS: dict[str, Command] = {
    "serve": Command("gpuwarden.commands.serve", "run the daemon: poll the GPUs and serve /metrics"),
    "check-config": Command("gpuwarden.commands.check_config", "validate a configuration file"),
    "check": Command(
        "gpuwarden.commands.check", "is each GPU ready for the next job: PASS/WARN/CRITICAL (for a prolog)"
    ),
    "diagnose": Command("gpuwarden.commands.diagnose", "why each GPU is (not) working: verdict, evidence and remedies"),
    "top": Command(
        "gpuwarden.commands.top", "the cluster's jobs and GPUs ranked by GPU-hours lost, by cause (from Prometheus)"
    ),
    "report": Command(
        "gpuwarden.commands.report",
        "one job's efficiency summary (from Prometheus): GPU-hours held, effective, lost by cause, energy",
    ),
    "reclaim": Command(
        "gpuwarden.commands.reclaim",
        "notify, warn and reclaim jobs that hold GPUs idle, gated on the why (from Prometheus; dry run by default)",
    ),
    "drain": Command(
        "gpuwarden.commands.drain",
        "take the nodes of GPUs that need service out of Slurm or Kubernetes, put them back once clean (from "
        "Prometheus; dry run by default)",
    ),
    "mixin": Command(
        "gpuwarden.commands.mixin",
        "write the Prometheus rules, Alertmanager routes and Grafana dashboards with your runbook and Grafana URLs",
    ),
    "collectors": Command("gpuwarden.commands.collectors", "list collectors and their default state"),
    "record": Command("gpuwarden.commands.record", "record a trace of raw NVML readings (JSON Lines)"),
    "completion": Command("gpuwarden.commands.completion", "print the shell code that completes gpuwarden's options"),
}


def load(name: str) -> ModuleType:
    """Import and return the module of command ``name``. Raises KeyError for a name not in ``COMMANDS``."""
    return importlib.import_module(COMMANDS[name].module)


def die(msg: str, code: int = EXIT_RUNTIME) -> int:
    """Print ``gpuwarden: msg`` on stderr (one line) and return ``code`` for the command to exit with."""
    print(f"gpuwarden: {msg}", file=sys.stderr)
    return code
