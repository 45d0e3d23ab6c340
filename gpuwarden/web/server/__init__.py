"""gpuwarden's HTTP server, a room of its own: it imports nothing of gpuwarden's but logging, and the app it serves
(any ASGI app) knows nothing of it.

- ``accept``: the accept loop, the per-source bounds on TLS handshakes;
- ``connection``: each connection's TLS, HTTP/1.1 (h11) and ASGI calls; it writes every answer's ``Date`` and cuts
  every body into parts of ``limits.ANSWER_PART_BYTES``, each written once the client has taken enough of the one
  before, whatever route answered;
- ``limits``: the bounds on connections, request heads and unsent answers, and what they did (``HttpLimits``);
- ``listener``: the server that runs them on one asyncio loop (signals, reload, shutdown grace).

Why gpuwarden serves HTTP itself, and what each bound holds against: docs/security.md and docs/reliability.md. The
server is frozen: a change comes with an incident or a new exposure, and the attack figures run again.
"""
