"""Cluster-wide views over Prometheus: ``gpuwarden top`` and ``gpuwarden report``."""
