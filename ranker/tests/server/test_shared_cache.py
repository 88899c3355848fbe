"""Pods sharing L2: hits across processes, one encode under a stampede, corrupt entries
and a Redis outage that never fails a request."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from kvrank.admission import TIMEOUT_HEADER
from kvrank.model.artifact import load_model

pytestmark = pytest.mark.redis


def settle(client: TestClient) -> None:
    """Wait until the entries an in-process server created have reached L2: they are
    written behind the answers, so a test that reads L2 right after one waits for them."""
    client.portal.call(client.app.state.kvrank.service.cache.flush)


@pytest.fixture
def model(artifact):
    return load_model(artifact)


@pytest.fixture
def flushed(redis_server):
    redis_server.cli("flushall")
    return redis_server


def shared(url: str) -> dict[str, Any]:
    """The test's Redis as a pod's L2, each read and write given a second: these claims are
    about what is stored and found, and a loaded machine can take longer than a pod's 20 ms."""
    return {"url": url, "op_timeout_ms": 1000}


def test_second_pod_hits_l2(make_client, flushed, factory, server_cfg, make_body) -> None:
    pod_a = make_client(redis=shared(flushed.url), namespace="shared")
    pod_b = make_client(redis=shared(flushed.url), namespace="shared")
    user, cands = factory.user(server_cfg, 12, 5), factory.candidates(server_cfg, 4, 5)
    req = make_body("bob", user, cands)
    a = pod_a.post("/v1/score", json=req).json()
    settle(pod_a)
    b = pod_b.post("/v1/score", json=req).json()
    assert (a["cache"], b["cache"]) == ("miss", "l2")
    assert 0 < b["timings_ms"]["serde"] <= b["timings_ms"]["l2"]
    assert 'stage="serde"' in pod_b.get("/metrics").text
    assert a["scores"] == b["scores"]
    assert pod_b.post("/v1/score", json=req).json()["cache"] == "l1"  # promoted


def test_namespaces_do_not_share_entries(
    make_client, flushed, factory, server_cfg, make_body
) -> None:
    stable = make_client(redis=shared(flushed.url), namespace="stable")
    canary = make_client(redis=shared(flushed.url), namespace="canary")
    req = make_body("carol", factory.user(server_cfg, 6, 2), factory.candidates(server_cfg, 3, 2))
    assert stable.post("/v1/score", json=req).json()["cache"] == "miss"
    assert canary.post("/v1/score", json=req).json()["cache"] == "miss"
    settle(stable)
    settle(canary)
    keys = flushed.cli("keys", "kvrank:*").stdout.split()
    assert {k.split(":")[1] for k in keys} == {"stable", "canary"}


def corrupt_counts(pod) -> dict[str, float]:
    from kvrank.tools.processes import samples

    text = pod.get("/metrics").text
    return {
        reason: sum(samples(text, "kvrank_cache_corrupt_entries_total", reason=reason))
        for reason in ("tag", "model")
    }


