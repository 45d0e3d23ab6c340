"""The child interpreter that loads ``gpuwarden serve``'s configuration (gpuwarden.config.load_config_apart):
``python -m gpuwarden.config_child`` first asks the kernel to kill it before any other process under memory
pressure (``/proc/self/oom_score_adj`` 1000, before its imports), then runs gpuwarden.config_load's ``main``. A
reload under a tight memory limit (a container's) then fails as one line and the daemon keeps serving, instead of
the OOM killer choosing the daemon, the larger process of the two."""

from __future__ import annotations


def first_to_go() -> bool:
    """Set this process's OOM score adjustment to 1000 (the kernel's first choice when memory runs out); return
    False where it cannot (no /proc, a read-only /proc): the load goes on. Raises nothing."""
    try:
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as f:
            f.write("1000")
    except OSError:
        return False
    return True


if __name__ == "__main__":
    first_to_go()
    from gpuwarden.config_load import main

    raise SystemExit(main())
