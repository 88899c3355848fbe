"""`kvrank bench --profile quick` reports every mode, exactness and memory in its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REQUIRED = {
    "profile",
    "shapes",
    "modes",
    "speedup_hit_vs_nocache_batched",
    "speedup_miss_vs_nocache_batched",
    "speedup_hit_vs_nocache_serial",
    "speedup_miss_vs_nocache_serial",
    "max_abs_diff_fp32",
    "int8_max_abs_logit_diff",
    "int8_auc_delta",
    "kv_bytes_per_user",
}
MODES = {"nocache_batched", "nocache_serial", "miss", "hit", "hit_int8", "incremental"}


@pytest.mark.slow
def test_quick_bench_writes_complete_json(tmp_path: Path, kvrank_cli) -> None:
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    outputs = ["--json", str(out), "--plot", str(png)]
    # ~80 s alone on 2 vCPUs; beside the cluster lane in make test, up to four times that
    args = ("bench", "--profile", "quick", "--candidates", "50,100", *outputs)
    proc = kvrank_cli(*args, timeout=900)
    report = json.loads(out.read_text())
    assert set(report) >= REQUIRED
    assert set(report["modes"]) == MODES
    assert set(report["per_candidates"]) == {"50", "100"}
    for per_c in report["per_candidates"].values():
        assert REQUIRED - {
            "profile",
            "shapes",
            "int8_auc_delta",
            "int8_max_abs_logit_diff",
            "kv_bytes_per_user",
        } <= set(per_c)
    assert report["max_abs_diff_fp32"] <= 1e-4
    hit = report["modes"]["hit"]
    tp = report["hit_throughput"]
    assert tp["achieved_tflops"] == pytest.approx(hit["flops"] / hit["p50_ms"] / 1e9)
    assert tp["device_name"] == "cpu" and tp["peak_tflops"] is None
    assert "TFLOP/s achieved on cpu" in proc.stdout
    kv = report["kv_bytes_per_user"]
    assert kv["int8"] < kv["bf16"] < kv["fp32"] and kv["int8_compact"] < kv["int8"]
    assert report["drift"] and report["drift"][0]["increments"] == 1
    inc = report["approximate_increments"]
    assert inc["model"].startswith("trained")
    assert [r["increments"] for r in inc["rows"]] == [1, 10, 50]
    for row in inc["rows"]:
        assert 0.5 < row["auc_exact"] < 1 and 0.5 < row["auc_approximate"] < 1
        assert row["auc_delta"] == pytest.approx(row["auc_approximate"] - row["auc_exact"])
        assert row["max_abs_logit_diff"] > 0  # every increment slid the window: not exact
    rt = report["l2_round_trip"]
    assert set(rt) == {"bf16", "int8_compact", "served_bf16"}
    served = rt.pop("served_bf16")  # L2 hits scored and answered, the tag first or beside
    assert served["entry_bytes"] == rt["bf16"]["entry_bytes"] and served["candidates"] == 100
    # a hit includes its own scoring, hit by hit (medians of the two, taken apart, need not
    # be ordered on a loaded machine)
    assert served["score_p50_ms"] > 0
    assert served["hit_inline_less_score_p50_ms"] > 0 and served["hit_beside_less_score_p50_ms"] > 0
    assert 0 < served["share_beside"] < 1 and 0 < served["share_inline"] < 1
    assert served["served"] == "inline"  # a quick entry is under a worker thread's size
    assert "An L2 hit served (bf16" in proc.stdout
    assert rt["int8_compact"]["entry_bytes"] < rt["bf16"]["entry_bytes"]
    assert rt["bf16"]["get_p50_ms"] > 0 and rt["bf16"]["plain_asyncio_get_p50_ms"] > 0
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "speed-up vs batched no-cache" in proc.stdout


def test_the_quick_profile_in_bf16_trains_in_fp32_then_scores_in_bf16() -> None:
    """What ``--compute-dtype bf16`` benchmarks: the trained weights, computing in bf16."""
    import dataclasses

    import torch

    from kvrank.bench.runner import PROFILES, _in_dtype, _model_for
    from kvrank.data.synthetic import SyntheticWorld

    prof = _in_dtype(dataclasses.replace(PROFILES["quick"], train_steps=3), "bf16")
    model, origin = _model_for(prof, "cpu", None)
    assert origin == "trained 3 steps" and model.cfg.compute_dtype == "bf16"
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    world = SyntheticWorld(model.cfg, 0)
    user = world.user(1, n_events=model.cfg.max_events)
    cands, _, _ = world.candidates(user, 20, 1)
    kv = model.encode_user(user.features)
    assert kv.nbytes == model.encode_user(user.features, kv_dtype="bf16").nbytes
    assert (model.score(kv, cands) - model.forward_full(user.features, cands)).abs().max() < 0.1


def test_a_lower_precision_is_refused_for_an_artifact_which_keeps_its_own(tmp_path) -> None:
    from typer.testing import CliRunner

    from kvrank.cli import app

    args = ["bench", "--compute-dtype", "bf16", "--model", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--compute-dtype" in result.output and "saved with" in result.output
    result = CliRunner().invoke(app, ["bench", "--compute-dtype", "int4"])
    assert result.exit_code == 2 and "fp32, bf16 or fp16" in result.output


def test_an_unknown_protocol_is_refused_before_the_bench_runs() -> None:
    from typer.testing import CliRunner

    from kvrank.cli import app

    result = CliRunner().invoke(app, ["bench", "--protocol", "json,carrier-pigeon"])
    assert result.exit_code == 2, result.output
    assert "--protocol" in result.output and "carrier-pigeon" in result.output
    result = CliRunner().invoke(app, ["bench", "--protocol", "v2-grpc"])  # no JSON reference
    assert result.exit_code == 2 and "json" in result.output


@pytest.mark.slow
def test_the_served_step_times_the_hit_by_each_protocol_and_extends_the_report(
    tmp_path: Path,
) -> None:
    """``kvrank bench --protocol``'s step after the bench: a served model's users asked by
    JSON (a miss, then an L1 hit) and by every other protocol (L1 hits), added to the
    bench's JSON beside what it had."""
    import torch

    from kvrank.model.artifact import save_model
    from kvrank.model.config import TINY
    from kvrank.model.ranker import RankerModel
    from kvrank.tools.callers import PROTOCOLS
    from kvrank.tools.served import bench_served

    torch.manual_seed(0)
    model = save_model(RankerModel(TINY, "v1").eval(), tmp_path / "v1")
    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"profile": "quick"}))
    bench_served("quick", "fp32", "cpu", PROTOCOLS, model, 10, report, users=3)
    written = json.loads(report.read_text())
    assert written["profile"] == "quick"  # the bench's own report is kept
    served = written["served"]
    assert served["cache_first"] == ["miss"] and served["cache_again"] == ["l1"]
    assert set(served["hit_by_protocol"]) == set(PROTOCOLS)
    for protocol, hits in served["hit_by_protocol"].items():
        assert hits["answers"] == ["200 l1"], (protocol, hits)
        assert 0 < hits["p50_ms"] <= hits["p99_ms"]
    assert served["max_abs_diff_hit_vs_miss"] == 0.0


