"""The API's start-time estimate routes (:mod:`corral.live.controller.estimates` does the work):

``GET /v1/estimates``
    The latest forecast of the queue: when it was made and how long it took (the admin also sees how many jobs'
    durations were known, learned or assumed).
``POST /v1/estimates``
    (Admin.) Make one now and answer with it.
``GET /v1/estimates/accuracy``
    (Admin.) The estimates of first starts against the real starts (``corral whatif accuracy``).
``POST /v1/estimates/whatif``
    (Admin.) The current queue forecast under the server's policy and under another, per tenant
    (``corral whatif --policy NAME``).
``POST /v1/jobs/test``
    Where and when a job would start if it were submitted now, without submitting it (``corral submit
    --test-only``); the body is a submission's, checked as one (a job that could never run is refused the same).

Each pending job's own estimate is in the job itself (``estimated_start``), under the usual visibility rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from corral.core.errors import CorralError
from corral.live.api.app import Principal, Who
from corral.live.api.models import (
    AccuracyOut,
    EstimatesOut,
    JobSubmission,
    TenantMoveOut,
    TestStartOut,
    WhatifIn,
    WhatifOut,
)
from corral.live.records import InvalidRequest, JobRequest, NotYours

if TYPE_CHECKING:
    from corral.live.controller import Controller

Responses = Callable[..., dict[int | str, dict[str, Any]]]


def add_estimate_routes(
    app: FastAPI,
    controller: Controller,
    request_from: Callable[[JobSubmission, Principal], JobRequest],
    node_of: Callable[[int], str],
    gpu_order: Sequence[int] | None,
    responses: Responses,
) -> None:
    estimator = controller.estimator

    def admin_only(who: Principal, what: str) -> None:
        if who.tenant is not None:
            raise NotYours(f"{what} needs the admin token")

    def summary(who: Principal) -> EstimatesOut:
        latest = estimator.latest
        admin = who.tenant is None
        if latest is None:
            return EstimatesOut(
                made_s=None,
                took_s=None,
                runs=None,
                interval_s=estimator.interval_s,
                pending=None,
                known=None,
                learned=None,
                assumed=None,
                cut_short=None,
            )
        basis = latest.basis
        return EstimatesOut(
            made_s=latest.made_s,
            took_s=latest.took_s,
            runs=latest.runs,
            interval_s=estimator.interval_s,
            # Counts over every tenant's jobs: a tenant sees no other tenant's counts (docs/live.md).
            pending=len(latest.estimates) if admin else None,
            known=basis.get("known", 0) if admin else None,
            learned=basis.get("learned", 0) if admin else None,
            assumed=basis.get("assumed", 0) if admin else None,
            cut_short=latest.cut_short,
        )

    @app.get("/v1/estimates", tags=["cluster"], summary="The latest start-time forecast", responses=responses())
    def get_estimates(who: Who) -> EstimatesOut:
        """When the pending jobs' start times were last estimated (each job's estimate is in the job)."""
        return summary(who)

    @app.post(
        "/v1/estimates",
        tags=["cluster"],
        summary="Estimate start times now",
        responses=responses(_403="A tenant's token."),
    )
    def refresh_estimates(who: Who) -> EstimatesOut:
        """Make a forecast of the queue now (in the worker process; it can take seconds on a long queue)."""
        admin_only(who, "a forecast on request")
        controller.estimator.refresh()
        return summary(who)

    @app.get(
        "/v1/estimates/accuracy",
        tags=["cluster"],
        summary="How good the estimates were",
        responses=responses(_403="A tenant's token."),
    )
    def estimate_accuracy(who: Who) -> AccuracyOut:
        """Each job's first and latest estimate of its first start against when it really started."""
        admin_only(who, "the estimates' accuracy")
        a = estimator.accuracy()
        return AccuracyOut(
            jobs=a.jobs,
            first_median_s=a.first_median_s,
            first_p90_s=a.first_p90_s,
            last_median_s=a.last_median_s,
            last_p90_s=a.last_p90_s,
            last_bias_s=a.last_bias_s,
            within=a.within,
        )

    @app.post(
        "/v1/estimates/whatif",
        tags=["cluster"],
        summary="The queue under another policy",
        responses=responses(_403="A tenant's token.", _422="A policy that does not exist or a bad option."),
    )
    def whatif(body: WhatifIn, who: Who) -> WhatifOut:
        """Forecast the current queue under the server's policy and under ``policy``, from one snapshot: per
        tenant, how its pending jobs' starts would move if the server switched now (``corral whatif --policy``)."""
        admin_only(who, "a what-if of another policy")
        from corral.policies.registry import make_policy

        try:
            policy = make_policy(body.policy)
        except CorralError as e:
            raise InvalidRequest(f"policy: {e}") from None
        found = estimator.whatif(policy)
        return WhatifOut(
            policy=controller.policy.describe(),
            other=policy.describe(),
            made_s=found.now.made_s,
            took_s=found.now.took_s + found.other.took_s,
            tenants=[
                TenantMoveOut(
                    tenant=m.tenant,
                    pending=m.pending,
                    wait_now_s=m.wait_now_s,
                    wait_other_s=m.wait_other_s,
                    earlier=m.earlier,
                    later=m.later,
                )
                for m in found.tenants
            ],
        )

    @app.post(
        "/v1/jobs/test",
        tags=["jobs"],
        summary="Where and when a job would start (nothing is submitted)",
        responses=responses(
            _403="A job for another tenant with a tenant's token.",
            _404="Unknown tenant.",
            _422="A body that does not fit the schema, or a job that can never run here.",
        ),
    )
    def test_job(body: JobSubmission, who: Who) -> TestStartOut:
        """A forecast of the queue with this job added, submitted now: when it would start, with a range, and on
        which GPUs. The same checks as a submission; nothing is queued or stored."""
        request = request_from(body, who)
        controller.check(request)
        e = estimator.test_only(request)
        gpus = [gpu_order[g] if gpu_order is not None and 0 <= g < len(gpu_order) else g for g in e.gpus]
        return TestStartOut(
            start_s=e.start_s,
            earliest_s=e.earliest_s,
            latest_s=e.latest_s,
            made_s=e.made_s,
            gpus=gpus,
            nodes=sorted({node_of(g) for g in e.gpus}),
        )
