"""Progressive delivery: a canary warms on mirrored traffic, then takes steps of real
traffic while the operator compares it with the stable version; it is promoted when every
check passes, aborted and purged when one fails, and never promoted without data."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from rankers import Ranker, Rankers, Traffic
from stack import NS, Stack

pytestmark = [pytest.mark.kube, pytest.mark.slow, pytest.mark.e2e]


def serving(rankers: Rankers, prefix: str, stable: str, redis: bool = True) -> Ranker:
    """A ranker serving ``stable`` on 3 replicas, Ready."""
    ranker = rankers.new(prefix)
    ranker.apply(progressive_spec(ranker, stable, None, redis=redis))
    ranker.wait_ready(f"on {stable}", 300)
    return ranker


def progressive_spec(
    ranker: Ranker, stable: str, canary: str | None, redis: bool = True, **rollout: Any
) -> dict[str, Any]:
    doc = ranker.serving(ranker.spec(redis=redis, replicas=3), stable)
    doc["spec"]["cache"]["retiredNamespaceGraceSeconds"] = 3
    return ranker.with_canary(doc, canary, weight=None, **rollout)


@pytest.mark.quiet_host
def test_an_identical_canary_warms_on_shadow_traffic_and_is_promoted_step_by_step(
    stack: Stack, rankers: Rankers
) -> None:
    """v2.1 has v2's weights: its scores agree, it warms up on the mirrored requests
    before it takes real ones, and the operator promotes it through both steps."""
    ranker = serving(rankers, "progressive", "v2")
    doc = progressive_spec(
        ranker,
        "v2",
        "v2.1",
        shadow={"sample": 0.5, "topK": 5},
        warmup={"hitRatio": 0.6, "minRequests": 30, "timeoutSeconds": 240},
        steps=[{"weight": 20, "pauseSeconds": 15}, {"weight": 40, "pauseSeconds": 15}],
        analysis={
            "scoreDelta": {"max": 1e-4, "quantile": 0.99, "minSamples": 20},
            "rankCorrelation": {"min": 0.99, "minSamples": 20},
            "errorRatio": {"max": 0.01, "minSamples": 20},
            "inconclusiveTimeoutSeconds": 120,
            "source": stack.ttl_source(),  # the run's Prometheus (kind: the pods)
        },
    )
    # a TTL longer than the scenario: what the canary's first real answers show is the
    # warm-up, not how often auto-tuned second-long TTLs expire an entry between two
    # mirrored requests of a user
    doc["spec"]["ttl"] = {"mode": "fixed", "fixedSeconds": 300}
    with Traffic(ranker) as traffic:
        ranker.apply(doc)
        stack.wait_for(lambda: ranker.rollout().get("phase") == "Warming", "v2.1 warming up", 240)
        shared = stack.must_get("service", ranker.name)["spec"]["selector"]
        assert shared.get("kvrank.io/version") == "v2", shared  # out of the shared Service
        assert not [r for r in traffic.results if r[1] == "v2.1"], "real traffic on v2.1"
        stack.wait_for(
            lambda: ranker.rollout().get("phase") in ("Progressing", "Promoted"),
            "v2.1 warm, joining the Service",
            240,
        )
        joined = ranker.rollout()
        assert joined["warmHitRatio"] >= 0.6 and joined["warmRequests"] >= 30, joined
        assert ranker.redis_keys(ranker.cache_namespace("v2.1")) > 0, (
            "the canary's namespace not warmed"
        )
        table = stack.kubectl("get", "rkd", ranker.name, "-n", NS)
        assert "Progressing" in table and "1/2" in table, table
        stack.wait_for(
            lambda: ranker.must_get()["spec"]["model"]["version"] == "v2.1", "v2.1 promoted", 300
        )
        ranker.wait_ready("on v2.1")
    _assert_promoted_through_both_steps(ranker, traffic)


def _assert_promoted_through_both_steps(ranker: Ranker, traffic: Traffic) -> None:
    """Promoted with every check passed (the same weights: equal scores), its first real
    answers from a warm cache, no request failed, and the Events of each stage posted."""
    done = ranker.rollout()
    assert done["phase"] == "Promoted", done
    assert "canary" not in ranker.must_get()["spec"]
    checks = {c["metric"]: c for c in done["checks"]}
    assert checks["scoreDelta"]["value"] <= 1e-4, checks  # the same weights: equal scores
    assert checks["rankCorrelation"]["value"] >= 0.99, checks
    assert all(c["result"] == "pass" for c in checks.values()), checks
    served = [r for r in traffic.results if r[1] == "v2.1"]
    assert len(served) >= 5, f"v2.1 answered {len(served)} real requests"
    assert all(r[2] != "miss" for r in served[:5]), f"first real answers {served[:5]}"
    assert not traffic.failures(), traffic.failures()[:5]
    assert ranker.events("CanaryWarm") and ranker.events("StepPassed")
    promoted = ranker.events("CanaryPromoted")
    assert promoted and "step 2/2" in promoted[-1], promoted
    assert ranker.score("after-auto-promote")["model_version"] == "v2.1"


def test_a_drifting_canary_is_aborted_at_its_first_step_and_purged(
    stack: Stack, rankers: Rankers
) -> None:
    """v3 has other weights than v1: the shadow comparison sees its scores drift beyond the
    threshold, the rollout aborts in step 1, the stable version is untouched."""
    ranker = serving(rankers, "drifting", "v1")
    stable = ranker.must_deployment("v1")
    doc = progressive_spec(
        ranker,
        "v1",
        "v3",
        shadow={"sample": 0.5},
        steps=[{"weight": 20, "pauseSeconds": 60}],
        analysis={
            "scoreDelta": {"max": 0.01, "minSamples": 10},
            "errorRatio": {"max": 0.01, "minSamples": 10},
            "source": {"type": "pods"},
        },
    )
    with Traffic(ranker) as traffic:
        ranker.apply(doc)
        stack.wait_for(lambda: ranker.rollout().get("phase") == "Aborted", "v3 aborted", 240)
        ranker.wait_purged("v3")
    aborted = ranker.condition("CanaryAnalysis")
    assert aborted is not None and aborted["status"] == "False", aborted
    assert aborted["reason"] == "AnalysisFailed", aborted
    message = aborted["message"]
    assert "step 1/1" in message and "scoreDelta" in message and "max 0.01" in message, message
    (event,) = ranker.events("RolloutAborted")
    assert "scoreDelta" in event, event
    assert ranker.redis_keys(ranker.cache_namespace("v3")) == 0
    ranker.wait_gone("v3")
    assert ranker.must_deployment("v1")["metadata"]["uid"] == stable["metadata"]["uid"]
    assert ranker.namespaces().get(ranker.cache_namespace("v1")) == "active"
    assert ranker.must_get()["spec"]["model"]["version"] == "v1"
    assert not traffic.failures(), traffic.failures()[:5]


def test_a_canary_without_data_is_never_promoted(stack: Stack, rankers: Rankers) -> None:
    """No verdict is not a pass: with Prometheus unreachable, and with no shadow traffic,
    the step waits, says why, and aborts after its timeout."""
    ranker = serving(rankers, "no-data", "v1", redis=False)
    unreachable = progressive_spec(
        ranker,
        "v1",
        "v2",
        redis=False,
        steps=[{"weight": 20, "pauseSeconds": 5}],
        analysis={
            "errorRatio": {"max": 0.01, "minSamples": 10},
            "inconclusiveTimeoutSeconds": 20,
            "source": {"type": "prometheus", "prometheus": {"url": "http://127.0.0.1:9"}},
        },
    )
    quiet = progressive_spec(
        ranker,
        "v1",
        "v2",
        redis=False,
        shadow={"sample": 0.5},
        steps=[{"weight": 20, "pauseSeconds": 5}],
        analysis={
            "scoreDelta": {"max": 0.01, "minSamples": 10},
            "inconclusiveTimeoutSeconds": 20,
            "source": {"type": "pods"},
        },
    )
    removed = progressive_spec(ranker, "v1", None, redis=False)
    for doc, why, traffic_on in (
        (unreachable, "PrometheusUnreachable", True),
        (quiet, "0/10 samples", False),
    ):
        ranker.apply(doc)
        with Traffic(ranker) if traffic_on else contextlib.nullcontext():
            waiting = stack.wait_for(
                lambda: (
                    (c := ranker.condition("CanaryAnalysis"))
                    and c["reason"] == "Inconclusive"
                    and ranker.rollout().get("phase") == "Progressing"
                    and c
                ),
                f"an inconclusive step ({why})",
                240,
            )
            assert waiting["status"] == "False" and why in waiting["message"], waiting
            ended = stack.wait_for(
                lambda: (
                    ranker.rollout().get("phase") in ("Aborted", "Promoted") and ranker.rollout()
                ),
                f"the rollout ended ({why})",
                120,
            )
        assert ended["phase"] == "Aborted" and ended["reason"] == "Inconclusive", ended
        assert ranker.must_get()["spec"]["model"]["version"] == "v1"
        ranker.apply(removed)  # a person removes the aborted canary; the next one starts anew
        stack.wait_for(lambda: ranker.rollout().get("ended"), "the canary removed", 60)
    ranker.wait_ready("without a canary")
