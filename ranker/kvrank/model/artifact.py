"""Model artifacts: ``config.json`` + ``model.safetensors`` (no pickle anywhere).

``config.json`` holds a format number, the model version string and the model's config.
Format 1 is the built-in ranker (a :class:`ModelConfig`); format 2 names an architecture and
the distribution + version that provides it (:mod:`kvrank.model.registry`), whose builder
makes the model: an artifact carries weights and config, never code. Weights are loaded with
safetensors and ``load_state_dict(strict=True)``, so a file that does not match the config
is an :class:`ArtifactError`, never a partial model.
An artifact lives in a directory, behind an ``http(s)://`` URL or under an ``s3://bucket/
prefix`` or ``gs://bucket/prefix`` (the directory's two files under it), which
:func:`resolve_artifact` downloads once into a local cache, retrying what a network or a
store drops. When the deployment names the artifact's SHA-256 (:func:`artifact_sha256`:
config and weights), a download that does not match is never cached and a directory that
does not match is refused.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import ValidationError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from kvrank import __version__
from kvrank.errors import ArtifactError
from kvrank.model import onetrans, registry
from kvrank.model.contract import CacheableRanker
from kvrank.model.ranker import RankerModel

ARTIFACT_FORMAT = 1
"""The built-in ranker's format (still written for it: such an artifact names no version of
kvrank, so upgrading kvrank never refuses it)."""
PLUGIN_FORMAT = 2
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
MAX_DOWNLOAD_BYTES = 64 * 2**30
DOWNLOAD_TIMEOUT_S = 60.0
DOWNLOAD_ATTEMPTS = 5
"""Tries of each file before a download fails: a refused or dropped connection, a timeout, a
5xx or a throttled request is tried again after a backoff (1, 2, 4, 8 s); a 4xx (missing,
forbidden) fails at once."""
DOWNLOAD_BACKOFF_S = 1.0
OBJECT_STORES = ("s3://", "gs://")
"""Schemes fetched through obstore (Rust's object_store), each with its cloud's credentials."""
SCHEMES = ("http://", "https://", *OBJECT_STORES)
ARTIFACT_FILES = (CONFIG_FILE, WEIGHTS_FILE)
"""What an artifact is, and what its checksum covers."""


def save_model(model: RankerModel, directory: Path, extra: dict[str, object] | None = None) -> Path:
    """Write ``model`` to ``directory`` (created if missing); returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(directory / WEIGHTS_FILE))
    # safetensors creates the file 0600; give it the mode any new file gets (umask), so a
    # ranker running as another user (uid 10001 in the image) can read a mounted artifact
    (directory / WEIGHTS_FILE).chmod(0o666 & ~_umask())
    doc = {
        "format": ARTIFACT_FORMAT,
        "model_version": model.version,
        "config": model.cfg.model_dump(mode="json"),
        "extra": extra or {},
    }
    (directory / CONFIG_FILE).write_text(json.dumps(doc, indent=2) + "\n")
    return directory


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_ranker(
    model: CacheableRanker,
    directory: Path,
    architecture: str,
    config: Mapping[str, Any],
    extra: dict[str, object] | None = None,
) -> Path:
    """Write a model of a registered ``architecture`` built from ``config`` (format 2, naming
    the distribution and version that provide the architecture here)."""
    if architecture == onetrans.ARCHITECTURE and isinstance(model, onetrans.OneTransRanker):
        return save_model(model.net, directory, extra)
    arch = registry.get(architecture)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.module.state_dict().items()}
    save_file(state, str(directory / WEIGHTS_FILE))
    (directory / WEIGHTS_FILE).chmod(0o666 & ~_umask())
    doc = {
        "format": PLUGIN_FORMAT,
        "architecture": architecture,
        "provider": {"distribution": arch.distribution, "version": arch.version},
        "model_version": model.version,
        "config": dict(config),
        "extra": extra or {},
    }
    (directory / CONFIG_FILE).write_text(json.dumps(doc, indent=2) + "\n")
    return directory


