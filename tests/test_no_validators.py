"""A serving daemon builds no pydantic validator beyond its configuration's: the models defer their schemas
(``defer_build``) and the NVML layer, the kubelet client and the insight analysis make them without validation
(``model_construct``), so that the readings' validators are built only when a JSON route, a page, a reply of the API
reference or a trace's input asks for it. Run in a child interpreter: the models of this one
are built by other tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import trace

_SCRIPT = """
import json, sys, time
sys.path.insert(0, {tests!r})
import pytest
from pydantic import BaseModel
from fake_nvml import FakeNvml

def built():
    def subs(c):
        for s in c.__subclasses__():
            yield s
            yield from subs(s)
    return {{c.__qualname__ for c in subs(BaseModel) if c.__dict__.get("__pydantic_complete__")
            and c.__module__.startswith("gpuwarden")}}

mp = pytest.MonkeyPatch()
from pathlib import Path
fake = FakeNvml(Path({trace!r})).install(mp)
from gpuwarden.config import load_config
cfg = load_config(None, {{}})  # the configuration is an edge: validated, by pydantic-settings
before = built()  # what reading the recording itself and the configuration validated
from gpuwarden.daemon import build_analyzers
from gpuwarden.nvml import NvmlSource
from gpuwarden.poller import Poller
from gpuwarden.sdnotify import Notifier
from gpuwarden.collectors import CollectOptions
from gpuwarden.catalog import select_collectors
from gpuwarden.exposition import Exposition
from gpuwarden.web.app import readiness
source = NvmlSource(xid_events=True, processes=True)
poller = Poller(source, 0.05, analyzers=build_analyzers(cfg), notifier=Notifier({{}}))
poller.start(thread=False)
expo = Exposition(poller, select_collectors(), CollectOptions())
fake.inject_xid(0, 79)
for n in range(3000):  # six polls at least, and until the XID watcher's thread delivered the event (a code's
    poller.poll_once()  # series appear only once it occurred)
    text = expo.render(poller.snapshot).decode()
    dict(readiness(poller.snapshot, 60.0))
    if n >= 5 and "gpu_xid_errors_total" in text:
        break
    time.sleep(0.02)
print(json.dumps({{"new": sorted(built() - before), "before": sorted(before), "xid": "gpu_xid_errors_total" in text,
                  "fabric": any(g.fabric is not None for g in poller.snapshot.poll.gpus)}}))
"""


def test_polls_renders_and_readiness_build_no_validator() -> None:
    """The configuration as ``gpuwarden serve`` loads it (validated: an edge), then six polls of a 2-GPU NVLink
    recording through the fake NVML (static facts, NVLink fabric, an XID event, processes), each rendered, and
    /readyz's answer: no model of the daemon's has had its validator built beyond what reading the recording for the
    fake and the configuration validated."""
    script = _SCRIPT.format(tests=str(Path(__file__).parent), trace=str(trace("h200x2-nvlink")))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, out.stderr[-3000:]
    seen = json.loads(lines[-1])
    assert seen["xid"] and seen["fabric"], seen  # the paths were taken
    assert seen["new"] == [], seen
