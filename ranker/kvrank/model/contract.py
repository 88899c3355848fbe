"""The cacheable-ranker contract: the seam between kvrank and a model, and nothing more.

kvrank owns the cache, the bytes, the keys and the HTTP schema; a model owns the math. A
model declares its inputs as a :class:`FeatureSpec` (user-side sequence columns, user
columns, candidate columns) and implements :class:`CacheableRanker`: ``encode_user`` (the
user's K/V, once), ``score`` (every candidate in one pass against them) and
``forward_full`` (the no-cache reference they must equal). Two capabilities are optional and
detected, never assumed: :class:`BatchScorer` (``score_many``: several users in one pass)
and :class:`Extendable` (``extend_user``: append events, computing only the new tokens).

Inputs reach a model as :class:`UserInput` / :class:`CandidateInput`: one tensor per
declared column, already validated against the spec (:mod:`kvrank.model.features`). The
cached state is a :class:`~kvrank.model.kv.UserKV` the model builds with
:meth:`UserKV.build <kvrank.model.kv.UserKV.build>`; kvrank stores, quantises, moves and
serialises it. This module defines types only; it computes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from kvrank.model.config import KVDType
from kvrank.model.kv import UserKV

ColumnKind = Literal["id", "dense"]
MAX_ID = 2**63 - 1
RESERVED_NAMES = frozenset({"user_id", "events", "candidates", "seq_hash"})
"""Top-level request fields kvrank owns: a user column may not take these names."""
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True)
class Column:
    """One input column a model reads.

    In the sequence and candidate groups a row is one event / one candidate: an ``id``
    column holds one id per row, a ``dense`` column ``width`` floats per row. In the user
    group the column is one row: ``width`` ids or ``width`` floats.
    """

    name: str
    kind: ColumnKind
    size: int | None = None
    """ids: every value must be < ``size`` (a vocabulary or bucket count); None: any id in
    ``[0, 2**63)``, which the model hashes into its tables."""
    width: int | None = None
    """Values per row: required for dense columns and every user column (``0`` declares a
    column that is always empty); unused by sequence and candidate id columns."""
    description: str = ""
    """Shown in the request schema (OpenAPI)."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"column name {self.name!r} must match {_NAME.pattern}")
        if self.size is not None and not 1 <= self.size <= MAX_ID:
            raise ValueError(f"column {self.name}: size {self.size} outside [1, 2**63)")
        if self.width is not None and self.width < 0:
            raise ValueError(f"column {self.name}: width {self.width} is negative")
        if self.width is None and self.kind == "dense":
            raise ValueError(f"column {self.name}: a dense column needs width (values per row)")

    @property
    def per_row(self) -> int:
        """``width`` as set, or 0 where it is not (a sequence or candidate id column)."""
        return self.width or 0


@dataclass(frozen=True)
class FeatureSpec:
    """Every input a model reads. kvrank derives from it the request schema, the checks of
    each request, the warm-up input and the sequence hash (every column here is hashed, so
    a model must read nothing else: the load-time checks catch one that does)."""

    sequence: tuple[Column, ...]
    """Per-event columns of the user's behaviour sequence, oldest event first. The first
    one names the sequence's length (``events.<first>``)."""
    user: tuple[Column, ...]
    """Non-sequential user-side columns (profile, context)."""
    candidate: tuple[Column, ...]
    """Per-candidate columns. The first one names the candidate count."""
    window: int
    """Events the model sees: a longer history keeps its last ``window`` events."""
    max_request_events: int = 10_000
    """The longest history a request may carry (the server's bound, not the model's)."""
    max_candidates: int = 1_000
    """The most candidates one request may carry."""
    extras: Mapping[str, object] = field(default_factory=dict)
    """Free-form notes shown to users (not interpreted)."""

    def __post_init__(self) -> None:
        if not self.sequence or not self.candidate:
            raise ValueError("a FeatureSpec needs at least one sequence and one candidate column")
        for group, cols in (("sequence", self.sequence), ("candidate", self.candidate)):
            if cols[0].kind != "id":
                raise ValueError(f"the first {group} column ({cols[0].name}) must be an id column")
            _unique(group, cols)
        _unique("user", self.user)
        for col in self.user:
            if col.width is None:
                raise ValueError(
                    f"user column {col.name} needs width (the {col.kind} values each request "
                    "sends for it; 0 declares a column that is always empty)"
                )
        clash = RESERVED_NAMES & {c.name for c in self.user}
        if clash:
            raise ValueError(f"user columns may not be named {sorted(clash)} (reserved)")
        if self.window < 1:
            raise ValueError(f"window {self.window} must be >= 1")


