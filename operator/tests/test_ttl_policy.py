"""The TTL policy the operator tunes by: the target, its hysteresis, and the same TTL a pod
would apply to the same mean."""

from __future__ import annotations

import pytest

from kvrank_operator.spec import parse_spec
from kvrank_operator.ttl_policy import next_ttl, parse_interval_means, target_ttl


def test_ttl_policy_with_hysteresis() -> None:
    spec = parse_spec({"model": {"version": "v1", "uri": "/m"}}).ttl
    assert target_ttl(10, spec) == 30 and target_ttl(1000, spec) == 300
    assert next_ttl(None, 10, spec) == 30
    assert next_ttl(30, 10.5, spec) is None  # 31.5 is within 10 %
    assert next_ttl(30, 20, spec) == 60
    assert next_ttl(30, None, spec) is None
    text = (
        'kvrank_user_interval_mean_seconds{cache_namespace="a",model_version="v1"} 4.0\n'
        'kvrank_user_interval_mean_seconds{cache_namespace="b",model_version="v1"} 0.0\n'
    )
    assert parse_interval_means(text) == [4.0]


@pytest.mark.parametrize("knobs", [{}, {"factor": 2.0, "minSeconds": 5, "maxSeconds": 60}])
def test_the_pods_config_gives_them_the_ttl_policy_the_operator_tunes_by(knobs: dict) -> None:
    """The operator computes the TTL it writes into the pods' config from the policy it
    writes beside it; a pod reading that section applies the same TTL to the same mean."""
    from kvrank.cache.adaptive_ttl import TTLSettings, ttl_for

    spec = parse_spec({"model": {"version": "v1", "uri": "/m"}, "ttl": knobs}).ttl
    ranker = TTLSettings(**spec.ranker_settings(None))
    for mean in (0.1, 1.5, 10.0, 42.0, 1000.0):
        assert target_ttl(mean, spec) == ttl_for(mean, ranker)
