"""Open Inference Protocol (v2) inputs as a caller builds them from a ``/v1/score`` body,
written here independently of the server's own parsing (the tests' oracle)."""

from __future__ import annotations

from typing import Any

import numpy as np

SCORE, MODEL = "/v1/score", "ranker"
INFER = f"/v2/models/{MODEL}/infer"


def tensors(body: dict[str, Any], spec, by_reference: str | None = None) -> list[tuple]:
    """``(name, datatype, array)`` of every input of a ``/v1/score`` body."""
    out: list[tuple] = [("user_id", "BYTES", np.array([body["user_id"].encode()], dtype=object))]
    if by_reference is not None:
        out.append(("seq_hash", "BYTES", np.array([by_reference.encode()], dtype=object)))
    groups = [("candidates", c, body["candidates"][c.name]) for c in spec.candidate]
    if by_reference is None:
        groups = [
            *(("events", c, body["events"][c.name]) for c in spec.sequence),
            *(("user", c, body[c.name]) for c in spec.user),
            *groups,
        ]
    for group, col, values in groups:
        name = col.name if group == "user" else f"{group}.{col.name}"
        dtype, kind = (np.int64, "INT64") if col.kind == "id" else (np.float32, "FP32")
        out.append((name, kind, np.asarray(values, dtype=dtype)))
    return out
