"""The serving process's logs: JSON lines (one object per line, what log shippers parse) or
plain text, at the configured level — and the access log, one line per scoring request.

An access line carries the request id, the route, the status, the latency, the cache outcome,
the model version and a keyed hash of the user id: requests of one user can be followed
(within the key's reach: every pod sharing ``log.user_key``, else one process) without the
log ever holding the id itself. The lines of shed requests are sampled (see
:class:`Sampler`): under a spike they are most of the traffic, and a line each cost as much
as the refusal itself. This module formats and emits; it decides nothing.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pythonjsonlogger.json import JsonFormatter

ACCESS = logging.getLogger("kvrank.access")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class LogConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="INFO logs every scoring request (the access log); WARNING does not."
    )
    format: Literal["json", "text"] = Field("json", description="json: one object per line.")
    user_key: SecretStr | None = Field(
        None,
        exclude=True,
        description="Key of the user-id hash in access lines (from a Secret; the same on every"
        " pod to follow a user across them). Unset: a random key per process.",
    )


class _JsonLines(JsonFormatter):
    """The operator's shape (kopf's JSON format): ``timestamp``, ``severity`` (lower case),
    ``message``; plus ``logger`` and the record's extra fields."""

    def add_fields(
        self, log_record: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        super().add_fields(log_record, record, message_dict)
        log_record["severity"] = record.levelname.lower()


def configure(cfg: LogConfig) -> None:
    """Route every logger (uvicorn's included) through one handler on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    if cfg.format == "json":
        handler.setFormatter(
            _JsonLines(
                "{name}{message}", style="{", rename_fields={"name": "logger"}, timestamp=True
            )
        )
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(cfg.level)


class UserHasher:
    """``user_id`` → 16 hex characters of a keyed BLAKE2b: stable under one key, useless for
    guessing ids (a plain hash of a numeric id is reversed by trying them all)."""

    def __init__(self, key: SecretStr | None) -> None:
        raw = key.get_secret_value().encode() if key else secrets.token_bytes(32)
        self._key = hashlib.blake2b(raw, digest_size=32).digest()  # any length → 32 bytes

    def __call__(self, user_id: str) -> str:
        return hashlib.blake2b(user_id.encode(), key=self._key, digest_size=8).hexdigest()


def access(fields: dict[str, Any]) -> None:
    """One access line (its fields become the JSON object's keys)."""
    if ACCESS.isEnabledFor(logging.INFO):
        summary = " ".join(f"{k}={v}" for k, v in fields.items())
        ACCESS.info(summary, extra=fields)


class Sampler:
    """Which lines of a kind to write: the first ``per_s`` in each second, then one in
    ``every`` (zap's production sampling). A line written says how many were skipped before
    it, so the log still accounts for every one; the exact counts are in the metrics."""

    def __init__(
        self, per_s: int = 10, every: int = 100, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_s, self.every, self.clock = per_s, every, clock
        self._second = -1
        self._in_second = 0
        self._skipped = 0

    def take(self) -> int | None:
        """``None``: skip this line; else write it, with this many skipped since the last."""
        second = int(self.clock())
        if second != self._second:
            self._second, self._in_second = second, 0
        self._in_second += 1
        if self._in_second > self.per_s and (self._in_second - self.per_s) % self.every:
            self._skipped += 1
            return None
        skipped, self._skipped = self._skipped, 0
        return skipped


SHED_LINES = Sampler()
"""The access lines of shed requests (a spike sheds thousands a second)."""


def shed_line_due(sampler: Sampler = SHED_LINES) -> int | None:
    """Whether to write a shed request's access line: ``None`` if not (INFO off, or the
    sampler skips it), else the shed requests whose lines were skipped since the last one
    (its ``sheds_not_logged``). Asked before the line is built: most are not written."""
    if not ACCESS.isEnabledFor(logging.INFO):
        return None
    return sampler.take()
