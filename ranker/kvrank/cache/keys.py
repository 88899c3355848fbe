"""Cache keys: ``kvrank:{namespace}:{model_version}:{user_id}:{seq_hash}``, and the
chained sequence hash that names a user's side of the input.

The hash chain starts from the model fingerprint and the user's non-sequential features,
then folds in one event at a time, so the value after n events names exactly that prefix:
an appended sequence can find the entry of its prefix (for ``extend_user``), and any change
of input or model gives a different key. Pure functions; no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # keys stay importable without torch (admin tools only need names)
    from torch import Tensor

    from kvrank.model.contract import FeatureSpec, UserInput

PREFIX = "kvrank"
_PART = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
HASH_BYTES = 16
SEQ_HASH_PATTERN = rf"^[0-9a-f]{{{2 * HASH_BYTES}}}$"
"""A sequence hash as answers name it and requests may send it back (lower-case hex)."""


@dataclass(frozen=True)
class CacheKey:
    """Where one user's K/V for one model version and one input live."""

    namespace: str
    model_version: str
    user_id: str
    seq_hash: str

    def __post_init__(self) -> None:
        for name in ("namespace", "model_version", "user_id", "seq_hash"):
            value = getattr(self, name)
            if not _PART.match(value):
                raise ValueError(f"CacheKey.{name}={value!r} must match {_PART.pattern}")

    def to_string(self) -> str:
        return f"{PREFIX}:{self.namespace}:{self.model_version}:{self.user_id}:{self.seq_hash}"

    @staticmethod
    def from_string(text: str) -> CacheKey:
        parts = text.split(":")
        if len(parts) != 5 or parts[0] != PREFIX:
            raise ValueError(f"not a kvrank cache key: {text!r}")
        return CacheKey(*parts[1:])

    def head_key(self) -> str:
        """The per-user record naming the latest cached length and hash."""
        return head_key(self.namespace, self.model_version, self.user_id)

    def lock_key(self) -> str:
        return f"{PREFIX}-lock:{self.namespace}:{self.model_version}:{self.user_id}:{self.seq_hash}"


@dataclass(frozen=True)
class Head:
    """The latest cached state of one user: how many events and the chain hash there.

    Every tier keeps one per user next to the entries, so that a request whose events
    extend a cached sequence finds the entry of that prefix.
    """

    length: int
    seq_hash: str

    def to_json(self) -> str:
        return json.dumps({"length": self.length, "seq_hash": self.seq_hash})

    @staticmethod
    def from_json(data: bytes | str) -> Head | None:
        """``None`` for anything that is not a head record (a corrupt head is a miss)."""
        try:
            doc = json.loads(data)
            return Head(int(doc["length"]), str(doc["seq_hash"]))
        except (ValueError, KeyError, TypeError):
            return None


def entry_prefix(namespace: str, model_version: str, user_id: str) -> str:
    """The start of every entry key of one user (for deleting all of them)."""
    return f"{PREFIX}:{namespace}:{model_version}:{user_id}:"


def head_key(namespace: str, model_version: str, user_id: str) -> str:
    return f"{PREFIX}-head:{namespace}:{model_version}:{user_id}"


def namespace_pattern(namespace: str) -> list[str]:
    """SCAN patterns matching every key (entries, heads, locks) of ``namespace``."""
    return [
        f"{PREFIX}:{namespace}:*",
        f"{PREFIX}-head:{namespace}:*",
        f"{PREFIX}-lock:{namespace}:*",
    ]


RANKER_COMMANDS = (
    # entries, heads and locks; a lock is released by a script; a user's entries are found
    # by SCAN (keyless: every name is listed, only the namespace's can then be touched)
    "+get", "+set", "+unlink", "+eval", "+evalsha", "+scan",
    # connecting and health: the handshake, the readiness PING, a cluster client's topology
    # and command table (redis-py's CLIENT SETINFO, Redis >= 7.2, is left refused: it
    # ignores the refusal, and naming it fails on 7.0)
    "+auth", "+hello", "+client|setname", "+ping",
    "+cluster|slots", "+cluster|shards", "+command",
)  # fmt: skip


def acl_rules(namespace: str) -> list[str]:
    """The ``ACL SETUSER`` rules that let a ranker (and the purge Job) use the keys of cache
    namespace ``namespace`` and nothing else: a deployment sharing a Redis with others can
    neither read nor overwrite their entries, nor flush, configure or list anything."""
    keys = [f"~{pattern}" for pattern in namespace_pattern(namespace)]
    return ["resetkeys", *keys, "resetchannels", "-@all", *RANKER_COMMANDS]


def _digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=HASH_BYTES)
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.digest()


def sequence_chain(user: UserInput, fingerprint: str, spec: FeatureSpec) -> list[str]:
    """Chain values after 0, 1, …, n events (``n + 1`` hex strings).

    Value ``i`` covers the fingerprint, every user column and events ``0..i-1`` (each
    event: its id columns as little-endian int64, then its dense columns as float32, in the
    spec's order); the last value is the request's ``seq_hash``. Every column the spec
    declares is hashed, so nothing a model reads can change without changing the key.
    """
    base = _digest(
        fingerprint.encode(),
        *(_bytes(user.user[c.name], c.kind) for c in spec.user),
    )
    rows = _event_rows(user, spec)
    # each step is _digest(value, ids, dense): the digest of one byte string, the constant
    # length prefixes included, so a step is one slice and one call rather than six updates
    lead = HASH_BYTES.to_bytes(8, "little")
    width, data = rows.shape[1], rows.tobytes()
    blake2b = hashlib.blake2b
    chain, value = [base.hex()], base
    for start in range(0, len(data), width):
        value = blake2b(lead + value + data[start : start + width], digest_size=HASH_BYTES).digest()
        chain.append(value.hex())
    return chain


def _event_rows(user: UserInput, spec: FeatureSpec) -> np.ndarray:
    """One row of bytes per event: the length of its id columns (8 bytes, little-endian),
    those ids as int64, the length of its dense columns, those as float32 — what the chain
    folds in for it."""
    n = len(user)
    ids = [user.events[c.name].cpu().numpy() for c in spec.sequence if c.kind == "id"]
    dense = [user.events[c.name].cpu().numpy() for c in spec.sequence if c.kind == "dense"]
    id_rows = np.stack(ids, axis=1).astype("<i8")
    dense_rows = np.concatenate(dense, axis=1).astype("<f4") if dense else np.zeros((n, 0), "<f4")
    wi, wd = id_rows.shape[1] * 8, dense_rows.shape[1] * 4
    rows = np.empty((n, 16 + wi + wd), np.uint8)
    rows[:, :8] = np.frombuffer(wi.to_bytes(8, "little"), np.uint8)
    rows[:, 8 : 8 + wi] = id_rows.view(np.uint8).reshape(n, wi)
    rows[:, 8 + wi : 16 + wi] = np.frombuffer(wd.to_bytes(8, "little"), np.uint8)
    rows[:, 16 + wi :] = dense_rows.view(np.uint8).reshape(n, wd)
    return rows


def _bytes(t: Tensor, kind: str) -> bytes:
    values = t.cpu().numpy()
    return values.astype("<i8" if kind == "id" else "<f4").tobytes()
