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


class HeaderError(InputError):
    """A request header is malformed or out of its limits (maps to 400, naming the header)."""


class RoutingKeyError(HeaderError):
    """The routing header (the key a proxy hashes to pick the user's pod) names another user
    than the body's ``user_id`` (maps to 400, naming the header)."""


class IncompatibleKVError(KvrankError, ValueError):
    """A ``UserKV`` was produced by another model version or configuration (maps to 409).

    The cache layer treats this as a miss; calling code that passes a foreign ``UserKV``
    directly to the model gets this error instead of a silently wrong score.
    """


class CorruptEntryError(KvrankError, ValueError):
    """Serialised K/V bytes failed validation: truncated, bad header or checksum.

    Raised by deserialisation only; every cache tier turns it into a miss, counted under
    ``reason`` (:class:`kvrank.cache.entry.Reason`: what kind of entry it was).
    """

    def __init__(self, message: str, reason: str = "payload") -> None:
        super().__init__(message)
        self.reason = reason


class ArtifactError(KvrankError, OSError):
    """A model artifact directory is missing files or holds an invalid config (maps to 500)."""


class DatasetError(KvrankError, OSError):
    """A dataset file is missing, could not be downloaded, or is not the file it should be
    (its hash or row count differs): the message names the file and what was expected."""

    def __init__(self, path: object, problem: str) -> None:
        super().__init__(f"{path} {problem}")
        self.path = path
        self.problem = problem


class WorkloadError(KvrankError, ValueError):
    """A load-test workload does not fit the model served (e.g. real MovieLens requests to a
    model whose features are another's): the message names the fields."""


class ModelCheckError(ArtifactError):
    """A model failed a load-time cacheability check (see :mod:`kvrank.model.checks`): it
    is never served, and the pod stays un-ready naming the check."""

    def __init__(self, check: str, problem: str) -> None:
        super().__init__(f"model check {check!r} failed: {problem}")
        self.check = check
        self.problem = problem


class DeviceError(KvrankError, RuntimeError):
    """The configured compute device is not usable here (e.g. ``cuda`` without a GPU)."""


class HistoryRequired(KvrankError):
    """A request sent its history by reference (a sequence hash) and no tier holds the entry
    under that exact key: never seen, expired, evicted, of another user, model version or
    deployment (maps to 412 ``history_required``, answered before any model work: the caller
    resends the request with its events)."""

    def __init__(self, field: str, seq_hash: str, why: str | None = None) -> None:
        why = why or f"no cached entry of this user under {field} {seq_hash!r}"
        super().__init__(f"history_required: {why}; send the request again with its events")
        self.why = why
        self.field = field
        self.seq_hash = seq_hash


class NonFiniteScores(KvrankError, RuntimeError):
    """The model gave NaN or infinite scores from a state made afresh for this request (a
    cached one that did was dropped and made again first): never answered as scores (500)."""

    def __init__(self, model_version: str) -> None:
        super().__init__(f"model {model_version} gave non-finite scores for this request")


class Overloaded(KvrankError):
    """The pod cannot serve this request before its deadline: shed before any model work
    (maps to 503 with ``Retry-After``: another pod, or this one a moment later, can).

    ``reason`` is one of :data:`kvrank.admission.SHED_REASONS`."""

    def __init__(self, reason: str, why: str, retry_after_s: int) -> None:
        super().__init__(f"overloaded: {why}")
        self.reason = reason
        self.retry_after_s = retry_after_s


class Abandoned(KvrankError):
    """An admitted request's deadline passed, or its caller left, before a piece of its
    model work started: the work is dropped, never computed (maps to 504 for a deadline;
    to 499, which nobody reads, for a caller that left).

    ``ticket`` is the request's own :class:`kvrank.admission.Ticket`: a request that shared
    another's computation (same user, same history) and got this error can tell that it was
    the other one that gave up."""

    def __init__(self, reason: str, stage: str, ticket: object) -> None:
        super().__init__(
            f"dropped before {stage}: "
            + ("the caller disconnected" if reason == "disconnected" else "its deadline passed")
        )
        self.reason = reason
        self.stage = stage
        self.ticket = ticket
