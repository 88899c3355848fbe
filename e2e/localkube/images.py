"""Container images for the real node: the pause image, and Docker images moved into it.

The node's containerd pulls nothing (there is no registry to reach): every image a pod
runs is imported into its ``k8s.io`` namespace first. The pause image is written here as a
docker-archive around the static ``pause`` binary that ``build-node.sh`` compiles; the
product's images come from the Docker engine that ``make images`` built them in, through
``docker save | ctr images import`` (all the changed ones in one archive, so the layers
they share travel once, and the layers the node has unpacked already left out of it: see
:mod:`localkube.archive`), skipped when containerd already holds the same image (same config
digest), so a reused containerd root ingests the multi-GB dependency layer once.
Imports drop the layer blobs once unpacked (the snapshots are what containers run from), and
:meth:`NodeImages.prune` removes every other image, so the reused root holds one copy of
each current image instead of one per build.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localkube.archive import LayerMismatch, chain_ids, rewrite

PAUSE_IMAGE = "kvrank.local/pause:3.10"
PAUSE_UID = 65535
HELD = "kvrank.local/held:"
"""Tags that keep the images an import replaces until it has unpacked the new ones."""


def pause_archive(binary: Path, out: Path, ref: str = PAUSE_IMAGE) -> Path:
    """A one-layer docker-archive whose only file is ``/pause`` (as ``docker save`` writes)."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tar.gettarinfo(str(binary), arcname="pause")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mode = 0o755
        with binary.open("rb") as f:
            tar.addfile(info, f)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": f"{PAUSE_UID}:{PAUSE_UID}"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [ref], "Layers": ["layer.tar"]}]
    ).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, mode="w") as tar:
        for name, data in (
            ("layer.tar", layer_bytes),
            (config_name, config),
            ("manifest.json", manifest),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return out


class NodeImages:
    """``ctr`` on the node's containerd socket, in the namespace the kubelet uses."""

    def __init__(self, ctr: Path, address: Path) -> None:
        self.base = [str(ctr), f"--address={address}", "--namespace=k8s.io"]

    def ctr(self, *args: str, timeout: float = 120) -> str:
        out = subprocess.run([*self.base, *args], capture_output=True, timeout=timeout, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed: {out.stderr.decode()[-2000:]}")
        return out.stdout.decode()

    def manifest(self, ref: str) -> dict[str, Any] | None:
        """The image's manifest (an index's first), or None when containerd lacks it."""
        digest = next(
            (
                cols[2]
                for cols in (line.split() for line in self.ctr("images", "ls").splitlines())
                if cols[:1] == [ref]
            ),
            None,
        )
        while digest is not None:
            doc: dict[str, Any] = json.loads(self.ctr("content", "get", digest))
            if "config" in doc:
                return doc
            manifests = doc.get("manifests") or []  # an index: its first (only) manifest
            digest = manifests[0]["digest"] if manifests else None
        return None

    def config_digest(self, ref: str) -> str | None:
        """The image's config digest (= ``docker inspect`` Id), or None when absent."""
        manifest = self.manifest(ref)
        return str(manifest["config"]["digest"]) if manifest else None

    def unpacked(self, images: list[list[str]]) -> dict[str, int]:
        """Of the layers of ``images`` (each one's diff ids, bottom first), those the node has
        unpacked (the snapshot of their chain exists), with their size as the manifests of
        the images it holds give it."""
        snapshots = {line.split()[0] for line in self.ctr("snapshots", "ls").splitlines()[1:]}
        sizes = {
            layer["digest"]: layer["size"]
            for ref in self.refs()
            for layer in (self.manifest(ref) or {}).get("layers", [])
        }
        return {
            diff: sizes[diff]
            for diff_ids in images
            for diff, chain in zip(diff_ids, chain_ids(diff_ids), strict=True)
            if chain in snapshots and diff in sizes
        }

    def refs(self) -> list[str]:
        return [line.split()[0] for line in self.ctr("images", "ls", "-q").splitlines() if line]

    def import_archive(self, archive: Path, pin: bool = False) -> None:
        self.ctr(
            "images", "import", "--local", "--discard-unpacked-layers", str(archive), timeout=600
        )
        if pin:
            for ref in _archive_refs(archive):
                self.ctr("images", "label", ref, "io.cri-containerd.pinned=pinned")

    def import_from_docker(
        self, docker: Sequence[str], env: dict[str, str], refs: Sequence[str]
    ) -> list[str]:
        """Copy ``refs`` from the Docker engine, but those containerd holds already (same
        config digest), in one archive: images built on one base (the ranker's plugin images
        on the ranker's) share its gigabytes of layers, which one archive carries once, and
        the layers the node has unpacked already are left out of it (see
        :mod:`localkube.archive`). Returns the refs imported."""
        stale = [ref for ref in refs if self.config_digest(ref) != _docker_id(docker, env, ref)]
        if not stale:
            return []
        # the images being replaced keep their snapshots referenced until the new ones are
        # unpacked: a garbage collection in between would take the layers left out
        present = set(self.refs())
        held = {f"{HELD}{i}": ref for i, ref in enumerate(stale) if ref in present}
        for name, ref in held.items():
            self.ctr("images", "tag", "--force", ref, name)
        try:
            layers = [_docker_layers(docker, env, ref) for ref in stale]
            try:
                self._import(docker, env, stale, self.unpacked(layers))
            except LayerMismatch:
                self._import(docker, env, stale, {})
        finally:
            if held:
                self.ctr("images", "rm", *held)
        return stale

    def _import(
        self, docker: Sequence[str], env: dict[str, str], refs: list[str], unpacked: dict[str, int]
    ) -> None:
        with tempfile.TemporaryFile() as log:
            save = subprocess.Popen([*docker, "save", *refs], stdout=subprocess.PIPE, env=env)
            ctr = subprocess.Popen(
                [*self.base, "images", "import", "--local", "--discard-unpacked-layers", "-"],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            assert save.stdout is not None and ctr.stdin is not None
            try:
                rewrite(save.stdout, ctr.stdin, unpacked)
                while save.stdout.read(1 << 20):  # the archive's padding
                    pass
            except BaseException:
                save.kill()
                ctr.kill()
                raise
            finally:
                ctr.stdin.close()
                save.stdout.close()
                saved, imported = save.wait(), ctr.wait(timeout=1800)
            if saved != 0 or imported != 0:
                log.seek(0)
                raise RuntimeError(f"importing {refs} failed: {log.read().decode()[-2000:]}")

    def name_by_id(self, refs: Sequence[str]) -> None:
        """Name each of ``refs`` also by its id (``sha256:`` of its config), as a pull through
        the kubelet does: for an image volume the kubelet hands containerd that id, which
        containerd then looks up by name — an imported image has none, and its pods fail
        with ``ImageVolumeMountFailed ... not found`` (kind's ``load`` meets the same)."""
        for ref in refs:
            digest = self.config_digest(ref)
            if digest is None:
                raise RuntimeError(f"the node holds no image {ref}")
            self.ctr("images", "tag", "--force", ref, digest)

    def prune(self, keep: set[str]) -> list[str]:
        """Remove every image but ``keep`` (older builds, the ``sha256:`` names an import
        adds); containerd's garbage collector then frees their snapshots. Returns what went."""
        gone = [ref for ref in self.refs() if ref not in keep]
        if gone:
            self.ctr("images", "rm", *gone, timeout=600)
        return gone


def _archive_refs(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        return [ref for entry in json.load(member) for ref in entry.get("RepoTags", [])]


def _docker_id(docker: Sequence[str], env: dict[str, str], ref: str) -> str:
    """The image's id in the Docker engine (its config digest)."""
    return _inspect(docker, env, ref, "{{.Id}}")


def _docker_layers(docker: Sequence[str], env: dict[str, str], ref: str) -> list[str]:
    """The image's layers' diff ids in the Docker engine, bottom first."""
    return list(json.loads(_inspect(docker, env, ref, "{{json .RootFS.Layers}}")))


def _inspect(docker: Sequence[str], env: dict[str, str], ref: str, template: str) -> str:
    inspect = subprocess.run(
        [*docker, "image", "inspect", "--format", template, ref],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if inspect.returncode != 0:
        raise RuntimeError(f"the Docker engine has no image {ref}: {inspect.stderr.strip()}")
    return inspect.stdout.strip()
