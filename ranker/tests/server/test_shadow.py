"""Shadow scoring between real `kvrank serve` processes: a stable pod mirrors its answered
requests to a canary pod, which warms its cache with them, and measures how far the
canary's scores are; a canary that is down fails no request of the stable pod."""

from __future__ import annotations

import time
from typing import Any

import httpx
import numpy as np
import pytest

from kvrank.admission import TIMEOUT_HEADER
from kvrank.model.artifact import save_model
from kvrank.model.config import TINY  # the model the conftest serves
from kvrank.server.shadow import compare
from kvrank.tools.processes import RankerProcess, free_port, wait_for

pytestmark = pytest.mark.slow


def score(url: str, body: dict[str, Any]) -> httpx.Response:
    """A scoring request that waits 30 s and says so: one the stable pod is slow to answer
    on a loaded machine is not the canary's doing."""
    return httpx.post(f"{url}/v1/score", json=body, timeout=30, headers={TIMEOUT_HEADER: "30000"})


def test_compare_sees_equal_reordered_and_shifted_scores() -> None:
    a = np.array([0.9, 0.5, 0.1, 0.7])
    delta, rho, changed = compare(a, a.copy(), 2)
    assert delta.max() == 0 and rho == pytest.approx(1.0) and not changed
    delta, rho, changed = compare(a, 1 - a, 2)  # the same candidates, reversed order
    assert rho == pytest.approx(-1.0) and changed
    delta, rho, changed = compare(a, a + 0.01, 2)  # shifted: same order, same top 2
    assert delta.max() == pytest.approx(0.01) and rho == pytest.approx(1.0) and not changed


def shadowing(target: str, sample: str = "1") -> dict[str, str]:
    """Mirror to ``target``, waiting up to a minute for each of its answers: whether a request
    was mirrored must not depend on how fast a loaded machine lets the canary answer (its
    2 s default would count a slow answer as an error)."""
    return {
        "KVRANK_SHADOW_URL": target,
        "KVRANK_SHADOW_SAMPLE": sample,
        "KVRANK_SHADOW_TOP_K": "3",
        "KVRANK_SHADOW_TIMEOUT_MS": "60000",
    }


def test_an_identical_canary_is_warmed_and_agrees(spawn_server, request_for) -> None:
    canary = spawn_server("--namespace", "v-canary")
    stable = spawn_server("--namespace", "v-stable", env=shadowing(canary.url))
    users = [f"user-{i}" for i in range(8)]
    for i, user in enumerate(users):
        _, _, body = request_for(user_id=user, seed=i)
        assert score(stable.url, body).status_code == 200
    wait_for(
        lambda: stable.metric("kvrank_shadow_requests_total", result="sent") == 8,
        "8 mirrored",
        120,
        interval=0.2,
    )
    assert stable.metric("kvrank_shadow_topk_changed_total") == 0
    # every ordering the same: all 8 correlations in the top bucket (0.999, 1]
    assert stable.metric("kvrank_shadow_rank_correlation_count") == 8
    assert stable.metric("kvrank_shadow_rank_correlation_bucket", le="0.999") == 0
    # every candidate's |Δscore| in the lowest bucket: the same weights score the same
    deltas = stable.metric("kvrank_shadow_abs_delta_count")
    assert deltas > 0 and stable.metric("kvrank_shadow_abs_delta_bucket", le="1e-07") == deltas
    # the canary scored them into its own cache: its first real request per user is a hit,
    # and it mirrored nothing itself
    _, _, body = request_for(user_id=users[3], seed=3)
    doc = score(canary.url, body).json()
    assert doc["cache"] == "l1"
    assert canary.metric("kvrank_shadow_requests_total") == 0


def test_a_canary_with_other_weights_is_seen_to_drift(
    spawn_server, request_for, factory, tmp_path
) -> None:
    other = tmp_path / "other"
    save_model(factory.model(TINY, seed=11, version="v1"), other)
    canary = RankerProcess.start(other, tmp_path, "--namespace", "v-canary")
    try:
        stable = spawn_server(env=shadowing(canary.url))
        for i in range(6):
            _, _, body = request_for(user_id=f"user-{i}", c=6, seed=i)
            score(stable.url, body).raise_for_status()
        wait_for(
            lambda: stable.metric("kvrank_shadow_requests_total", result="sent") == 6,
            "mirrored",
            120,
            interval=0.2,
        )
        deltas = stable.metric("kvrank_shadow_abs_delta_count")
        assert stable.metric("kvrank_shadow_abs_delta_bucket", le="0.001") < deltas
        assert stable.metric("kvrank_shadow_rank_correlation_bucket", le="0.999") > 0
    finally:
        canary.stop()


def test_a_canary_that_is_down_fails_no_request(spawn_server, request_for) -> None:
    stable = spawn_server(env=shadowing(f"http://127.0.0.1:{free_port()}"))
    statuses = []
    for i in range(10):
        _, _, body = request_for(user_id=f"user-{i}", seed=i)
        statuses.append(score(stable.url, body).status_code)
    assert statuses == [200] * 10
    wait_for(
        lambda: stable.metric("kvrank_shadow_requests_total", result="error") == 10,
        "10 errors",
        120,
        interval=0.2,
    )
    assert stable.metric("kvrank_shadow_requests_total", result="sent") == 0


@pytest.mark.parametrize(
    "settings",
    [{"sample": "0"}, {"sample": "1", "version": "v1"}],
    ids=["not-sampled", "pod-of-the-target-version"],
)
def test_nothing_is_mirrored_unless_sampled_and_by_another_version(
    spawn_server, request_for, settings
) -> None:
    """A canary pod reads the same config file as the stable pods: naming its own version
    as the target keeps it from mirroring to itself."""
    canary = spawn_server()
    env = shadowing(canary.url, sample=settings["sample"])
    if "version" in settings:
        env["KVRANK_SHADOW_VERSION"] = settings["version"]  # the version this pod serves
    stable = spawn_server(env=env)
    _, _, body = request_for()
    score(stable.url, body).raise_for_status()
    time.sleep(1)
    assert stable.metric("kvrank_shadow_requests_total") == 0
    assert canary.metric("kvrank_requests_total") == 0


def test_sampling_and_target_reload_with_the_config_file(
    make_client, spawn_server, request_for, tmp_path, monkeypatch
) -> None:
    """What the operator does during a rollout: rewrite the pod's config file; shadowing
    starts without a restart."""
    import kvrank.server.reload as reload

    monkeypatch.setattr(reload, "CONFIG_POLL_S", 0.05)
    canary = spawn_server()
    path = tmp_path / "ranker.yaml"
    path.write_text("shadow:\n  sample: 0\n")
    stable = make_client(config_file=str(path))
    _, _, body = request_for(user_id="before")
    stable.post("/v1/score", json=body).raise_for_status()
    time.sleep(0.1)
    path.write_text(f"shadow:\n  url: {canary.url}\n  sample: 1\n")
    deadline = time.monotonic() + 5
    while stable.get("/admin/config").json()["shadow"]["sample"] != 1:
        assert time.monotonic() < deadline, "the shadow section was not reloaded"
        time.sleep(0.05)
    _, _, body = request_for(user_id="after")
    stable.post("/v1/score", json=body).raise_for_status()
    wait_for(lambda: canary.metric("kvrank_requests_total") == 1, "mirrored", 30, interval=0.2)
