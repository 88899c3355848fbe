"""Server configuration: one typed root (pydantic-settings), read once at start-up from
defaults ← an optional JSON/YAML file ← ``KVRANK_*`` environment variables ← CLI flags
(later wins).

Every field is also an environment variable: ``KVRANK_<FIELD>`` for top-level fields and
``KVRANK_<SECTION>_<FIELD>`` inside a section (``KVRANK_REDIS_URL``,
``KVRANK_TTL_FIXED_SECONDS``), so the names cannot drift from the fields. The file is
watched while serving: changes to its ``ttl`` and ``shadow`` sections (the operator writes
them) apply without a restart. Secrets (the Redis password, the cache-entry secret) come from
``KVRANK_REDIS_PASSWORD`` / ``KVRANK_ENTRY_SECRET`` or a mounted Secret file, never from the
config file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from kvrank.admission import AdmissionSettings
from kvrank.cache import LOCK_WAIT_S, TTLSettings
from kvrank.model.config import KVDType
from kvrank.model.ranker import DEFAULT_REFRESH_EVERY
from kvrank.server.logs import LogConfig
from kvrank.server.shadow import ShadowConfig

ENV_PREFIX = "KVRANK_"
ROUTING_HEADER = "X-KVRank-User"
"""Where callers put the user id for a proxy to hash (``routing_header``'s default)."""


class RedisConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(None, description="redis:// or rediss:// URL; None: L1 only.")
    cluster: bool = False
    password_file: str | None = Field(None, description="File holding the password (Secret).")
    password: SecretStr | None = Field(
        None, exclude=True, description="From KVRANK_REDIS_PASSWORD only (never the file)."
    )
    tls_ca_file: str | None = Field(None, description="rediss://: trust only this CA file.")
    tls_check_hostname: bool = Field(
        True, description="rediss://: the certificate must name the host (off: chain only)."
    )
    op_timeout_ms: float = Field(20.0, gt=0, le=10_000)


class ServerConfig(BaseSettings):
    model_config = SettingsConfigDict(
        extra="forbid",
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="_",
        env_nested_max_split=1,
    )

    model_dir: str = Field(
        "artifacts/quick",
        description="Artifact directory, or an http(s):// URL, s3://bucket/prefix or"
        " gs://bucket/prefix to download.",
    )
    model_cache_dir: str = Field(
        "/tmp/kvrank-models", description="Where artifacts given by URL are downloaded."
    )
    model_version: str | None = Field(
        None,
        description="When set, the artifact's version must equal it (the operator sets it to"
        " the version its Deployment is labelled with).",
    )
    model_name: str = Field(
        "ranker",
        pattern=r"^[A-Za-z0-9_.\-]{1,253}$",
        description="The name the Open Inference Protocol serves the model under"
        " (/v2/models/{model_name}); the operator sets the RankerDeployment's name.",
    )
    model_sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-fA-F]{64}$",
        description="SHA-256 of the artifact (config.json and model.safetensors: what"
        " `kvrank model-digest DIR` prints): checked after download (a mismatch is never"
        " cached) and on a local directory.",
    )
    device: str = Field(
        "auto",
        description="auto: CUDA when torch sees a GPU, else the CPU; cpu; cuda or cuda:N (the"
        " pod exits when it has no GPU). The operator sets cuda for versions requesting"
        " nvidia.com/gpu.",
    )
    cuda_graphs: bool = Field(
        False,
        description="Score the built-in model's passes from CUDA graphs, one per bucket of"
        " users × candidates (padded to it), captured on first use: a GPU pass is bound by"
        " launching its kernels. A CUDA device and the built-in model only; off until"
        " measured on a GPU (make bench-cuda).",
    )
    check_model: bool = Field(
        True,
        description="Run the cacheability checks (kvrank check-model) at load, before ready;"
        " a failure stops the server naming the check.",
    )
    torch_threads: int = Field(
        0,
        ge=0,
        le=1024,
        description="torch intra-op threads; 0: the CPUs the pod's cgroup quota allows"
        " (rounded down, at least 1; every core when there is no quota), not torch's one"
        " per core of the node, which under a CPU limit spin away the quota and throttle"
        " the event loop with them.",
    )
    namespace: str = Field("default", pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    entry_secret_file: str | None = Field(
        None,
        description="File holding the deployment's cache-entry secret (a Secret; the operator"
        " creates one per RankerDeployment): every L2 entry carries a tag keyed by it, and"
        " an entry whose tag does not verify is a miss. One secret per line: the first seals,"
        " every one opens (to rotate, put the new one first, roll the pods, then drop the old)."
        " Unset: entries are bound to their key and model but not authenticated.",
    )
    entry_secret: SecretStr | None = Field(
        None, exclude=True, description="From KVRANK_ENTRY_SECRET only (never the file)."
    )
    plugin: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="module:builder that builds the artifact's architecture, from a module"
        " importable here (the working directory or PYTHONPATH) rather than an installed"
        " package: for trying a model before packaging it. Its source is part of the"
        " model's cache identity.",
    )
    kv_dtype: KVDType | None = None
    l1_bytes: int | None = Field(
        None,
        ge=0,
        description="Bytes of entries L1 keeps on the serving device (0: none); unset: half"
        " of a GPU's memory free once the model is loaded, 512 MiB on a CPU. The budget in"
        " force is in /readyz and kvrank_l1_budget_bytes.",
    )
    host_bytes: int = Field(
        0,
        ge=0,
        description="Host-memory tier between L1 and Redis (pinned on CUDA): what L1 evicts"
        " for room is kept here while its TTL lasts; 0: off.",
    )
    redis: RedisConfig = Field(default_factory=RedisConfig)
    ttl: TTLSettings = Field(default_factory=TTLSettings)
    cache_mode: Literal["kv", "full"] = Field(
        "kv",
        description="kv: cached K/V; full: no cache, the C full sequences batched (chunks of"
        " 32) per request.",
    )
    lock_wait_ms: float = Field(LOCK_WAIT_S * 1e3, ge=0, le=1000)
    microbatch_ms: float = Field(
        0.0,
        ge=0,
        le=100,
        description="Hold each score back this long for others to join its pass (0: none;"
        " the scores queued while the model is busy share a pass anyway).",
    )
    microbatch_max: int = Field(
        32, ge=1, le=1024, description="Requests one scoring pass takes at most (1: each alone)."
    )
    microbatch_rows: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="Padded candidate rows (requests × their most candidates) one scoring pass"
        " takes at most; 0: by device (512 on a CPU, 16,384 on a GPU).",
    )
    incremental: Literal["exact", "approximate", "off"] = Field(
        "exact",
        description="exact: extend a cached user only when it equals a full encode, else"
        " encode in full; approximate: extend also once a window slides (bounded drift,"
        " see refresh_every); off: always encode in full.",
    )
    refresh_every: int = Field(
        DEFAULT_REFRESH_EVERY, ge=1, description="approximate: full encode after N extends."
    )
    routing_header: str = Field(
        ROUTING_HEADER,
        pattern=r"^[A-Za-z0-9-]{1,64}$",
        description="The header a proxy hashes to send a user to one pod (it never reads the"
        " body); when a request carries it, it must equal the body's user_id (else 400).",
    )
    admission: AdmissionSettings = Field(
        default_factory=AdmissionSettings,
        description="What one pod takes on under a spike: requests it cannot serve before"
        " their deadline are refused at once (503, Retry-After), work nobody waits for is"
        " dropped.",
    )
    prefetch_max_inflight: int = Field(
        64, ge=0, le=4096, description="Prefetches being made at once; more are dropped (202)."
    )
    max_body_bytes: int = Field(4 * 2**20, ge=1024)
    drain_delay_s: float = Field(
        5.0,
        ge=0,
        le=120,
        description="On SIGTERM keep serving (readyz 503) this long while endpoints update.",
    )
    shutdown_grace_s: float = Field(
        20.0,
        ge=0,
        le=600,
        description="Then finish in-flight requests within this (drain + grace < the pod's 30 s).",
    )
    keep_alive_s: float = Field(
        75.0,
        ge=1,
        le=3600,
        description=(
            "An idle connection is closed after this long. Longer than the idle timeout of the"
            " proxies in front (the bundled router's and the queue proxy's 30 s): a proxy that"
            " reuses a connection the ranker is closing sees a reset and retries on another pod,"
            " which moves a user away from its cached entry."
        ),
    )
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    admin_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Set: /admin/* is served on this port only (keep it out of the scoring"
        " Service), everything else on `port` only. Unset: all on `port` (local use).",
    )
    probe_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Set: /healthz and /readyz are also answered on this port by a thread of"
        " their own, never behind scoring work (the kubelet's probes: a saturated pod stays"
        " ready and alive). Unset: on `port` only.",
    )
    grpc_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Set: the Open Inference Protocol's gRPC service"
        " (inference.GRPCInferenceService) on this port, beside the HTTP API. Unset: none.",
    )
    fronts: int = Field(
        0,
        ge=0,
        le=64,
        description="0: one process serves (HTTP, parsing and the model share one"
        " interpreter). N: an engine process owns the model, the cache and admission control,"
        " and N front processes share the ports, parse and validate requests and hand the"
        " engine tensors over a Unix socket in `run_dir`.",
    )
    run_dir: str | None = Field(
        None,
        description="With fronts: where the engine's socket and the processes' metrics files"
        " live (a fresh directory under the system's temporary one when unset).",
    )
    config_file: str | None = None
    log: LogConfig = Field(default_factory=LogConfig)
    shadow: ShadowConfig = Field(
        default_factory=ShadowConfig,
        description="Mirror a sampled share of answered requests to a canary and compare"
        " scores; hot-reloaded from the file.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _ConfigFile(settings_cls, init_settings)


class _ConfigFile(PydanticBaseSettingsSource):
    """The JSON/YAML file named by ``config_file`` (a flag or ``KVRANK_CONFIG_FILE``)."""

    def __init__(self, settings_cls: type[BaseSettings], flags: PydanticBaseSettingsSource):
        super().__init__(settings_cls)
        self.flags = flags

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # the whole file is read at once in __call__

    def __call__(self) -> dict[str, Any]:
        path = self.flags().get("config_file") or os.environ.get(ENV_PREFIX + "CONFIG_FILE")
        if not path:
            return {}
        doc = read_file(path)
        if "password" in (doc.get("redis") or {}):
            raise ValueError(f"{path}: redis.password must not be in a file; use a Secret")
        if "entry_secret" in doc:
            raise ValueError(f"{path}: entry_secret must not be in a file; use a Secret")
        return {**doc, "config_file": str(path)}


def environment_variables(
    model: type[BaseModel] = ServerConfig, prefix: str = ENV_PREFIX
) -> dict[str, str]:
    """Every environment variable the server reads → the dotted key it sets."""
    names: dict[str, str] = {}
    for name, info in model.model_fields.items():
        section = info.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            inner = environment_variables(section, f"{prefix}{name.upper()}_")
            names |= {env: f"{name}.{key}" for env, key in inner.items()}
        else:
            names[prefix + name.upper()] = name
    return names


def read_file(path: str | Path) -> dict[str, Any]:
    text = Path(path).read_text()
    doc = yaml.safe_load(text) if str(path).endswith((".yaml", ".yml")) else json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return doc


def load_config(overrides: dict[str, Any]) -> ServerConfig:
    """Defaults ← file (``config_file`` from overrides or env) ← env ← overrides (not None)."""
    return ServerConfig(**{k: v for k, v in overrides.items() if v is not None})


def redis_password(cfg: RedisConfig) -> str | None:
    if cfg.password_file:
        return Path(cfg.password_file).read_text().strip()
    return cfg.password.get_secret_value() if cfg.password else None


MIN_SECRET_BYTES = 16


def entry_secrets(cfg: ServerConfig) -> tuple[bytes, ...]:
    """The cache-entry secrets, the sealing one first (empty: none configured)."""
    if cfg.entry_secret_file:
        lines = Path(cfg.entry_secret_file).read_text().splitlines()
        field = "entry_secret_file"
    elif cfg.entry_secret:
        lines, field = cfg.entry_secret.get_secret_value().splitlines(), "entry_secret"
    else:
        return ()
    secrets = tuple(line.strip().encode() for line in lines if line.strip())
    if not secrets or min(map(len, secrets)) < MIN_SECRET_BYTES:
        raise ValueError(
            f"{field}: every secret (one per line) must have at least {MIN_SECRET_BYTES} bytes"
        )
    return secrets
