"""The HTTP face of the daemon: the app and its routes (``app``), the exporter-toolkit web config (``config``), basic
auth (``auth``), the bounds on connections and request heads (``limits``), and gpuwarden's own HTTP server: the
accept loop (``accept``), each connection's TLS, HTTP/1.1 and ASGI calls (``connection``) and the server that runs
them (``listener``); ``gate`` puts the app behind its rate limit and auth or not; the JSON documents the routes
serve, next to them: ``diagnosis`` (``/api/v1/diagnosis``, ``gpuwarden diagnose --json``) and ``idleness``
(``/api/v1/idleness``)."""
