"""Architectures: the names an artifact's ``config.json`` may give, and who builds each.

A model is a Python package installed in the ranker image (a derived image ``FROM`` the
ranker's, with the team's wheel added); it announces its architectures in the
``kvrank.models`` entry-point group, each mapping a name to a builder
``build(config, version) -> CacheableRanker`` that makes a fresh, untrained model. The
built-in ranker is registered the same way (``onetrans``, by kvrank's own distribution).
Code never comes from an artifact or a URL: an artifact only names an architecture and the
distribution + version that wrote it, and loading refuses any other installed version.
Tests register builders in-process with :func:`register`. No weights are read here.
"""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvrank.errors import ArtifactError
from kvrank.model.contract import CacheableRanker

ENTRY_POINT_GROUP = "kvrank.models"

Builder = Callable[[Mapping[str, Any], str], CacheableRanker]


@dataclass(frozen=True)
class Architecture:
    """One registered architecture."""

    name: str
    build: Builder
    distribution: str | None
    """The installed distribution providing it (None: registered in-process)."""
    version: str | None
    """That distribution's installed version."""


_REGISTERED: dict[str, Architecture] = {}
CONTRACT_MEMBERS = (
    "version",
    "kv_dtypes",
    "features",
    "module",
    "device",
    "fingerprint",
    "encode_user",
    "score",
    "forward_full",
)


def register(
    name: str, build: Builder, distribution: str | None = None, version: str | None = None
) -> None:
    """Register ``build`` under ``name`` in this process (tests, notebooks); an installed
    entry point of the same name is shadowed."""
    _REGISTERED[name] = Architecture(name, build, distribution, version)


def unregister(name: str) -> None:
    _REGISTERED.pop(name, None)


def architectures() -> dict[str, Architecture]:
    """Every architecture available here, by name (entry points, then in-process ones)."""
    found: dict[str, Architecture] = {}
    for ep in md.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        found[ep.name] = Architecture(
            ep.name,
            _lazy(ep),
            dist.name if dist is not None else None,
            dist.version if dist is not None else None,
        )
    return found | _REGISTERED


def _lazy(ep: md.EntryPoint) -> Builder:
    def build(config: Mapping[str, Any], version: str) -> CacheableRanker:
        try:
            builder = ep.load()
        except Exception as exc:  # an installed plugin that fails to import
            raise ArtifactError(
                f"architecture {ep.name!r}: cannot import {ep.value}: {exc!r}"
            ) from exc
        model: CacheableRanker = builder(config, version)
        return model

    return build


def get(name: str) -> Architecture:
    """The architecture ``name``; ``ArtifactError`` listing the known ones if missing."""
    known = architectures()
    if name not in known:
        raise ArtifactError(
            f"architecture {name!r} is not installed (known: {', '.join(sorted(known)) or 'none'});"
            f" install the package that provides it in the ranker image"
            f" (entry-point group {ENTRY_POINT_GROUP!r})"
        )
    return known[name]


def build(arch: Architecture, config: Mapping[str, Any], version: str) -> CacheableRanker:
    """A fresh model from ``arch``; ``ArtifactError`` when the config is refused or the
    result does not implement the contract."""
    try:
        model = arch.build(config, version)
    except ArtifactError:
        raise
    except (ValueError, TypeError, KeyError) as exc:
        raise ArtifactError(f"architecture {arch.name!r} refused its config: {exc}") from exc
    if not isinstance(model, CacheableRanker):
        missing = [name for name in CONTRACT_MEMBERS if not hasattr(model, name)]
        raise ArtifactError(
            f"architecture {arch.name!r} built a {type(model).__name__}, which does not"
            f" implement CacheableRanker (missing: {', '.join(missing)})"
        )
    return model
