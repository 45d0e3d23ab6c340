"""The node page at ``/`` in a real browser: headless Chromium (Debian's package, installed by .ci/run) loads the
page from a daemon replaying recorded traces, with every host but 127.0.0.1 unresolvable, and the test reads the
DOM the page's script built. A screenshot of each page lands in .screenshots (or $GPUWARDEN_SCREENSHOTS; not in
build/, which would shadow the ``build`` package for ``python3 -m build`` in the checkout)."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from conftest import trace
from helpers import REPO, daemon, skip_where_nvml_works

from gpuwarden.web.app import PAGE_CSP

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
SHOTS = Path(os.environ.get("GPUWARDEN_SCREENSHOTS", REPO / ".screenshots"))

needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (.ci/run installs Debian's)")


def _chromium(url: str, *args: str) -> str:
    """Run headless Chromium on ``url`` with the network cut off but for 127.0.0.1; return its stdout."""
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--virtual-time-budget=6000",
        "--window-size=1400,1000", *args, url,
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    return out.stdout


class _Dom(HTMLParser):
    """The elements of a dumped DOM as (tag, attributes, text inside) - enough to find cards and their text."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], list[str]]] = []
        self._open: list[int] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}, []))
        if tag not in ("link", "meta", "br", "img", "input"):
            self._open.append(len(self.elements) - 1)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            i = self._open.pop()
            if self.elements[i][0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for i in self._open:
            self.elements[i][2].append(data)

    def find(self, **attrs: str) -> list[tuple[str, dict[str, str], str]]:
        """Elements whose attributes include ``attrs`` (``class_`` matches one class), with their text."""
        out = []
        for tag, a, text in self.elements:
            if all(
                (v in a.get("class", "").split()) if k == "class_" else a.get(k.replace("_", "-")) == v
                for k, v in attrs.items()
            ):
                out.append((tag, a, "".join(text)))
        return out


def _dom(url: str) -> _Dom:
    """The DOM the page's script built (the <noscript> view left out: with scripts on, its content is text)."""
    d = _Dom()
    d.feed(re.sub(r"<noscript>.*?</noscript>", "", _chromium(url, "--dump-dom"), flags=re.S))
    return d


def _verdicts(url: str) -> dict[str, str]:
    doc = httpx.get(url + "/api/v1/diagnosis", timeout=5).json()
    return {str(g["gpu"]): g["diagnosis"]["verdict"] for g in doc["gpus"] if g["diagnosis"]}


def _wait_verdicts(url: str, gpus: int) -> dict[str, str]:
    deadline = time.monotonic() + 30
    while len(v := _verdicts(url)) < gpus:
        assert time.monotonic() < deadline, f"only {len(v)} of {gpus} GPUs have a verdict"
        time.sleep(0.3)
    return v


def test_page_and_assets_are_self_contained() -> None:
    """Nothing on the page comes from elsewhere: the CSP allows only the daemon, and no asset names a URL."""
    from fastapi.testclient import TestClient

    from gpuwarden.poller import Poller
    from gpuwarden.replay import ReplaySource
    from gpuwarden.web.app import create_app

    class _NoExposition:
        pass

    p = Poller(ReplaySource(trace("h100-idle")), 1.0)
    app = create_app(p, _NoExposition(), 60.0, telemetry_path="/custom-metrics")  # type: ignore[arg-type]
    client = TestClient(app)
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-security-policy"] == PAGE_CSP
    assert 'href="custom-metrics"' in page.text and "$" not in page.text
    for name, ctype in (("node.js", "text/javascript"), ("node.css", "text/css")):
        r = client.get(f"/page/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(ctype)
        assert "http://" not in r.text and "https://" not in r.text and "innerHTML" not in r.text
    assert client.get("/page/../server.py").status_code == 404
    assert client.get("/page/nope.js").status_code == 404


@pytest.mark.e2e
@needs_chromium
def test_page_shows_every_gpu_verdict_readings_and_strip() -> None:
    with daemon("--replay", str(trace("derived-8gpu"))) as url:
        before = _wait_verdicts(url, 8)
        time.sleep(2)  # some history for the strip
        SHOTS.mkdir(parents=True, exist_ok=True)
        _chromium(url + "/", f"--screenshot={SHOTS / 'node-page-8gpu.png'}")
        dom = _dom(url + "/")
        after = _verdicts(url)
        jobs = [j["job"] for j in httpx.get(url + "/api/v1/diagnosis", timeout=5).json()["jobs"]]
    cards = dom.find(class_="gpu")
    assert [a["data-gpu"] for _, a, _ in cards] == [str(i) for i in range(8)]
    shown = {a["data-gpu"]: a["data-verdict"] for _, a, _ in cards}
    for gpu, verdict in shown.items():
        assert verdict in (before[gpu], after[gpu]), (gpu, verdict, before[gpu], after[gpu])
    for _, _, text in cards:
        assert "What to do:" in text and " °C" in text and " W of " in text and " GB of " in text
    meters = {a["data-meter"] for _, a, _ in dom.find() if "data-meter" in a}
    assert {"activity", "memory", "temperature", "power", "SM clock", "starved"} <= meters
    # one starved figure per GPU, over the verdict's own window, named on it (not a 5-minute ratio beside a verdict
    # on the last minute)
    starved = [t for _, _, t in dom.find(data_meter="starved")]
    assert len(starved) == 8 and all(re.fullmatch(r"starved\d+% · last \d+ s", t) for t in starved), starved
    assert all(re.fullmatch(r"SM activity\d+% · last \d+ s", t) for _, _, t in dom.find(data_meter="activity"))
    states = {a["data-state"] for _, a, _ in dom.find() if "data-state" in a}
    assert states & {"busy", "starved"}, states
    assert dom.find(id="banner")[0][1].get("hidden") is not None  # fresh data: no warning shown
    rows = [t for tag, _, t in dom.find() if tag == "tr"][1:]
    assert rows and all(jobs[0] in r for r in rows[:1]), rows
    assert (SHOTS / "node-page-8gpu.png").stat().st_size > 10_000


@pytest.mark.e2e
@needs_chromium
def test_bidirectional_and_control_characters_from_the_machine_are_shown_escaped(tmp_path: Path) -> None:
    """A host and a GPU whose names carry U+202E (right-to-left override: what follows shows reversed) and a bell: the
    page shows them as \\u escapes, in the header, the card and the window title, never the characters themselves
    (a trace derived from h100-idle, marked modified)."""
    import gzip
    import json

    lines = gzip.decompress(trace("h100-idle").read_bytes()).decode().splitlines()
    header = json.loads(lines[0])
    header["node"]["hostname"] = "node\u202egpj.exe\u0007"
    header["node"]["gpus"][0]["name"] = "NVIDIA \u2066H100\u202a"
    header.setdefault("metadata", {})["modified"] = "hostname and GPU name replaced with bidi and control characters"
    path = tmp_path / "bidi.jsonl.gz"
    path.write_bytes(gzip.compress("\n".join([json.dumps(header), *lines[1:]]).encode() + b"\n"))
    with daemon("--replay", str(path)) as url:
        _wait_verdicts(url, 1)
        dumped = _chromium(url + "/", "--dump-dom")
        plain_page = httpx.get(url + "/", timeout=5).text  # as curl sees it: the no-JavaScript view
    assert "NVIDIA \\u2066H100\\u202a" in plain_page.split("<noscript>", 1)[1]
    assert not any(c in plain_page for c in "\u202e\u2066\u202a\u0007"), "a control character reached the page"
    dom = _Dom()
    dom.feed(dumped)
    assert dom.find(id="hostname")[0][2] == "node\\u202egpj.exe\\u0007"
    (card,) = dom.find(class_="gpu")
    assert "NVIDIA \\u2066H100\\u202a" in card[2], card[2]
    assert "<title>gpuwarden · node\\u202egpj.exe\\u0007</title>" in dumped
    assert not any(c in dumped for c in "\u202e\u2066\u202a\u0007"), "a control character reached the page"


@pytest.mark.e2e
def test_without_javascript_the_page_gives_each_gpus_verdict_and_what_to_do() -> None:
    """curl, a text browser or a screenshot with scripts off sees each GPU's verdict, why and what to do first (the
    page's <noscript>, made on the server at each request), not "loading"."""
    with daemon("--replay", str(trace("derived-8gpu"))) as url:
        before = _wait_verdicts(url, 8)
        page = httpx.get(url + "/", timeout=5).text
        after = _verdicts(url)
        gpus = httpx.get(url + "/api/v1/diagnosis", timeout=5).json()["gpus"]
    remedies = {str(g["gpu"]): g["diagnosis"]["remedies"][0] for g in gpus if g["diagnosis"]}
    view = page.split("<noscript>", 1)[1].split("</noscript>", 1)[0]
    rows = re.findall(r"<tr><td>(\d+)</td><td>[^<]*</td><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td></tr>", view)
    assert [r[0] for r in rows] == [str(i) for i in range(8)], view
    for gpu, verdict, why, todo in rows:
        assert verdict in (before[gpu], after[gpu]) and why and todo, (gpu, verdict, why, todo)
    assert any(html.unescape(todo) == remedies[gpu] for gpu, _, _, todo in rows)


@pytest.mark.e2e
@needs_chromium
def test_the_jobs_table_says_what_its_columns_hold_and_the_slurm_job_number() -> None:
    """GPU indices and PIDs under headers that say so (not counts), and a job keyed by its SLUID with the number users
    type beside it."""
    with daemon("--replay", str(trace("derived-h200x2-slurm-4242-a"))) as url:
        _wait_verdicts(url, 2)
        jobs = httpx.get(url + "/api/v1/diagnosis", timeout=5).json()["jobs"]
        dom = _dom(url + "/")
    sluid = next(j for j in jobs if j["job"] == "sEKNKTV3WPV500")
    heads = [t for tag, _, t in dom.find() if tag == "th"]
    assert heads[:5] == ["job", "kind", "GPU indices", "PIDs", "imbalance"], heads
    rows = [t for tag, _, t in dom.find() if tag == "tr"][1:]
    [row] = [r for r in rows if "sEKNKTV3WPV500" in r]
    assert "sEKNKTV3WPV500 (Slurm job 4242)" in row, row
    assert ", ".join(map(str, sluid["pids"])) in row and ", ".join(map(str, sluid["gpus"])) in row, row


@pytest.mark.e2e
@needs_chromium
def test_page_of_the_demo() -> None:
    """The screenshot of the page with the demo running (the README's first command)."""
    with daemon("--demo") as url:
        _wait_verdicts(url, 1)
        time.sleep(2)
        SHOTS.mkdir(parents=True, exist_ok=True)
        _chromium(url + "/", f"--screenshot={SHOTS / 'node-page-demo.png'}")
        dom = _dom(url + "/")
        hostname = httpx.get(url + "/api/v1/gpus", timeout=5).json()["hostname"]
    assert dom.find(id="hostname")[0][2] == hostname
    (card,) = dom.find(class_="gpu")
    assert card[1]["data-verdict"] and "GPU 0 · NVIDIA H100" in card[2]
    assert (SHOTS / "node-page-demo.png").stat().st_size > 10_000


@pytest.mark.e2e
@needs_chromium
def test_page_without_a_driver_names_the_cause() -> None:
    """A daemon waiting for an NVIDIA driver that is not there: the banner says why there are no readings."""
    skip_where_nvml_works("the no-driver page")
    with daemon("--nvml.wait") as url:
        dom = _dom(url + "/")
    [(_, attrs, text)] = dom.find(id="banner")
    assert attrs.get("hidden") is None and "no readings: NVML unavailable" in text, text


@pytest.mark.e2e
@needs_chromium
def test_api_reference_renders_offline() -> None:
    """/docs in a browser with no network: Swagger UI reads the daemon's OpenAPI 3.1 document and lists its
    operations (Swagger UI 4 showed "Unable to render this definition" here)."""
    with daemon("--demo") as url:
        assert httpx.get(url + "/openapi.json", timeout=5).json()["openapi"].startswith("3.1")
        dom = _dom(url + "/docs")
        _chromium(url + "/docs", f"--screenshot={SHOTS / 'api-reference.png'}")
    text = " ".join(t for _, _, t in dom.find(class_="opblock-summary-path"))
    assert "/api/v1/gpus" in text and "/api/v1/diagnosis" in text, text
    assert not dom.find(class_="errors-wrapper"), [t for _, _, t in dom.find(class_="errors-wrapper")]
    assert "Unable to render" not in "".join(t for _, _, t in dom.find(id="swagger-ui"))


@pytest.mark.e2e
@needs_chromium
def test_page_is_readable_on_a_phone() -> None:
    """The 8-GPU page on a 390 px wide phone screen (Playwright driving the same Chromium): nothing wider than the
    screen, every card and meter inside it, so no text is cut off or needs a sideways scroll."""
    from playwright.sync_api import sync_playwright

    with daemon("--replay", str(trace("derived-8gpu"))) as url, sync_playwright() as pw:
        _wait_verdicts(url, 8)
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True)
            page.goto(url + "/")
            page.locator("article.gpu[data-gpu='7'] .meter[data-meter='starved']").wait_for()
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "node-page-phone.png"))
            width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
            outside = page.evaluate(
                """() => [...document.querySelectorAll('article.gpu, article.gpu *, header, table')]
                     .filter((e) => e.getBoundingClientRect().width
                                     && e.getBoundingClientRect().right > innerWidth + 0.5)
                     .map((e) => e.tagName + '.' + e.className + ' ' + (e.textContent || '').slice(0, 40))"""
            )
        finally:
            browser.close()
    assert width[0] <= width[1] == 390, width
    assert outside == [], outside


def test_a_free_gpus_badge_is_not_the_colour_of_busy() -> None:
    """A free GPU's verdict is ``ok``, whose colour is the legend's green for busy: the page gives free cards a colour
    of their own, unlike every state's in the legend."""
    css = (REPO / "gpuwarden" / "page" / "node.css").read_text()
    js = (REPO / "gpuwarden" / "page" / "node.js").read_text()
    [free] = re.findall(r'\.gpu\[data-verdict="free"\] \{ --sev: (#[0-9a-f]{6}); \}', css)
    legend = dict(re.findall(r'(\w+): "(#[0-9a-f]{6})"', js.split("\n\n")[0] + js[: js.index("};") + 2]))
    assert legend["busy"] == "#2e7d32" and free not in legend.values() and free != "#2e7d32", (free, legend)
