"""Shell completion (argcomplete): ``gpuwarden completion bash`` sourced into a real bash completes commands,
options and their choices from the parser of the command on the line; the protocol's answer for the other shells."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = pytest.mark.e2e  # each case starts gpuwarden


def _bash(line: str) -> list[str]:
    """What bash's completion offers for ``line`` (the cursor at its end), after sourcing the completion code."""
    words = line.split() + ([""] if line.endswith(" ") else [])
    script = "; ".join([
        f'eval "$({sys.executable} -m gpuwarden completion bash)"',
        f"COMP_LINE={line!r}", "COMP_POINT=${#COMP_LINE}",
        f"COMP_WORDS=({' '.join(repr(w) for w in words)})", f"COMP_CWORD={len(words) - 1}",
        f"_python_argcomplete gpuwarden {words[-1]!r} {words[-2]!r}", "printf '%s\\n' \"${COMPREPLY[@]}\"",
    ])  # fmt: skip
    bindir = Path(sys.executable).parent  # the completion code runs the `gpuwarden` on PATH
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=REPO, env=env, timeout=60,
                         check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return [w.strip() for w in res.stdout.splitlines() if w.strip()]


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("gpuwarden") is None, reason="needs bash and the "
                    "installed gpuwarden command")  # fmt: skip
def test_bash_completes_commands_options_and_choices() -> None:
    assert _bash("gpuwarden rec") == ["reclaim", "record"]
    assert "--prometheus" in _bash("gpuwarden top --prom") and "--timeout" not in _bash("gpuwarden top --prom")
    assert _bash("gpuwarden serve --log.level ") == ["debug", "info", "warning", "error"]
    assert _bash("gpuwarden serve --demo f") == ["faults"]


def test_every_shell_gets_its_code_and_an_unknown_one_is_refused() -> None:
    for shell in ("bash", "zsh", "fish", "tcsh", "powershell"):
        res = subprocess.run([sys.executable, "-m", "gpuwarden", "completion", shell], capture_output=True, text=True,
                             cwd=REPO, check=False)  # fmt: skip
        assert res.returncode == 0 and "gpuwarden" in res.stdout and "complete" in res.stdout.lower(), shell
    res = subprocess.run([sys.executable, "-m", "gpuwarden", "completion", "csh"], capture_output=True, text=True,
                         cwd=REPO, check=False)  # fmt: skip
    assert res.returncode == 2 and "invalid choice: 'csh'" in res.stderr