def test_only_pods_with_the_deployments_secret_and_weights_share_entries(
    make_client, flushed, model, factory, server_cfg, make_body, tmp_path
) -> None:
    """Same namespace, same version label: a pod holding another secret (another
    deployment, or anyone with the Redis password) or other weights (retrained under the
    same label) serves none of the entries, and its own answers are the model's."""
    from kvrank.model.artifact import save_model

    secret = tmp_path / "secret"
    secret.write_text("the deployment's entry secret\n")
    redis = {"url": flushed.url}
    pod_a = make_client(redis=redis, entry_secret_file=str(secret))
    pod_b = make_client(redis=redis, entry_secret_file=str(secret))
    stranger = make_client(redis=redis, entry_secret="another deployment's secret")
    retrained = tmp_path / "retrained"
    save_model(factory.model(server_cfg, seed=11, version="v1"), retrained)
    other_weights = make_client(
        redis=redis, entry_secret_file=str(secret), model_dir=str(retrained)
    )
    user, cands = factory.user(server_cfg, 7, 3), factory.candidates(server_cfg, 4, 3)
    req = make_body("erin", user, cands)
    assert pod_a.post("/v1/score", json=req).json()["cache"] == "miss"
    settle(pod_a)
    assert pod_b.post("/v1/score", json=req).json()["cache"] == "l2"
    doc = stranger.post("/v1/score", json=req).json()
    assert doc["cache"] == "miss" and corrupt_counts(stranger) == {"tag": 1, "model": 0}
    expected = model.forward_full(user, cands).sigmoid()
    assert torch.allclose(torch.tensor(doc["scores"]), expected, atol=1e-5)
    settle(stranger)  # its entry replaced pod A's: pod A's kind now refuse it in turn
    doc = other_weights.post("/v1/score", json=req).json()
    assert doc["cache"] == "miss" and corrupt_counts(other_weights) == {"tag": 0, "model": 1}
    retrained_expected = load_model(retrained).forward_full(user, cands).sigmoid()
    assert torch.allclose(torch.tensor(doc["scores"]), retrained_expected, atol=1e-5)


def test_a_secret_rotated_in_the_mounted_file_takes_effect_without_a_restart(
    make_client, flushed, factory, server_cfg, make_body, tmp_path
) -> None:
    """A rotation's steps written to running pods' secret files (as the kubelet updates a
    mounted Secret): a pod that puts the new secret first seals with it and still opens what
    the others sealed with the old one; a pod still on the old one cannot open the new
    entries (a miss, counted) until its own file changes."""
    import time

    old, new = "the old entry secret, 32 bytes..", "the new entry secret, 32 bytes.."
    file_a, file_b = tmp_path / "a", tmp_path / "b"
    file_a.write_text(old + "\n")
    file_b.write_text(old + "\n")
    redis = {"url": flushed.url}
    pod_a = make_client(redis=redis, entry_secret_file=str(file_a))
    pod_b = make_client(redis=redis, entry_secret_file=str(file_b))

    def cache(pod, user: str) -> str:  # type: ignore[no-untyped-def]
        seed = sum(map(ord, user))
        user_side, cands = (
            factory.user(server_cfg, 6, seed),
            factory.candidates(server_cfg, 3, seed),
        )
        doc = pod.post("/v1/score", json=make_body(user, user_side, cands)).json()
        settle(pod)
        return str(doc["cache"])

    def rotate(pod, file, text: str) -> None:  # type: ignore[no-untyped-def]
        file.write_text(text)
        codec = lambda: pod.app.state.kvrank.service.cache.codec  # noqa: E731
        deadline = time.monotonic() + 30
        while list(codec().secrets) != [s.encode() for s in text.splitlines()]:
            assert time.monotonic() < deadline, "the secret file was not reloaded"
            time.sleep(0.1)

    assert (cache(pod_a, "u0"), cache(pod_b, "u0")) == ("miss", "l2")
    rotate(pod_b, file_b, f"{new}\n{old}\n")  # B seals with the new one, opens both
    assert (cache(pod_a, "u1"), cache(pod_b, "u1")) == ("miss", "l2")  # A's, sealed old
    assert (cache(pod_b, "u2"), cache(pod_a, "u2")) == ("miss", "miss")  # B's, sealed new
    assert corrupt_counts(pod_a) == {"tag": 1, "model": 0}
    rotate(pod_a, file_a, f"{new}\n")  # the old one dropped
    assert (cache(pod_b, "u3"), cache(pod_a, "u3")) == ("miss", "l2")
    file_a.write_text("short\n")  # below the minimum: the secrets in force stay
    seen = pod_a.app.state.kvrank.watched_mtimes
    deadline = time.monotonic() + 30
    while seen.get(str(file_a)) != file_a.stat().st_mtime:  # the watcher read it
        assert time.monotonic() < deadline, "the secret file was not read again"
        time.sleep(0.1)
    assert list(pod_a.app.state.kvrank.service.cache.codec.secrets) == [new.encode()]