def _unique(group: str, cols: tuple[Column, ...]) -> None:
    names = [c.name for c in cols]
    if len(set(names)) != len(names):
        raise ValueError(f"{group} columns repeat a name: {names}")


@dataclass(frozen=True)
class UserInput:
    """One user's side of a request, validated against the model's :class:`FeatureSpec`."""

    events: Mapping[str, Tensor]
    """Sequence column → ``[n]`` int64 ids or ``[n, width]`` float32 values, oldest first."""
    user: Mapping[str, Tensor]
    """User column → ``[width]`` int64 ids or ``[width]`` float32 values."""

    def __len__(self) -> int:
        return int(next(iter(self.events.values())).shape[0])

    def slice(self, start: int, stop: int | None = None) -> UserInput:
        """The same user with only events ``start:stop`` (what ``extend_user`` gets)."""
        return UserInput({k: v[start:stop] for k, v in self.events.items()}, self.user)


@dataclass(frozen=True)
class CandidateInput:
    """C candidates, validated: candidate column → ``[C]`` int64 or ``[C, width]`` float32."""

    columns: Mapping[str, Tensor]

    def __len__(self) -> int:
        return int(next(iter(self.columns.values())).shape[0])

    def select(self, index: Tensor | slice) -> CandidateInput:
        return CandidateInput({k: v[index] for k, v in self.columns.items()})


@runtime_checkable
class CacheableRanker(Protocol):
    """A ranker whose user side can be computed once and reused for every candidate.

    The preconditions (checked at load by :mod:`kvrank.model.checks`): user-side tokens never
    attend to candidates; a candidate attends to the user side and to itself, never to other
    candidates; nothing in the state depends on anything but the spec's user-side columns;
    ``score`` equals ``forward_full``.

    Every input reaches the model checked against :attr:`features` (kvrank checks each
    request once, with :mod:`kvrank.model.features`, and answers bad input with a 422 naming
    the field): a model need not check it again.
    """

    version: str
    """The model version (from the artifact); part of every cache key."""
    kv_dtypes: Mapping[KVDType, float]
    """The K/V storage dtypes this model may be served with → the largest |Δlogit| against
    fp32 storage the load-time check accepts for it."""

    @property
    def features(self) -> FeatureSpec:
        """The inputs the model reads."""
        ...

    @property
    def module(self) -> nn.Module:
        """The torch module holding every weight: kvrank loads ``model.safetensors`` into it
        strictly, moves it to the device and puts it in eval mode."""
        ...

    @property
    def device(self) -> torch.device: ...

    def fingerprint(self) -> str:
        """Stable hash of everything that fixes the state's shapes and meaning (the
        architecture and its config): salts cache keys and is written into every ``UserKV``."""
        ...

    def encode_user(self, user: UserInput, kv_dtype: KVDType | None = None) -> UserKV:
        """The user's cached state (stored in ``kv_dtype``; None: the compute dtype)."""
        ...

    def score(self, user_kv: UserKV, candidates: CandidateInput) -> Tensor:
        """Logits ``[C]`` of every candidate in one pass against the cached state; raise
        ``IncompatibleKVError`` for a state this model did not make."""
        ...

    def forward_full(self, user: UserInput, candidates: CandidateInput) -> Tensor:
        """The no-cache reference logits ``[C]``: each candidate with the user's whole input
        through the whole model. ``score`` must equal it (fp32: within 1e-5)."""
        ...


@runtime_checkable
class BatchScorer(Protocol):
    """Optional: several users' requests in one pass (the model thread's continuous
    batching)."""

    def score_many(self, requests: list[tuple[UserKV, CandidateInput]]) -> list[Tensor]:
        """Per request, the logits ``score`` would give."""
        ...


@runtime_checkable
class Extendable(Protocol):
    """Optional: append events to a cached user, computing only the new tokens."""

    def extend_user(self, user_kv: UserKV, new_events: UserInput) -> UserKV:
        """The state after ``new_events`` (a :class:`UserInput` holding only them)."""
        ...

    def extend_is_exact(self, user_kv: UserKV, n_new: int) -> bool:
        """Whether extending by ``n_new`` events equals a full encode of the longer history.
        A model whose state cannot be extended exactly (e.g. positions counted back from the
        newest event) answers False, or does not implement :class:`Extendable` at all."""
        ...
