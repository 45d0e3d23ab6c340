"""A small client of the Prometheus HTTP API (``/api/v1/query``), which Thanos, Mimir, VictoriaMetrics and Cortex
speak too: ``top`` and ``report`` ask any of them.

Only instant queries are used; ranges are written into the PromQL (subqueries), so one request answers one
question and the answer is a plain vector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import httpx

from gpuwarden.urls import redacted


class PrometheusError(Exception):
    """A query could not be answered: the server is unreachable, refuses, or is not a Prometheus API. The message is
    one line meant for the user."""


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector: its labels and value (a float, never NaN: NaN samples are dropped)."""

    labels: dict[str, str]
    value: float


class Prometheus:
    """Instant queries against ``url`` (``http://HOST:9090``, or a Thanos/Mimir query front end with its path prefix,
    e.g. ``http://mimir/prometheus``; credentials as ``http://USER:PASSWORD@HOST``).

    ``headers`` are sent with every request (e.g. ``X-Scope-OrgID`` for Mimir/Cortex tenants).
    """

    def __init__(self, url: str, timeout: float = 30.0, headers: dict[str, str] | None = None) -> None:
        base = url if "://" in url else f"http://{url}"
        self.base = base.rstrip("/")
        try:
            self._client = httpx.Client(base_url=self.base, timeout=timeout, headers=headers or {})
        except (httpx.InvalidURL, ValueError):
            raise PrometheusError(f"not a usable URL: {redacted(url)}") from None

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def query(self, promql: str, time: float | None = None) -> list[Sample]:
        """Evaluate ``promql`` at ``time`` (Unix seconds; None: now) and return the vector's samples.

        Raises PrometheusError when the server cannot be reached, answers an HTTP error or a PromQL error, or answers
        something other than a vector (a scalar result is returned as one sample without labels).
        """
        params = {"query": promql}
        if time is not None:
            params["time"] = f"{time:.3f}"
        target = f"{redacted(self.base)}/api/v1/query"  # as printed: never the password
        try:
            resp = self._client.post("/api/v1/query", data=params)
        except httpx.HTTPError as exc:
            raise PrometheusError(f"cannot reach {target}: {exc or type(exc).__name__}") from None
        if resp.status_code in (401, 403):
            raise PrometheusError(f"{target} refused the request (HTTP {resp.status_code}): credentials in the URL?")
        try:
            body = resp.json()
        except ValueError:
            raise PrometheusError(f"{target} answered HTTP {resp.status_code}, not the Prometheus API") from None
        if not isinstance(body, dict) or "status" not in body:
            raise PrometheusError(f"{target} answered HTTP {resp.status_code}, not the Prometheus API")
        if body.get("status") != "success":
            error = body.get("error", f"HTTP {resp.status_code}") if isinstance(body, dict) else "not JSON"
            raise PrometheusError(f"{target}: {error}")
        data = body.get("data") or {}
        kind, result = data.get("resultType"), data.get("result")
        if kind == "scalar" and isinstance(result, list):
            return [Sample({}, float(result[1]))]
        if kind != "vector" or not isinstance(result, list):
            raise PrometheusError(f"{target} answered a {kind}, not a vector")
        out = []
        for r in result:
            value = float(r["value"][1])
            if not math.isnan(value):
                out.append(Sample(dict(r.get("metric", {})), value))
        return out
