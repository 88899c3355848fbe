"""A small circuit breaker for the L2 tier.

Closed: calls go through; ``failure_threshold`` consecutive failures open it. Open: calls
are refused (the caller treats that as a miss) until ``cooldown_s`` has passed. Half-open:
one trial call decides — success closes, failure opens again. It closes by itself; nobody
has to reset it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

State = Literal["closed", "open", "half_open"]


@dataclass
class CircuitBreaker:
    failure_threshold: int = 3
    cooldown_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    _failures: int = field(default=0, init=False)
    _opened_at: float = field(default=0.0, init=False)
    _state: State = field(default="closed", init=False)
    opened_total: int = field(default=0, init=False)

    @property
    def state(self) -> State:
        if self._state == "open" and self.clock() - self._opened_at >= self.cooldown_s:
            self._state = "half_open"
        return self._state

    def allow(self) -> bool:
        return self.state != "open"

    def success(self) -> None:
        self._failures = 0
        self._state = "closed"

    def failure(self) -> None:
        self._failures += 1
        if self._state == "half_open" or self._failures >= self.failure_threshold:
            if self._state != "open":
                self.opened_total += 1
            self._state = "open"
            self._opened_at = self.clock()
