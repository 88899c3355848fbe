"""Request and response bodies of ``POST /v1/score`` and ``/v1/prefetch``, with the limits
that protect the server (a prefetch body is a scoring body without ``candidates``).

The request body is derived from the model's :class:`FeatureSpec` (:func:`request_model`):
``user_id``, ``events`` (one list per sequence column), one field per user column and
``candidates`` (one list per candidate column). For the built-in ranker that is the schema
kvrank has always served. Pydantic checks types, finiteness and bounds;
:func:`to_inputs` checks the cross-field lengths and names the offending field; id ranges
and widths are checked against the spec (:mod:`kvrank.model.features`) and surface as 422 too.

A body is decoded first by :func:`strict_body`'s msgspec decoder, the same schema with no
coercion, in C and straight into lists (~6× pydantic on a production-size body), its
history's columns read from their JSON text straight into arrays (:func:`read_ids`,
:func:`read_rows`): what it accepts, pydantic accepts with the same values. What it refuses
goes to the pydantic model, which accepts what its lax mode may (``"3"`` for ``3``) or names
the field and the limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import numpy as np
import simdjson
from pydantic import BaseModel, ConfigDict, Field, create_model
from torch import Tensor

from kvrank.cache import SEQ_HASH_PATTERN
from kvrank.errors import HeaderError, InputError
from kvrank.model.contract import CandidateInput, Column, FeatureSpec, UserInput
from kvrank.model.features import candidates_from_lists, events_from_lists, user_from_lists

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


RequestBody = Any
"""A scoring or prefetch body as :class:`StrictBody` or the pydantic model gives it: the same
fields under the same names."""


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
    fields = _user_side(spec, by_reference=True) | {"candidates": (candidates, ...)}
    model: type[BaseModel] = create_model("ScoreRequest", __config__=_STRICT, **fields)  # type: ignore[call-overload]
    return model


def prefetch_model(spec: FeatureSpec) -> type[BaseModel]:
    """The ``PrefetchRequest`` body: a ``ScoreRequest`` without ``candidates``."""
    model: type[BaseModel] = create_model(  # type: ignore[call-overload]
        "PrefetchRequest", __config__=_STRICT, **_user_side(spec)
    )
    return model


def _user_side(spec: FeatureSpec, by_reference: bool = False) -> dict[str, Any]:
    """The user's fields; ``by_reference``: ``events`` may be left out for ``seq_hash``."""
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
    if by_reference:
        since = create_model(  # type: ignore[call-overload]
            "EventsSince",
            __config__=_STRICT,
            seq_hash=(str, Field(pattern=SEQ_HASH_PATTERN, description=SINCE_HASH_DOC)),
            events=(events, Field(description="The events after it, oldest first.")),
        )
        fields["events"] = (events | None, Field(None, description=EVENTS_DOC))
        fields["seq_hash"] = (
            str | None,
            Field(None, pattern=SEQ_HASH_PATTERN, description=SEQ_HASH_DOC),
        )
        fields["events_since"] = (since | None, Field(None, description=EVENTS_SINCE_DOC))
    return fields | {c.name: _user_field(c) for c in spec.user}


_Length = tuple[str | None, str, int, int]
"""A list's group (``None``: the top level), field, least and most items."""
_Lengths = list[_Length]


@dataclass(frozen=True)
class StrictBody:
    """The :func:`request_model` (or :func:`prefetch_model`) body as a msgspec decoder:
    every type, pattern and unknown-field rule of the pydantic model, no coercion; the list
    lengths checked after (msgspec's own length bounds cost it 6×).

    A body's history is read first by ``history``: the same decoder with each sequence
    column left as its JSON text, which :func:`read_ids` and :func:`read_rows` read straight
    into arrays (no Python int or float per value: a production-size body decoded into
    tensors in ~0.42 ms instead of ~0.58). A column they do not take as it is (empty,
    nested otherwise, a value not of the column's kind) sends the body to ``decoder``, whose
    answer is the same as before they were there."""

    decoder: msgspec.json.Decoder[Any]
    lengths: tuple[_Length, ...]
    history: msgspec.json.Decoder[Any]
    sequence: tuple[Column, ...]

    def decode(self, raw: bytes) -> Any | None:
        """The body, or ``None``: something only pydantic can accept or explain."""
        body = self._read_history(raw)
        if body is None:
            try:
                body = self.decoder.decode(raw)
            except msgspec.MsgspecError:
                return None
        for group, name, least, most in self.lengths:
            holder = body
            for part in () if group is None else group.split("."):
                holder = getattr(holder, part) if holder is not None else None
            if holder is not None and not least <= len(getattr(holder, name)) <= most:
                return None
        return body

    def _read_history(self, raw: bytes) -> Any | None:
        """The body by ``history``, its sequence columns arrays; ``None`` when a column is
        not one the readers take (or the body not one ``decoder`` would take)."""
        try:
            body = self.history.decode(raw)
        except msgspec.MsgspecError:
            return None
        since = getattr(body, "events_since", None)
        for events in (body.events, None if since is None else since.events):
            if events is None:
                continue
            for col in self.sequence:
                text = bytes(getattr(events, col.name))
                array = read_ids(text) if col.kind == "id" else read_rows(text, col.per_row)
                if array is None:
                    return None
                setattr(events, col.name, array)
        return body


