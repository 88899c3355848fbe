"""The images ``make images`` builds, inspected and run as plain containers.

What only the images themselves can tell: the user they run as (numeric, so
``runAsNonRoot`` can verify it), a CUDA build of torch in the ranker image, the operator
image's CRD equal to the chart's, the redis image's server and client. How they run under
their manifests (the chart's Deployment, the operator's pods, Pod Security ``restricted``,
probes, volumes) is the end-to-end suite's job, on the local cluster's real node.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml
from localkube.engine import ROOT, Docker, Images

pytestmark = [pytest.mark.docker, pytest.mark.slow]
CHART = ROOT / "charts" / "kvrank-operator"


def test_images_run_as_a_numeric_non_root_user(docker: Docker, images: Images) -> None:
    for ref, uid in (
        (images.ranker, 10001),
        (images.operator, 10001),
        (images.redis, 10001),
        (images.router, 10001),
    ):
        config = docker.inspect(ref)["Config"]
        assert config["User"] == str(uid), ref  # numeric: runAsNonRoot can verify it
        ident = docker("run", "--rm", "--entrypoint", "id", ref).stdout
        assert ident.startswith(f"uid={uid}("), ident


def test_ranker_image_carries_a_cuda_build_of_torch(docker: Docker, images: Images) -> None:
    probe = (
        "import json, torch; print(json.dumps({'cuda': torch.version.cuda,"
        " 'cudnn': torch.backends.cudnn.version(), 'built': torch.backends.cuda.is_built()}))"
    )
    out = docker("run", "--rm", "--entrypoint", "python", images.ranker, "-c", probe).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert found["built"] and found["cuda"] and found["cudnn"], found
    env = dict(e.split("=", 1) for e in docker.inspect(images.ranker)["Config"]["Env"])
    assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # the device plugin sets it per allocation


def test_operator_image_prints_the_charts_crd(docker: Docker, images: Images) -> None:
    out = docker("run", "--rm", "--read-only", "--cap-drop", "ALL", images.operator, "crd")
    crd = CHART / "crds" / "rankerdeployments.yaml"
    assert yaml.safe_load(out.stdout) == yaml.safe_load(crd.read_text())


def test_operator_image_has_every_dependency_of_its_reconciler(
    docker: Docker, images: Images
) -> None:
    # `crd` imports little; the reconciler (leader election, certificates, kopf) the rest
    probe = "import kvrank_operator.handlers, kvrank_operator.leader; print('ok')"
    out = docker(
        "run", "--rm", "--read-only", "--entrypoint", "python", images.operator, "-c", probe
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_redis_image_serves_cluster_mode_and_carries_the_cli(
    docker: Docker, images: Images
) -> None:
    script = (
        "redis-server --port 7001 --cluster-enabled yes --save '' --daemonize yes"
        " --dir /tmp --cluster-config-file /tmp/nodes.conf && sleep 1"
        " && redis-cli -p 7001 cluster info | head -1"
    )
    out = docker(
        "run",
        "--rm",
        "--read-only",
        "--tmpfs",
        "/tmp",
        "--cap-drop",
        "ALL",
        "--entrypoint",
        "sh",
        images.redis,
        "-c",
        script,
    ).stdout
    assert "cluster_state:" in out, out


def test_the_plugin_image_serves_its_own_architecture_as_non_root(
    docker: Docker, images: Images
) -> None:
    probe = (
        "from kvrank.model.registry import architectures as a;"
        "s = a()['sasrec']; print(s.distribution, s.version, sorted(a()))"
    )
    for ref in (images.plugin, images.plugin_canary):
        out = docker("run", "--rm", "--entrypoint", "python", ref, "-c", probe).stdout
        assert out.split()[:2] == ["kvrank-sasrec", "0.1.0"], out
        assert "onetrans" in out
        assert docker.inspect(ref)["Config"]["User"] == "10001"
    plugins = (images.plugin, images.plugin_canary)
    labels = [docker.inspect(r)["Config"]["Labels"]["io.kvrank.release"] for r in plugins]
    assert labels == ["stable", "canary"]  # two images: a canary can bring code of its own


def test_the_router_image_is_the_stock_envoy(docker: Docker, images: Images) -> None:
    out = docker("run", "--rm", "--read-only", "--cap-drop", "ALL", images.router, "--version")
    assert "/1.40.0/" in out.stdout, out.stdout


def model_files(docker: Docker, ref: str, into: Path) -> tuple[list[str], Path]:
    """The files a model image's layers hold (``docker save``), and its ``/models`` copied
    to ``into``."""
    saved = subprocess.run(
        ["docker", "save", ref], capture_output=True, env=docker.env, check=True
    ).stdout
    names = []
    with tarfile.open(fileobj=io.BytesIO(saved)) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
        for layer in manifest[0]["Layers"]:
            blob = archive.extractfile(layer)
            assert blob is not None, layer
            with tarfile.open(fileobj=io.BytesIO(blob.read())) as tar:
                names += [m.name for m in tar.getmembers() if m.isfile()]
    made = docker("create", "--entrypoint", "/none", ref).stdout.strip()
    try:
        docker("cp", f"{made}:/models", str(into))
    finally:
        docker("rm", made)
    return names, into


def test_the_examples_model_images_hold_one_checked_artifact_and_nothing_else(
    docker: Docker, images: Images, tmp_path: Path
) -> None:
    """An ``oci://`` model image is FROM scratch: its artifact under /models (what a pod
    mounts), no shell or Python; the artifact names the version its tag names, and v2 is
    v1's weights under another version (so the progressive example promotes it)."""
    from kvrank.model.artifact import load_ranker

    models = [ref for ref in images.examples if "-model:" in ref]
    assert {ref.rsplit("/", 1)[1] for ref in models} == {
        "feed-ranker-model:v1",
        "feed-ranker-model:v2",
        "sasrec-model:s1",
    }
    weights = {}
    for ref in models:
        tag = ref.rsplit(":", 1)[1]
        names, artifact = model_files(docker, ref, tmp_path / tag)
        assert sorted(names) == sorted(f"models/{p.name}" for p in artifact.iterdir()), names
        assert {"config.json", "model.safetensors"} <= {p.name for p in artifact.iterdir()}
        model = load_ranker(artifact)
        assert model.version == tag, (ref, model.version)
        weights[tag] = (artifact / "model.safetensors").read_bytes()
    assert weights["v1"] == weights["v2"]
