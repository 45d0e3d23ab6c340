"""Every declared reading travels end to end - fake NVML in NVML's units, the real NVML layer, the snapshot, the
declared family - with nothing written for it but its declaration (and its model field)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import render, trace
from fake_nvml import FakeNvml
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.catalog import COLLECTORS, FAMILIES, READINGS, Reading, select_collectors
from gpuwarden.nvml import NvmlSource
from gpuwarden.poller import Poller


def _raw(r: Reading) -> int:
    """A number NVML could answer for ``r``, different for every reading."""
    return 3 + READINGS.index(r)


def _base(r: Reading) -> float:
    return float(_raw(r)) if r.integer else _raw(r) * r.scale


@pytest.mark.parametrize("reading", READINGS, ids=lambda r: f"{r.field}:{r.key or r.call}")
def test_declared_reading_reaches_its_family(monkeypatch: pytest.MonkeyPatch, reading: Reading) -> None:
    fake = FakeNvml(trace("h100-compute_bound"))
    for dev in fake.devices:
        if reading.only_if is not None:
            dev.static = dev.static.model_copy(update={reading.only_if: True})
        value: object = _base(reading)
        records = []
        for rec in dev.records:
            if reading.key is not None:
                value = {**getattr(rec, reading.field), reading.key: _base(reading)}
            records.append(rec.model_copy(update={reading.field: value}))
        dev.records = records
    fake.install(monkeypatch)
    poller = Poller(NvmlSource(slow_interval=1.0, xid_events=False, processes=False), 1.0)
    snap = poller.start(thread=False)
    poller.stop()
    got = getattr(snap.poll.gpus[0], reading.field)  # type: ignore[union-attr]
    got = got.get(reading.key) if reading.key is not None else got
    assert got == pytest.approx(_base(reading)), "the NVML layer did not read it back in base units"
    text = render(snap, enable=tuple(COLLECTORS))
    exported = {fam.name for fam in text_string_to_metric_families(text)}
    by_hand = [f for f in FAMILIES if f.shows == reading.field]
    for f in by_hand:  # a hand-written family made from this reading: it is there (its values are its own code's)
        assert f.base_name in exported, f.name
    shown = [f for f in FAMILIES if f.reading == reading.field and f.key in (None, reading.key)]
    assert shown or by_hand, f"no family declared for {reading.field}"
    values = {
        (s.name, s.labels.get(f.labels[0]) if f.labels and f.key is None else None): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        for f in shown
        if s.name == f.name
    }
    for f in shown:
        key = reading.key if f.labels and f.key is None else None
        assert values.get((f.name, key)) == pytest.approx(_base(reading)), f.name


def test_every_collector_of_the_catalogue_is_selectable() -> None:
    assert select_collectors(enable=tuple(COLLECTORS)) == sorted(COLLECTORS)
    with pytest.raises(ValueError, match="unknown collector 'nope'"):
        select_collectors(enable=("nope",))
    with pytest.raises(ValueError, match="cannot be disabled"):
        select_collectors(disable=("exporter",))


def test_disable_defaults_keeps_only_the_self_metrics_and_what_is_enabled() -> None:
    assert select_collectors(disable_defaults=True) == ["exporter"]
    assert select_collectors(enable=("gpm",), disable_defaults=True) == ["exporter", "gpm"]


@pytest.mark.e2e
def test_collector_flags_both_forms_are_shown_and_work() -> None:
    import subprocess
    import sys

    help_text = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "serve", "--help"], capture_output=True, text=True, timeout=30
    ).stdout
    assert "--collector.gpm, --no-collector.gpm" in help_text and "--collector.disable-defaults" in help_text
    from gpuwarden.cli import build_parser
    from gpuwarden.commands.serve import overrides

    args = build_parser().parse_args(["serve", "--no-collector.gpm", "--collector.disable-defaults", "--collector.xid"])
    assert overrides(args)["collectors"] == {"enable": ["xid"], "disable": ["gpm"], "disable_defaults": True}


def test_every_counter_field_of_the_readings_is_declared_cumulative() -> None:
    from pydantic import BaseModel

    from gpuwarden.catalog import CUMULATIVE
    from gpuwarden.model import GpuReading, HostReading, ProcessReading

    declared = {(c.record, c.field) for c in CUMULATIVE}
    models: dict[str, type[BaseModel]] = {"gpu": GpuReading, "process": ProcessReading, "host": HostReading}
    for record, reading in models.items():
        for name in reading.model_fields:
            if name.endswith("_total") and name != "memory_total_bytes":
                assert (record, name) in declared, f"{reading.__name__}.{name} is a counter: declare it in CUMULATIVE"
    for c in CUMULATIVE:
        assert c.field in models[c.record].model_fields, c


def test_clock_event_groups_are_what_the_alerts_and_dashboards_match() -> None:
    import re

    from gpuwarden.catalog import (
        CLOCK_EVENT_GROUPS,
        CLOCK_EVENT_REASONS,
        CONDITION_REASONS,
        THROTTLE_REASONS,
        clock_event_reasons,
    )

    assert {n for names in CLOCK_EVENT_GROUPS.values() for n in names} <= set(CLOCK_EVENT_REASONS.values())
    template = (Path(__file__).parent.parent / "alerts" / "gpuwarden.rules.yml").read_text()  # generated
    for alert, group in (("GpuThermalSlowdown", "thermal"), ("GpuHardwareSlowdown", "hardware")):
        block = template[template.index(f"alert: {alert}\n") :]
        regex = re.search(r'reason=~"([^"]+)"', block)
        assert regex and regex.group(1) == "|".join(clock_event_reasons(group)), alert
    # the GPU's own condition, not the workload's power cap: the outlier record and its alert's description
    block = template[template.index("record: uuid:gpu_clock_throttled:ratio\n") :]
    regex = re.search(r'reason=~"([^"]+)"', block)
    assert regex and regex.group(1) == "|".join(CONDITION_REASONS) and "sw_power_cap" not in CONDITION_REASONS
    dashboards = Path(__file__).parent.parent / "gpuwarden" / "mixin" / "dashboards"
    either = {"|".join(THROTTLE_REASONS), "|".join(CONDITION_REASONS)}
    for board in dashboards.glob("*.json"):
        for regex in re.findall(r'reason=~\\"([^"\\]+)\\"', board.read_text()):
            assert regex in either, (board.name, regex)


def test_every_family_is_in_a_golden_exposition_or_named_by_a_test() -> None:
    """A family no golden exposition holds (tests/data/golden) and no test names could change shape, or vanish,
    unnoticed: each is held by one or the other."""
    import re
    from pathlib import Path

    from gpuwarden.catalog import FAMILIES

    here = Path(__file__).parent
    golden = "".join(p.read_text() for p in (here / "data" / "golden").glob("*.prom"))
    named = "".join(p.read_text() for p in here.glob("test_*.py") if p.name != "test_catalog.py")
    exposed = set(re.findall(r"^# TYPE (\w+) ", golden, re.M))
    exposed |= {f"{name}_total" for name in exposed}  # a counter's TYPE line names it without _total
    loose = [f.name for f in FAMILIES if f.name not in exposed and f.name not in named]
    assert loose == [], f"families neither in a golden exposition (tools/generate.py) nor named by a test: {loose}"


def test_the_layers_under_the_analysis_import_none_of_it() -> None:
    """Data flows NVML -> readings -> snapshot -> analysis -> collectors -> exposition: the modules of the readings
    and the snapshot import nothing from gpuwarden.insight (the one upward arrow there was, snapshot -> insight, is
    gone), the analysis nothing above it, and only gpuwarden.nvml imports pynvml."""
    import ast
    from pathlib import Path

    pkg = Path(__file__).parent.parent / "gpuwarden"
    lower = [pkg / n for n in ("model.py", "snapshot.py", "source.py", "trace.py", "catalog.py", "poller.py")]
    lower += [*sorted((pkg / "nvml").glob("*.py")), *sorted((pkg / "replay").glob("*.py"))]
    for path in lower:
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.startswith("gpuwarden.insight")], path.name
    # and the analysis imports only the layers under it (the documents the HTTP routes serve live with the routes,
    # gpuwarden.web: the one arrow up from the analysis there was, insight.idleness -> allocation, is gone)
    under = ("gpuwarden.insight", "gpuwarden.model", "gpuwarden.snapshot", "gpuwarden.catalog", "gpuwarden.trace")
    for path in sorted((pkg / "insight").glob("*.py")):
        tree = ast.parse(path.read_text())
        froms = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        froms += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        up = [m for m in froms if m.startswith("gpuwarden") and not m.startswith(under)]
        assert up == [], f"{path.name} imports {up}"
    for path in pkg.rglob("*.py"):
        tree = ast.parse(path.read_text())
        uses = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names if a.name == "pynvml"]
        uses += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "pynvml"]
        assert not uses or path.parent.name == "nvml", path


def test_the_http_server_imports_nothing_of_gpuwarden_but_logging_and_the_app_nothing_of_it() -> None:
    """gpuwarden.web.server is a room of its own: it imports only itself and gpuwarden.logs; the app's modules
    (gpuwarden.web and its documents) import nothing of it, so whoever adds a route cannot lean on flow control."""
    import ast
    from pathlib import Path

    web = Path(__file__).parent.parent / "gpuwarden" / "web"

    def imported(path: Path) -> list[str]:
        tree = ast.parse(path.read_text())
        names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        return names + [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]

    for path in sorted((web / "server").glob("*.py")):
        ours = [m for m in imported(path) if m.startswith("gpuwarden")]
        assert all(m.startswith(("gpuwarden.web.server", "gpuwarden.logs")) for m in ours), (path.name, ours)
    for path in sorted(web.glob("*.py")):
        assert not [m for m in imported(path) if m.startswith("gpuwarden.web.server")], path.name


def test_the_diagnosis_vocabulary_imports_nothing_of_its_engine() -> None:
    """gpuwarden.insight.vocabulary (states, thresholds, the result and verdict models) is what the engine and the
    readers above it share: it imports nothing of gpuwarden.insight outside itself, so reading it needs no engine."""
    import ast
    from pathlib import Path

    vocabulary = Path(__file__).parent.parent / "gpuwarden" / "insight" / "vocabulary"
    assert sorted(p.stem for p in vocabulary.glob("*.py")) == ["__init__", "result", "states", "thresholds", "verdicts"]
    for path in sorted(vocabulary.glob("*.py")):
        tree = ast.parse(path.read_text())
        names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        engine = [m for m in names if m.startswith("gpuwarden.insight") and not m.startswith("gpuwarden.insight.voc")]
        assert engine == [], (path.name, engine)
