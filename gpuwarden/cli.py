# PYTHON_ARGCOMPLETE_OK (argcomplete's marker: this entry point completes itself; gpuwarden completion SHELL)
"""The ``gpuwarden`` command: parses the command line and runs one subcommand (gpuwarden.commands)."""

from __future__ import annotations

import argparse
import difflib
import os
import signal
import sys
from typing import ClassVar, NoReturn

from gpuwarden import __version__
from gpuwarden.commands import COMMANDS, HUP_PENDING, load
from gpuwarden.terminal import visible


def _version() -> str:
    """``gpuwarden --version``: the version and the build's runtime (Python, nvidia-ml-py, prometheus-client, and the
    NVIDIA driver where one answers)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    from gpuwarden.nvml.driver import driver_version

    driver = driver_version() or "none found"
    return (
        f"gpuwarden {__version__}\n  python: {platform.python_version()}\n  nvidia-ml-py: {installed('nvidia-ml-py')}"
        f"\n  prometheus-client: {installed('prometheus-client')}\n  NVIDIA driver: {driver}"
    )


class _VersionAction(argparse.Action):
    """``--version``: print ``_version()`` (computed only when asked: it may load NVML) and exit 0."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=str(kwargs.get("help", "")))

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: object, values: object, option: object = None
    ) -> None:
        print(_version())
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse's parser, saying a usage error in a few lines instead of the whole usage: the error, the option or
    command nearest each unknown one ("did you mean"), and where every option is (``--help``). Exits 2, as argparse
    does (argparse documents ``error`` as the method to override for this)."""

    #: The command line being parsed (``main`` sets it): where the unknown words are looked for.
    argv: ClassVar[list[str]] = []

    def error(self, message: str) -> NoReturn:  # argparse: must not return
        known = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        hints = []
        for token in self.argv:
            name = token.split("=", 1)[0]
            if name.startswith("--") and name not in known:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
                hints += [f"{visible(name)}: did you mean {close[0]}?"] if close else []
        command = _chosen(self.argv)
        if command is not None and command not in COMMANDS and self.prog == "gpuwarden":
            close = difflib.get_close_matches(command, list(COMMANDS), n=1, cutoff=0.6)
            hints += [f"{visible(command)}: did you mean {close[0]}?"] if close else []
        lines = [f"{self.prog}: error: {message}", *(f"  {h}" for h in hints)]
        lines.append(f"  ({self.prog} --help for every option)")
        self.exit(2, "\n".join(lines) + "\n")


def _chosen(argv: list[str]) -> str | None:
    """The subcommand named on ``argv`` (its first word that is not an option; the top level takes no values)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _complete() -> None:
    """Answer a shell's completion request (argcomplete: the line in ``COMP_LINE`` up to ``COMP_POINT``) from the
    parser of the subcommand the line names, or of the top level; argcomplete exits when it has answered."""
    import shlex

    import argcomplete

    line = os.environ.get("COMP_LINE", "")[: int(os.environ.get("COMP_POINT", "0") or 0)]
    try:
        words = shlex.split(line)[1:]
    except ValueError:  # an open quote: the words before it
        words = line.split()[1:]
    done = words if line.endswith(" ") else words[:-1]  # the word being typed names no command yet
    chosen = _chosen(done)
    argcomplete.autocomplete(build_parser(chosen if chosen in COMMANDS else None))


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """Return the parser of the ``gpuwarden`` command: the full parser of subcommand ``chosen`` (of every one when
    None), the others by name and help only, without importing their modules."""
    p = _Parser(prog="gpuwarden", description="NVIDIA GPU monitoring daemon and Prometheus exporter")
    p.add_argument("--version", action=_VersionAction, help="print the version and the runtime, then exit")
    sub = p.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        if chosen is None or name == chosen:
            module = load(name)
            module.add_parser(sub).set_defaults(run=module.run)
        else:
            sub.add_parser(name, help=command.help)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpuwarden`` console script; returns the exit status.

    First of all, a SIGHUP (``systemctl reload``) while ``serve`` starts is noted (``HUP_PENDING``) and applied once
    it serves, instead of ending the process (SIGHUP's default); every other command gets the default back.
    """
    signal.signal(signal.SIGHUP, lambda sig, frame: HUP_PENDING.set())
    argv = sys.argv[1:] if argv is None else argv
    _Parser.argv = list(argv)
    chosen = _chosen(argv)
    if chosen != "serve":
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    from gpuwarden.logs import setup

    setup("warning")  # serve sets its configured level and format once it has read them
    try:
        if "_ARGCOMPLETE" in os.environ:  # a shell asks for completions (gpuwarden completion SHELL): answered, exits
            _complete()
        parser = build_parser(chosen if chosen in COMMANDS else None)
        try:
            args, extra = parser.parse_known_args(argv)  # --version prints here
            if extra:  # said by the subcommand's parser: its usage, not the top level's
                sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
                sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
        except SystemExit as exc:
            if chosen == "check" and exc.code == 2:  # argparse's usage error: not the CRITICAL a prolog drains for
                from gpuwarden.commands.check import EXIT_USAGE

                return EXIT_USAGE
            raise
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (check-config FILE | head -1): nothing more to say to it
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
