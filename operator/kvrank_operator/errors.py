"""Operator errors. A :class:`SpecError` is a spec the schema could not reject (e.g. a
canary with the stable version): it becomes a Degraded condition and an Event, and nothing
is deleted. Mapping to kopf's permanent/temporary errors happens in ``handlers`` only."""

from __future__ import annotations


class OperatorError(Exception):
    """Base class of operator errors."""


class SpecError(OperatorError, ValueError):
    """A RankerDeployment spec is invalid; ``field`` is its dotted path."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"spec.{field}: {problem}")
        self.field = field
        self.problem = problem


class DocumentError(OperatorError, ValueError):
    """A document given to ``render`` is not a RankerDeployment the operator would take;
    ``field`` is its dotted path from the document's top."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
