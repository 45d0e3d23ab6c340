"""Every generated file of the repository, made by one command.

    python3 tools/generate.py            # write every artefact that is stale, and say which
    python3 tools/generate.py --check    # write nothing: list the stale ones, exit 1 if any
    python3 tools/generate.py --only docs

Each artefact is made by the generator that owns it (the rules by gpuwarden.mixin.rules through alerts/generate.py,
the dashboards by dashboards/generate.py, ...); this file only lists them, in the order one feeds the next (the
Kubernetes manifests embed the rules and dashboards written before them). tests/test_generated.py holds every
committed artefact to its generator and names the stale one.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def script(relative: str) -> ModuleType:
    """Return the module of the script at ``relative`` (to the repository root), imported under its file name."""
    path = ROOT / relative
    name = path.stem if path.stem != "generate" else f"{path.parent.name}_generate"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Artefact:
    """One generated artefact: ``make()`` returns each file it owns (path relative to the root -> its whole text),
    computed from the files as they are on disk now."""

    name: str
    make: Callable[[], dict[str, str]]


def _rules() -> dict[str, str]:
    gen = script("alerts/generate.py")
    text = gen.render(None)
    return {"alerts/gpuwarden.rules.yml": text, "alerts/tests/bare.rules.yml": gen.bare(text),
            "alerts/tests/memory.rules.yml": gen.memory_only(text)}  # fmt: skip


def _memory_cases() -> dict[str, str]:
    return {"alerts/tests/memory.test.yml": script("tools/memory_shapes.py").promtool_text()}


def _dcgm_compat() -> dict[str, str]:
    return {"gpuwarden/mixin/dcgm-compat.rules.yml": script("alerts/dcgm_compat.py").render()}


def _dashboards() -> dict[str, str]:
    gen = script("dashboards/generate.py")
    return {f"gpuwarden/mixin/dashboards/gpuwarden-{name}.json": gen.render(build()) for name, build in gen.BOARDS}


def _kubernetes() -> dict[str, str]:
    gen = script("deploy/kubernetes/generate.py")
    return {"deploy/kubernetes/prometheusrule.yaml": gen.render(),
            "deploy/kubernetes/components/grafana-dashboards/dashboards.yaml": gen.render_dashboards()}  # fmt: skip


def _config_example() -> dict[str, str]:
    from gpuwarden.config.example import HEADER, example

    return {"deploy/gpuwarden.example.yml": HEADER + example()}


def _docs() -> dict[str, str]:
    from gpuwarden.docs import metrics_reference, with_rule_table, with_trace_fields

    return {
        "docs/metrics.md": metrics_reference(),
        "docs/trace-format.md": with_trace_fields((ROOT / "docs" / "trace-format.md").read_text()),
        "docs/scores.md": with_rule_table((ROOT / "docs" / "scores.md").read_text()),
    }


def _evaluation() -> dict[str, str]:
    from bench.insight_eval import with_evaluation_table

    return {"docs/scores.md": with_evaluation_table((ROOT / "docs" / "scores.md").read_text())}


def _goldens() -> dict[str, str]:
    sys.path.insert(0, str(ROOT / "tests"))
    golden = script("tests/test_golden_expositions.py")
    return {str(golden.golden_path(p).relative_to(ROOT)): golden.exposition(p) for p in golden.PATHS}


#: Every artefact, in the order one feeds the next.
ARTEFACTS: tuple[Artefact, ...] = (
    Artefact("rules", _rules),
    Artefact("memory promtool cases", _memory_cases),
    Artefact("dcgm-compat rules", _dcgm_compat),
    Artefact("dashboards", _dashboards),
    Artefact("kubernetes manifests", _kubernetes),
    Artefact("configuration example", _config_example),
    Artefact("docs", _docs),
    Artefact("evaluation table", _evaluation),
    Artefact("golden expositions", _goldens),
)


def stale(artefact: Artefact) -> dict[str, str]:
    """Return the files of ``artefact`` whose committed text is not what its generator makes now (path -> new
    text); a file missing counts as stale."""
    out = {}
    for rel, text in artefact.make().items():
        path = ROOT / rel
        if not path.exists() or path.read_text() != text:
            out[rel] = text
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: 0 when nothing is (or, without --check, is left) stale; 1 with --check when something is."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="write nothing; list the stale files, exit 1 if any")
    p.add_argument("--only", choices=[a.name for a in ARTEFACTS], action="append", help="these artefacts only")
    args = p.parse_args(argv)
    found = False
    for artefact in ARTEFACTS:
        if args.only and artefact.name not in args.only:
            continue
        for rel, text in stale(artefact).items():
            found = True
            print(f"{artefact.name}: {rel} {'is stale' if args.check else 'written'}")
            if not args.check:
                (ROOT / rel).write_text(text)
    return 1 if found and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
