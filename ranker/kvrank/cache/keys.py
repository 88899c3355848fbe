"""Cache keys: ``kvrank:{namespace}:{model_version}:{user_id}:{seq_hash}``, and the
chained sequence hash that names a user's side of the input.

The hash chain starts from the model fingerprint and the user's non-sequential features,
then folds in the events a block of :data:`BLOCK` at a time; the value after n events is the
chain after its whole blocks, n and the events past them, hashed once. So the value after n
events names exactly that prefix (an appended sequence finds the entry of its prefix, for
``extend_user``), any change of input or model gives a different key, the whole history is
hashed in ``n / BLOCK`` calls rather than one per event, and a value extends with the events
after it given the chain's state there (one block value and fewer than ``BLOCK`` events).
Pure functions; no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, overload

import numpy as np

from kvrank_common import HEAD_PREFIX, KEY_PREFIX, LOCK_PREFIX

if TYPE_CHECKING:  # keys stay importable without torch (admin tools only need names)
    from torch import Tensor

    from kvrank.model.contract import FeatureSpec, UserInput

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
            if not _PART.fullmatch(value):
                raise ValueError(f"CacheKey.{name}={value!r} must match {_PART.pattern}")

    def to_string(self) -> str:
        return f"{KEY_PREFIX}:{self.namespace}:{self.model_version}:{self.user_id}:{self.seq_hash}"

    @staticmethod
    def from_string(text: str) -> CacheKey:
        parts = text.split(":")
        if len(parts) != 5 or parts[0] != KEY_PREFIX:
            raise ValueError(f"not a kvrank cache key: {text!r}")
        return CacheKey(*parts[1:])

    def head_key(self) -> str:
        """The per-user record naming the latest cached length and hash."""
        return head_key(self.namespace, self.model_version, self.user_id)

    def lock_key(self) -> str:
        return f"{LOCK_PREFIX}:{self.namespace}:{self.model_version}:{self.user_id}:{self.seq_hash}"


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
    return f"{KEY_PREFIX}:{namespace}:{model_version}:{user_id}:"


def head_key(namespace: str, model_version: str, user_id: str) -> str:
    return f"{HEAD_PREFIX}:{namespace}:{model_version}:{user_id}"


def _digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=HASH_BYTES)
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.digest()


BLOCK = 64
"""Events folded into the chain per step."""
_STEP, _VALUE = b"kvrank-block", b"kvrank-seq"
"""blake2b personalisations: a block step and a value are never the same digest."""


@dataclass(frozen=True)
class ChainState:
    """Where a chain stands after :attr:`events` events: all it needs to extend its value with
    the events after them, the old events left out — the block value there, the events past
    that block, and the user columns' bytes the chain started from (what an extension hands
    the model as the user's columns)."""

    events: int
    block: bytes
    tail: bytes
    user: bytes

    def seq_hash(self) -> str:
        """The chain's value at :attr:`events`: a state is only used when this equals the
        hash it was found under."""
        return _value(self.block, self.events, self.tail)

    def to_bytes(self) -> bytes:
        header = self.events.to_bytes(8, "little") + len(self.user).to_bytes(4, "little")
        return header + self.user + self.block + self.tail

    @staticmethod
    def from_bytes(data: bytes) -> ChainState:
        """``ValueError`` for anything :meth:`to_bytes` did not write."""
        if len(data) < 12 + HASH_BYTES:
            raise ValueError("a chain state is at least 28 bytes")
        events = int.from_bytes(data[:8], "little")
        size = int.from_bytes(data[8:12], "little")
        if len(data) < 12 + size + HASH_BYTES:
            raise ValueError("a chain state shorter than its user columns")
        user, rest = data[12 : 12 + size], data[12 + size :]
        return ChainState(events, rest[:HASH_BYTES], rest[HASH_BYTES:], user)


