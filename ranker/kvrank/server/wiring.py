"""The composition root: a :class:`~kvrank.service.RankingService` from a ``ServerConfig``.

Resolves the device and the artifact, loads the model and checks it (refused models never
become ready), then builds the cache tiers, the metrics and the service. Runs on the model
thread (see :mod:`kvrank.runner`): loading runs torch too. Nothing else in the server
constructs a component.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from kvrank.cache import (
    AdaptiveTTL,
    CacheCollector,
    CacheSettings,
    HostStore,
    L1Store,
    RedisSettings,
    RedisStore,
    l1_and_redis,
)
from kvrank.cpus import usable_cpus
from kvrank.errors import ArtifactError, DeviceError
from kvrank.metrics import Metrics
from kvrank.model.artifact import artifact_digest, load_ranker, resolve_artifact
from kvrank.model.checks import CheckPlan, check_model
from kvrank.model.contract import CacheableRanker
from kvrank.model.device import l1_budget, resolve_device
from kvrank.model.golden import load_golden
from kvrank.model.kv import TORCH_DTYPES
from kvrank.model.onetrans import OneTransRanker
from kvrank.model.registry import use_plugin
from kvrank.server.config import ServerConfig, entry_secrets, redis_password
from kvrank.service import RankingService

log = logging.getLogger("kvrank.server")


def build_service(cfg: ServerConfig) -> RankingService:
    """Everything a server needs."""
    threads = cfg.torch_threads or usable_cpus()
    torch.set_num_threads(threads)
    log.info("torch intra-op threads: %d (%s)", threads, "set" if cfg.torch_threads else "quota")
    device = resolve_device(cfg.device)
    local = resolve_artifact(cfg.model_dir, Path(cfg.model_cache_dir), cfg.model_sha256)
    use_plugin(cfg.plugin)
    if cfg.plugin:
        log.info("the artifact's architecture is built by the plugin %s", cfg.plugin)
    model = load_ranker(local, device)
    _check_identity(cfg, model)
    log.info("model %s loaded on %s (%s)", model.version, device, type(model).__name__)
    if cfg.check_model:
        _check(cfg, model, local)
    if cfg.cuda_graphs:
        _use_cuda_graphs(model, device)
    settings = CacheSettings(
        cfg.namespace,
        model.version,
        model.fingerprint(),
        str(device),
        lock_wait_s=cfg.lock_wait_ms / 1e3,
        model_digest=artifact_digest(local),
        kv_dtype=cfg.kv_dtype or _weights_dtype(model),
        secrets=entry_secrets(cfg),
    )
    l1_bytes, chosen = l1_budget(cfg.l1_bytes, device)
    log.info("L1 budget: %.1f MiB (%s)", l1_bytes / 2**20, chosen)
    l1, l2 = L1Store(l1_bytes), _l2(cfg)
    host = HostStore(cfg.host_bytes, str(device)) if cfg.host_bytes else None
    # a model that can check a state it is handed (capability detected) vets Redis's entries
    check = getattr(model, "check_kv", None)
    cache = l1_and_redis(settings, l1, l2, AdaptiveTTL(cfg.ttl), host, check)
    metrics = Metrics(model.version, cfg.namespace, device=str(device))
    metrics.add_reader(CacheCollector(cache, l1, l2, host))
    return RankingService(model, cache, cfg, metrics)  # the config is the service's settings


def _use_cuda_graphs(model: CacheableRanker, device: torch.device) -> None:
    """The config's ``cuda_graphs``, or why this model or device cannot have them. After
    the load-time checks: those hold the model's own passes, which the graphs replay."""
    if device.type != "cuda":
        raise DeviceError(f"cuda_graphs=true needs a CUDA device; this server computes on {device}")
    if not isinstance(model, OneTransRanker):
        raise ArtifactError(
            f"cuda_graphs=true: the built-in model only; this artifact's is {type(model).__name__}"
        )
    model.use_cuda_graphs()
    log.info("scoring passes replayed from CUDA graphs (captured per bucket on first use)")


def _check_identity(cfg: ServerConfig, model: CacheableRanker) -> None:
    """The artifact is the version the config names, and offers the K/V dtype it asks for."""
    if cfg.model_version is not None and model.version != cfg.model_version:
        raise ArtifactError(
            f"the artifact at {cfg.model_dir} is model version {model.version!r},"
            f" expected model_version={cfg.model_version!r}"
        )
    if cfg.kv_dtype is not None and cfg.kv_dtype not in model.kv_dtypes:
        raise ArtifactError(
            f"kv_dtype={cfg.kv_dtype!r}: this model offers {sorted(model.kv_dtypes)} only"
        )


def _weights_dtype(model: CacheableRanker) -> str | None:
    """What the model stores K/V in when asked for no dtype: its weights' (``None``: mixed,
    entries of any dtype are then opened, and still checked by the model)."""
    dtypes = {p.dtype for p in model.module.parameters() if p.is_floating_point()}
    names = {dtype: name for name, dtype in TORCH_DTYPES.items()}
    return names.get(dtypes.pop()) if len(dtypes) == 1 else None


def _check(cfg: ServerConfig, model: CacheableRanker, local: Path) -> None:
    """The load-time checks of the paths this config will use; a failure refuses the model."""
    plan = CheckPlan(
        thorough=False,  # the shapes that matter; `kvrank check-model` tries them all
        kv_dtypes=(cfg.kv_dtype,) if cfg.kv_dtype else (),
        score_many=cfg.microbatch_max > 1,
        extend=cfg.incremental != "off",
        golden=load_golden(local, model.features),
    )
    report = check_model(model, plan)
    for r in report.results:
        log.info("model check %s: %s (%s)", r.name, "ok" if r.passed else "FAILED", r.detail)
    report.raise_for_failure()


def _l2(cfg: ServerConfig) -> RedisStore | None:
    if not cfg.redis.url:
        return None
    return RedisStore(
        RedisSettings(
            cfg.redis.url,
            cluster=cfg.redis.cluster,
            password=redis_password(cfg.redis),
            tls_ca_file=cfg.redis.tls_ca_file,
            tls_check_hostname=cfg.redis.tls_check_hostname,
            op_timeout_s=cfg.redis.op_timeout_ms / 1e3,
        )
    )
