"""Pure builders of the Kubernetes objects a ``RankerDeployment`` owns.

Every function takes the typed spec (and the resource's name/namespace) and returns plain
dicts; no API calls, no randomness except where a caller passes it in. Owner references
are added by the reconciler, which knows the owner's UID. ``ranker`` builds the serving
side, ``redis`` the managed Redis Cluster, ``common`` what both share, and ``desired``
lists everything that should exist now (the reconcilers' apply sets).
"""

from kvrank_operator.manifests.common import (
    ADMIN_ACCESS_LABEL,
    CONFIG_FILE,
    ENTRY_SECRET_FILE,
    REDIS_PORT,
    deployment_name,
    entry_secret_name,
    image_tag,
    label_value,
    labels,
    password_secret,
    ranker_auth_secret,
    ranker_selector,
    redis_name,
    redis_url,
    restricted_container,
    restricted_pod,
    selector,
    tls_secret_name,
    version_labels,
    version_selector,
)
from kvrank_operator.manifests.desired import Desired, desired_rankers, desired_redis
from kvrank_operator.manifests.ranker import (
    POD_MONITOR_API,
    PROMETHEUS_SELECTOR,
    PodMonitoring,
    config_map,
    deployment,
    network_policies,
    pod_disruption_budget,
    pod_monitor,
    purge_job,
    ranker_config,
    services,
)
from kvrank_operator.manifests.redis import bootstrap_script, managed_redis, tls_dns_names
from kvrank_operator.manifests.router import pods_service, router_name, router_objects

__all__ = [
    "ADMIN_ACCESS_LABEL",
    "CONFIG_FILE",
    "ENTRY_SECRET_FILE",
    "POD_MONITOR_API",
    "PROMETHEUS_SELECTOR",
    "REDIS_PORT",
    "Desired",
    "PodMonitoring",
    "bootstrap_script",
    "config_map",
    "deployment",
    "deployment_name",
    "desired_rankers",
    "desired_redis",
    "entry_secret_name",
    "image_tag",
    "label_value",
    "labels",
    "managed_redis",
    "network_policies",
    "password_secret",
    "pod_disruption_budget",
    "pod_monitor",
    "pods_service",
    "purge_job",
    "ranker_auth_secret",
    "ranker_config",
    "ranker_selector",
    "redis_name",
    "redis_url",
    "restricted_container",
    "restricted_pod",
    "router_name",
    "router_objects",
    "selector",
    "services",
    "tls_dns_names",
    "tls_secret_name",
    "version_labels",
    "version_selector",
]
