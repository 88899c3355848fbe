"""A ``docker save`` stream rewritten as an OCI image layout without the layers the node has.

The product's images share one multi-GB dependency layer that changes only with the
dependencies; after a code change only their top layers are new. ``ctr images import`` of a
docker-archive ingests every layer it carries (minutes for that one), while an OCI layout
names its layers by digest and containerd reads a layer's blob only to unpack it, which it
skips when the snapshot of that layer (its chain id) exists already. :func:`rewrite` turns
the docker-archive stream into such a layout on the fly, leaving out the layers the caller
says the node has unpacked, and writes the same manifests containerd's own docker-archive
import would. A left-out layer is recognised by its size and then checked by its digest as
it streams past; one that turns out to be another layer of the same size raises
:class:`LayerMismatch` (the stream is spent: import the plain way).
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import tarfile
from dataclasses import dataclass, field
from typing import IO, Any

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
IMAGE_NAME = "io.containerd.image.name"
REF_NAME = "org.opencontainers.image.ref.name"
CHUNK = 1 << 20
WORTH_LEAVING_OUT = 32 << 20
"""Smaller layers travel even when the node has them: they cost nothing to import, and an
edit that keeps a small file's size (a version string) would make their size ambiguous."""


class LayerMismatch(RuntimeError):
    """A layer of a left-out size had another digest: nothing of the stream may be imported."""


@dataclass
class _Seen:
    layers: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (digest, size)
    links: dict[str, str] = field(default_factory=dict)  # a layer symlink -> its target
    configs: dict[str, bytes] = field(default_factory=dict)
    manifest: list[dict[str, Any]] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)


def chain_ids(diff_ids: list[str]) -> list[str]:
    """Each layer's chain id (what containerd names its unpacked snapshot by)."""
    chain: list[str] = []
    for diff in diff_ids:
        parent = chain[-1] if chain else None
        chain.append(diff if parent is None else _sha256(f"{parent} {diff}".encode()))
    return chain


def rewrite(source: IO[bytes], sink: IO[bytes], unpacked: dict[str, int]) -> list[str]:
    """Copy the docker-archive ``source`` to ``sink`` as an OCI layout, without the layers in
    ``unpacked`` (digest -> size). Returns the digests left out."""
    seen = _Seen()
    by_size: dict[int, set[str]] = {}
    for digest, size in unpacked.items():
        if size >= WORTH_LEAVING_OUT:
            by_size.setdefault(size, set()).add(digest)
    with (
        tarfile.open(fileobj=source, mode="r|") as tin,
        tarfile.open(fileobj=sink, mode="w|") as out,
    ):
        for member in tin:
            name = posixpath.normpath(member.name)
            if member.issym() and name.endswith("/layer.tar"):
                seen.links[name] = posixpath.normpath(
                    posixpath.join(posixpath.dirname(name), member.linkname)
                )
            elif not member.isfile():
                continue
            elif name == "manifest.json":
                seen.manifest = json.load(_read(tin, member))
            elif name.endswith("/layer.tar"):
                seen.layers[name] = _layer(tin, member, out, by_size, seen.left_out)
            elif name.endswith(".json") and "/" not in name:  # an image's config
                data = _read(tin, member).read()
                seen.configs[name] = data
                _add(out, f"blobs/sha256/{_sha256(data).split(':')[1]}", data)
        _layout(out, seen)
    return seen.left_out


def _layer(
    tin: tarfile.TarFile,
    member: tarfile.TarInfo,
    out: tarfile.TarFile,
    by_size: dict[int, set[str]],
    left_out: list[str],
) -> tuple[str, int]:
    source = _read(tin, member)
    digest = hashlib.sha256()
    expected = by_size.get(member.size)
    if expected:  # the node has a layer of this size: read past it
        while chunk := source.read(CHUNK):
            digest.update(chunk)
        found = f"sha256:{digest.hexdigest()}"
        if found not in expected:
            raise LayerMismatch(f"{member.name} ({member.size} bytes) is {found}, not {expected}")
        left_out.append(found)
        return found, member.size
    info = tarfile.TarInfo(member.name)
    info.size, info.mode = member.size, 0o644
    out.addfile(info, _Hashing(source, digest))
    return f"sha256:{digest.hexdigest()}", member.size


def _layout(out: tarfile.TarFile, seen: _Seen) -> None:
    """The manifests (as containerd's docker-archive import writes them), the index naming
    each tag, and the ``oci-layout`` marker."""
    entries = []
    for image in seen.manifest:
        config = seen.configs[image["Config"]]
        doc = json.loads(config)
        layers = [seen.layers[seen.links.get(n, posixpath.normpath(n))] for n in image["Layers"]]
        manifest = _json(
            {
                "schemaVersion": 2,
                "mediaType": DOCKER_MANIFEST,
                "config": {
                    "mediaType": DOCKER_CONFIG,
                    "digest": _sha256(config),
                    "size": len(config),
                },
                "layers": [{"mediaType": DOCKER_LAYER, "digest": d, "size": s} for d, s in layers],
            }
        )
        digest = _sha256(manifest)
        _add(out, f"blobs/sha256/{digest.split(':')[1]}", manifest)
        platform = {"architecture": doc.get("architecture", "amd64"), "os": doc.get("os", "linux")}
        for ref in image.get("RepoTags") or []:
            entries.append(
                {
                    "mediaType": DOCKER_MANIFEST,
                    "digest": digest,
                    "size": len(manifest),
                    "annotations": {IMAGE_NAME: ref, REF_NAME: ref.rsplit(":", 1)[1]},
                    "platform": platform,
                }
            )
    _add(
        out, "index.json", _json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})
    )
    _add(out, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))


class _Hashing:
    """A reader that hashes what passes through it."""

    def __init__(self, source: IO[bytes], digest: Any) -> None:
        self.source, self.digest = source, digest

    def read(self, n: int = -1) -> bytes:
        data = self.source.read(n)
        self.digest.update(data)
        return data


def _read(tin: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    f = tin.extractfile(member)
    assert f is not None, member.name
    return f


def _add(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    out.addfile(info, io.BytesIO(data))


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _sha256(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"
