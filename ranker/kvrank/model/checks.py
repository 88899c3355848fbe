"""Load-time cacheability checks: is this model safe to serve from a K/V cache?

A model that breaks the contract would not fail loudly: it would serve wrong scores from the
cache. So before a model is served (``kvrank serve`` before ``/readyz``; ``kvrank
check-model DIR`` in a team's CI) it runs on random inputs drawn from its own feature spec:

- ``cached_equals_full``: ``score`` over ``encode_user`` equals ``forward_full`` over several
  history lengths (window-sized and longer included) and candidate counts;
- ``candidates_independent``: a candidate scored alone, in a permuted set and duplicated
  gets the same score (catches cross-candidate attention, batch-dependent normalisation);
- ``encode_deterministic``: the same user encodes to the same state, also after other users
  (catches hidden state, and inputs the cache key does not cover: a request differing only
  in something unhashed would be served another user's state);
- ``bytes_roundtrip``: the state read back from its bytes scores bit for bit the same;
- ``kv_dtype[<dtype>]``: each offered storage dtype stays within its declared |Δlogit|;
- ``score_many``: batched scoring equals per-request scoring (when the model has it);
- ``extend_exact``: extending equals a full encode wherever the model says it is exact
  (when the model can extend);
- ``golden_parity``: the logits training exported with the weights (``golden.safetensors``,
  when the artifact has one) are what serving gives (train/serve parity).

Each check reports what it measured; nothing here touches a cache or the network.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from kvrank.errors import ModelCheckError
from kvrank.model.contract import (
    BatchScorer,
    CacheableRanker,
    CandidateInput,
    Extendable,
    UserInput,
)
from kvrank.model.features import example_candidates, example_user
from kvrank.model.golden import GOLDEN_TOLERANCE, GoldenCase
from kvrank.model.kv import UserKV

EXACT_TOLERANCE = 1e-5
"""|Δlogit| allowed between cached and no-cache scores (fp32). A model computing in a lower
precision declares its own as ``score_tolerance``."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str
    seconds: float


@dataclass
class CheckReport:
    results: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if not r.passed]

    def raise_for_failure(self) -> None:
        """``ModelCheckError`` naming the first failed check (and how many failed)."""
        if self.failed:
            first = self.failed[0]
            others = f" (and {len(self.failed) - 1} more)" if len(self.failed) > 1 else ""
            raise ModelCheckError(first.name, first.detail + others)


class _Failed(Exception):
    pass


@dataclass(frozen=True)
class CheckPlan:
    """Which checks to run, and how many shapes each tries."""

    thorough: bool = True
    """Every shape (``kvrank check-model``); off: the fewest that still cover a history
    shorter than the window and one past it (a pod's start-up, where seconds count)."""
    kv_dtypes: tuple[str, ...] | None = None
    """Storage dtypes to check; None: every one the model offers."""
    score_many: bool = True
    extend: bool = True
    golden: list[GoldenCase] | None = None
    """Training's inputs and logits (``golden.safetensors``): served logits must match."""


def check_model(
    model: CacheableRanker, plan: CheckPlan | None = None, seed: int = 0
) -> CheckReport:
    """Run the checks of ``plan`` that apply to ``model``; never raises for a failed check."""
    report = CheckReport()
    probe = _Probe(model, plan or CheckPlan(), seed)
    for name, check in probe.checks():
        start = time.perf_counter()
        try:
            detail = check()
            passed = True
        except _Failed as exc:
            detail, passed = str(exc), False
        except Exception as exc:  # a model that crashes on valid input fails the check
            detail, passed = f"raised {type(exc).__name__}: {exc}", False
        report.results.append(CheckResult(name, passed, detail, time.perf_counter() - start))
    return report