_OPEN, _CLOSE, _COMMA = ord("["), ord("]"), ord(",")


def read_ids(text: bytes) -> np.ndarray | None:
    """A JSON list of ids as int64, or ``None`` unless it is a flat, non-empty list of
    integers from 0 to 2**63 - 1 (what the strict decoder takes: anything else is its to
    take or refuse)."""
    if text.find(b"[", text.find(b"[") + 1) >= 0:  # a list inside the list
        return None
    try:
        doc = simdjson.Parser().parse(text)
        if not isinstance(doc, simdjson.Array):
            return None
        ids = np.frombuffer(doc.as_buffer(of_type="i"), np.int64)
    except (ValueError, TypeError, RuntimeError):  # not int64s
        return None
    if not ids.size or ids.min() < 0:
        return None
    return ids.copy()  # writable, owned


def read_rows(text: bytes, width: int) -> np.ndarray | None:
    """A JSON list of rows of ``width`` numbers as float32 ``(rows, width)``, or ``None``
    unless it is a non-empty list of such rows, each exactly that wide.

    The parser flattens the rows; their shape is checked on the text's brackets and commas
    (a number holds neither; a string fails the parser's read): one bracket pair per row
    plus the list's, the rows side by side, and ``rows × width - 1`` commas in all, the
    ``width - 1`` after row ``i``'s first ``i × width`` inside it and the next one between
    it and row ``i + 1``."""
    try:
        doc = simdjson.Parser().parse(text)
        if not isinstance(doc, simdjson.Array):
            return None
        rows = len(doc)
        flat = np.frombuffer(doc.as_buffer(of_type="d"), np.float64)
    except (ValueError, TypeError, RuntimeError):  # not numbers (a string, a bigint)
        return None
    if not width or not rows or flat.size != rows * width:
        return None
    chars = np.frombuffer(text, np.uint8)
    starts, ends = np.flatnonzero(chars == _OPEN), np.flatnonzero(chars == _CLOSE)
    commas = np.flatnonzero(chars == _COMMA)
    if starts.size != rows + 1 or ends.size != rows + 1 or commas.size != rows * width - 1:
        return None
    starts, ends = starts[1:], ends[:-1]  # the rows'
    by_row = np.append(commas, len(text)).reshape(rows, width)  # a last "separator" after all
    inside, after = by_row[:, : width - 1], by_row[:-1, width - 1]
    if not (
        (starts < ends).all()
        and (ends[:-1] < after).all()
        and (after < starts[1:]).all()
        and (width == 1 or ((starts < inside[:, 0]).all() and (inside[:, -1] < ends).all()))
    ):
        return None
    with np.errstate(over="ignore"):  # beyond float32: infinite, as the lists' path makes it
        return flat.astype(np.float32).reshape(rows, width)


def strict_body(spec: FeatureSpec, prefetch: bool = False) -> StrictBody:
    """The scoring body (``prefetch``: the prefetch body) of a model with ``spec``."""
    lengths: _Lengths = []
    decoder = _strict_decoder(spec, prefetch, lengths, raw_history=False)
    history = _strict_decoder(spec, prefetch, [], raw_history=True)
    return StrictBody(decoder, tuple(lengths), history, spec.sequence)