def test_a_short_entry_secret_is_refused_naming_the_setting(make_client) -> None:
    with pytest.raises(ValueError, match=r"entry_secret: every secret .* at least 16 bytes"):
        make_client(entry_secret="short")


def test_corrupt_l2_entry_is_a_miss_with_correct_scores(
    make_client, flushed, model, factory, server_cfg, make_body
) -> None:
    writer = make_client(redis=shared(flushed.url))
    user, cands = factory.user(server_cfg, 9, 8), factory.candidates(server_cfg, 5, 8)
    req = make_body("dave", user, cands)
    writer.post("/v1/score", json=req)
    settle(writer)
    (key,) = flushed.cli("keys", "kvrank:default:*").stdout.split()
    flushed.cli("setrange", key, "200", "XXXXXXXX")  # flip payload bytes in place
    reader = make_client(redis=shared(flushed.url))
    doc = reader.post("/v1/score", json=req).json()
    assert doc["cache"] == "miss"
    expected = model.forward_full(user, cands).sigmoid()
    assert torch.allclose(torch.tensor(doc["scores"]), expected, atol=1e-5)


def test_redis_outage_fails_no_request_and_l2_resumes(
    make_client, spawn_redis, factory, server_cfg, make_body
) -> None:
    redis = spawn_redis()
    pod = make_client(redis={"url": redis.url, "op_timeout_ms": 50}, l1_bytes=0)
    svc = pod.app.state.kvrank.service
    svc.cache.tiers[-1].store.breaker.cooldown_s = 0.2  # the Redis tier
    reqs = [
        make_body(f"user{i}", factory.user(server_cfg, 5, i), factory.candidates(server_cfg, 3, i))
        for i in range(10)
    ]
    statuses = []
    for i in range(60):
        if i == 20:
            redis.stop()  # mid-load
        if i == 40:
            redis.start()
            import time

            time.sleep(0.3)
        statuses.append(pod.post("/v1/score", json=reqs[i % 10]).status_code)
    assert statuses == [200] * 60
    outcomes = [pod.post("/v1/score", json=r).json()["cache"] for r in reqs]
    assert "l2" in outcomes  # L2 hits resumed after the restart


BURST = 40


def test_stampede_across_two_processes_encodes_once(
    spawn_server, flushed, factory, server_cfg, make_body
) -> None:
    args = ("--redis", flushed.url, "--namespace", "stampede")
    # 40 requests of one user at once, half on each pod: each pod shares one lookup among
    # its own callers and one pod's lookup waits on the other's lock. The bounds are wide
    # (a waiter gives up after 1 s, Redis calls after 2 s) and the TTL pinned (40 requests
    # within milliseconds measure an interval that clamps the adaptive TTL to its 1 s
    # minimum): what is measured is encodes, not speed. Admission queues every request
    # (drop mode): shedding prices each waiting request at the measured miss, though behind
    # the lock they are hits. (200 at once kept both loops parsing long enough, on a loaded
    # 2-core box, that the callers' connection pool ran out of its 30 s.)
    env = {
        "KVRANK_ADMISSION_MODE": "drop",
        "KVRANK_LOCK_WAIT_MS": "1000",
        "KVRANK_REDIS_OP_TIMEOUT_MS": "2000",
        "KVRANK_TTL_FIXED_SECONDS": "60",
    }
    pods = [spawn_server(*args, env=env), spawn_server(*args, env=env)]
    req = make_body(
        "hot-user", factory.user(server_cfg, 30, 3), factory.candidates(server_cfg, 8, 3)
    )

    async def burst() -> list[httpx.Response]:
        # the callers wait a minute, and say so: what is measured is encodes, not latency
        async with httpx.AsyncClient(timeout=60, headers={TIMEOUT_HEADER: "60000"}) as client:
            return await asyncio.gather(
                *[client.post(f"{pods[i % 2].url}/v1/score", json=req) for i in range(BURST)]
            )

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * BURST, [
        r.text for r in responses if r.status_code != 200
    ][:3]
    assert len({tuple(r.json()["scores"]) for r in responses}) == 1
    encodes = sum(p.metric("kvrank_user_encodes_total", kind="full") for p in pods)
    flights = {
        e: [p.metric("kvrank_singleflight_total", event=e) for p in pods]
        for e in ("remote_wait", "remote_hit", "remote_timeout", "shared")
    }
    errors = [p.metric("kvrank_redis_errors_total") for p in pods]
    assert encodes == 1, f"{encodes} full encodes; singleflight {flights}, redis errors {errors}"
    shared = sum(p.metric("kvrank_singleflight_total", event="shared") for p in pods)
    assert shared > 0  # in-process waiters shared a computation instead of repeating it


