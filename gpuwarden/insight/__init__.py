"""Insight: time accounting, scores, job attribution and diagnosis, derived from polls.

Pure functions over the plain models of ``gpuwarden.model`` (no I/O), plus one stateful analyzer
(``gpuwarden.insight.analyzer.InsightAnalyzer``) that the poller calls after every poll and whose
immutable result the ``insight`` collector, ``/api/v1/diagnosis`` and ``gpuwarden diagnose`` read.
Every state, score and threshold is defined in ``docs/scores.md``.
"""
