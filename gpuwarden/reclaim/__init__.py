"""Reclaim gated on the why: a ladder of actions (notify the owner, warn, reclaim) for jobs that hold GPUs and leave
them idle, driven by the daemons' own accounting and verdicts in Prometheus, never by utilization alone.

- gpuwarden.reclaim.policy: the policy file (steps, their actions, what may climb), validated;
- gpuwarden.reclaim.ladder: the ladder itself, one tick at a time (no I/O);
- gpuwarden.reclaim.actions: the actions, templated commands and webhooks, run bounded (never in a tick's way);
- gpuwarden.reclaim.controller: the loop over Prometheus (``gpuwarden reclaim``), its dry-run report over a range
  and its own metrics.
"""