def load_model(directory: Path, device: str | torch.device = "cpu") -> RankerModel:
    """Load a built-in ranker artifact written by :func:`save_model`, in eval mode on
    ``device`` (any architecture: :func:`load_ranker`)."""
    model = load_ranker(directory, device)
    if not isinstance(model, onetrans.OneTransRanker):
        raise ArtifactError(
            f"model artifact {directory}: not the built-in ranker (use load_ranker)"
        )
    return model.net


def read_config(directory: Path) -> dict[str, Any]:
    """The artifact's ``config.json``, checked for the fields its format needs."""
    cfg_path, weights = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for path in (cfg_path, weights):
        if not path.is_file():
            raise ArtifactError(f"model artifact {directory}: missing {path.name}")
    try:
        doc = json.loads(cfg_path.read_text())
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        fmt = doc.get("format")
        if fmt not in (ARTIFACT_FORMAT, PLUGIN_FORMAT):
            raise ArtifactError(
                f"{cfg_path}: format {fmt!r} is not {ARTIFACT_FORMAT} or {PLUGIN_FORMAT}"
            )
        required = ["model_version", "config"]
        if fmt == PLUGIN_FORMAT:
            required += ["architecture", "provider"]
        for key in required:
            if key not in doc:
                raise KeyError(key)
        if not isinstance(doc["config"], dict):
            raise ValueError("config is not a JSON object")
    except (ValueError, KeyError) as exc:
        raise ArtifactError(f"{cfg_path}: invalid config: {exc!r}") from exc
    return doc


def load_ranker(directory: Path, device: str | torch.device = "cpu") -> CacheableRanker:
    """Build the artifact's model with its architecture's installed builder, load its
    weights strictly and put it in eval mode on ``device``."""
    doc = read_config(directory)
    version = str(doc["model_version"])
    if doc["format"] == ARTIFACT_FORMAT:
        try:
            model: CacheableRanker = onetrans.build(doc["config"], version)
        except ValidationError as exc:
            raise ArtifactError(f"{directory / CONFIG_FILE}: invalid config: {exc}") from exc
    else:
        arch = registry.get(str(doc["architecture"]))
        _check_provider(arch, doc["provider"], directory)
        model = registry.build(arch, doc["config"], version)
    weights = directory / WEIGHTS_FILE
    try:
        state = load_file(str(weights), device="cpu")
        model.module.load_state_dict(state, strict=True)
    except (SafetensorError, RuntimeError) as exc:
        raise ArtifactError(f"{weights}: weights do not match the config: {exc}") from exc
    model.module.to(device).eval()
    return model


def artifact_digest(directory: Path) -> str:
    """A digest of what makes the artifact's model compute what it computes: its files
    (:func:`artifact_sha256`) and the code that builds it (the providing distribution's name,
    version and installed-file list with its hashes; kvrank's version for the built-in
    ranker). Retrained weights, an edited config or changed plugin code under the same
    version label give another digest, so their cache entries never mix."""
    doc = read_config(directory)
    h = hashlib.sha256(artifact_sha256(directory).encode())
    if doc["format"] == ARTIFACT_FORMAT:
        code = f"kvrank {__version__}"
    else:
        arch = registry.get(str(doc["architecture"]))
        code = f"{arch.name} {arch.distribution} {arch.version} {_record(arch.distribution)}"
        code += arch.code  # a --plugin's source files (no distribution records them)
    h.update(code.encode())
    return h.hexdigest()[:32]


def artifact_sha256(directory: Path) -> str:
    """The artifact's checksum, what ``model_sha256`` pins: the SHA-256 of its manifest, one
    ``<sha256>  <name>`` line per file (``config.json``, then ``model.safetensors``) — what
    ``sha256sum config.json model.safetensors | sha256sum`` prints in its directory, and
    ``kvrank model-digest`` prints. An edited config is another artifact, as retrained
    weights are."""
    return hashlib.sha256(_manifest(directory).encode()).hexdigest()


def _manifest(directory: Path) -> str:
    return "".join(f"{file_sha256(directory / name)}  {name}\n" for name in ARTIFACT_FILES)


