"""The real node's image import: a ``docker save`` stream rewritten as an OCI layout that
leaves out the layers the node has unpacked, and keeps everything else an image needs."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest
from localkube.archive import WORTH_LEAVING_OUT, LayerMismatch, chain_ids, rewrite


def sha(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


BASE, RANKER, PLUGIN = b"dependencies" * 3_000_000, b"ranker code", b"plugin code"
assert len(BASE) >= WORTH_LEAVING_OUT


def docker_archive() -> bytes:
    """Two images on one base layer, as ``docker save`` writes them: each layer in a
    directory of its own, the second image's copy of the base a symlink to the first."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        add("a1/layer.tar", BASE)
        add("a2/layer.tar", RANKER)
        link = tarfile.TarInfo("b1/layer.tar")
        link.type, link.linkname = tarfile.SYMTYPE, "../a1/layer.tar"
        tar.addfile(link)
        add("b2/layer.tar", PLUGIN)
        manifest = []
        for tag, layers, top in (
            ("ranker:test", ["a1", "a2"], RANKER),
            ("plugin:test", ["b1", "b2"], PLUGIN),
        ):
            config = json.dumps(
                {
                    "architecture": "amd64",
                    "os": "linux",
                    "rootfs": {"diff_ids": [sha(BASE), sha(top)]},
                }
            ).encode()
            add(f"{sha(config)[7:]}.json", config)
            manifest.append(
                {
                    "Config": f"{sha(config)[7:]}.json",
                    "RepoTags": [f"ghcr.io/kvrank/{tag}"],
                    "Layers": [f"{d}/layer.tar" for d in layers],
                }
            )
        add("manifest.json", json.dumps(manifest).encode())
    return out.getvalue()


def layout(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def test_the_layers_the_node_has_are_left_out_and_each_image_still_names_all_of_its_own() -> None:
    sink = io.BytesIO()
    left_out = rewrite(io.BytesIO(docker_archive()), sink, {sha(BASE): len(BASE)})
    assert left_out == [sha(BASE)]
    files = layout(sink.getvalue())
    blobs = {sha(data) for data in files.values()}
    assert sha(BASE) not in blobs  # megabytes that never reach containerd
    assert {sha(RANKER), sha(PLUGIN)} <= blobs
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    by_digest = {sha(data): data for data in files.values()}
    index = json.loads(files["index.json"])
    names = {}
    for entry in index["manifests"]:
        manifest = json.loads(by_digest[entry["digest"]])
        assert entry["size"] == len(by_digest[entry["digest"]])
        assert manifest["config"]["digest"] in by_digest  # the config travels
        names[entry["annotations"]["io.containerd.image.name"]] = [
            (layer["digest"], layer["size"]) for layer in manifest["layers"]
        ]
    assert names == {
        "ghcr.io/kvrank/ranker:test": [(sha(BASE), len(BASE)), (sha(RANKER), len(RANKER))],
        "ghcr.io/kvrank/plugin:test": [(sha(BASE), len(BASE)), (sha(PLUGIN), len(PLUGIN))],
    }


def test_without_unpacked_layers_every_layer_travels() -> None:
    sink = io.BytesIO()
    assert rewrite(io.BytesIO(docker_archive()), sink, {}) == []
    blobs = {sha(data) for data in layout(sink.getvalue()).values()}
    assert {sha(BASE), sha(RANKER), sha(PLUGIN)} <= blobs


def test_small_layers_travel_even_when_the_node_has_them() -> None:
    sink = io.BytesIO()
    assert rewrite(io.BytesIO(docker_archive()), sink, {sha(RANKER): len(RANKER)}) == []
    assert sha(RANKER) in {sha(data) for data in layout(sink.getvalue()).values()}


def test_another_layer_of_a_left_out_size_stops_the_rewrite() -> None:
    """Recognised by size, checked by digest: a different layer of that size is never
    left out (the caller imports the plain way)."""
    with pytest.raises(LayerMismatch, match=r"a1/layer\.tar"):
        rewrite(io.BytesIO(docker_archive()), io.BytesIO(), {"sha256:" + "0" * 64: len(BASE)})


def test_chain_ids_are_containerds() -> None:
    a, b = sha(b"a"), sha(b"b")
    assert chain_ids([a, b]) == [a, sha(f"{a} {b}".encode())]
