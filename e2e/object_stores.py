"""The object stores the tests fetch model artifacts from: real S3- and GCS-compatible
servers, each one process built once from its Go module (``scripts/build-<name>.sh``),
serving a folder of artifacts as a bucket — and the environment a ranker needs to reach
one (its endpoint and credentials, as a pod gets them from a Secret).

gofakes3 serves the folder as it is (files written later are served too); fake-gcs-server
loads it when it starts.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ObjectStore:
    """One kind of store: how to build and run its server and how a client reaches it."""

    scheme: str
    """The artifact URIs it serves: ``<scheme>://<bucket>/<prefix>``."""
    binary: str
    """The server's command (and its build script's name: ``build-<binary>.sh``)."""
    bucket_path: str
    """The path that answers 200 once the server serves ``{bucket}``."""

    def built(self) -> Path:
        """The server's binary, built once (the script returns at once when it is)."""
        script = ROOT / "scripts" / f"build-{self.binary}.sh"
        out = subprocess.run(
            ["bash", str(script)], capture_output=True, text=True, check=True, timeout=900
        ).stdout
        return Path(out.strip().splitlines()[-1]) / self.binary

    def command(self, folder: Path, bucket: str, host: str, port: int) -> list[str]:
        """The server on ``host:port`` serving ``folder`` as ``bucket``."""
        raise NotImplementedError

    def env(self, endpoint: str) -> dict[str, str]:
        """What a ranker's environment holds to fetch from the store at ``endpoint``."""
        raise NotImplementedError

    def up(self, endpoint: str, bucket: str) -> bool:
        """Whether the store at ``endpoint`` answers for ``bucket``."""
        try:
            url = endpoint + self.bucket_path.format(bucket=bucket)
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False


class S3Store(ObjectStore):
    """gofakes3: serves the folder as it is (files written later too)."""

    def command(self, folder: Path, bucket: str, host: str, port: int) -> list[str]:
        return [str(self.built()), "-backend", "directfs", "-directfs.path", str(folder),
                "-directfs.bucket", bucket, "-host", f"{host}:{port}", "-quiet"]  # fmt: skip

    def env(self, endpoint: str) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "kvrank-test",
            "AWS_SECRET_ACCESS_KEY": "kvrank-test-secret",
        }


class GCSStore(ObjectStore):
    """fake-gcs-server: loads each folder under ``-data`` as the bucket so named, at start."""

    def command(self, folder: Path, bucket: str, host: str, port: int) -> list[str]:
        if folder.name != bucket:
            raise ValueError(f"fake-gcs-server serves {folder} as {folder.name!r}, not {bucket!r}")
        return [str(self.built()), "-scheme", "http", "-host", host, "-port", str(port),
                "-public-host", f"{host}:{port}", "-backend", "memory",
                "-data", str(folder.parent), "-log-level", "warn"]  # fmt: skip

    def env(self, endpoint: str) -> dict[str, str]:
        # a service-account key naming the emulator as its endpoint (no OAuth token to get)
        key = {"type": "service_account", "gcs_base_url": endpoint, "disable_oauth": True,
               "client_email": "", "private_key_id": "", "private_key": ""}  # fmt: skip
        return {"GOOGLE_SERVICE_ACCOUNT_KEY": json.dumps(key)}


S3 = S3Store("s3", "gofakes3", "/{bucket}/")
GCS = GCSStore("gs", "fake-gcs-server", "/storage/v1/b/{bucket}")