def file_sha256(path: Path) -> str:
    """A file's SHA-256 (hex), computed once per file as it is on disk (~1 s per GB): the
    weights are read once at load, though the checksum (on the download, before it is moved
    into the cache) and the cache identity both need them. Known by device, inode, size and
    modification time, which a rename keeps."""
    st = path.stat()
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if identity not in _DIGESTS:
        if len(_DIGESTS) >= 64:
            _DIGESTS.clear()
        with path.open("rb") as f:
            _DIGESTS[identity] = hashlib.file_digest(f, "sha256").hexdigest()
    return _DIGESTS[identity]


_DIGESTS: dict[tuple[int, int, int, int], str] = {}


def _record(distribution: str | None) -> str:
    """The distribution's installed files with their hashes (pip's RECORD): any code change
    that was installed changes it."""
    if distribution is None:
        return ""
    try:
        return importlib.metadata.distribution(distribution).read_text("RECORD") or ""
    except importlib.metadata.PackageNotFoundError:
        return ""


def _check_provider(arch: registry.Architecture, provider: object, directory: Path) -> None:
    """The artifact must be loaded by the distribution and version that wrote it: another
    version's code may read the same weights differently."""
    if not isinstance(provider, dict):
        raise ArtifactError(f"{directory / CONFIG_FILE}: provider is not a JSON object")
    if arch.code:  # a --plugin: the code named on the command line is the one asked for
        return
    want = (provider.get("distribution"), provider.get("version"))
    have = (arch.distribution, arch.version)
    if want != have:
        raise ArtifactError(
            f"model artifact {directory}: architecture {arch.name!r} was written by"
            f" {want[0]} {want[1]}, but this image has {have[0]} {have[1]};"
            " serve it from an image with that version installed"
        )


def is_url(location: str) -> bool:
    return "://" in location


def resolve_artifact(location: str, cache_dir: Path, sha256: str | None = None) -> Path:
    """A local directory holding the artifact at ``location``: a path as it is, or an
    ``http(s)://`` URL, ``s3://bucket/prefix`` or ``gs://bucket/prefix`` whose two files
    are downloaded (once: a complete download is reused) into ``cache_dir/<digest of the
    URL>``. A partial download never looks complete.

    ``sha256``: the expected :func:`artifact_sha256` (hex), checked on whatever is returned
    (a mismatching download is discarded before it is cached).
    """
    if not is_url(location):
        if sha256 is not None:
            verify_artifact(Path(location), sha256, location)
        return Path(location)
    if not location.startswith(SCHEMES):
        scheme = location.split("://", 1)[0]
        raise ArtifactError(
            f"model location {location!r}: scheme {scheme!r} is not supported"
            " (use a path in a mounted volume, an http(s):// URL, s3://bucket/prefix or"
            " gs://bucket/prefix)"
        )
    fetch = _download_object if location.startswith(OBJECT_STORES) else _download
    target = cache_dir / hashlib.sha256(location.encode()).hexdigest()[:16]
    if (target / CONFIG_FILE).is_file() and (target / WEIGHTS_FILE).is_file():
        if sha256 is not None:
            verify_artifact(target, sha256, location)
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=cache_dir))
    try:
        for name in (WEIGHTS_FILE, CONFIG_FILE):
            fetch(f"{location.rstrip('/')}/{name}", staging / name)
        if sha256 is not None:
            verify_artifact(staging, sha256, location)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def verify_artifact(directory: Path, sha256: str, location: str) -> None:
    """``ArtifactError`` unless the artifact's :func:`artifact_sha256` is ``sha256``."""
    try:
        digest = artifact_sha256(directory)
    except OSError as exc:
        raise ArtifactError(f"model artifact {location}: cannot read it: {exc}") from exc
    want = sha256.lower()
    if digest == want:
        return
    hint = ""
    if file_sha256(directory / WEIGHTS_FILE) == want:
        hint = (
            f"; {want[:12]}… is {WEIGHTS_FILE}'s own: the checksum covers {CONFIG_FILE} too"
            " (`kvrank model-digest DIR` prints it)"
        )
    raise ArtifactError(
        f"model artifact {location}: has sha256 {digest} ({' and '.join(ARTIFACT_FILES)}),"
        f" expected {want} (model_sha256){hint}"
    )


