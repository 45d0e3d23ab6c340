"""``gpuwarden completion SHELL``: the shell code that completes gpuwarden's commands, options and their values
(argcomplete's, for bash, zsh, fish, tcsh or PowerShell), to source from the shell's start-up file."""

from __future__ import annotations

import argparse

from gpuwarden.commands import COMMANDS, Subparsers

SHELLS = ("bash", "zsh", "fish", "tcsh", "powershell")


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``completion`` on ``subparsers`` and return its parser."""
    p = subparsers.add_parser(
        "completion",
        help=COMMANDS["completion"].help,
        description="Print the shell code that completes gpuwarden's commands and options (argcomplete's). Bash: "
        "add 'eval \"$(gpuwarden completion bash)\"' to ~/.bashrc; zsh: the same with zsh in ~/.zshrc; fish: "
        "'gpuwarden completion fish | source' in ~/.config/fish/config.fish.",
    )
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    return p


def run(args: argparse.Namespace) -> int:
    """Print the completion code for ``args.shell``; 0."""
    import argcomplete

    print(argcomplete.shellcode(["gpuwarden"], shell=args.shell), end="")
    return 0
