"""The steps of the fleet accounting, without a Prometheus: the range's whole steps, and the attribution step each
range gets (15 s up to a day, coarser past it so that a week costs what a day does)."""

from __future__ import annotations

import pytest

from gpuwarden.cluster.usage import MAX_ATTRIBUTION_STEPS, Accounting, default_attribution


@pytest.mark.parametrize(
    ("range_", "step", "fine_ms"),
    [
        ("1d", "1m", 15_000),
        ("3h", "1h", 15_000),
        ("3h", "5s", 5_000),
        ("7d", "1h", 100_000),
        ("7d", "1m", 60_000),
        ("30d", "1h", 450_000),
    ],  # fmt: skip
)
def test_each_range_is_summed_at_the_attribution_step_its_length_allows(range_: str, step: str, fine_ms: int) -> None:
    from gpuwarden.cluster.durations import seconds

    acc = Accounting(None, range_, step, at=1_800_000_000.0, attribution=default_attribution(seconds(range_)))  # type: ignore[arg-type]
    fine = acc._fine  # noqa: SLF001 - the accounting the jobs and GPUs are summed in
    assert fine._step_ms == fine_ms and fine._fine is fine  # noqa: SLF001 - summed there, not split again
    # about as many steps as a day's at 15 s (the parts divide the step: 100 s, not 105, at 7 days in hours), or the
    # range's own steps where --step is finer than that
    assert seconds(range_) * 1000 / fine_ms <= max(1.05 * MAX_ATTRIBUTION_STEPS, seconds(range_) / seconds(step))
    assert acc._step_ms % fine_ms == 0  # noqa: SLF001 - the parts tile the step


def test_a_range_that_is_not_whole_steps_is_refused() -> None:
    with pytest.raises(ValueError, match="not a whole number of --step"):
        Accounting(None, "90m", "1h")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="longer than --range"):
        Accounting(None, "1h", "2h")  # type: ignore[arg-type]


class _Recorder:
    """A Prometheus that records every query and answers the narrowing query with ``gpus`` UUIDs, nothing else."""

    def __init__(self, gpus: int) -> None:
        self.queries: list[str] = []
        self.gpus = gpus

    def query(self, promql: str, time: float | None = None) -> list:
        from gpuwarden.cluster.promapi import Sample

        self.queries.append(promql)
        if promql.startswith("group by (uuid)"):
            return [Sample({"uuid": f"GPU-{i:08x}-1111-2222-3333-444455556666"}, 1.0) for i in range(self.gpus)]
        return []


def _report_queries(gpus: int) -> list[str]:
    """The queries ``report`` asks of a job of ``gpus`` GPUs (job_details, stragglers, lost_gpus)."""
    from gpuwarden.cluster.usage import JobKey

    prom = _Recorder(gpus)
    acc = Accounting(prom, "1d", "1m", 'cluster="train-a"', at=1_800_000_000.0)  # type: ignore[arg-type]
    acc.job_details("sSLUID0123456789")
    acc.stragglers(JobKey("sSLUID0123456789"))
    acc.lost_gpus(JobKey("sSLUID0123456789"))
    return prom.queries


@pytest.mark.parametrize("gpus", [1, 17, 64, 512])
def test_a_jobs_queries_do_not_grow_with_the_job_and_name_each_gpu_once(gpus: int) -> None:
    """report's queries name at most NARROW_GPUS GPUs each: the longest is no longer at 17, 64 or 512 GPUs than at
    NARROW_GPUS (VictoriaMetrics refuses queries past 16 KiB), and every GPU of the job is in exactly one part."""
    import re

    from gpuwarden.cluster.usage import NARROW_GPUS

    queries = _report_queries(gpus)
    longest = max(len(q.encode()) for q in queries)
    assert longest <= max(len(q.encode()) for q in _report_queries(NARROW_GPUS)) < 6_000
    parts = {m for q in queries for m in re.findall(r'uuid=~"([^"]*)"', q)}
    named = [u for part in parts for u in part.split("|")]
    assert len(named) == len(set(named)) == gpus
    assert all(len(part.split("|")) <= NARROW_GPUS for part in parts)


class _Prices:
    """Answers the accounting's two price queries as Prometheus would for three nodes: n1 of one model, n2 of two
    (6 H200s, 2 of another), n3 from an older daemon (a price without a model); records what was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def query(self, promql: str, time: float | None = None) -> list:
        from gpuwarden.cluster.promapi import Sample

        self.asked.append(promql)
        if "gpuwarden_gpu_hour_price" in promql:
            return [Sample({"instance": "n1:9400", "model": "NVIDIA H200", "currency": "USD"}, 4.0),
                    Sample({"instance": "n2:9400", "model": "NVIDIA H200", "currency": "USD"}, 4.0),
                    Sample({"instance": "n2:9400", "model": "Tesla T4", "currency": "USD"}, 0.5),
                    Sample({"instance": "n3:9400", "currency": "USD"}, 2.0)]  # fmt: skip
        if "gpu_info" in promql:
            return [Sample({"instance": "n2:9400", "name": "NVIDIA H200"}, 6.0),
                    Sample({"instance": "n2:9400", "name": "Tesla T4"}, 2.0)]  # fmt: skip
        return []


def test_lost_hours_are_priced_by_the_nodes_gpu_models() -> None:
    from gpuwarden.cluster.usage import Usage

    prom = _Prices()
    acc = Accounting(prom, "1h", "1m", at=1_800_000_000.0)  # type: ignore[arg-type]
    where = acc.cluster_of({})  # the series name no cluster
    usages = [Usage(instances={"n1:9400"}), Usage(instances={"n2:9400"}), Usage(instances={"n3:9400"}),
              Usage(instances={"n1:9400", "n3:9400"}), Usage(instances={"n9:9400"})]  # fmt: skip
    for u in usages:
        u.lost_hours["input"], u.cluster = 10.0, where
    acc._price(usages)  # noqa: SLF001 - the pricing step alone
    assert [u.cost for u in usages] == pytest.approx([40.0, 10 * (6 * 4.0 + 2 * 0.5) / 8, 20.0, 10 * 3.0, None])
    assert usages[0].currency == "USD" and usages[4].currency == ""
    # the GPU counts are asked only of the node of several models
    [counted] = [q for q in prom.asked if "gpu_info" in q]
    assert 'instance=~"n2:9400"' in counted and "n1" not in counted