def test_the_wire_benchmark_sends_each_hit_both_ways_with_the_same_scores() -> None:
    """A short ``make bench-wire``: every block an L1 hit, the same scores to the last bit by
    every protocol (JSON, tritonclient's binary tensors over HTTP and gRPC, whole and by
    reference) and by a baseline commit's server (here HEAD's own tree), and a request by
    reference without the history's bytes."""
    import argparse

    from bench_wire import BASELINE, PROTOCOLS, run

    args = argparse.Namespace(
        users=2, events=200, candidates=5, repeat=2, rounds=2, seed=1, baseline="HEAD"
    )
    report = run(args)
    assert report["equal_scores"]
    assert set(report["protocols"]) == {*PROTOCOLS, BASELINE}
    assert all(p["caches"] == ["l1"] for p in report["protocols"].values()), report
    sizes = {k: v["bytes_per_request"] for k, v in report["protocols"].items()}
    assert sizes["json-ref"] < sizes["json"] / 10, sizes
    assert sizes["v2-binary-ref"] < sizes["v2-binary"] < sizes["json"], sizes
    assert sizes["v2-grpc-ref"] < sizes["v2-grpc"] < sizes["json"], sizes
    assert len(report["rounds"]) == 2 and report["workload"]["requests_per_block"] == 4
    assert set(report["ratios"]) == {f"{p}_vs_json" for p in PROTOCOLS[1:]} | {
        f"{p}_vs_{BASELINE}" for p in PROTOCOLS
    }


@pytest.mark.slow
def test_the_batching_benchmark_serves_every_mode_the_same_hits_and_scores() -> None:
    """A short ``make bench-batching``: each server (one request per pass, a window,
    continuous batching, an engine with two fronts, and a baseline commit's tree: here
    HEAD's own) answers only L1 hits with the scores of the one-at-a-time server (the run
    fails otherwise), and the one that may batch nothing scored one request per pass."""
    import argparse

    from bench_batching import BASELINE, FRONTS, MODES, run

    args = argparse.Namespace(
        sizes="tiny", callers=4, seconds=0.5, rounds=2, users=8, candidates=5, baseline="HEAD",
        fronts=2,
    )  # fmt: skip
    report = run(args)
    servers = report["sizes"]["tiny"]["servers"]
    assert set(servers) == {*MODES, FRONTS, BASELINE}
    assert servers["alone"]["requests_per_pass"] == 1.0
    for name, s in servers.items():
        assert s["hits_per_s"] > 0 and s["open_loop"]["requests"] > 0, name
        assert s["max_abs_dscore_vs_alone"] <= 1e-5, name
    assert len(report["sizes"]["tiny"]["rounds"]) == 2


