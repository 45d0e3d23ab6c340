"""The HTTP face of the daemon: the app and its routes (``app``), the exporter-toolkit web config (``config``), basic
auth (``auth``), ``gate`` (the app behind its rate limit and auth or not), and the JSON documents the routes serve,
next to them: ``diagnosis`` (``/api/v1/diagnosis``, ``gpuwarden diagnose --json``) and ``idleness``
(``/api/v1/idleness``). The HTTP server that serves the app is a package of its own, ``server``, which knows nothing
of the app."""