def _download(url: str, dest: Path) -> None:
    """One file over http(s), tried up to ``DOWNLOAD_ATTEMPTS`` times."""
    for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
        try:
            _get(url, dest)
            return
        except urllib.error.HTTPError as exc:
            if (exc.code < 500 and exc.code != 429) or attempt == DOWNLOAD_ATTEMPTS:
                raise ArtifactError(f"downloading {url} failed: {exc}") from exc
        except (urllib.error.URLError, OSError) as exc:
            if attempt == DOWNLOAD_ATTEMPTS:
                raise ArtifactError(
                    f"downloading {url} failed after {attempt} attempts: {exc}"
                ) from exc
        time.sleep(DOWNLOAD_BACKOFF_S * 2 ** (attempt - 1))


def _get(url: str, dest: Path) -> None:
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp, dest.open("wb") as f:
        size = 0
        while chunk := resp.read(1 << 20):
            size += len(chunk)
            if size > MAX_DOWNLOAD_BYTES:
                raise ArtifactError(f"{url}: larger than {MAX_DOWNLOAD_BYTES} bytes")
            f.write(chunk)


def _download_object(url: str, dest: Path) -> None:
    """One object of ``s3://bucket/key`` or ``gs://bucket/key`` through obstore (Rust's
    object_store), credentials from the pod's environment as each cloud's own tools read
    them. S3: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (from a Secret), a web
    identity token as IRSA mounts it or the instance's role; ``AWS_REGION``;
    ``AWS_ENDPOINT_URL`` for an S3-compatible store such as MinIO or Ceph (``AWS_ALLOW_HTTP=
    true`` for a plain-http one). GCS: a service-account key (``GOOGLE_SERVICE_ACCOUNT_KEY``,
    its JSON from a Secret, or ``GOOGLE_SERVICE_ACCOUNT``/``GOOGLE_APPLICATION_CREDENTIALS``,
    a file) or the metadata server's (GKE Workload Identity). Throttling, 5xx and dropped
    connections are retried with a backoff (1, 2, 4, 8 s)."""
    import datetime as dt

    import obstore
    import obstore.exceptions
    from obstore.store import from_url

    if TYPE_CHECKING:
        from obstore.store import ClientConfig, RetryConfig

    location, _, key = url.rpartition("/")
    retry: RetryConfig = {
        "max_retries": DOWNLOAD_ATTEMPTS - 1,
        "backoff": {"init_backoff": dt.timedelta(seconds=DOWNLOAD_BACKOFF_S), "base": 2},
        "retry_timeout": dt.timedelta(minutes=10),
    }
    client: ClientConfig = {  # given here, the client's options replace what the environment says
        "connect_timeout": dt.timedelta(seconds=DOWNLOAD_TIMEOUT_S),
        "timeout": dt.timedelta(hours=1),  # a whole GET: the default 30 s cuts large weights
        # GCS is https://storage.googleapis.com unless the service-account key names another
        # endpoint (gcs_base_url: an emulator), which is then taken as written
        "allow_http": url.startswith("gs://")
        or os.environ.get("AWS_ALLOW_HTTP", "").lower() == "true",
    }
    try:
        store = from_url(location, retry_config=retry, client_options=client)
        size = obstore.head(store, key)["size"]
        if size > MAX_DOWNLOAD_BYTES:
            raise ArtifactError(f"{url}: {size} bytes, larger than {MAX_DOWNLOAD_BYTES}")
        with dest.open("wb") as f:
            for chunk in obstore.get(store, key).stream(min_chunk_size=1 << 20):
                f.write(chunk)
    except (obstore.exceptions.BaseError, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ArtifactError(f"downloading {url} failed: {first}") from exc