@pytest.mark.slow
def test_the_front_benchmark_serves_the_same_hits_and_scores_through_triton() -> None:
    """A short ``make bench-triton``: a real Triton Inference Server (2.51, from the
    ``nvidia-pytriton`` wheel) with kvrank's engine as its Python-backend model answers every
    user's v2 request, over HTTP and gRPC, as an L1 hit with ``kvrank serve``'s scores,
    bitwise (the run fails otherwise), under closed and open loops."""
    import argparse

    from bench_triton_front import run

    args = argparse.Namespace(
        sizes="tiny", callers=4, seconds=0.5, rounds=2, users=8, candidates=5, batch=8,
        queue_delay_us=100, protocols="http,grpc",
    )  # fmt: skip
    report = run(args)
    servers = report["sizes"]["tiny"]["servers"]
    assert set(servers) == {f"{s}/{p}" for s in ("kvrank", "triton") for p in ("http", "grpc")}
    for name, s in servers.items():
        assert s["hits_per_s"] > 0 and s["open_loop"]["requests"] > 0, name
        assert s["users_compared"] == 8 and s["users_with_other_scores"] == 0, name
    assert len(report["sizes"]["tiny"]["rounds"]) == 2


@pytest.mark.slow
def test_the_redis_fault_benchmark_answers_through_a_killed_restarted_and_forged_redis() -> None:
    """A short ``make bench-redis-fault``: two rankers, each an engine and a front, share a
    redis-server that is killed, started again empty and has entries overwritten while
    requests arrive. Every request is answered with scores, or refused by admission control
    (503 shed, 504 past its deadline) — never a 500, a 4xx or a dropped connection — and
    every phase of the schedule is reported."""
    import argparse

    from bench_redis_fault import PHASES, run

    args = argparse.Namespace(pods=2, fronts=[1], requests=72, rate=12.0, users=30, candidates=5)
    report = run(args)
    (one,) = report["runs"]
    assert list(one["faults"]) == ["killed", "started empty", "forged"], one["faults"]
    assert set(one["total"]["refused"]) <= {"503", "504"}, one["total"]
    assert list(one["phases"]) == list(PHASES)
    assert sum(p["requests"] for p in one["phases"].values()) == one["total"]["requests"] == 72


@pytest.mark.slow
def test_the_rate_benchmark_climbs_until_a_bound_breaks_and_reports_each_bounds_highest_rate() -> (
    None
):
    """A short run of what ``make bench-cuda`` measures on a GPU (here the tiny model on the
    CPU): an open loop of L1 hits by reference, then of misses, at climbing rates. Every
    step's answers are the kind it asked for, the climb stops at the first step outside the
    largest bound (or the ceiling), and each bound's highest rate is that of a step that kept
    every answer right and its p99 within it — whatever this machine's speed."""
    import argparse

    from bench_rate import run, within

    args = argparse.Namespace(
        size="tiny", compute_dtype="fp32", device="cpu", users=4, candidates=5, fronts=1,
        clients=1, l1_bytes=None, hit_protocol="json-ref", cuda_graphs=False,
        bounds="2000,100", start_rate=4.0,
        miss_start_rate=4.0, factor=2.0, refine=1, ceiling=16.0, step_s=1.0,
    )  # fmt: skip
    report = run(args)
    assert report["bounds_ms"] == [100.0, 2000.0]
    for kind, expect in (("hits", "200 l1"), ("misses", "200 miss")):
        steps = report[kind]["steps"]
        rates = [s["rate"] for s in steps]
        assert rates[0] == 4.0 and max(rates) <= 16.0, (kind, rates)
        for s in steps:
            assert s["requests"] == int(s["rate"] * args.step_s), (kind, s)
            assert s["all_right"] and set(s["answers"]) == {expect}, (kind, s)
            assert s["pod_busy_cores"] > 0 and s["gpu_util_percent"] is None
        climbed = [s for s in steps if s["rate"] in (4.0, 8.0, 16.0)]
        # the climb ends at the first step outside the largest bound, or at the ceiling
        assert all(within(s, 2000.0) for s in climbed[:-1]), (kind, climbed)
        for bound in (100.0, 2000.0):
            best = report[kind]["best_rate_per_s"][f"p99_le_{bound:g}_ms"]
            passing = [s["rate"] for s in steps if within(s, bound)]
            assert best == (max(passing) if passing else None), (kind, bound, steps)


def test_the_graph_benchmark_times_eager_and_bucketed_passes_with_the_same_scores() -> None:
    """A short run of the CUDA-graph comparison ``make bench-cuda`` makes, on the CPU (the
    bucketed passes then run eagerly): every case reports both times and scores within the
    model contract of the eager pass (the run fails otherwise)."""
    import argparse

    from bench_graphs import run

    args = argparse.Namespace(
        size="tiny", device="cpu", dtypes="fp32", users="1,3", candidates="5,70", repeat=1
    )
    report = run(args)
    assert not report["replayed"] and report["gpu"] is None
    cases = {(r["users"], r["candidates"]) for r in report["rows"]}
    assert cases == {(1, 5), (1, 70), (3, 5), (3, 70)}
    for r in report["rows"]:
        assert r["eager_p50_ms"] > 0 and r["graphs_p50_ms"] > 0
        assert r["max_abs_dlogit"] <= 1e-5, r
    assert report["rows"][-1]["graphs_captured"] == 0  # nothing captured without a GPU
