"""One reconciler per concern of a ``RankerDeployment``.

Each module owns one part of what the operator manages — the model versions' Deployments
and Services (``versions``), the managed Redis (``managed_redis``), the canary's rollout
(``canary``, whose decisions are :mod:`kvrank_operator.rollout`'s), the cache namespaces
(``cache_namespaces``), the cache TTL (``ttl``), cache-affinity routing (``routing``) and
the PodMonitor (``monitoring``) — and returns its part of the status as typed values plus a
:class:`~kvrank_operator.reconcilers.base.Report` (conditions, Events, its next deadline).
They share only the pass's inputs (``base.Pass``) and the one read of the cluster
(``observe``); none imports another (an import-linter contract says so), and none writes
the status: :mod:`kvrank_operator.reconcile` composes them and the handler patches once.
"""
