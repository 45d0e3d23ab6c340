"""The HTTP face of the daemon (Starlette; FastAPI only for the API reference): /metrics, /, /healthz, /readyz,
/api/v1/gpus, /api/v1/diagnosis, /api/v1/idleness, /docs, /openapi.json.

Every handler reads the latest NodeSnapshot published by the poller; none calls NVML, so a scrape is
answered at once even while a poll hangs.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from gpuwarden import __version__
from gpuwarden.exposition import Exposition, respond
from gpuwarden.model import GpuReading, GpuStatic
from gpuwarden.snapshot import NodeSnapshot, SnapshotHolder

if TYPE_CHECKING:
    from fastapi import FastAPI


class GpuDocument(BaseModel):
    """One GPU in /api/v1/gpus: its static facts and its latest reading (None before the first poll)."""

    static: GpuStatic
    reading: GpuReading | None = None


class GpusDocument(BaseModel):
    """The body of /api/v1/gpus: node facts, source, freshness and every GPU."""

    hostname: str
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: str | None = None
    source: str = Field(description="nvml or replay")
    last_poll_timestamp: float | None = Field(default=None, description="Unix seconds of the last successful poll")
    fresh: bool
    down_reason: str | None = Field(default=None, description="why the source cannot read, when it cannot")
    gpus: list[GpuDocument]


class Readiness(BaseModel):
    """The body of /readyz."""

    ready: bool
    reason: str
    last_poll_age_seconds: float | None = None


def gpus_document(snap: NodeSnapshot, stale_after: float, now: float | None = None) -> GpusDocument:
    """Return the /api/v1/gpus document of ``snap`` (``fresh``: last poll at most ``stale_after`` s old)."""
    now = time.time() if now is None else now
    readings = {g.index: g for g in snap.poll.gpus} if snap.poll is not None else {}
    node = snap.static
    return GpusDocument(
        hostname=node.hostname,
        driver_version=node.driver_version,
        nvml_version=node.nvml_version,
        cuda_driver_version=node.cuda_driver_version,
        source=snap.source,
        last_poll_timestamp=snap.last_success_timestamp,
        fresh=snap.fresh(now, stale_after),
        down_reason=snap.down_reason,
        gpus=[GpuDocument(static=s, reading=readings.get(s.index)) for s in node.gpus],
    )


def readiness(snap: NodeSnapshot | None, stale_after: float, now: float | None = None) -> Readiness:
    """Return whether the daemon is ready: a source that answered, and a last poll at most ``stale_after`` old; when
    not, ``reason`` says so and why the source is down (``NodeSnapshot.down_reason``: driver missing, NVML error,
    a hanging call)."""
    now = time.time() if now is None else now
    why = f": {snap.down_reason}" if snap is not None and snap.down_reason else ""
    if snap is None or snap.last_success_timestamp is None:
        return Readiness(ready=False, reason=f"no successful poll yet{why}")
    age = now - snap.last_success_timestamp
    if age > stale_after:
        return Readiness(
            ready=False,
            reason=f"last successful poll is {age:.1f} s old (limit {stale_after:g} s){why}",
            last_poll_age_seconds=age,
        )
    return Readiness(ready=True, reason="ok", last_poll_age_seconds=age)


_GZIP = {"content-encoding": "gzip", "vary": "Accept-Encoding"}


#: The node page's Content-Security-Policy: its script and style sheet come from the daemon, nothing else loads.
PAGE_CSP = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"

_PAGE_TYPES = {"node.js": "text/javascript; charset=utf-8", "node.css": "text/css; charset=utf-8"}


def node_page(telemetry_path: str = "/metrics") -> str:
    """Return the HTML of the node page served at ``/`` (gpuwarden/page/node.html, package data) with the version
    and the metrics path filled in; its script (``page/node.js``) reads /api/v1/gpus and /api/v1/diagnosis."""
    from importlib.resources import files
    from string import Template

    text = files("gpuwarden.page").joinpath("node.html").read_text(encoding="utf-8")
    return Template(text).substitute(
        version=html.escape(__version__), metrics=html.escape(telemetry_path.lstrip("/"), quote=True)
    )


#: Where the node page's view for a browser without JavaScript goes (inside its ``<noscript>``).
_FIRST_VIEW = "<!--first-view-->"


def first_view(document: Any) -> str:
    """HTML of the node page's view without JavaScript: each GPU's verdict, its summary and what to do first, from a
    DiagnosisDocument (``document``; None: the diagnosis is off or not made yet), for curl, a text browser, a screen
    reader with scripts off or a plain headless screenshot. Every value from the machine is escaped for HTML after
    its control and bidirectional characters are shown as escapes (gpuwarden.terminal.visible)."""
    from gpuwarden.terminal import visible

    def esc(value: object) -> str:
        return html.escape(visible("" if value is None else value))

    if document is None:
        return "<p>No diagnosis yet on this node: reload in a few seconds (or see /metrics).</p>"
    if not document.available:
        return f"<p>{esc(document.hostname)}: no diagnosis: {esc(document.reason)}</p>"
    rows = []
    for g in document.gpus:
        d = g.diagnosis
        verdict, summary, todo = (d.verdict, d.summary, d.remedies[0] if d.remedies else "") if d else ("-", "", "")
        rows.append(f"<tr><td>{g.gpu}</td><td>{esc(g.name)}</td><td>{esc(verdict)}</td><td>{esc(summary)}</td>"
                    f"<td>{esc(todo)}</td></tr>")  # fmt: skip
    head = "<tr><th>GPU</th><th>name</th><th>verdict</th><th>why</th><th>what to do first</th></tr>"
    return (f"<p>{esc(document.hostname)}: {len(rows)} GPU(s), the diagnosis of the last poll (the page redraws it "
            f"live with JavaScript on).</p><table>{head}{''.join(rows)}</table>")  # fmt: skip


def page_routes(telemetry_path: str, diagnosis: Callable[[], BaseModel | None] | None = None) -> list[Route]:
    """The node page at ``/`` and its assets under ``/page/`` (read once, from the package), each with PAGE_CSP. The
    page carries ``first_view`` of ``diagnosis()`` (the /api/v1/diagnosis route's answer; None: none) for a browser
    without JavaScript, made at each request in a worker thread."""
    from importlib.resources import files

    before, _, after = node_page(telemetry_path).partition(_FIRST_VIEW)
    assets = {name: files("gpuwarden.page").joinpath(name).read_bytes() for name in _PAGE_TYPES}
    csp = {"content-security-policy": PAGE_CSP, "x-content-type-options": "nosniff"}

    def view() -> str:
        return first_view(diagnosis() if diagnosis is not None else None)

    async def landing(request: Request) -> Response:
        return HTMLResponse(before + await run_in_threadpool(view) + after, headers=csp)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in assets:
            return Response("not found\n", status_code=404, media_type="text/plain")
        return Response(assets[name], headers={"content-type": _PAGE_TYPES[name], **csp})

    return [Route("/", landing, methods=["GET"]), Route("/page/{name}", asset, methods=["GET"])]


@dataclass(frozen=True)
class JsonRoute:
    """A JSON endpoint: ``path``, its ``summary`` and ``model`` for the API reference, and ``answer()``, the
    document to serve (a ``model``), or None before the first snapshot (503 ``{"detail": "no snapshot yet"}``)."""

    path: str
    summary: str
    model: type[BaseModel]
    answer: Callable[[], BaseModel | None]


def _json(document: BaseModel, status: int = 200) -> Response:
    """``document`` as FastAPI would answer it for its response model: its JSON (by field name, every field)."""
    return JSONResponse(document.model_dump(mode="json"), status_code=status)


def _endpoint(route: JsonRoute) -> Callable[[Request], Awaitable[Response]]:
    def answer() -> Response:
        document = route.answer()
        if document is None:
            return JSONResponse({"detail": "no snapshot yet"}, status_code=503)
        return _json(document)

    async def endpoint(request: Request) -> Response:
        # in a worker thread, as FastAPI ran these: a document built on demand (an insight result at 64 GPUs takes
        # milliseconds) never holds up a scrape on the event loop
        return await run_in_threadpool(answer)

    return endpoint


def create_app(
    holder: SnapshotHolder,
    exposition: Exposition,
    stale_after: float,
    extra: Sequence[JsonRoute] = (),
    telemetry_path: str = "/metrics",
) -> Starlette:
    """Return the app serving the latest snapshot of ``holder`` (the poller): the exposition at ``telemetry_path``,
    /healthz, /readyz, /api/v1/gpus and the ``extra`` JSON routes (e.g. /api/v1/diagnosis: ``diagnosis_route``), the
    node page at ``/``; and the API reference at /docs and /openapi.json.

    Plain Starlette routes: FastAPI (7.8 MiB of a daemon's memory, and its per-request dependency solving) is loaded
    only for the API reference, the first time /docs or /openapi.json is asked for (``ApiReference``), which
    describes the same routes with the same models.
    """

    async def metrics(request: Request) -> Response:
        # The poll thread renders ahead, so the text is usually ready: send it from the event loop. Otherwise render
        # in a worker thread, never blocking the loop.
        headers = request.headers
        body, fmt, gz = respond(exposition, headers.get("accept"), headers.get("accept-encoding"))
        if body is None:
            body = await run_in_threadpool(exposition.render, None, fmt)
        if gz and body:
            return Response(exposition.gzipped(body), headers={"content-type": fmt.content_type, **_GZIP})
        return Response(body, headers={"content-type": fmt.content_type})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        r = readiness(holder.snapshot, stale_after)
        # its fields are JSON types as they stand: no serializer (a probe every few seconds builds no pydantic schema)
        return JSONResponse(dict(r), 200 if r.ready else 503)

    def gpus() -> GpusDocument | None:
        snap = holder.snapshot
        return None if snap is None else gpus_document(snap, stale_after)

    json_routes = [JsonRoute("/api/v1/gpus", "Static facts and the latest reading of every GPU", GpusDocument, gpus),
                   *extra]  # fmt: skip
    reference = ApiReference(json_routes)
    routes: list[BaseRoute] = [
        Route(telemetry_path, metrics, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        *(Route(r.path, _endpoint(r), methods=["GET"]) for r in json_routes),
        *page_routes(telemetry_path, next((r.answer for r in extra if r.path == "/api/v1/diagnosis"), None)),
        Route("/openapi.json", reference, methods=["GET"]),
        Route("/docs", reference, methods=["GET"]),
        Route("/docs/assets/{file:path}", reference, methods=["GET"]),
    ]
    return Starlette(routes=routes)


class ApiReference:
    """The API reference (/openapi.json, and Swagger UI 5 at /docs with its files under /docs/assets), from a FastAPI
    app built the first time one of them is asked for: FastAPI and fastapi-swagger are imported then, not before.
    The FastAPI app declares the daemon's JSON routes with their models (its OpenAPI schema describes what the
    Starlette routes answer) and serves nothing else."""

    def __init__(self, routes: Sequence[JsonRoute]) -> None:
        self._routes = list(routes)
        self._app: Any = None
        self._lock = threading.Lock()

    def _build(self) -> FastAPI:
        from fastapi import FastAPI

        app = FastAPI(
            title="gpuwarden",
            version=__version__,
            description="NVIDIA GPU monitoring daemon: Prometheus metrics and JSON readings.",
            docs_url=None,  # FastAPI's pages load Swagger UI and ReDoc from CDNs: blank on an air-gapped node
            redoc_url=None,
        )
        add_docs(app)

        def healthz() -> dict[str, str]:
            return {"status": "ok"}

        app.get("/healthz", summary="Liveness: the process answers")(healthz)

        def readyz() -> Readiness:
            raise NotImplementedError  # described only: the Starlette route answers

        app.get(
            "/readyz",
            summary="Readiness: the source answered and the last poll is fresh",
            response_model=Readiness,
            responses={503: {"model": Readiness}},
        )(readyz)
        for route in self._routes:
            app.get(route.path, summary=route.summary, response_model=route.model,
                    responses={503: {"description": "no snapshot yet"}})(_described(route))  # fmt: skip
        return app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve /openapi.json, /docs or a file under /docs/assets from the FastAPI app (built on first use)."""
        if self._app is None:
            with self._lock:
                if self._app is None:
                    self._app = self._build()
        await self._app(scope, receive, send)


def _described(route: JsonRoute) -> Callable[[], Any]:
    def endpoint() -> Any:
        return route.answer()

    endpoint.__name__ = route.path.strip("/").replace("/", "_")
    return endpoint


def add_docs(app: FastAPI) -> None:
    """Serve the API reference at ``/docs`` with Swagger UI 5 (which reads the OpenAPI 3.1 document FastAPI
    publishes; Swagger UI 4 cannot) from the fastapi-swagger package's files, under ``/docs/assets``, so the page
    works with no network; nothing on it is fetched from elsewhere (no favicon, no validator badge)."""
    from importlib.resources import files

    from fastapi.openapi.docs import get_swagger_ui_html
    from starlette.staticfiles import StaticFiles

    assets = files("fastapi_swagger") / "resources"
    app.mount("/docs/assets", StaticFiles(directory=str(assets)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="openapi.json",
            title="gpuwarden API",
            swagger_js_url="docs/assets/swagger-ui-bundle.js",
            swagger_css_url="docs/assets/swagger-ui.css",
            swagger_favicon_url="data:,",
            swagger_ui_parameters={"validatorUrl": None},
        )


def diagnosis_route(holder: SnapshotHolder) -> JsonRoute:
    """The ``GET /api/v1/diagnosis`` route (a DiagnosisDocument), for ``create_app(extra=...)``."""
    from gpuwarden.web.diagnosis import DiagnosisDocument, diagnosis_document

    def answer() -> DiagnosisDocument | None:
        snap = holder.snapshot
        return None if snap is None else diagnosis_document(snap)

    return JsonRoute("/api/v1/diagnosis", "Verdict, evidence and remedies for every GPU", DiagnosisDocument, answer)


def idleness_route(holder: SnapshotHolder) -> JsonRoute:
    """The ``GET /api/v1/idleness`` route (an IdlenessDocument: each GPU and job active, idle with its cause and for
    how long, or unknown), for ``create_app(extra=...)``."""
    from gpuwarden.web.idleness import IdlenessDocument, idleness_document

    def answer() -> IdlenessDocument | None:
        snap = holder.snapshot
        return None if snap is None else idleness_document(snap)

    return JsonRoute(
        "/api/v1/idleness", "Each GPU and job: active, idle (cause, seconds) or unknown", IdlenessDocument, answer
    )
