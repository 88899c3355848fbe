"""Server configuration: one typed root, read once at start-up from defaults, an optional
JSON/YAML file, ``KVRANK_*`` environment variables and CLI flags (later wins).

The same file is watched while serving: changes to the ``ttl`` section (the operator
writes it) apply without a restart. Secrets (the Redis password) come from an environment
variable or a mounted Secret file, never from the config file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from kvrank.model.config import KVDType


class RedisConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str | None = Field(None, description="redis:// or rediss:// URL; None: L1 only.")
    cluster: bool = False
    password_file: str | None = Field(None, description="File holding the password (Secret).")
    tls_ca_file: str | None = None
    op_timeout_ms: float = Field(20.0, gt=0, le=10_000)


class TTLConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fixed_seconds: float | None = Field(None, gt=0, le=86_400)
    factor: float = Field(3.0, gt=0, le=100)
    min_seconds: float = Field(1.0, gt=0)
    max_seconds: float = Field(300.0, gt=0)
    jitter: float = Field(0.1, ge=0, le=0.5)


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_dir: str = Field(
        "artifacts/quick", description="Artifact directory, or an http(s):// URL to download."
    )
    model_cache_dir: str = Field(
        "/tmp/kvrank-models", description="Where artifacts given by URL are downloaded."
    )
    device: str = "cpu"
    namespace: str = Field("default", pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    kv_dtype: KVDType | None = None
    l1_bytes: int = Field(512 * 2**20, ge=0)
    redis: RedisConfig = Field(default_factory=RedisConfig)
    ttl: TTLConfig = Field(default_factory=TTLConfig)
    cache_mode: Literal["kv", "full"] = Field(
        "kv", description="kv: cached K/V; full: no cache, C full forwards per request."
    )
    lock_wait_ms: float = Field(10.0, ge=0, le=1000)
    microbatch_ms: float = Field(0.0, ge=0, le=100, description="0: micro-batching off.")
    refresh_every: int = Field(50, ge=1)
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
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    config_file: str | None = None


ENV_PREFIX = "KVRANK_"
ENV_FIELDS = {
    "MODEL_DIR": ("model_dir",),
    "MODEL_CACHE_DIR": ("model_cache_dir",),
    "DEVICE": ("device",),
    "NAMESPACE": ("namespace",),
    "KV_DTYPE": ("kv_dtype",),
    "L1_BYTES": ("l1_bytes",),
    "REDIS_URL": ("redis", "url"),
    "REDIS_CLUSTER": ("redis", "cluster"),
    "REDIS_PASSWORD_FILE": ("redis", "password_file"),
    "REDIS_TLS_CA_FILE": ("redis", "tls_ca_file"),
    "TTL_FIXED_SECONDS": ("ttl", "fixed_seconds"),
    "HOST": ("host",),
    "PORT": ("port",),
    "CONFIG_FILE": ("config_file",),
    "REDIS_OP_TIMEOUT_MS": ("redis", "op_timeout_ms"),
    "LOCK_WAIT_MS": ("lock_wait_ms",),
    "REFRESH_EVERY": ("refresh_every",),
    "CACHE_MODE": ("cache_mode",),
    "MICROBATCH_MS": ("microbatch_ms",),
    "SHUTDOWN_GRACE_S": ("shutdown_grace_s",),
    "DRAIN_DELAY_S": ("drain_delay_s",),
}


def read_file(path: str | Path) -> dict[str, Any]:
    text = Path(path).read_text()
    doc = yaml.safe_load(text) if str(path).endswith((".yaml", ".yml")) else json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return doc


def load_config(overrides: dict[str, Any], env: dict[str, str] | None = None) -> ServerConfig:
    """Defaults ← file (``config_file`` from overrides or env) ← env ← overrides."""
    env = dict(os.environ) if env is None else env
    merged: dict[str, Any] = {}
    path = overrides.get("config_file") or env.get(ENV_PREFIX + "CONFIG_FILE")
    if path:
        _deep_merge(merged, read_file(path))
        merged["config_file"] = str(path)
    for name, target in ENV_FIELDS.items():
        if ENV_PREFIX + name in env:
            _set(merged, target, env[ENV_PREFIX + name])
    _deep_merge(merged, {k: v for k, v in overrides.items() if v is not None})
    return ServerConfig.model_validate(merged)


def redis_password(cfg: RedisConfig, env: dict[str, str] | None = None) -> str | None:
    env = dict(os.environ) if env is None else env
    if cfg.password_file:
        return Path(cfg.password_file).read_text().strip()
    return env.get(ENV_PREFIX + "REDIS_PASSWORD")


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        doc = doc.setdefault(part, {})
    doc[path[-1]] = value


def _deep_merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    for k, v in other.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _deep_merge(into[k], v)
        else:
            into[k] = v
