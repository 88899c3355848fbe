"""The load-time cacheability checks: sound models pass every one, and each broken model is
refused by the check named for its flaw (the command line and a server's start alike)."""

from __future__ import annotations

import json

import pytest
import torch
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from kvrank.cli import app as cli
from kvrank.errors import ModelCheckError
from kvrank.model.artifact import load_ranker, save_ranker
from kvrank.model.checks import CheckPlan, check_model
from kvrank.model.onetrans import OneTransRanker
from kvrank.server.app import create_app
from kvrank.server.config import load_config


def test_the_built_in_model_passes_every_check(factory, tiny_cfg) -> None:
    report = check_model(OneTransRanker(factory.model(tiny_cfg)))
    names = [r.name for r in report.results]
    assert report.passed, report.failed
    assert names[:5] == [
        "cached_equals_full",
        "window_respected",
        "candidates_independent",
        "encode_deterministic",
        "bytes_roundtrip",
    ]
    assert {"kv_dtype[int8]", "kv_dtype[bf16]", "score_many", "extend_exact"} <= set(names)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_built_in_model_computing_in_half_precision_is_held_to_its_own_rounding(
    factory, tiny_cfg, dtype
) -> None:
    """What a GPU serves in: its cached and full paths round differently, so the checks hold
    it to its dtype's bound instead of fp32's 1e-5 (a bf16 production-size model was refused
    at start for 0.002)."""
    model = OneTransRanker(factory.model(tiny_cfg.model_copy(update={"compute_dtype": dtype})))
    report = check_model(model)
    assert report.passed, report.failed
    assert model.score_tolerance > 1e-5
    detail = report.results[0].detail
    assert f"(≤ {model.score_tolerance:g})" in detail, detail


def test_the_example_plugin_passes_and_a_non_extendable_one_is_not_asked_to_extend(
    sasrec_artifact, sasrec_tail_artifact
) -> None:
    extendable = check_model(load_ranker(sasrec_artifact))
    assert extendable.passed, extendable.failed
    assert "extend_exact" in [r.name for r in extendable.results]
    tail = check_model(load_ranker(sasrec_tail_artifact))
    assert tail.passed, tail.failed
    assert "extend_exact" not in [r.name for r in tail.results]


@pytest.mark.parametrize(
    "name",
    [
        "test-candidates-see-each-other",
        "test-batch-normalized",
        "test-user-side-sees-candidates",
        "test-hidden-state",
        "test-reads-past-window",
    ],
)
def test_each_broken_model_fails_the_check_named_for_its_flaw(
    broken_plugins, factory, tiny_cfg, tmp_path, name
) -> None:
    cls, check = broken_plugins[name]
    report = check_model(cls(factory.model(tiny_cfg)))
    assert check in [r.name for r in report.failed], report.results
    with pytest.raises(ModelCheckError) as info:
        report.raise_for_failure()
    assert info.value.check == report.failed[0].name


def test_a_fast_plan_still_catches_every_broken_model(broken_plugins, factory, tiny_cfg) -> None:
    """A pod's start-up runs fewer shapes; none of the flaws gets through it."""
    plan = CheckPlan(thorough=False, kv_dtypes=(), score_many=False)
    for cls, check in broken_plugins.values():
        report = check_model(cls(factory.model(tiny_cfg)), plan)
        assert check in [r.name for r in report.failed], (cls, report.results)


def test_check_model_command_names_the_failed_check(
    broken_plugins, factory, tiny_cfg, tmp_path
) -> None:
    from model_plugins import save_broken

    bad = save_broken("test-batch-normalized", factory.model(tiny_cfg), tmp_path / "bad")
    result = CliRunner().invoke(cli, ["check-model", str(bad), "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 1, result.output
    assert "candidates_independent" in result.output and "FAILED" in result.output
    doc = json.loads((tmp_path / "r.json").read_text())
    assert not doc["passed"]
    assert {c["name"]: c["passed"] for c in doc["checks"]}["candidates_independent"] is False

    good = save_ranker(OneTransRanker(factory.model(tiny_cfg)), tmp_path / "good", "onetrans", {})
    ok = CliRunner().invoke(cli, ["check-model", str(good)])
    assert ok.exit_code == 0, ok.output


def test_a_server_refuses_a_broken_model_before_it_is_ready(
    broken_plugins, factory, tiny_cfg, tmp_path
) -> None:
    from model_plugins import save_broken

    bad = save_broken("test-user-side-sees-candidates", factory.model(tiny_cfg), tmp_path / "m")
    app = create_app(load_config({"model_dir": str(bad)}))
    with pytest.raises(ModelCheckError, match="cached_equals_full"), TestClient(app):
        pass
    assert app.state.kvrank.ready is False
    assert "cached_equals_full" in (app.state.kvrank.startup_error or "")


def test_a_listwise_variant_of_the_example_is_refused_for_its_slate_dependence(tmp_path) -> None:
    """Candidates that see the slate are a real listwise design, and exact without a cache
    too: the check that refuses it is the one about independence, not exactness."""
    from model_plugins import save_sasrec

    report = check_model(load_ranker(save_sasrec(tmp_path / "m", slate_context=True)))
    outcome = {r.name: r.passed for r in report.results}
    assert outcome["cached_equals_full"] is True
    assert outcome["candidates_independent"] is False


def test_training_logits_shipped_with_the_weights_must_be_what_serving_gives(
    sasrec_artifact, tmp_path
) -> None:
    """Train/serve parity: the golden cases pass as exported, and a serving path that
    disagrees with training (here: the exported logits moved) is refused."""
    import shutil

    from kvrank.model.features import example_candidates, example_user
    from kvrank.model.golden import GoldenCase, load_golden, save_golden

    art = tmp_path / "m"
    shutil.copytree(sasrec_artifact, art)
    model = load_ranker(art)
    g = torch.Generator().manual_seed(0)
    cases = []
    for n in (1, 5, 12):
        user, cands = example_user(model.features, n, g), example_candidates(model.features, 4, g)
        cases.append(GoldenCase(user, cands, model.forward_full(user, cands)))
    save_golden(art, cases)
    golden = load_golden(art, model.features)
    passed = check_model(model, CheckPlan(golden=golden))
    assert {r.name: r.passed for r in passed.results}["golden_parity"] is True
    moved = [GoldenCase(c.user, c.candidates, c.logits + 0.01) for c in cases]
    save_golden(art, moved)
    result = CliRunner().invoke(cli, ["check-model", str(art)])
    assert result.exit_code == 1 and "golden_parity" in result.output, result.output
