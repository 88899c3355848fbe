"""Request and response bodies of ``POST /v1/score`` and ``/v1/prefetch``, with the limits
that protect the server (a prefetch body is a scoring body without ``candidates``).

The request body is derived from the model's :class:`FeatureSpec` (:func:`request_model`):
``user_id``, ``events`` (one list per sequence column), one field per user column and
``candidates`` (one list per candidate column). For the built-in ranker that is the schema
kvrank has always served. Pydantic checks types, finiteness and bounds;
:func:`to_inputs` checks the cross-field lengths and names the offending field; id ranges
and widths are checked against the spec (:mod:`kvrank.model.features`) and surface as 422 too.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from kvrank.model.contract import CandidateInput, Column, FeatureSpec, UserInput
from kvrank.model.features import candidates_from_lists, user_from_lists

Id = Annotated[int, Field(ge=0, le=2**63 - 1)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
USER_ID_PATTERN = r"^[A-Za-z0-9_.\-]+$"
"""What a user id may be made of, wherever one arrives (a scoring body, an admin path): never
a glob character, a key separator or a space."""
USER_ID_MAX = 128
USER_IDS_MAX = 64
"""A user id column's list may be this long before its width is even checked."""
USER_DENSE_MAX = 256
_STRICT = ConfigDict(extra="forbid")


def request_model(spec: FeatureSpec) -> type[BaseModel]:
    """The ``ScoreRequest`` body of a model with ``spec`` (its OpenAPI schema too)."""
    candidates = create_model(  # type: ignore[call-overload]
        "CandidatesIn",
        __config__=_STRICT,
        **{
            c.name: _rows(c, spec.max_candidates, first=i == 0)
            for i, c in enumerate(spec.candidate)
        },
    )
    fields = _user_side(spec) | {"candidates": (candidates, ...)}
    model: type[BaseModel] = create_model("ScoreRequest", __config__=_STRICT, **fields)  # type: ignore[call-overload]
    return model


def prefetch_model(spec: FeatureSpec) -> type[BaseModel]:
    """The ``PrefetchRequest`` body: a ``ScoreRequest`` without ``candidates``."""
    model: type[BaseModel] = create_model(  # type: ignore[call-overload]
        "PrefetchRequest", __config__=_STRICT, **_user_side(spec)
    )
    return model


def _user_side(spec: FeatureSpec) -> dict[str, Any]:
    events = create_model(  # type: ignore[call-overload]
        "EventsIn",
        __config__=_STRICT,
        **{
            c.name: _rows(c, spec.max_request_events, first=i == 0)
            for i, c in enumerate(spec.sequence)
        },
    )
    fields: dict[str, Any] = {
        "user_id": (str, Field(min_length=1, max_length=USER_ID_MAX, pattern=USER_ID_PATTERN)),
        "events": (events, ...),
    }
    return fields | {c.name: _user_field(c) for c in spec.user}


def _rows(col: Column, limit: int, first: bool) -> tuple[Any, Any]:
    """A per-event / per-candidate column: a list of ids, or a list of rows of floats."""
    if col.kind == "id":
        kwargs: dict[str, Any] = {"max_length": limit, "description": col.description or None}
        if first:
            kwargs["min_length"] = 1
        return list[Id], Field(**kwargs)
    return list[list[Finite]], Field(
        default_factory=list, max_length=limit, description=col.description or None
    )


def _user_field(col: Column) -> tuple[Any, Any]:
    if col.kind == "id":
        kind: Any = list[Id]
        bound = max(col.width, USER_IDS_MAX)
    else:
        kind, bound = list[Finite], max(col.width, USER_DENSE_MAX)
    return kind, Field(default_factory=list, max_length=bound, description=col.description or None)


def to_inputs(body: BaseModel, spec: FeatureSpec) -> tuple[UserInput, CandidateInput]:
    """The request's user side and candidates as tensors (``InputError`` naming the field
    when lengths disagree)."""
    cands = {c.name: getattr(body.candidates, c.name) for c in spec.candidate}  # type: ignore[attr-defined]
    return to_user(body, spec), candidates_from_lists(spec, cands)


def to_user(body: BaseModel, spec: FeatureSpec) -> UserInput:
    """The user side of a scoring or prefetch request as tensors."""
    events = {c.name: getattr(body.events, c.name) for c in spec.sequence}  # type: ignore[attr-defined]
    user = {c.name: getattr(body, c.name) for c in spec.user}
    return user_from_lists(spec, events, user)


class ScoreResponse(BaseModel):
    request_id: str
    model_version: str
    scores: list[float]
    cache: str = Field(description="l1 | host | l2 | incremental | miss (none: cache disabled)")
    timings_ms: dict[str, float]


class PrefetchResponse(BaseModel):
    request_id: str
    status: str = Field(
        description="accepted: the user's entry is being made (or is already cached);"
        " dropped: too many prefetches in flight, or the pod has no model time to spare"
        " (scoring requests come first); the ranking request will make it"
    )


class InvalidateResponse(BaseModel):
    user_id: str
    removed: int


def body_for(
    spec: FeatureSpec, user_id: str, user: UserInput, cands: CandidateInput
) -> dict[str, Any]:
    """The JSON body of a request for ``user`` and ``cands`` (what :func:`to_inputs` reads):
    how clients and the load tools build requests for any model."""
    body: dict[str, Any] = {
        "user_id": user_id,
        "events": {c.name: user.events[c.name].tolist() for c in spec.sequence},
    }
    body |= {c.name: user.user[c.name].tolist() for c in spec.user}
    body["candidates"] = {c.name: cands.columns[c.name].tolist() for c in spec.candidate}
    return body
