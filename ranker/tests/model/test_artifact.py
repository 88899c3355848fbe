"""Model artifacts: config.json + model.safetensors round trip; broken artifacts are refused."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch
from object_stores import GCS, S3, ObjectStore

from kvrank.errors import ArtifactError
from kvrank.model.artifact import load_model, save_model


def test_round_trip_scores_identically(factory, tiny_cfg, tmp_path) -> None:
    model = factory.model(tiny_cfg, version="v7")
    save_model(model, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert loaded.version == "v7" and loaded.cfg == tiny_cfg
    user, cands = factory.user(tiny_cfg, 9, 1), factory.candidates(tiny_cfg, 4, 1)
    assert torch.equal(
        loaded.score(loaded.encode_user(user), cands), model.score(model.encode_user(user), cands)
    )
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]


def test_saved_files_take_the_umask_mode(factory, tiny_cfg, tmp_path) -> None:
    """The ranker image runs as uid 10001: an artifact written by another user under the
    usual umask must stay readable to it (safetensors alone creates the weights 0600)."""
    previous = os.umask(0o022)
    try:
        save_model(factory.model(tiny_cfg), tmp_path / "m")
    finally:
        os.umask(previous)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "m").iterdir()}
    assert modes == {"config.json": 0o644, "model.safetensors": 0o644}


def test_missing_weights(factory, tiny_cfg, tmp_path) -> None:
    save_model(factory.model(tiny_cfg), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ArtifactError, match=r"missing model\.safetensors"):
        load_model(tmp_path)


def test_config_that_does_not_match_weights(factory, tiny_cfg, tmp_path) -> None:
    save_model(factory.model(tiny_cfg), tmp_path)
    doc = json.loads((tmp_path / "config.json").read_text())
    doc["config"]["d_model"] = 64
    (tmp_path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="do not match"):
        load_model(tmp_path)


def test_invalid_config_values(factory, tiny_cfg, tmp_path) -> None:
    save_model(factory.model(tiny_cfg), tmp_path)
    doc = json.loads((tmp_path / "config.json").read_text())
    doc["config"]["n_heads"] = 5
    (tmp_path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="not divisible"):
        load_model(tmp_path)


def test_pickled_weights_are_not_loaded(factory, tiny_cfg, tmp_path) -> None:
    save_model(factory.model(tiny_cfg), tmp_path)
    torch.save({"x": torch.zeros(1)}, tmp_path / "model.safetensors")  # a pickle in disguise
    with pytest.raises(ArtifactError):
        load_model(tmp_path)


# ------------------------------------------------------------------ artifacts by URL
@pytest.fixture
def http_dir():
    """Serve a directory over HTTP on loopback; yields (root, base URL, request log)."""
    import functools
    import http.server
    import threading

    served: list[str] = []

    def serve(root):
        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                served.append(self.path)

        handler = functools.partial(Handler, directory=str(root))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", served

    servers: list = []
    yield serve
    for s in servers:
        s.shutdown()
        s.server_close()


def test_url_artifact_is_downloaded_once_and_scores_identically(
    factory, tiny_cfg, tmp_path, http_dir
) -> None:
    from kvrank.model.artifact import resolve_artifact

    model = factory.model(tiny_cfg, version="v9")
    save_model(model, tmp_path / "site" / "models" / "v9")
    base, served = http_dir(tmp_path / "site")
    url = f"{base}/models/v9"
    local = resolve_artifact(url, tmp_path / "cache")
    assert local.parent == tmp_path / "cache"
    loaded = load_model(local)
    user, cands = factory.user(tiny_cfg, 9, 2), factory.candidates(tiny_cfg, 4, 2)
    assert torch.equal(
        loaded.score(loaded.encode_user(user), cands), model.score(model.encode_user(user), cands)
    )
    assert len(served) == 2
    assert resolve_artifact(url, tmp_path / "cache") == local
    assert len(served) == 2, "a complete download is reused"
    assert resolve_artifact(str(tmp_path / "site"), tmp_path / "cache") == tmp_path / "site"


def test_url_artifact_errors_are_clear_and_leave_nothing_half_written(
    factory, tiny_cfg, tmp_path, http_dir
) -> None:
    from kvrank.model.artifact import resolve_artifact

    save_model(factory.model(tiny_cfg), tmp_path / "site" / "m")
    (tmp_path / "site" / "m" / "config.json").unlink()  # weights arrive, config is missing
    base, _ = http_dir(tmp_path / "site")
    with pytest.raises(ArtifactError, match=r"config\.json.*(404|Not Found)"):
        resolve_artifact(f"{base}/m", tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []
    with pytest.raises(ArtifactError, match="scheme 'hdfs' is not supported"):
        resolve_artifact("hdfs://namenode/m", tmp_path / "cache")


def test_the_artifact_checksum_is_verified_and_a_mismatch_is_never_cached(
    factory, tiny_cfg, tmp_path, http_dir
) -> None:

    from kvrank.model.artifact import artifact_sha256, resolve_artifact

    site = save_model(factory.model(tiny_cfg, version="v1"), tmp_path / "site" / "m")
    good = artifact_sha256(site)
    base, served = http_dir(tmp_path / "site")
    wrong = "0" * 64
    with pytest.raises(ArtifactError, match=rf"sha256 {good} .*, expected {wrong}"):
        resolve_artifact(f"{base}/m", tmp_path / "cache", wrong)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []  # nothing half-trusted kept
    local = resolve_artifact(f"{base}/m", tmp_path / "cache", good.upper())
    assert load_model(local).version == "v1"
    with pytest.raises(ArtifactError, match="expected 0000"):  # the cached copy is checked too
        resolve_artifact(f"{base}/m", tmp_path / "cache", wrong)
    with pytest.raises(ArtifactError, match="model_sha256"):  # and a mounted directory
        resolve_artifact(str(site), tmp_path / "cache", wrong)
    assert resolve_artifact(str(site), tmp_path / "cache", good) == site
    assert len(served) == 4  # two downloads: the discarded one and the kept one


def test_a_failing_server_is_tried_again_and_a_missing_file_is_not(
    factory, tiny_cfg, tmp_path, monkeypatch
) -> None:
    """503s (an artifact server restarting, a proxy's hiccup) are retried with a backoff; a
    404 is an answer, not an outage: it fails at once."""
    import http.server
    import threading

    from kvrank.model import artifact

    monkeypatch.setattr(artifact, "DOWNLOAD_BACKOFF_S", 0.01)
    site = save_model(factory.model(tiny_cfg, version="v1"), tmp_path / "site" / "m")
    asked: list[str] = []

    class Flaky(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(tmp_path / "site"), **kwargs)  # type: ignore[arg-type]

        def do_GET(self) -> None:
            asked.append(self.path)
            if self.path.startswith("/m/") and asked.count(self.path) <= 2:  # twice first
                self.send_error(503)
                return
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        local = artifact.resolve_artifact(f"{base}/m", tmp_path / "cache")
        assert load_model(local).version == "v1"
        assert sorted(asked) == sorted(3 * ["/m/model.safetensors", "/m/config.json"])
        asked.clear()
        with pytest.raises(ArtifactError, match="404"):
            artifact.resolve_artifact(f"{base}/nowhere", tmp_path / "cache")
        assert asked == ["/nowhere/model.safetensors"], "a 404 is not retried"
    finally:
        server.shutdown()
        server.server_close()
    assert site.is_dir()


# ------------------------------------------------------------------ artifacts in object stores
class Store:
    """A real S3- or GCS-compatible server process on loopback serving a folder as the bucket
    ``models`` (:mod:`object_stores`); the ranker's environment points at it."""

    def __init__(self, kind: ObjectStore, root: Path) -> None:
        from kvrank.tools.processes import free_port

        self.kind, self.port = kind, free_port()
        self.scheme, self.folder = kind.scheme, root / "models"
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        command = self.kind.command(self.folder, "models", "127.0.0.1", self.port)
        self.proc = subprocess.Popen(command)
        deadline = time.monotonic() + 30
        while not self.kind.up(self.endpoint, "models"):
            assert time.monotonic() < deadline and self.proc.poll() is None, "store not up"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def test_the_checksum_covers_the_config_and_is_what_sha256sum_prints(
    factory, tiny_cfg, tmp_path
) -> None:
    """An edited config.json beside the same weights is another artifact; the checksum is
    the one coreutils gives, and the weights' own checksum is refused with what to use."""
    from kvrank.model.artifact import CONFIG_FILE, WEIGHTS_FILE, artifact_sha256, resolve_artifact

    site = save_model(factory.model(tiny_cfg, version="v1"), tmp_path / "m")
    good = artifact_sha256(site)
    shell = subprocess.run(
        f"sha256sum {CONFIG_FILE} {WEIGHTS_FILE} | sha256sum",
        shell=True, cwd=site, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert shell.stdout.split()[0] == good
    config = json.loads((site / CONFIG_FILE).read_text())
    config["model_version"] = "v1-edited"
    (site / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(ArtifactError, match=rf"expected {good}"):
        resolve_artifact(str(site), tmp_path / "cache", good)
    weights_only = hashlib.sha256((site / WEIGHTS_FILE).read_bytes()).hexdigest()
    with pytest.raises(ArtifactError, match=r"covers config\.json too.*kvrank model-digest"):
        resolve_artifact(str(site), tmp_path / "cache", weights_only)


@pytest.fixture(params=[S3, GCS], ids=lambda kind: kind.scheme)
def store(request, tmp_path, monkeypatch):
    running = Store(request.param, tmp_path / "store")
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in request.param.env(running.endpoint).items():
        monkeypatch.setenv(key, value)
    yield running
    running.stop()


def test_an_object_store_artifact_is_downloaded_once_checked_and_scores_identically(
    factory, tiny_cfg, tmp_path, store
) -> None:
    from kvrank.model.artifact import artifact_sha256, resolve_artifact

    model = factory.model(tiny_cfg, version="v7")
    stored = save_model(model, store.folder / "feed" / "v7")
    good = artifact_sha256(stored)
    store.start()
    uri, wrong = f"{store.scheme}://models/feed/v7", "f" * 64
    with pytest.raises(ArtifactError, match=rf"sha256 {good} .*, expected {wrong}"):
        resolve_artifact(uri, tmp_path / "cache", wrong)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []  # nothing half-trusted kept
    local = resolve_artifact(f"{uri}/", tmp_path / "cache", good)
    loaded = load_model(local)
    user, cands = factory.user(tiny_cfg, 9, 2), factory.candidates(tiny_cfg, 4, 2)
    assert torch.equal(
        loaded.score(loaded.encode_user(user), cands), model.score(model.encode_user(user), cands)
    )
    store.stop()  # a complete download is reused: the store is not asked again
    assert resolve_artifact(f"{uri}/", tmp_path / "cache", good) == local


def test_object_store_errors_name_the_object_and_leave_nothing_behind(
    factory, tiny_cfg, tmp_path, store
) -> None:
    from kvrank.model.artifact import resolve_artifact

    save_model(factory.model(tiny_cfg, version="v1"), store.folder / "feed" / "v1")
    store.start()
    missing = f"{store.scheme}://models/feed/v404"
    with pytest.raises(ArtifactError, match=rf"{missing}/model\.safetensors failed.*404"):
        resolve_artifact(missing, tmp_path / "cache")
    elsewhere = f"{store.scheme}://elsewhere/feed/v1"
    with pytest.raises(ArtifactError, match=rf"{elsewhere}/model\.safetensors failed"):
        resolve_artifact(elsewhere, tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []


def test_an_object_store_that_comes_up_late_is_waited_for(
    factory, tiny_cfg, tmp_path, store
) -> None:
    """Retries with a backoff: the first tries find no server (a pod starting while
    the store's endpoint is still down), a later one downloads."""
    import threading

    from kvrank.model.artifact import resolve_artifact

    save_model(factory.model(tiny_cfg, version="v8"), store.folder / "feed" / "v8")
    started = time.monotonic()
    late = threading.Timer(0.7, store.start)
    late.start()
    try:
        local = resolve_artifact(f"{store.scheme}://models/feed/v8", tmp_path / "cache")
    finally:
        late.join()
    assert load_model(local).version == "v8"
    assert time.monotonic() - started >= 0.7, "the store was not up before the first try"
