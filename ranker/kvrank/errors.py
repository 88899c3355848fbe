"""Domain exceptions of the kvrank data plane.

Every error a caller can provoke with bad input is an :class:`InputError` that names the
offending field and the limit it broke. The HTTP boundary maps these to status codes
(noted on each class); nothing below the boundary knows about HTTP. Internal invariants
use ``assert`` instead: they are bugs, not input.
"""

from __future__ import annotations


class KvrankError(Exception):
    """Base class of every kvrank error."""


class InputError(KvrankError, ValueError):
    """A request or feature tensor is malformed (maps to HTTP 422).

    ``field`` is the dotted name of the offending input (``events.item_ids``,
    ``candidates.dense``) and ``problem`` says what limit it broke.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class IncompatibleKVError(KvrankError, ValueError):
    """A ``UserKV`` was produced by another model version or configuration (maps to 409).

    The cache layer treats this as a miss; calling code that passes a foreign ``UserKV``
    directly to the model gets this error instead of a silently wrong score.
    """


class CorruptEntryError(KvrankError, ValueError):
    """Serialised K/V bytes failed validation: truncated, bad header or checksum.

    Raised by deserialisation only; every cache tier turns it into a miss.
    """


class ArtifactError(KvrankError, OSError):
    """A model artifact directory is missing files or holds an invalid config (maps to 500)."""


class ModelCheckError(ArtifactError):
    """A model failed a load-time cacheability check (see :mod:`kvrank.model.checks`): it
    is never served, and the pod stays un-ready naming the check."""

    def __init__(self, check: str, problem: str) -> None:
        super().__init__(f"model check {check!r} failed: {problem}")
        self.check = check
        self.problem = problem


class DeviceError(KvrankError, RuntimeError):
    """The configured compute device is not usable here (e.g. ``cuda`` without a GPU)."""
