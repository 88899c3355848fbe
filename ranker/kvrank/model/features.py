"""A model's inputs, checked against its :class:`FeatureSpec`: the request's lists made into
tensors, every tensor's shape, dtype, id range and finiteness, and example inputs.

Every problem is an :class:`InputError` naming the field as a request spells it
(``events.categories``, ``candidates.dense[3]``, ``profile_ids``) and the limit it broke, so
the HTTP boundary maps it to 422 unchanged. Example inputs (random, from a seed) feed the
warm-up, the load-time checks and the load generator. No model code runs here.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from kvrank.errors import InputError
from kvrank.model.contract import CandidateInput, Column, FeatureSpec, UserInput

ANY_ID = 2**62
"""Example ids of a column without a ``size`` are drawn below this (any id is valid)."""


Values = Sequence[Any]
"""A request's list for one column: ids, floats, or rows of floats; or already an array
(int64 ids, or float32 rows of the column's width, never empty) where the JSON decoder read
the column straight into one (:mod:`kvrank.server.schemas`)."""


def user_from_lists(
    spec: FeatureSpec, events: Mapping[str, Values], user: Mapping[str, Values]
) -> UserInput:
    """A request's user side as tensors (lengths checked; ranges by :func:`check_user`)."""
    fixed = {c.name: _row(c, user.get(c.name, [])) for c in spec.user}
    return UserInput(events_from_lists(spec, events), fixed)


def events_from_lists(
    spec: FeatureSpec, events: Mapping[str, Values], group: str = "events"
) -> dict[str, Tensor]:
    """A request's events as tensors (lengths checked, errors naming ``group.<column>``)."""
    first = spec.sequence[0].name
    n = len(events[first])
    return {c.name: _column(c, events.get(c.name, []), n, group, first) for c in spec.sequence}


def candidates_from_lists(spec: FeatureSpec, columns: Mapping[str, Values]) -> CandidateInput:
    first = spec.candidate[0].name
    c = len(columns[first])
    return CandidateInput(
        {
            col.name: _column(col, columns.get(col.name, []), c, "candidates", first)
            for col in spec.candidate
        }
    )


def _column(col: Column, values: Values, n: int, group: str, first: str) -> Tensor:
    field = f"{group}.{col.name}"
    if col.kind == "id":
        if len(values) != n:
            raise InputError(field, f"has {len(values)} values; {group}.{first} has {n}")
        if isinstance(values, np.ndarray):  # read from the JSON text as int64 already
            return torch.from_numpy(values)
        return _tensor(values, np.int64)
    if isinstance(values, np.ndarray):  # read as (rows, per_row) float32, none empty
        if len(values) != n:
            raise InputError(field, f"has {len(values)} rows; expected {n}")
        return torch.from_numpy(values)
    if col.per_row == 0 and not values:
        return torch.zeros(n, 0)
    if not values and n:
        raise InputError(field, f"missing: the model expects {n} rows of {col.per_row} values")
    if len(values) != n:
        raise InputError(field, f"has {len(values)} rows; expected {n}")
    if set(map(len, values)) - {col.per_row}:  # in C; the row is named only when one is off
        for i, row in enumerate(values):
            if len(row) != col.per_row:
                raise InputError(
                    f"{field}[{i}]", f"has {len(row)} values; the model expects {col.per_row}"
                )
    with np.errstate(over="ignore"):  # rows read flat: half the time of nested lists
        flat = np.fromiter(itertools.chain.from_iterable(values), np.float32, n * col.per_row)
    return torch.from_numpy(flat.reshape(n, col.per_row))


def _row(col: Column, values: Values) -> Tensor:
    if not values and col.per_row:
        raise InputError(col.name, f"missing: the model expects {col.per_row} values")
    return _tensor(values, np.int64 if col.kind == "id" else np.float32)


def _tensor(values: Values, dtype: type[np.generic]) -> Tensor:
    """Python lists as a tensor, through numpy (half the time of ``torch.tensor`` on lists;
    the same values: ints as int64, floats rounded to float32 alike, a float beyond float32
    infinite, which :func:`check_dense` refuses, as ``torch.tensor`` makes it). A flat list
    of ids is read as an iterator: half the time of ``np.asarray``, which first looks for
    nested lists."""
    if dtype is np.int64:
        return torch.from_numpy(np.fromiter(values, np.int64, len(values)))
    with np.errstate(over="ignore"):
        return torch.from_numpy(np.asarray(values, dtype=dtype))


def check_user(spec: FeatureSpec, user: UserInput) -> None:
    """``InputError`` unless ``user`` holds exactly the spec's columns, well formed."""
    _names(spec.sequence, user.events, "events")
    _names(spec.user, user.user, "")
    n = len(user)
    if n == 0:
        raise InputError(
            f"events.{spec.sequence[0].name}", "the sequence is empty; at least 1 event needed"
        )
    for col in spec.sequence:
        _check(col, user.events[col.name], f"events.{col.name}", n)
    for col in spec.user:
        check_ids_or_dense(user.user[col.name], col.name, col.kind, (col.per_row,), col.size)


def check_candidates(spec: FeatureSpec, cands: CandidateInput) -> None:
    _names(spec.candidate, cands.columns, "candidates")
    c = len(cands)
    if c == 0:
        raise InputError(f"candidates.{spec.candidate[0].name}", "no candidates; at least 1 needed")
    for col in spec.candidate:
        _check(col, cands.columns[col.name], f"candidates.{col.name}", c)


def _names(cols: tuple[Column, ...], given: Mapping[str, Tensor], group: str) -> None:
    missing = [c.name for c in cols if c.name not in given]
    if missing:
        raise InputError(_field(group, missing[0]), "missing")
    known = {c.name for c in cols}
    extra = [name for name in given if name not in known]
    if extra:
        raise InputError(_field(group, extra[0]), "not a feature of this model")


def _field(group: str, name: str) -> str:
    return f"{group}.{name}" if group else name


def _check(col: Column, t: Tensor, field: str, rows: int) -> None:
    shape = (rows,) if col.kind == "id" else (rows, col.per_row)
    check_ids_or_dense(t, field, col.kind, shape, col.size)


def check_ids_or_dense(
    t: Tensor, field: str, kind: str, shape: tuple[int, ...], limit: int | None
) -> None:
    if kind == "id":
        check_ids(t, field, shape, limit)
    else:
        check_dense(t, field, shape)


def _shape(t: Tensor, field: str, shape: tuple[int, ...]) -> None:
    if not isinstance(t, Tensor):
        raise InputError(field, f"expected a tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise InputError(field, f"shape {tuple(t.shape)} does not match expected {shape}")


def check_ids(t: Tensor, field: str, shape: tuple[int, ...], limit: int | None) -> None:
    """int64 ids of ``shape``, each in ``[0, limit)`` (``[0, 2**63)`` without a limit)."""
    _shape(t, field, shape)
    if t.dtype != torch.int64:
        raise InputError(field, f"dtype {t.dtype} is not int64")
    if t.numel() == 0:
        return
    if int(t.min()) < 0:
        raise InputError(field, f"id {int(t.min())} is negative; ids must be >= 0")
    if limit is not None and int(t.max()) >= limit:
        raise InputError(field, f"id {int(t.max())} is out of range [0, {limit})")


def check_dense(t: Tensor, field: str, shape: tuple[int, ...]) -> None:
    """Finite floats of ``shape``."""
    _shape(t, field, shape)
    if not t.is_floating_point():
        raise InputError(field, f"dtype {t.dtype} is not a floating type")
    if t.numel() and not _all_finite(t):
        raise InputError(field, "contains NaN or infinite values")


def _all_finite(t: Tensor) -> bool:
    """Whether every value of floating ``t`` is finite; a float32 tensor on the CPU (what a
    request's lists become) is read through numpy, at a quarter of torch's cost per call."""
    if t.dtype == torch.float32 and t.device.type == "cpu" and not t.requires_grad:
        return bool(np.isfinite(t.numpy()).all())
    return bool(torch.isfinite(t).all())


def example_user(spec: FeatureSpec, n: int, generator: torch.Generator) -> UserInput:
    """A random valid user with ``n`` events."""
    seq = {c.name: _random(c, (n,), generator) for c in spec.sequence}
    fixed = {c.name: _random(c, (), generator) for c in spec.user}
    return UserInput(seq, fixed)


def example_candidates(spec: FeatureSpec, c: int, generator: torch.Generator) -> CandidateInput:
    """``c`` random valid candidates."""
    return CandidateInput({col.name: _random(col, (c,), generator) for col in spec.candidate})


def _random(col: Column, rows: tuple[int, ...], g: torch.Generator) -> Tensor:
    """Rows of ``col``: ``rows=()`` is the user group's one row of ``width`` values."""
    if col.kind == "id":
        shape = rows if rows else (col.per_row,)
        return torch.randint(0, col.size or ANY_ID, shape, generator=g)
    return torch.randn(*rows, col.per_row, generator=g)