def _strict_decoder(
    spec: FeatureSpec, prefetch: bool, lengths: _Lengths, raw_history: bool
) -> msgspec.json.Decoder[Any]:
    """The body's msgspec decoder (its list lengths added to ``lengths``); ``raw_history``:
    with the sequence columns left as JSON text (:class:`msgspec.Raw`)."""
    events = _strict_group(
        "events", spec.sequence, spec.max_request_events, lengths, raw=raw_history
    )
    fields: list[tuple[Any, ...]] = [("user_id", _USER_ID)]
    if prefetch:
        fields.append(("events", events))
    else:
        since_lengths = [
            ("events_since.events", n, lo, hi) for g, n, lo, hi in lengths if g == "events"
        ]
        lengths += since_lengths  # the same limits on the events after a hash
        since = msgspec.defstruct(
            "EventsSince",
            [("seq_hash", _SEQ_HASH), ("events", events)],
            kw_only=True,
            forbid_unknown_fields=True,
        )
        cands = _strict_group("candidates", spec.candidate, spec.max_candidates, lengths)
        fields += [("events", events | None, None), ("seq_hash", _SEQ_HASH | None, None)]
        fields += [("events_since", since | None, None), ("candidates", cands)]
    for c in spec.user:
        id_col = c.kind == "id"
        kind = list[_StrictId] if id_col else list[float]
        fields.append((c.name, kind, msgspec.field(default_factory=list)))
        lengths.append(
            (None, c.name, 0, max(c.per_row, USER_IDS_MAX if id_col else USER_DENSE_MAX))
        )
    name = "PrefetchRequest" if prefetch else "ScoreRequest"
    body = msgspec.defstruct(name, fields, kw_only=True, forbid_unknown_fields=True)
    return msgspec.json.Decoder(body)


def _strict_group(
    group: str, cols: tuple[Column, ...], limit: int, lengths: _Lengths, raw: bool = False
) -> Any:
    """``events`` or ``candidates`` as :func:`_rows` makes them: ids required, the first
    column not empty; rows of floats empty when left out. A row of a column with a width is
    a tuple of exactly that many floats (a fixed-length array decodes in two thirds of the
    time of a list; a row of another length is pydantic's to name). ``raw``: every column
    as its JSON text (left out: an empty list's)."""
    fields: list[tuple[Any, ...]] = []
    for i, c in enumerate(cols):
        if raw:
            empty = c.kind == "dense"  # required ids, as below
            default = (msgspec.field(default_factory=_empty_list),) if empty else ()
            fields.append((c.name, msgspec.Raw, *default))
        elif c.kind == "id":
            fields.append((c.name, list[_StrictId]))
        else:
            row: Any = tuple.__class_getitem__((float,) * c.per_row) if c.per_row else list[float]
            fields.append((c.name, list[row], msgspec.field(default_factory=list)))
        lengths.append((group, c.name, 1 if i == 0 and c.kind == "id" else 0, limit))
    name = f"{group.capitalize()}In"
    return msgspec.defstruct(name, fields, kw_only=True, forbid_unknown_fields=True)


def _empty_list() -> msgspec.Raw:
    return msgspec.Raw(b"[]")


# Python's ``$`` matches before a final newline; pydantic's (Rust) does not: ``\Z`` here
_StrictId = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
_USER_ID = Annotated[
    str,
    msgspec.Meta(min_length=1, max_length=USER_ID_MAX, pattern=USER_ID_PATTERN[:-1] + r"\Z"),
]
_SEQ_HASH = Annotated[str, msgspec.Meta(pattern=SEQ_HASH_PATTERN[:-1] + r"\Z")]


EVENTS_DOC = (
    "The user's history, one list per sequence column. Required unless the history is sent"
    " by reference (seq_hash, or the If-Match header) or as events_since."
)
EVENTS_SINCE_DOC = (
    "The history as the events after one an earlier answer named: scored from the entry"
    " cached under seq_hash extended with these events (exactly, where the model extends"
    " it so), the answer's seq_hash and events those of the whole history; or 412"
    " history_required at once when no tier holds that entry or it cannot be extended"
    " exactly: send the whole history then. Instead of events, seq_hash and the user"
    " columns (the entry's are used)."
)
SINCE_HASH_DOC = "The seq_hash (ETag) an earlier answer for this user named."
SEQ_HASH_DOC = (
    "The history by reference: the seq_hash an earlier answer for this user named (its"
    " ETag). Scored from the entry cached under it, or 412 history_required at once (never"
    " seen, expired, another user's or model's): send the events then. Instead of events and"
    " the user columns, which the hash covers."
)


def by_reference(body: RequestBody, spec: FeatureSpec, if_match: str | None) -> str | None:
    """The sequence hash the request sends its history by (``If-Match`` or the body's
    ``seq_hash``), or ``None`` when it sends its events; ``InputError`` naming the field
    when the two forms are mixed or neither is there."""
    seq_hash: str | None = body.seq_hash
    users = tuple(c.name for c in spec.user)
    if body.events_since is not None:
        if if_match is not None:
            raise HeaderError(IF_MATCH, "must be left out when events_since names the history")
        _left_out(body, ("events", "seq_hash", *users), "events_since")
        return None
    if if_match is not None:
        if seq_hash is not None and seq_hash != if_match:
            raise HeaderError(IF_MATCH, "names another seq_hash than the body's")
        seq_hash = if_match
    if seq_hash is None:
        if body.events is None:
            raise InputError("events", "required unless seq_hash (or If-Match) names the history")
        return None
    _left_out(body, ("events", *users), "seq_hash" if if_match is None else IF_MATCH)
    return seq_hash