class SequenceChain(Sequence[str]):
    """The hashes of one user's side after 0, 1, …, n events (``n + 1`` hex strings); the
    last, :attr:`seq_hash`, names the request's whole history.

    Block value ``0`` is the digest of the fingerprint and every user column; block value
    ``j + 1`` is ``blake2b(block value j ‖ the bytes of events 64j … 64j + 63, person
    "kvrank-block")``; the value after ``i`` events is ``blake2b(block value ⌊i/64⌋ ‖ i as 8
    bytes little-endian ‖ the bytes of the events past that block, person "kvrank-seq")``.
    An event's bytes: the length of its id columns (8 bytes, little-endian), those ids as
    int64, the length of its dense columns, those as float32, in the spec's order. Every
    column the spec declares is hashed, so nothing a model reads can change without changing
    the key. Values other than the last are computed when asked for (a prefix lookup asks
    for one). A chain extended from a :class:`ChainState` (:func:`extend_chain`) knows the
    values from that state's block on only; earlier ones raise ``IndexError``.
    """

    def __init__(self, base: bytes, rows: np.ndarray, user: bytes = b"", first: int = 0) -> None:
        self._first, self._user = first, user
        self._events, self._width = first + int(rows.shape[0]), int(rows.shape[1])
        self._data = rows.tobytes()
        step, data = BLOCK * self._width, memoryview(self._data)  # blocks hashed in place
        blocks = [base]
        for start in range(0, ((self._events - first) // BLOCK) * step, step):
            block = hashlib.blake2b(blocks[-1], digest_size=HASH_BYTES, person=_STEP)
            block.update(data[start : start + step])
            blocks.append(block.digest())
        self._blocks = blocks
        self.seq_hash = self._value(self._events)

    def _block_and_tail(self, i: int) -> tuple[bytes, bytes]:
        """The block value before event ``i`` and the bytes of the events past it."""
        whole = i // BLOCK
        start, stop = (whole * BLOCK - self._first) * self._width, (i - self._first) * self._width
        return self._blocks[whole - self._first // BLOCK], self._data[start:stop]

    def _value(self, i: int) -> str:
        block, tail = self._block_and_tail(i)
        return _value(block, i, tail)

    def state(self) -> ChainState:
        """Where the chain stands after its last event (what :func:`extend_chain` takes)."""
        block, tail = self._block_and_tail(self._events)
        return ChainState(self._events, block, tail, self._user)

    def __len__(self) -> int:
        return self._events + 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"the chain has {len(self)} values")
        i %= len(self)
        if i < self._first:
            raise IndexError(f"extended from event {self._first}: value {i} is not known here")
        return self.seq_hash if i == self._events else self._value(i)


def _value(block: bytes, i: int, tail: bytes) -> str:
    state = block + i.to_bytes(8, "little") + tail
    return hashlib.blake2b(state, digest_size=HASH_BYTES, person=_VALUE).hexdigest()


def sequence_chain(user: UserInput, fingerprint: str, spec: FeatureSpec) -> SequenceChain:
    """The hash chain of ``user``'s side for a model with ``fingerprint`` and ``spec``."""
    columns = [_bytes(user.user[c.name], c.kind) for c in spec.user]
    base = _digest(fingerprint.encode(), *columns)
    return SequenceChain(base, _event_rows(user, spec), b"".join(columns))


def extend_chain(state: ChainState, events: UserInput, spec: FeatureSpec) -> SequenceChain:
    """The chain of the history ``state`` stands after, extended with ``events`` (the events
    after it; their user columns are not read): its values equal :func:`sequence_chain`'s of
    the whole history. ``ValueError`` when ``state`` does not fit ``spec``'s events."""
    rows = _event_rows(events, spec)
    width = rows.shape[1]
    past = state.events % BLOCK
    if len(state.block) != HASH_BYTES or len(state.tail) != past * width:
        raise ValueError(f"a chain state after {state.events} events must hold {past} of them")
    tail = np.frombuffer(state.tail, np.uint8).reshape(past, width)
    return SequenceChain(state.block, np.concatenate([tail, rows]), state.user, state.events - past)


def user_columns(state: ChainState, spec: FeatureSpec) -> dict[str, np.ndarray]:
    """The user columns the chain of ``state`` started from (``ValueError``: they do not
    fit ``spec``)."""
    out, at = {}, 0
    for c in spec.user:
        dtype = np.dtype("<i8" if c.kind == "id" else "<f4")
        size = c.per_row * dtype.itemsize
        if at + size > len(state.user):
            raise ValueError(f"the chain state's user columns end before column {c.name}")
        out[c.name] = np.frombuffer(state.user, dtype, c.per_row, at).astype(
            dtype.newbyteorder("=")
        )
        at += size
    if at != len(state.user):
        raise ValueError("the chain state's user columns are longer than the model's")
    return out


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
