"""Deployments sharing one Redis, each through an ACL user limited to its own cache
namespace (``docs/reference/redis-acl.md``): each serves its own entries from Redis, neither
can read or overwrite the other's, and a pod pointed at a namespace its user may not touch
still answers every request (Redis refusing is a cache failure: a miss)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
import torch
from redis.exceptions import NoPermissionError

from kvrank.cache import (
    CacheSettings,
    Created,
    L1Store,
    Outcome,
    RedisSettings,
    RedisStore,
    TieredCache,
    l1_and_redis,
    purge_namespace,
)
from kvrank_common import acl_rules

pytestmark = pytest.mark.redis

PASSWORD = "per-deployment-redis-password"
OWNERS = {"feed": "feed-3f9a2c81", "ads": "ads-0b7e44d2"}
"""Each deployment's part of its cache namespaces, as the operator names them
(``<owner>.<version>``); its user's rules cover ``<owner>.*``: every version, no other."""


@pytest.fixture(params=["redis", "redis-cluster"])
def acl_users(request, redis_server, redis_cluster):
    """ACL users ``feed`` and ``ads`` on the shared redis-server (or every node of the Redis
    Cluster), each limited to its own deployment's namespaces by :func:`acl_rules`; deleted
    afterwards.
    Yields (a node, whether it is a cluster)."""
    cluster = request.param == "redis-cluster"
    nodes = redis_cluster.nodes if cluster else [redis_server]
    redis_cluster.flush() if cluster else redis_server.cli("flushall")
    for node in nodes:
        for user in ("feed", "ads"):
            rules = acl_rules(f"{OWNERS[user]}.*")
            out = node.cli("acl", "setuser", user, "reset", "on", f">{PASSWORD}", *rules)
            assert out.stdout.strip() == "OK", out.stdout + out.stderr
    yield nodes[0], cluster
    for node in nodes:
        node.cli("acl", "deluser", "feed", "ads")


def url_as(server, user: str) -> str:
    return server.url.replace("redis://", f"redis://{user}@")


async def test_each_deployment_reads_only_its_own_namespace(
    acl_users, model, factory, tiny_cfg, patient_s
):
    user = factory.user(tiny_cfg, 8, 1)
    cands = factory.candidates(tiny_cfg, 5, 1)
    reference = model.forward_full(user, cands)
    made: list[TieredCache] = []

    server, cluster = acl_users

    def pod(redis_user: str, namespace: str) -> TieredCache:
        url = url_as(server, redis_user)
        settings = RedisSettings(url, cluster=cluster, password=PASSWORD, op_timeout_s=patient_s)
        fp = model.cfg.fingerprint()
        made.append(
            l1_and_redis(CacheSettings(namespace, "v1", fp), L1Store(10**7), RedisStore(settings))
        )
        return made[-1]

    async def create(prefix: object = None) -> Created:
        return Created(model.encode_user(user), Outcome.MISS, "encode")

    try:
        # each deployment (feed with a canary version): a miss on one pod, an L2 hit on the next
        for name, version in (("feed", "v1"), ("feed", "v2"), ("ads", "v1")):
            namespace = f"{OWNERS[name]}.{version}"
            first, second = pod(name, namespace), pod(name, namespace)
            key = first.key("u", "h8")
            assert (await first.get_or_create(key, 8, create)).outcome is Outcome.MISS
            await first.flush()
            hit = await second.get_or_create(key, 8, create)
            assert hit.outcome is Outcome.L2
            torch.testing.assert_close(model.score(hit.kv, cands), reference, atol=1e-5, rtol=0)
        # a feed pod configured with the ads namespace: Redis refuses it; it still answers
        astray = pod("feed", f"{OWNERS['ads']}.v1")
        found = await astray.get_or_create(astray.key("u", "h8"), 8, create)
        assert found.outcome is Outcome.MISS and astray.tiers[-1].store.stats.errors > 0
        torch.testing.assert_close(model.score(found.kv, cands), reference, atol=1e-5, rtol=0)
        await astray.flush()
        # and the ads entry it could not overwrite is still ads' own
        again = pod("ads", f"{OWNERS['ads']}.v1")
        assert (await again.get_or_create(again.key("u", "h8"), 8, create)).outcome is Outcome.L2
    finally:
        for cache in made:
            await cache.close()


async def test_a_purge_as_the_deployments_user_removes_its_namespace_only(acl_users):
    """The purge Job authenticates as the deployment's ACL user (its name in the URL): on a
    Redis Cluster it reaches every master as that user, removes the retired namespace's keys
    and leaves another deployment's alone."""
    server, cluster = acl_users
    retired, kept = f"{OWNERS['feed']}.v1", f"{OWNERS['ads']}.v1"
    root = (aioredis.RedisCluster if cluster else aioredis.Redis).from_url(server.url)
    keys = {ns: [f"kvrank:{ns}:v1:user-{i}:h8" for i in range(30)] for ns in (retired, kept)}
    try:
        for key in keys[retired] + keys[kept]:  # over every master's slots
            await root.set(key, b"entry")
        settings = RedisSettings(url_as(server, "feed"), cluster=cluster, password=PASSWORD)
        assert await purge_namespace(settings, retired) == 30
        with pytest.raises(NoPermissionError):  # another deployment's keys: refused
            await purge_namespace(settings, kept)
        assert [await root.get(key) for key in keys[retired]] == [None] * 30
        assert [await root.get(key) for key in keys[kept]] == [b"entry"] * 30
    finally:
        await root.aclose()


async def test_a_deployments_user_cannot_read_or_delete_anothers_keys(redis_server):
    redis_server.cli("flushall")
    for user in ("feed", "ads"):
        rules = acl_rules(f"{OWNERS[user]}.*")
        redis_server.cli("acl", "setuser", user, "reset", "on", f">{PASSWORD}", *rules)
    ads_key = f"kvrank:{OWNERS['ads']}.v1:v1:u:h8"
    ads = aioredis.Redis.from_url(url_as(redis_server, "ads"), password=PASSWORD)
    feed = aioredis.Redis.from_url(url_as(redis_server, "feed"), password=PASSWORD)
    try:
        assert await ads.set(ads_key, b"entry")
        for command in (feed.get(ads_key), feed.unlink(ads_key), feed.set(ads_key, b"x")):
            with pytest.raises(NoPermissionError):
                await command
        for command in (feed.flushall(), feed.config_get("*"), feed.keys("*")):
            with pytest.raises(NoPermissionError):
                await command
        assert await ads.get(ads_key) == b"entry"
    finally:
        await ads.aclose()
        await feed.aclose()
        redis_server.cli("acl", "deluser", "feed", "ads")
