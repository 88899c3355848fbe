"""Trying a model before packaging it: ``--plugin module:builder`` (``KVRANK_PLUGIN``) makes
``kvrank check-model`` and ``kvrank serve`` build an artifact with a module next to the
command, not an installed distribution; its source is part of the model's cache identity."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import kvrank_sasrec.model
import pytest
import torch

from kvrank.model import registry
from kvrank.model.artifact import artifact_digest, load_ranker
from kvrank.model.features import example_candidates, example_user
from kvrank.server.schemas import body_for
from kvrank.tools.processes import RankerProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def author_dir(tmp_path: Path) -> Path:
    """A model author's working directory: the example SASRec model as a plain module file
    (``my_ranker.py``), which no installed distribution provides."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(kvrank_sasrec.model.__file__, work / "my_ranker.py")
    return work


def kvrank(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = str(Path(sys.executable).parent / "kvrank")
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_check_model_builds_the_artifact_with_the_module_named(author_dir, sasrec_artifact):
    ok = kvrank("check-model", str(sasrec_artifact), "--plugin", "my_ranker:build", cwd=author_dir)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    assert "FAILED" not in ok.stdout
    for plugin, says in (
        ("not_here:build", "cannot import not_here"),
        ("my_ranker:nope", "my_ranker has no callable 'nope'"),
        ("my_ranker", "expected module:builder"),
    ):
        refused = kvrank("check-model", str(sasrec_artifact), "--plugin", plugin, cwd=author_dir)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr


def test_a_server_given_the_plugin_scores_as_the_installed_model_under_another_identity(
    author_dir, sasrec_artifact, tmp_path
):
    installed = load_ranker(sasrec_artifact)
    user = example_user(installed.features, 12, torch.Generator().manual_seed(1))
    cands = example_candidates(installed.features, 5, torch.Generator().manual_seed(2))
    expected = installed.score(installed.encode_user(user), cands).sigmoid().tolist()
    env = {"KVRANK_PLUGIN": "my_ranker:build", "PYTHONPATH": str(author_dir)}
    server = RankerProcess.start(sasrec_artifact, tmp_path, env=env, timeout_s=120)
    try:
        body = body_for(installed.features, "author", user, cands)
        answer = httpx.post(f"{server.url}/v1/score", json=body, timeout=60).json()
        logged = server.log.read_text()
    finally:
        server.stop()
    assert answer["scores"] == pytest.approx(expected, abs=1e-6)
    assert "is built by the plugin my_ranker:build" in logged

    # the identity its cache entries carry: the module's source, not the installed package's
    sys.path.insert(0, str(author_dir))
    try:
        registry.use_plugin("my_ranker:build")
        as_plugin = artifact_digest(sasrec_artifact)
        (author_dir / "my_ranker.py").write_text(
            (author_dir / "my_ranker.py").read_text() + "\n# edited\n"
        )
        sys.modules.pop("my_ranker")  # a new process, with the edited module
        registry.use_plugin("my_ranker:build")
        edited = artifact_digest(sasrec_artifact)
    finally:
        registry.use_plugin(None)
        sys.path.remove(str(author_dir))
        sys.modules.pop("my_ranker", None)
    assert len({artifact_digest(sasrec_artifact), as_plugin, edited}) == 3