def _left_out(body: RequestBody, names: tuple[str, ...], field: str) -> None:
    """``InputError`` naming the first of ``names`` the body sends beside ``field``, the
    form its history came in."""
    for name in names:
        if getattr(body, name):
            raise InputError(name, f"must be left out when {field} names the history")


IF_MATCH = "If-Match"
_ETAG = re.compile(f'^"({SEQ_HASH_PATTERN.strip("^$")})"$')


def if_match(raw: str | None) -> str | None:
    """The sequence hash of an ``If-Match: "<seq_hash>"`` header (one strong entity tag, as
    answers send it in ``ETag``); ``HeaderError`` for anything else."""
    if raw is None:
        return None
    found = _ETAG.match(raw.strip())
    if found is None:
        raise HeaderError(IF_MATCH, 'must be one entity tag an answer sent: "<seq_hash>"')
    return found.group(1)


def etag(seq_hash: str) -> str:
    return f'"{seq_hash}"'


def _rows(col: Column, limit: int, first: bool) -> tuple[Any, Any]:
    """A per-event / per-candidate column: a list of ids, or a list of rows of floats."""
    if col.kind == "id":
        kwargs: dict[str, Any] = {"max_length": limit, "description": col.description or None}
        if first:
            kwargs["min_length"] = 1
        return list[Id], Field(**kwargs)
    about: str | None = col.description or None
    if col.per_row:  # required: the description says so (the group's rows, ``width`` each)
        need = f"one row of {col.per_row} values per row of the group"
        about = f"{about} ({need})" if about else need.capitalize()
    return list[list[Finite]], Field(default_factory=list, max_length=limit, description=about)


def _user_field(col: Column) -> tuple[Any, Any]:
    if col.kind == "id":
        kind: Any = list[Id]
        bound = max(col.per_row, USER_IDS_MAX)
    else:
        kind, bound = list[Finite], max(col.per_row, USER_DENSE_MAX)
    # left out only when the history is sent by reference: the schema cannot say "required
    # with events", so the description does (and a missing one is named "missing")
    need = f"{col.per_row} values; required unless the history is sent by reference"
    description = f"{col.description} ({need})" if col.description else need.capitalize()
    return kind, Field(default_factory=list, max_length=bound, description=description)


def to_inputs(body: RequestBody, spec: FeatureSpec) -> tuple[UserInput, CandidateInput]:
    """The request's user side and candidates as tensors (``InputError`` naming the field
    when lengths disagree)."""
    return to_user(body, spec), to_candidates(body, spec)


def to_candidates(body: RequestBody, spec: FeatureSpec) -> CandidateInput:
    """A scoring request's candidates as tensors."""
    cands = {c.name: getattr(body.candidates, c.name) for c in spec.candidate}
    return candidates_from_lists(spec, cands)


def to_events_since(body: RequestBody, spec: FeatureSpec) -> tuple[str, dict[str, Tensor]]:
    """A request's ``events_since``: the hash it names and the events after it as tensors."""
    since = body.events_since
    listed = {c.name: getattr(since.events, c.name) for c in spec.sequence}
    return since.seq_hash, events_from_lists(spec, listed, "events_since.events")


def to_user(body: RequestBody, spec: FeatureSpec) -> UserInput:
    """The user side of a scoring or prefetch request as tensors."""
    events = {c.name: getattr(body.events, c.name) for c in spec.sequence}
    user = {c.name: getattr(body, c.name) for c in spec.user}
    return user_from_lists(spec, events, user)


class ScoreResponse(BaseModel):
    request_id: str
    model_version: str
    scores: list[float]
    cache: str = Field(description="l1 | host | l2 | incremental | miss (none: cache disabled)")
    timings_ms: dict[str, float]
    seq_hash: str | None = Field(
        None,
        description="The hash of the user's history the scores were made with (also the"
        " ETag): send it back as seq_hash or If-Match instead of the same events (null: the"
        " pod caches nothing).",
    )
    events: int | None = Field(
        None, description="How many events that history has (null: it was sent by reference)."
    )


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