class _Probe:
    def __init__(self, model: CacheableRanker, plan: CheckPlan, seed: int) -> None:
        self.model = model
        self.plan = plan
        self.spec = model.features
        self.gen = torch.Generator().manual_seed(seed)
        self.tol = float(getattr(model, "score_tolerance", EXACT_TOLERANCE))
        w = self.spec.window
        longest = min(w + 3, self.spec.max_request_events)
        shapes = {(1, 1), (max(1, w // 2), 7), (w, 33), (longest, 5)}
        if not plan.thorough:
            shapes = {(max(1, w // 2), 7), (longest, 5)}
        self.shapes = sorted(shapes)
        """(history length, candidate count) pairs: short, half, full and past the window."""

    def checks(self) -> Iterator[tuple[str, Callable[[], str]]]:
        yield "cached_equals_full", self.cached_equals_full
        yield "window_respected", self.window_respected
        yield "candidates_independent", self.candidates_independent
        yield "encode_deterministic", self.encode_deterministic
        yield "bytes_roundtrip", self.bytes_roundtrip
        wanted = self.plan.kv_dtypes
        for dtype in self.model.kv_dtypes:
            if dtype == "fp32" or (wanted is not None and dtype not in wanted):
                continue  # fp32 is the reference itself
            yield f"kv_dtype[{dtype}]", lambda d=dtype: self.kv_dtype(d)  # type: ignore[misc]
        if self.plan.score_many and isinstance(self.model, BatchScorer):
            yield "score_many", self.score_many
        if self.plan.extend and isinstance(self.model, Extendable):
            yield "extend_exact", self.extend_exact
        if self.plan.golden:
            yield "golden_parity", self.golden_parity

    # ------------------------------------------------------------------ inputs
    def user(self, n: int) -> UserInput:
        return example_user(self.spec, n, self.gen)

    def cands(self, c: int) -> CandidateInput:
        return example_candidates(self.spec, c, self.gen)

    def _logits(self, t: Tensor, c: int, what: str) -> Tensor:
        if tuple(t.shape) != (c,):
            raise _Failed(f"{what} returned shape {tuple(t.shape)} for {c} candidates")
        t = t.detach().float().cpu()
        if not bool(torch.isfinite(t).all()):
            raise _Failed(f"{what} returned non-finite logits")
        return t

    def _score(self, kv: UserKV, cands: CandidateInput) -> Tensor:
        return self._logits(self.model.score(kv, cands), len(cands), "score")

    def _near(self, a: Tensor, b: Tensor, tol: float, what: str) -> float:
        delta = float((a - b).abs().max())
        if not delta <= tol:
            raise _Failed(f"{what}: max |Δlogit| {delta:.3g} > {tol:g}")
        return delta

    # ------------------------------------------------------------------ checks
    def cached_equals_full(self) -> str:
        worst = 0.0
        spread = 0.0
        for n, c in self.shapes:
            user, cands = self.user(n), self.cands(c)
            cached = self._score(self.model.encode_user(user), cands)
            full = self._logits(self.model.forward_full(user, cands), c, "forward_full")
            worst = max(worst, self._near(cached, full, self.tol, f"{n} events, {c} candidates"))
            spread = max(spread, float(full.std()) if c > 1 else 0.0)
        if spread == 0.0:
            raise _Failed("every candidate got the same logit: the check would prove nothing")
        return f"max |Δlogit| {worst:.2g} over {len(self.shapes)} shapes (≤ {self.tol:g})"

    def window_respected(self) -> str:
        """kvrank hands a model the whole history (the hash covers every event); the model
        keeps its last ``window``: events before them must change nothing."""
        w = self.spec.window
        past = min(3, self.spec.max_request_events - w)
        if past <= 0:
            return "no request may be longer than the window: nothing to cut"
        user, cands = self.user(w + past), self.cands(7)
        whole = self._score(self.model.encode_user(user), cands)
        last = self._score(self.model.encode_user(user.slice(past)), cands)
        what = f"{w + past} events against their last {w} (the window)"
        delta = self._near(whole, last, self.tol, what)
        return f"{past} events before the window change nothing: max |Δlogit| {delta:.2g}"

    def candidates_independent(self) -> str:
        n, c = self.shapes[-2][0], 9
        kv, cands = self.model.encode_user(self.user(n)), self.cands(c)
        together = self._score(kv, cands)
        worst = 0.0
        for i in (0, c // 2, c - 1):
            alone = self._score(kv, cands.select(torch.tensor([i])))
            worst = max(
                worst, self._near(alone, together[i : i + 1], self.tol, f"candidate {i} alone")
            )
        perm = torch.randperm(c, generator=self.gen)
        permuted = self._score(kv, cands.select(perm))
        worst = max(worst, self._near(permuted, together[perm], self.tol, "a permuted set"))
        dup = torch.arange(c).repeat_interleave(2)
        doubled = self._score(kv, cands.select(dup))
        worst = max(worst, self._near(doubled, together[dup], self.tol, "a duplicated set"))
        return f"alone, permuted and duplicated: max |Δlogit| {worst:.2g}"

    def encode_deterministic(self) -> str:
        n = self.shapes[-2][0]
        user = self.user(n)
        first = self.model.encode_user(user)
        for m in (1, n):  # other users in between: no state may carry over
            self.model.encode_user(self.user(m))
        again = self.model.encode_user(user)
        if first.to_bytes() != again.to_bytes():
            raise _Failed(
                "the same user encoded twice gave different states: the state depends on"
                " something the cache key does not cover (hidden state, randomness, time)"
            )
        return "same input, same state bytes (also after other users)"

    def bytes_roundtrip(self) -> str:
        n, c = self.shapes[-2]
        kv, cands = self.model.encode_user(self.user(n)), self.cands(c)
        back = UserKV.from_bytes(kv.to_bytes(), self.model.device)
        if not torch.equal(self._score(kv, cands), self._score(back, cands)):
            raise _Failed("the state read back from its bytes scores differently")
        return f"{kv.nbytes} bytes, scores bit-identical after the round trip"

    def kv_dtype(self, dtype: str) -> str:
        n, c = self.shapes[-2]
        user, cands = self.user(n), self.cands(c)
        ref = self._score(self.model.encode_user(user, "fp32"), cands)
        stored = self.model.encode_user(user, dtype)  # type: ignore[arg-type]
        if stored.kv_dtype != dtype:
            raise _Failed(f"encode_user(kv_dtype={dtype!r}) stored {stored.kv_dtype!r}")
        back = UserKV.from_bytes(stored.to_bytes(), self.model.device)
        tol = float(self.model.kv_dtypes[dtype])  # type: ignore[index]
        delta = self._near(self._score(back, cands), ref, tol, f"{dtype} storage")
        return f"max |Δlogit| {delta:.2g} vs fp32 storage (≤ {tol:g}), {stored.nbytes} bytes"

    def score_many(self) -> str:
        assert isinstance(self.model, BatchScorer)
        requests = [(self.model.encode_user(self.user(n)), self.cands(c)) for n, c in self.shapes]
        batched = self.model.score_many(requests)
        if len(batched) != len(requests):
            raise _Failed(f"score_many returned {len(batched)} results for {len(requests)}")
        worst = 0.0
        for i, ((kv, cands), logits) in enumerate(zip(requests, batched, strict=True)):
            one = self._logits(logits, len(cands), "score_many")
            worst = max(worst, self._near(one, self._score(kv, cands), self.tol, f"request {i}"))
        return f"{len(requests)} requests batched: max |Δlogit| {worst:.2g}"

    def extend_exact(self) -> str:
        model = self.model
        assert isinstance(model, Extendable)
        w = self.spec.window
        cases = {(1, 1), (max(1, w // 2), 3), (max(1, w - 2), 2), (w, 1), (w, 4)}
        if not self.plan.thorough:
            cases = {(max(1, w // 2), 3), (w, 1)}
        exact, worst = 0, 0.0
        for base, new in sorted(cases):
            user, cands = self.user(base + new), self.cands(7)
            prefix = model.encode_user(user.slice(0, base))
            if not model.extend_is_exact(prefix, new):
                continue
            extended = model.extend_user(prefix, user.slice(base))
            if extended.length != min(base + new, w):
                raise _Failed(
                    f"extended state has length {extended.length}, expected {min(base + new, w)}"
                )
            full = self._score(model.encode_user(user), cands)
            worst = max(
                worst,
                self._near(self._score(extended, cands), full, self.tol, f"{base}+{new} events"),
            )
            exact += 1
        if exact == 0:
            return f"never exact on the {len(cases)} cases tried: serving encodes in full"
        return f"{exact} of {len(cases)} cases exact: max |Δlogit| {worst:.2g} vs a full encode"

    def golden_parity(self) -> str:
        assert self.plan.golden
        worst = 0.0
        for i, case in enumerate(self.plan.golden):
            served = self._score(self.model.encode_user(case.user), case.candidates)
            want = case.logits.float().cpu()
            worst = max(worst, self._near(served, want, GOLDEN_TOLERANCE, f"golden case {i}"))
        n = len(self.plan.golden)
        return f"{n} cases from training: max |Δlogit| {worst:.2g} (≤ {GOLDEN_TOLERANCE:g})"
