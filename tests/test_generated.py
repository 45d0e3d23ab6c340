"""Every generated file is what its generator makes from the repository as it is (tools/generate.py): one case per
artefact, naming the stale files and the command that writes them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_PATH = REPO / "tools" / "generate.py"
_spec = importlib.util.spec_from_file_location("generate_all", _PATH)
assert _spec is not None and _spec.loader is not None
generate = importlib.util.module_from_spec(_spec)
sys.modules["generate_all"] = generate
_spec.loader.exec_module(generate)

# the golden expositions are held one recording at a time by tests/test_golden_expositions.py (a changed exposition is
# a regression there unless intended); tools/generate.py writes them all the same
CHECKED = [a for a in generate.ARTEFACTS if a.name != "golden expositions"]


@pytest.mark.parametrize("artefact", CHECKED, ids=lambda a: a.name)
def test_the_committed_artefact_is_its_generators_output(artefact: object) -> None:
    stale = generate.stale(artefact)
    assert not stale, f"stale: {', '.join(stale)}: run python3 tools/generate.py --only {artefact.name!r}"  # type: ignore[attr-defined]


def test_a_changed_artefact_is_found_and_written_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--check names a file that differs from its generator's output and exits 1; without it the file is written
    and a second --check passes."""
    root = tmp_path / "repo"
    (root / "deploy").mkdir(parents=True)
    example = root / "deploy" / "gpuwarden.example.yml"
    example.write_text("stale\n")
    monkeypatch.setattr(generate, "ROOT", root)
    assert generate.main(["--check", "--only", "configuration example"]) == 1
    assert example.read_text() == "stale\n"
    assert generate.main(["--only", "configuration example"]) == 0
    assert example.read_text() == (REPO / "deploy" / "gpuwarden.example.yml").read_text()
    assert generate.main(["--check", "--only", "configuration example"]) == 0