def test_graceful_shutdown_drains_in_flight_requests(
    spawn_server, factory, server_cfg, make_body
) -> None:
    import signal
    import threading
    import time

    pod = spawn_server("--no-cache")  # C full forwards: a request that takes a while
    req = make_body("slow", factory.user(server_cfg, 30, 4), factory.candidates(server_cfg, 150, 4))
    result: dict[str, object] = {}

    def call() -> None:
        try:
            result["status"] = httpx.post(f"{pod.url}/v1/score", json=req, timeout=60).status_code
        except httpx.HTTPError as exc:
            result["error"] = repr(exc)

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.3)  # the request is being served
    pod.proc.send_signal(signal.SIGTERM)
    t.join(timeout=60)
    assert result.get("status") == 200, result
    # uvicorn re-raises the signal once drained: a clean exit by SIGTERM
    assert pod.proc.wait(timeout=30) in (0, -signal.SIGTERM)


def test_sigterm_keeps_serving_while_not_ready_then_exits(
    spawn_server, factory, server_cfg, make_body
) -> None:
    """Endpoints are updated after SIGTERM, not at it: during the drain delay the pod says
    not-ready but still answers the requests that are still routed to it."""
    import signal
    import time

    pod = spawn_server(env={"KVRANK_DRAIN_DELAY_S": "3"})
    req = make_body("late", factory.user(server_cfg, 10, 5), factory.candidates(server_cfg, 5, 5))
    assert httpx.get(f"{pod.url}/readyz", timeout=5).status_code == 200
    pod.proc.send_signal(signal.SIGTERM)
    sent_at = time.monotonic()
    time.sleep(0.5)
    assert httpx.get(f"{pod.url}/readyz", timeout=5).status_code == 503
    assert httpx.post(f"{pod.url}/v1/score", json=req, timeout=10).status_code == 200
    assert pod.proc.poll() is None, "exited before the drain delay"
    assert pod.proc.wait(timeout=30) in (0, -signal.SIGTERM)
    assert time.monotonic() - sent_at >= 2.5


