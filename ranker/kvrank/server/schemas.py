"""Request and response bodies of ``POST /v1/score``, with the limits that protect the server.

Pydantic checks types, finiteness and bounds; :meth:`ScoreRequest.to_features` checks the
cross-field lengths and names the offending field. Shapes specific to the loaded model
(e.g. how many profile ids) are checked by the model and surface as 422 too.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import BaseModel, ConfigDict, Field

from kvrank.errors import InputError
from kvrank.model.inputs import Candidates, Events, UserFeatures

Id = Annotated[int, Field(ge=0, le=2**63 - 1)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
MAX_EVENTS = 10_000
MAX_CANDIDATES = 1_000


class EventsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item_ids: list[Id] = Field(min_length=1, max_length=MAX_EVENTS)
    categories: list[Id] = Field(max_length=MAX_EVENTS)
    actions: list[Id] = Field(max_length=MAX_EVENTS)
    gaps: list[Id] = Field(max_length=MAX_EVENTS)
    dense: list[list[Finite]] = Field(default_factory=list, max_length=MAX_EVENTS)


class CandidatesIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    item_ids: list[Id] = Field(min_length=1, max_length=MAX_CANDIDATES)
    categories: list[Id] = Field(max_length=MAX_CANDIDATES)
    dense: list[list[Finite]] = Field(default_factory=list, max_length=MAX_CANDIDATES)


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
    events: EventsIn
    profile_ids: list[Id] = Field(default_factory=list, max_length=64)
    context_ids: list[Id] = Field(default_factory=list, max_length=64)
    user_dense: list[Finite] = Field(default_factory=list, max_length=256)
    candidates: CandidatesIn

    def to_features(self, event_dense: int, cand_dense: int) -> tuple[UserFeatures, Candidates]:
        ev, c = self.events, self.candidates
        n = len(ev.item_ids)
        for name in ("categories", "actions", "gaps"):
            if len(getattr(ev, name)) != n:
                raise InputError(
                    f"events.{name}",
                    f"has {len(getattr(ev, name))} values; events.item_ids has {n}",
                )
        if len(c.categories) != len(c.item_ids):
            raise InputError(
                "candidates.categories",
                f"has {len(c.categories)} values; candidates.item_ids has {len(c.item_ids)}",
            )
        ev_dense = _matrix(ev.dense, n, event_dense, "events.dense")
        c_dense = _matrix(c.dense, len(c.item_ids), cand_dense, "candidates.dense")
        user = UserFeatures(
            Events(
                _ids(ev.item_ids), _ids(ev.categories), _ids(ev.actions), _ids(ev.gaps), ev_dense
            ),
            _ids(self.profile_ids),
            _ids(self.context_ids),
            torch.tensor(self.user_dense, dtype=torch.float32),
        )
        return user, Candidates(_ids(c.item_ids), _ids(c.categories), c_dense)


class ScoreResponse(BaseModel):
    request_id: str
    model_version: str
    scores: list[float]
    cache: str = Field(description="l1 | l2 | incremental | miss (none: cache disabled)")
    timings_ms: dict[str, float]


class InvalidateResponse(BaseModel):
    user_id: str
    removed: int


def _ids(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _matrix(rows: list[list[float]], n: int, width: int, field: str) -> torch.Tensor:
    if width == 0 and not rows:
        return torch.zeros(n, 0)
    if len(rows) != n:
        raise InputError(field, f"has {len(rows)} rows; expected {n}")
    for i, row in enumerate(rows):
        if len(row) != width:
            raise InputError(f"{field}[{i}]", f"has {len(row)} values; the model expects {width}")
    return torch.tensor(rows, dtype=torch.float32)
