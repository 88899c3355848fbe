"""The API client's apply ledger: what is sent again and when."""

from __future__ import annotations

from spec_fragments import example

from kvrank_operator import manifests as m
from kvrank_operator.spec import parse_spec


def test_an_unchanged_object_is_not_sent_again_until_the_reapply_period() -> None:
    from kvrank_operator.kube import ApplyLedger

    now = [0.0]
    ledger = ApplyLedger(reapply_s=300, clock=lambda: now[0])  # a short period, for the test
    key = ("v1", "ConfigMap", "prod", "feed-config")
    cm = m.config_map(parse_spec(example("basic.yaml")), "feed", "prod", 30.0)
    digest = ledger.digest(cm)
    assert ledger.needs_sending(key, digest)
    ledger.sent(key, digest)
    now[0] = 299.0
    assert not ledger.needs_sending(key, digest)  # the steady state: no write
    changed = ledger.digest(m.config_map(parse_spec(example("basic.yaml")), "feed", "prod", 45.0))
    assert ledger.needs_sending(key, changed)  # a new TTL goes out at once
    now[0] = 300.0
    assert ledger.needs_sending(key, digest)  # drift is undone within the period
    ledger.sent(key, digest)
    ledger.forget()
    assert ledger.needs_sending(key, digest)  # a new spec: everything goes out again