def test_a_large_entry_is_scored_while_its_tag_is_checked_and_a_forged_one_is_never_answered(
    make_client, flushed, model, factory, server_cfg, make_body
) -> None:
    """Pod B reads entries as a production-size one is read (``off_loop_bytes`` 0): handed to
    the model with every check made but the tag, checked beside. A genuine entry is an L2
    hit whose answer waited for its tag (stage ``tag``); one forged without the secret is
    scored, refused, and the answer is the model's own as a miss (by reference: a 412);
    either way the next request is served from the cache."""
    from dataclasses import replace

    import redis

    store = redis.Redis.from_url(flushed.url)

    def reading_large(pod: TestClient) -> TestClient:
        cache = pod.app.state.kvrank.service.cache
        cache.settings = replace(cache.settings, off_loop_bytes=0)
        return pod

    secret = {"entry_secret": "the deployment's entry secret"}
    pod_a = make_client(redis=shared(flushed.url), **secret)
    user, cands = factory.user(server_cfg, 11, 4), factory.candidates(server_cfg, 5, 4)
    req = make_body("frank", user, cands)
    expected = model.forward_full(user, cands).sigmoid()
    first = pod_a.post("/v1/score", json=req)
    settle(pod_a)
    pod_b = reading_large(make_client(redis=shared(flushed.url), **secret))
    hit = pod_b.post("/v1/score", json=req).json()
    assert hit["cache"] == "l2" and "tag" in hit["timings_ms"], hit
    assert hit["scores"] == first.json()["scores"]
    assert pod_b.post("/v1/score", json=req).json()["cache"] == "l1"  # verified, promoted
    assert 'stage="tag"' in pod_b.get("/metrics").text
    (key,) = flushed.cli("keys", "kvrank:default:*").stdout.split()
    stranger = make_client(redis=shared(flushed.url), entry_secret="a guess at the secret")
    assert stranger.post("/v1/score", json=req).json()["cache"] == "miss"  # and it writes ...
    settle(stranger)  # ... its own entry over pod A's: one pod B's secret does not verify
    forged = store.get(key)
    for path in ("whole", "by reference"):
        store.set(key, forged)
        pod = reading_large(make_client(redis=shared(flushed.url), **secret))
        if path == "whole":
            doc = pod.post("/v1/score", json=req).json()
            assert doc["cache"] == "miss", doc
            assert torch.allclose(torch.tensor(doc["scores"]), expected, atol=1e-5)
            settle(pod)
            assert store.get(key) != forged  # made again and written over it
            assert pod.post("/v1/score", json=req).json()["cache"] == "l1"
        else:
            by_ref = {"user_id": "frank", "candidates": req["candidates"]}
            tag = {"If-Match": first.headers["etag"]}
            answer = pod.post("/v1/score", json=by_ref, headers=tag)
            assert answer.status_code == 412, answer.text
            assert store.get(key) is None  # deleted: the caller resends its events
        assert corrupt_counts(pod) == {"tag": 1, "model": 0}


def test_an_entry_forged_again_before_the_second_lookup_is_still_a_miss_never_an_error(
    make_client, flushed, model, factory, server_cfg, make_body
) -> None:
    """Someone rewrites the forged entry before every lookup: the first is scored beside its
    tag and dropped, the second checks the tag before the entry is handed over, refuses it,
    and the request is answered as a miss with the model's own scores."""
    from dataclasses import replace

    import redis

    store = redis.Redis.from_url(flushed.url)
    secret = {"entry_secret": "the deployment's entry secret"}
    user, cands = factory.user(server_cfg, 10, 6), factory.candidates(server_cfg, 4, 6)
    req = make_body("grace", user, cands)
    stranger = make_client(redis=shared(flushed.url), entry_secret="a guess at the secret")
    stranger.post("/v1/score", json=req)
    settle(stranger)
    (key,) = flushed.cli("keys", "kvrank:default:*").stdout.split()
    forged = store.get(key)
    pod = make_client(redis=shared(flushed.url), **secret)
    cache = pod.app.state.kvrank.service.cache
    cache.settings = replace(cache.settings, off_loop_bytes=0)  # read as a large entry
    lookup, lookups = cache.get_or_create, []

    async def forged_first(*args, **kwargs):  # type: ignore[no-untyped-def]
        store.set(key, forged)
        lookups.append(kwargs.get("tag_beside", args[4] if len(args) > 4 else False))
        return await lookup(*args, **kwargs)

    cache.get_or_create = forged_first
    doc = pod.post("/v1/score", json=req)
    assert doc.status_code == 200, doc.text
    assert doc.json()["cache"] == "miss" and lookups == [True, False], (doc.json(), lookups)
    expected = model.forward_full(user, cands).sigmoid()
    assert torch.allclose(torch.tensor(doc.json()["scores"]), expected, atol=1e-5)
    assert corrupt_counts(pod) == {"tag": 2, "model": 0}
