"""The examples as a user applies them, unmodified: ``basic.yaml``, then ``canary.yaml`` and
``progressive.yaml`` over it (one deployment walked through a rollout), and
``bring-your-own-model.yaml`` — each serving from the model image it names (``oci://``, an
image volume on the real node), with the images the chart defaults to wherever the example
names none. (``quickstart.yaml`` is applied as it is in test_serving.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from api_server import fetched_crds, install_crds
from rankers import Ranker, Rankers, example
from stack import NS, Stack

from kvrank.model.artifact import load_ranker
from kvrank.model.features import example_candidates, example_user
from kvrank.server.schemas import body_for

ROOT = Path(__file__).resolve().parents[1]
REQUEST = json.loads((ROOT / "examples" / "request.json").read_text())


def apply_example(stack: Stack, name: str) -> None:
    stack.kubectl("apply", "-n", NS, "-f", str(ROOT / "examples" / name))


def model_image(part: dict[str, Any]) -> str:
    """The model image a spec's ``model`` or ``canary`` names (``oci://<image>``)."""
    uri: str = part["uri"]
    assert uri.startswith("oci://"), uri
    return uri.removeprefix("oci://")


def served_from(ranker: Ranker, version: str, image: str, model: str) -> None:
    """Its pods of ``version`` run ``image`` (the ranker's) and mount ``model``, the model
    image the example names."""
    pods = ranker.pods(version=version)
    assert pods, f"no pods of {ranker.name} {version}"
    for pod in pods:
        assert {c["image"] for c in pod["spec"]["containers"]} == {image}, pod["spec"]
        (volume,) = (v for v in pod["spec"]["volumes"] if v["name"] == "model-image")
        assert volume["image"]["reference"] == model, volume


def autoscaled(stack: Stack, ranker: Ranker) -> None:
    """``examples/autoscaling``'s recipes applied as written beside ``ranker``: the
    HorizontalPodAutoscaler finds its scale subresource (AbleToScale; with no custom metrics
    API here it scales nothing), the ScaledObject is admitted; the ranker still answers."""
    recipes = ROOT / "examples" / "autoscaling"
    # KEDA's ScaledObject CRD (from KEDA's Go module, as the operator tests install it)
    crds = fetched_crds("keda-crds.sh")
    install_crds(stack.cluster, [crds / "keda.sh_scaledobjects.yaml"], ["scaledobjects.keda.sh"])
    try:
        for recipe in ("hpa.yaml", "keda-scaledobject.yaml"):
            stack.kubectl("apply", "-n", NS, "-f", str(recipes / recipe))

        def able() -> dict[str, Any] | None:
            hpa = stack.get("hpa", ranker.name) or {}
            conditions = (hpa.get("status") or {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == "AbleToScale"), None)

        condition = stack.wait_for(able, "the HPA's AbleToScale condition")
        assert condition["status"] == "True", condition  # it read rkd/feed-ranker's scale
        assert stack.get("scaledobject", ranker.name) is not None
        resp = stack.score(ranker.name, REQUEST)
        assert resp.status_code == 200, resp.text
    finally:
        for recipe in ("hpa.yaml", "keda-scaledobject.yaml"):
            path = str(recipes / recipe)
            stack.kubectl("delete", "-n", NS, "-f", path, "--ignore-not-found")


def test_basic_then_canary_then_progressive_as_written_answer_the_readmes_request(
    stack: Stack, rankers: Rankers
) -> None:
    ranker = rankers.from_example("basic.yaml")
    ranker.wait_ready("as basic.yaml is written", 420)
    # the chart's default ranker image, the model image basic.yaml names
    served_from(
        ranker, "v1", stack.images.ranker, model_image(example("basic.yaml")["spec"]["model"])
    )
    first = stack.score(ranker.name, REQUEST)
    assert first.status_code == 200, first.text
    answer = first.json()
    assert answer["model_version"] == "v1", answer
    assert len(answer["scores"]) == len(REQUEST["candidates"]["item_ids"]), answer
    autoscaled(stack, ranker)

    # canary.yaml over it: v2 from its own model image beside v1, for a share of the users
    apply_example(stack, "canary.yaml")
    ranker.wait_condition("CanaryReady", "True", 420)
    canary = model_image(example("canary.yaml")["spec"]["canary"])
    served_from(ranker, "v2", stack.images.ranker, canary)
    versions = set()
    for i in range(40):
        resp = stack.score(ranker.name, {**REQUEST, "user_id": f"walk-{i}"})
        assert resp.status_code == 200, resp.text
        versions.add(resp.json()["model_version"])
    assert versions == {"v1", "v2"}, versions

    # progressive.yaml over it: the operator takes the rollout in hand; callers are answered
    apply_example(stack, "progressive.yaml")
    stack.wait_for(lambda: ranker.rollout().get("phase"), "a progressive rollout's phase")
    for i in range(10):
        resp = stack.score(ranker.name, {**REQUEST, "user_id": f"walk-{i}"})
        assert resp.status_code == 200, resp.text
    assert (ranker.condition("Degraded") or {}).get("status") != "True", ranker.status()


def artifact_of(stack: Stack, image: str, into: Path) -> Path:
    """The artifact inside a model image (``/models``), copied out by the Docker engine."""
    made = stack.docker("create", "--entrypoint", "/none", image).stdout.strip()
    try:
        stack.docker("cp", f"{made}:/models", str(into))
    finally:
        stack.docker("rm", made)
    return into


def test_bring_your_own_model_as_written_serves_the_teams_image_and_model_image(
    stack: Stack, rankers: Rankers, tmp_path: Path
) -> None:
    doc = example("bring-your-own-model.yaml")
    ranker = rankers.from_example("bring-your-own-model.yaml")
    ranker.wait_ready("as bring-your-own-model.yaml is written", 420)
    served_from(ranker, "s1", doc["spec"]["model"]["image"], model_image(doc["spec"]["model"]))
    model = load_ranker(artifact_of(stack, model_image(doc["spec"]["model"]), tmp_path / "s1"))
    g = torch.Generator().manual_seed(7)
    user, candidates = example_user(model.features, 9, g), example_candidates(model.features, 6, g)
    body = body_for(model.features, "byom-user", user, candidates)
    expected = model.forward_full(user, candidates).sigmoid()
    resp = stack.score(ranker.name, body)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["model_version"] == "s1", answer
    # the model image's own model answered (bf16 K/V, the example's default: within 1e-2)
    assert (torch.tensor(answer["scores"]) - expected).abs().max() <= 1e-2, answer
