"""What a log shipper gets from a real `kvrank serve` process: JSON lines only, one access
line per scoring request (errors included; shed ones sampled) with what an on-call engineer
needs — and never the user's id."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from kvrank.server.logs import Sampler


def lines(pod: Any) -> list[dict[str, Any]]:
    pod.stop()  # everything flushed
    text = pod.log.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def access(pod: Any) -> list[dict[str, Any]]:
    return [r for r in lines(pod) if r.get("logger") == "kvrank.access"]


def test_every_line_is_json_and_each_scoring_request_has_an_access_line(
    spawn_server, request_for
) -> None:
    pod = spawn_server()
    _, _, req = request_for(user_id="alice-4711")
    for _ in range(2):
        assert httpx.post(f"{pod.url}/v1/score", json=req, timeout=10).status_code == 200
    for timeout_ms, code in (("1", 503), ("0", 400)):  # refused on its headers: shed, bad
        headers = {"x-kvrank-timeout-ms": timeout_ms}
        answer = httpx.post(f"{pod.url}/v1/score", json=req, headers=headers, timeout=10)
        assert answer.status_code == code, answer.text
    bad = {**req, "candidates": {**req["candidates"], "item_ids": []}}
    assert httpx.post(f"{pod.url}/v1/score", json=bad, timeout=10).status_code == 422
    assert httpx.get(f"{pod.url}/healthz", timeout=10).status_code == 200
    records = access(pod)  # parses every line: a non-JSON line fails here
    assert [r["status"] for r in records] == [200, 200, 503, 400, 422]  # none for /healthz
    first, second, shed, bad_header, invalid = records
    assert shed["route"] == bad_header["route"] == "/v1/score"
    assert shed["user"] is None and shed["latency_ms"] > 0
    assert (first["cache"], second["cache"]) == ("miss", "l1")
    assert first["user"] == second["user"]
    assert len(first["user"]) == 16 and first["candidates"] == len(req["candidates"]["item_ids"])
    assert first["model_version"] == "v1" and first["latency_ms"] > 0
    assert first["severity"] == "info" and first["request_id"] != second["request_id"]
    assert {"timestamp", "message"} <= first.keys()  # the operator's lines have the same keys
    assert invalid["cache"] is None and invalid["user"] is None  # refused before it was read
    assert "alice-4711" not in pod.log.read_text()


@pytest.mark.slow
def test_a_shared_key_follows_a_user_across_pods_and_none_is_per_process(
    spawn_server, request_for
) -> None:
    _, _, req = request_for(user_id="bob")
    key = {"KVRANK_LOG_USER_KEY": "from-a-secret"}
    pods = [spawn_server(env=key), spawn_server(env=key), spawn_server()]
    for pod in pods:
        assert httpx.post(f"{pod.url}/v1/score", json=req, timeout=10).status_code == 200
    a, b, c = ([r["user"] for r in access(pod)] for pod in pods)
    assert a == b and a != c


def test_the_level_and_format_come_from_the_settings(spawn_server, request_for) -> None:
    pod = spawn_server(env={"KVRANK_LOG_LEVEL": "WARNING", "KVRANK_LOG_FORMAT": "text"})
    _, _, req = request_for(user_id="carol")
    assert httpx.post(f"{pod.url}/v1/score", json=req, timeout=10).status_code == 200
    pod.stop()
    assert "kvrank.access" not in pod.log.read_text()  # access lines are INFO


def test_shed_requests_access_lines_are_sampled_and_still_account_for_every_one(
    spawn_server, request_for
) -> None:
    """Under a spike a line per shed request would cost as much as the refusal: the first
    ones of each second are written, the others counted on the next line written."""
    pod = spawn_server()
    _, _, req = request_for(user_id="dave")
    assert httpx.post(f"{pod.url}/v1/score", json=req, timeout=10).status_code == 200
    shed = {"x-kvrank-timeout-ms": "1"}  # less than one miss takes: refused on its headers
    with httpx.Client(base_url=pod.url, timeout=10) as client:
        for _ in range(60):
            assert client.post("/v1/score", json=req, headers=shed).status_code == 503
        time.sleep(1.05)  # the next second: its first shed is written
        assert client.post("/v1/score", json=req, headers=shed).status_code == 503
    records = [r for r in access(pod) if r["status"] == 503]
    assert len(records) < 61 // 2, len(records)
    assert len(records) + sum(r["sheds_not_logged"] for r in records) == 61
    assert records[-1]["sheds_not_logged"] > 0


def test_the_sampler_writes_the_first_lines_of_each_second_then_one_in_every() -> None:
    now = [100.0]
    sampler = Sampler(per_s=3, every=5, clock=lambda: now[0])
    taken = [sampler.take() for _ in range(14)]
    # 3 written, then the 5th after them (the 8th), then the 13th; each says what it skipped
    assert taken == [0, 0, 0, None, None, None, None, 4, None, None, None, None, 4, None]
    now[0] = 101.2
    assert [sampler.take() for _ in range(2)] == [1, 0]
