"""Replay: the Source interface fed by a recorded trace, for demos, tests and diagnosis offline."""

from gpuwarden.replay.source import ReplaySource, demo_trace_path

__all__ = ["ReplaySource", "demo_trace_path"]
