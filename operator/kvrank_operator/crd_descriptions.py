"""What each RankerDeployment field means, for ``kubectl explain`` and the reference page
(``docs/reference/rankerdeployment.md``), by the field's path. A description written beside
the field's schema in :mod:`kvrank_operator.crd` wins; these fill in the rest, so that no
field is left without one (a test holds every field to it, and every path here to a field).
"""

from __future__ import annotations

from typing import Any

DESCRIPTIONS: dict[str, str] = {
    "spec": "The model to serve, its cache, and how a new version rolls out.",
    "spec.model": "The stable model version: its artifact, image, replicas and pods.",
    "spec.model.replicas": "Ranker pods of the stable version (the scale subresource sets it;"
    " a canary's pods are split off it by weight unless canary.replicas is set).",
    "spec.model.nodeSelector": "Node labels the ranker pods must run on (e.g. a GPU pool).",
    "spec.model.tolerations": "Tolerations of the ranker pods (core/v1 Toleration), e.g. for"
    " tainted GPU nodes.",
    "spec.model.env": "Extra environment variables of the ranker container (KVRANK_* settings"
    " among them).",
    "spec.model.env[].name": "The variable's name.",
    "spec.model.env[].value": "A literal value (or valueFrom).",
    "spec.model.pod": "What platforms set on every ranker pod of this resource.",
    "spec.model.pod.imagePullSecrets[].name": "A Secret of type dockerconfigjson in the"
    " resource's namespace.",
    "spec.model.pod.serviceAccountName": "The pods' ServiceAccount (its token is mounted only"
    " when one is named: rankers call no Kubernetes API).",
    "spec.model.pod.labels": "Extra pod labels (policy, cost allocation); app.kubernetes.io/*"
    " and kvrank.io/* are the operator's.",
    "spec.model.pod.annotations": "Extra pod annotations (a service mesh, a log shipper).",
    "spec.model.pod.priorityClassName": "The pods' PriorityClass.",
    "spec.model.pod.runtimeClassName": "The pods' RuntimeClass (e.g. nvidia).",
    "spec.model.pod.securityContext.runAsUser": "The uid the ranker runs as (default: the"
    " image's, 10001).",
    "spec.model.pod.securityContext.runAsGroup": "The primary gid the ranker runs as.",
    "spec.model.pod.securityContext.fsGroup": "The gid that owns the pod's volumes.",
    "spec.model.pod.startupProbe.periodSeconds": "Seconds between two startup checks.",
    "spec.model.pod.startupProbe.failureThreshold": "Failed checks before the pod is restarted:"
    " periodSeconds x failureThreshold is the time allowed to download, load and warm up.",
    "spec.canary": "A second model version taking a share of the traffic, in its own cache"
    " namespace; with steps, rolled out and promoted or aborted by the operator. Removing it"
    " aborts a rollout.",
    "spec.canary.uri": "The canary's artifact location: a path in a mounted volume or the"
    " image, an http(s):// URL, s3://bucket/prefix, gs://bucket/prefix or oci://<model image>"
    " (as model.uri).",
    "spec.canary.weight": "Percent of the traffic (and replicas) the canary takes when it has"
    " no steps; it stays there until promoted in the spec.",
    "spec.canary.replicas": "Canary pods, instead of a weight's share of model.replicas (the"
    " stable version then keeps all of its own).",
    "spec.canary.shadow.sample": "Share of their answered requests the stable pods mirror to"
    " the canary, off the request path.",
    "spec.canary.shadow.topK": "The top-k whose membership change the shadow comparison counts"
    " (topKChangedRatio).",
    "spec.canary.warmup.hitRatio": "The canary joins the Service once its cache hit ratio on"
    " mirrored requests reaches this.",
    "spec.canary.warmup.minRequests": "... over at least this many mirrored requests.",
    "spec.canary.warmup.timeoutSeconds": "After this long warming, the canary joins anyway"
    " (a WarmupTimedOut Warning).",
    "spec.canary.steps[].weight": "Percent of the traffic the canary takes in this step.",
    "spec.canary.steps[].pauseSeconds": "The least time the step lasts; its checks must pass"
    " over it before the next step.",
    "spec.canary.analysis.p99LatencyRatio.max": "Largest canary p99 / stable p99 latency.",
    "spec.canary.analysis.errorRatio.max": "Largest share of the canary's answers that are 5xx.",
    "spec.canary.analysis.hitRatio.min": "Smallest canary cache hit ratio.",
    "spec.canary.analysis.scoreDelta.max": "Largest |stable score - canary score| at the"
    " quantile, over mirrored requests.",
    "spec.canary.analysis.scoreDelta.quantile": "The quantile of the score deltas compared to max.",
    "spec.canary.analysis.rankCorrelation.min": "Smallest Spearman rank correlation per"
    " mirrored request, at the quantile.",
    "spec.canary.analysis.rankCorrelation.quantile": "The (low) quantile of the per-request"
    " correlations compared to min.",
    "spec.canary.analysis.topKChangedRatio.max": "Largest share of mirrored requests whose"
    " top-k set changed.",
    "spec.canary.analysis.source": "Where the counters come from: the ranker pods' /metrics"
    " (pods) or Prometheus.",
    "spec.canary.analysis.source.type": "pods (default) or prometheus (then prometheus.url).",
    "spec.cache": "The user-side K/V cache: the pods' own (L1) and Redis (L2), shared by all.",
    "spec.cache.l1Bytes": "Bytes of entries each pod keeps on its device (L1); 0 turns L1 off."
    " Unset: half of the GPU's memory free once the model is loaded (512 MiB on a CPU); each"
    " pod reports its budget in /readyz and kvrank_l1_budget_bytes.",
    "spec.cache.kvDtype": "How entries are stored: bf16/fp16 halve fp32's bytes, int8 quarters"
    " them (a small, measured score change: docs/benchmarks.md).",
    "spec.cache.redis": "The shared L2 cache: a Redis Cluster the operator runs (managed) or"
    " one of yours (external).",
    "spec.cache.redis.mode": "managed: the operator deploys and heals a Redis Cluster;"
    " external: url (and passwordSecretRef) name yours.",
    "spec.cache.redis.shards": "Managed: Redis masters (hash slots split between them); fixed"
    " once the cluster is formed.",
    "spec.cache.redis.replicasPerShard": "Managed: replicas of each master (promoted when it"
    " is lost); fixed once formed.",
    "spec.cache.redis.memory": "Managed: memory per Redis node, a byte quantity (1Gi): the"
    " pod's memory request and limit, and maxmemory at 90 % of it (LRU eviction).",
    "spec.cache.redis.nodeSelector": "Managed: node labels the Redis pods must run on.",
    "spec.cache.redis.tolerations": "Managed: tolerations of the Redis pods.",
    "spec.cache.redis.persistence": "Managed: append-only files on a PersistentVolumeClaim of"
    " `memory`'s size per node, instead of an emptyDir (a cache: off by default).",
    "spec.cache.redis.url": "External: redis:// or rediss:// URL of your Redis.",
    "spec.cache.redis.cluster": "External: the URL is a Redis Cluster node (cluster mode).",
    "spec.cache.redis.passwordSecretRef": "External: the Secret key holding the Redis password.",
    "spec.cache.redis.passwordSecretRef.name": "The Secret's name (in the resource's namespace).",
    "spec.cache.redis.passwordSecretRef.key": "The key in the Secret.",
    "spec.cache.redis.tls": "TLS to Redis: external, the url is rediss://; managed, every"
    " connection to and between the nodes, with a generated CA unless tlsSecretName is set.",
    "spec.cache.retiredNamespaceGraceSeconds": "After a version leaves (promoted over, or"
    " aborted), its cache namespace is purged from Redis this long after.",
    "spec.ttl": "How long a user's entry lives: measured from the users' request intervals"
    " (auto) or fixed.",
    "spec.ttl.mode": "auto: clamp(mean interval x factor, minSeconds, maxSeconds), re-measured"
    " every intervalSeconds; fixed: fixedSeconds.",
    "spec.ttl.fixedSeconds": "The TTL when mode is fixed.",
    "spec.ttl.factor": "Auto: the TTL is the users' mean request interval times this.",
    "spec.ttl.minSeconds": "Auto: the shortest TTL set.",
    "spec.ttl.maxSeconds": "Auto: the longest TTL set.",
    "spec.ttl.jitter": "Each entry's TTL varies by up to this share, so entries written"
    " together do not expire together.",
    "spec.ttl.source": "Where request intervals are read: the ranker pods' /metrics (pods) or"
    " Prometheus.",
    "spec.ttl.source.type": "pods (default) or prometheus (then prometheus.url).",
    "spec.ttl.intervalSeconds": "How often the operator measures and, when it moved by more"
    " than 10 %, rewrites the TTL.",
    "spec.service": "The shared Service callers score through (status.url).",
    "spec.service.port": "The Service's port (the rankers' scoring port; not 8081, the admin"
    " port).",
    "spec.service.type": "ClusterIP, NodePort or LoadBalancer.",
    "spec.routing.replicas": "Bundled: router (Envoy) pods.",
    "spec.routing.clusterDomain": "Bundled: the cluster's DNS domain (the router finds each"
    " version's pods by name).",
    "spec.routing.gateway.name": "Gateway mode: the Gateway the HTTPRoute attaches to.",
    "spec.routing.gateway.namespace": "Gateway mode: its namespace (default: the resource's).",
    "spec.routing.gateway.sectionName": "Gateway mode: the Gateway's listener to attach to.",
    "spec.routing.gateway.hostnames": "Gateway mode: the HTTPRoute's hostnames.",
    "status": "Written by the operator: conditions, replicas per version, the TTL and hit"
    " ratio, the rollout and the cache namespaces (see kubectl get rkd NAME -o yaml).",
    "status.conditions": "The resource's conditions, one per type: Ready (every version's"
    " pods Ready), Progressing, Degraded (an invalid spec), RankersStarted, CacheReady (Redis"
    " answers), CanaryReady, CanaryAnalysis, TTLSource, RouterReady and Monitoring"
    " (docs/troubleshooting.md says what each reason means).",
    "status.conditions[].type": "The condition, e.g. Ready.",
    "status.conditions[].status": "True, False or Unknown.",
    "status.conditions[].reason": "Why, in one CamelCase word (docs/troubleshooting.md).",
    "status.conditions[].message": "Why, for a person.",
    "status.conditions[].observedGeneration": "The spec generation this was decided on.",
    "status.conditions[].lastTransitionTime": "When status last flipped.",
    "status.observedGeneration": "The spec generation the operator last reconciled.",
    "status.url": "Where callers in the cluster score: the shared Service's URL.",
    "status.replicas": "Ready ranker pods of every version (the scale subresource's"
    " running replicas).",
    "status.selector": "The label selector of every ranker pod of this resource (the scale"
    " subresource's; an autoscaler reads it).",
    "status.readyText": "Ready pods / desired pods of the serving versions (kubectl get's"
    " Pods column).",
    "status.versions": "Each live model version: its role and pods.",
    "status.versions[].version": "The model version.",
    "status.versions[].role": "stable or canary.",
    "status.versions[].replicas": "Pods desired for this version.",
    "status.versions[].readyReplicas": "Of those, Ready.",
    "status.canary": "The canary's rollout; after it ended, how it ended (ended: true).",
    "status.canary.version": "The canary's model version.",
    "status.canary.phase": "Starting, Warming (shadow traffic fills its cache), Progressing"
    " (steps), Manual (waits for a person), Promoted or Aborted.",
    "status.canary.since": "When it entered this phase or step.",
    "status.canary.step": "The current step, 1 ... len(steps); 0 before the first.",
    "status.canary.message": "What the rollout waits for, or why it moved.",
    "status.canary.weight": "The canary's share of traffic now, in percent.",
    "status.canary.stepText": "The step as n/total.",
    "status.canary.checks": "The current step's analysis, one entry per check.",
    "status.canary.checks[].metric": "The metric checked (spec.canary.analysis.checks).",
    "status.canary.checks[].value": "The canary's value over the window (null: no data).",
    "status.canary.checks[].max": "The bound it must not exceed.",
    "status.canary.checks[].min": "The bound it must reach.",
    "status.canary.checks[].samples": "Requests the value is measured over.",
    "status.canary.checks[].minSamples": "Requests needed before the check decides.",
    "status.canary.checks[].result": "pass, fail or inconclusive (too few samples or no data).",
    "status.canary.warmHitRatio": "Warming: the canary cache's hit ratio on shadow traffic.",
    "status.canary.warmRequests": "Warming: shadow requests the canary has served.",
    "status.canary.reason": "Aborted: why.",
    "status.canary.ended": "The spec no longer names this canary: the record says how its"
    " rollout ended.",
    "status.ttl": "The cache TTL in force: what the ranker pods' ConfigMap carries.",
    "status.ttl.seconds": "The TTL, in seconds.",
    "status.ttl.meanIntervalSeconds": "The mean per-user request interval it was derived"
    " from (null: a fixed TTL).",
    "status.ttl.updatedAt": "When the TTL was last set.",
    "status.ttl.source": "fixed, pods or prometheus: where the interval was read.",
    "status.hitRatio": "Requests served from a cache / requests, as last measured.",
    "status.observedAt": "When the TTL tuner's published values last changed.",
    "status.cacheNamespaces": "Each model version's cache namespace in Redis, live or"
    " retired, until it is purged.",
    "status.cacheNamespaces[].version": "The model version.",
    "status.cacheNamespaces[].namespace": "The key prefix its entries are written under.",
    "status.cacheNamespaces[].role": "The role the version had when it was last live.",
    "status.cacheNamespaces[].state": "active (a live version's), retired (kept warm for a"
    " rollback), purging (a Job deletes its keys) or purged.",
    "status.cacheNamespaces[].since": "When it entered this state.",
    "status.cacheNamespaces[].purgeAfter": "Retired: when its purge is due.",
    "status.cacheNamespaces[].job": "Purging: the purge Job's name.",
    "status.kopf": "The operator framework's own bookkeeping (kopf); not the user's.",
}


def described(schema: dict[str, Any], path: str = "") -> dict[str, Any]:
    """``schema`` with a description from :data:`DESCRIPTIONS` on every field that has none
    of its own (``path``: the field's, ``spec.model.env[].name`` style)."""
    out = dict(schema)
    if path and "description" not in out and path in DESCRIPTIONS:
        out["description"] = DESCRIPTIONS[path]
    if "properties" in out:
        out["properties"] = {
            key: described(child, f"{path}.{key}" if path else key)
            for key, child in out["properties"].items()
        }
    if "items" in out:
        out["items"] = described(out["items"], f"{path}[]")
    return out
