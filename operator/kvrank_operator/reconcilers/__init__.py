"""The concerns of a ``RankerDeployment``, and the two deciders of its pass.

A pass first lets the **deciders** settle the spec as it applies now: the cache TTL
(``ttl``, from measured request intervals) and the canary's rollout (``canary``, whose
decisions are :mod:`kvrank_operator.rollout`'s). Then each **concern** — the managed Redis
(``managed_redis``), the model versions' Deployments and Services (``versions``), the
PodMonitor (``monitoring``), cache-affinity routing (``routing``) and the cache namespaces
(``cache_namespaces``) — has one shape (``base.Concern``): what it wants applied, and what
it reports from the one observation after the apply (``observe``). The tuple in
``concerns`` orders them. None imports another (an import-linter contract says so), none
reads another's report and none writes the status: :mod:`kvrank_operator.reconcile`
composes the reports and the handler patches once.
"""
