"""The HTTP face of the daemon: the app and its routes (``app``), the exporter-toolkit web config (``config``), basic
auth (``auth``), the bounds on connections and request heads (``limits``), and the listener, the one module that
knows uvicorn's internals (``listener``); ``gate`` puts the app behind auth or not."""
