"""``GET /metrics``: the controller's state in Prometheus' text format (``prometheus-client``).

Read at scrape time from the controller's own snapshots (a custom collector, so nothing is kept twice and a scrape
costs one pass over the GPUs, the tenants and the running jobs), on a registry of this app's own (several servers
in one process, as in tests, do not collide). What is exported:

==========================================  =========================================================================
``corral_info``                             version and policy (labels)
``corral_gpu_allocated_ratio``              per GPU: share given to ordinary placements (0..1)
``corral_gpu_sm_used_ratio``                per GPU: measured SM use (NVML, or the jobs' reports on stand-ins)
``corral_gpu_memory_bytes``                 per GPU: its memory
``corral_gpu_memory_used_bytes``            per GPU: memory in use by its jobs
``corral_gpu_jobs``                         per GPU and class (guaranteed, opportunistic): jobs on it
``corral_job_step_seconds``                 per running job: its latest mini-batch time
``corral_job_slowdown_ratio``               per running job with a baseline: latest step / step time alone
``corral_job_gpu_share_ratio``              per running job: its share (an opportunistic job's compute cap)
``corral_job_memory_cap_bytes``             per running job with one: its memory cap or reservation
``corral_tenant_quota_gpus``                per tenant with a quota
``corral_tenant_guaranteed_gpus``           per tenant: GPUs its guaranteed jobs hold (counts against its quota)
``corral_tenant_opportunistic_gpus``        per tenant: shares of its opportunistic jobs
``corral_tenant_jobs``                      per tenant and phase (running, pending)
``corral_queue_jobs``                       pending jobs by the reason they wait (``not examined yet`` for the rest)
``corral_round_duration_seconds``           histogram of the scheduling rounds' wall time
``corral_job_events_total``                 job events by kind (launched, preempted, paused, resized, finished, ...)
==========================================  =========================================================================

Labels name GPUs by index and node, jobs by id, tenant and class: never a command line, an environment or a token.
A job's step time alone (its baseline) is the solo time it reports, else the one the controller measures: the
median of its latest step reports made while no other job ran on its GPUs, for its current run, placement, share
and batch size (:mod:`corral.live.controller.baseline`).
The wait reasons are the policy's sentences, so ``corral_queue_jobs`` has one series per distinct reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from corral import __version__
from corral.core.job import FULL_GPU_MILLI, JobPhase
from corral.live.controller.stats import ROUND_BUCKETS_S
from corral.live.records import ClusterSnapshot

if TYPE_CHECKING:
    from corral.live.controller import Controller

MIB = 1024 * 1024
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
NOT_EXAMINED = "not examined yet"


class ControllerCollector(Collector):
    """Every metric of the module docstring, read from ``controller`` at each scrape."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def collect(self) -> Iterator[Metric]:
        c = self.controller
        cluster = c.cluster()
        yield from self._gpus(cluster)
        yield from self._jobs()
        yield from self._tenants()
        yield from self._queue(cluster.pending)
        yield from self._loop()
        info = InfoMetricFamily("corral", "corral serve's version and policy")
        info.add_metric([], {"version": __version__, "policy": cluster.policy})
        yield info

    def _gpus(self, cluster: ClusterSnapshot) -> Iterator[Metric]:
        labels = ["gpu", "node", "type"]
        alloc = GaugeMetricFamily(
            "corral_gpu_allocated_ratio", "Share of the GPU given to ordinary placements", labels=labels
        )
        used = GaugeMetricFamily("corral_gpu_sm_used_ratio", "Measured SM use of the GPU", labels=labels)
        mem = GaugeMetricFamily("corral_gpu_memory_bytes", "GPU memory", labels=labels)
        mem_used = GaugeMetricFamily("corral_gpu_memory_used_bytes", "GPU memory in use by its jobs", labels=labels)
        jobs = GaugeMetricFamily("corral_gpu_jobs", "Jobs on the GPU by class", labels=[*labels, "class"])
        for g in cluster.gpus:
            key = [str(g.index), g.node, g.type_name]
            alloc.add_metric(key, g.allocated_milli / FULL_GPU_MILLI)
            used.add_metric(key, g.sm_util if g.sm_util is not None else 0.0)
            mem.add_metric(key, g.mem_mib * MIB)
            mem_used.add_metric(key, (g.mem_used_mib or 0) * MIB)
            opportunistic = sum(1 for j in g.jobs if j.opportunistic)
            jobs.add_metric([*key, "guaranteed"], len(g.jobs) - opportunistic)
            jobs.add_metric([*key, "opportunistic"], opportunistic)
        yield from (alloc, used, mem, mem_used, jobs)

    def _jobs(self) -> Iterator[Metric]:
        labels = ["job", "tenant", "class"]
        step = GaugeMetricFamily("corral_job_step_seconds", "Latest mini-batch time of a running job", labels=labels)
        slow = GaugeMetricFamily(
            "corral_job_slowdown_ratio",
            "Latest step time over the step time alone on the same GPUs: the solo time the job reports, else the "
            "median of its latest step reports made with no other job on its GPUs (this run, placement, share, "
            "batch size); only jobs with one",
            labels=labels,
        )
        share = GaugeMetricFamily("corral_job_gpu_share_ratio", "Share of each GPU (compute cap)", labels=labels)
        cap = GaugeMetricFamily("corral_job_memory_cap_bytes", "Memory cap or reservation per GPU", labels=labels)
        for record in self.controller.jobs(phases=[JobPhase.RUNNING]):
            status = record.status
            placement = status.placement
            if placement is None:
                continue
            key = [record.job_id, status.spec.tenant, "opportunistic" if placement.opportunistic else "guaranteed"]
            share.add_metric(key, placement.gpu_milli / FULL_GPU_MILLI)
            if placement.mem_mib is not None:
                cap.add_metric(key, placement.mem_mib * MIB)
            tel = record.telemetry
            if tel is not None:
                step.add_metric(key, tel.step_time_s)
                if tel.slowdown is not None:  # over the controller's baseline (ObservedTelemetry), when it has one
                    slow.add_metric(key, tel.slowdown)
        yield from (step, slow, share, cap)

    def _tenants(self) -> Iterator[Metric]:
        quota = GaugeMetricFamily("corral_tenant_quota_gpus", "Guaranteed GPUs promised", labels=["tenant"])
        held = GaugeMetricFamily("corral_tenant_guaranteed_gpus", "GPUs its guaranteed jobs hold", labels=["tenant"])
        opp = GaugeMetricFamily(
            "corral_tenant_opportunistic_gpus", "Shares of its opportunistic jobs", labels=["tenant"]
        )
        jobs = GaugeMetricFamily("corral_tenant_jobs", "Jobs by phase", labels=["tenant", "phase"])
        for t in self.controller.tenants():
            if t.quota_gpus is not None:
                quota.add_metric([t.name], t.quota_gpus)
            held.add_metric([t.name], t.guaranteed_gpus)
            opp.add_metric([t.name], t.opportunistic_gpus)
            jobs.add_metric([t.name, "running"], t.running)
            jobs.add_metric([t.name, "pending"], t.pending)
        yield from (quota, held, opp, jobs)

    def _queue(self, pending: int) -> Iterator[Metric]:
        counts: dict[str, int] = {}
        for reason in self.controller.waiting_reasons().values():
            counts[reason] = counts.get(reason, 0) + 1
        rest = pending - sum(counts.values())
        if rest > 0:
            counts[NOT_EXAMINED] = counts.get(NOT_EXAMINED, 0) + rest
        queue = GaugeMetricFamily("corral_queue_jobs", "Pending jobs by the reason they wait", labels=["reason"])
        for reason, n in sorted(counts.items()):
            queue.add_metric([reason], n)
        yield queue

    def _loop(self) -> Iterator[Metric]:
        stats = self.controller.stats.snapshot()
        cumulative, buckets = 0, []
        for bound, n in zip((*map(str, ROUND_BUCKETS_S), "+Inf"), stats.round_bucket_counts, strict=True):
            cumulative += n
            buckets.append((bound, cumulative))
        rounds = HistogramMetricFamily("corral_round_duration_seconds", "Wall time of a scheduling round")
        rounds.add_metric([], buckets, sum_value=stats.round_seconds_sum)
        yield rounds
        events = CounterMetricFamily("corral_job_events", "Job events by kind", labels=["kind"])
        for kind, n in sorted(stats.events.items()):
            events.add_metric([kind], n)
        yield events


def metrics_registry(controller: Controller) -> CollectorRegistry:
    """A registry of its own holding the controller's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControllerCollector(controller))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
