"""gpuwarden: a per-node NVIDIA GPU monitoring daemon with a Prometheus exporter."""

__version__ = "0.2.0"
