"""Architectures: the names an artifact's ``config.json`` may give, and who builds each.

A model is a Python package installed in the ranker image (a derived image ``FROM`` the
ranker's, with the team's wheel added); it announces its architectures in the
``kvrank.models`` entry-point group, each mapping a name to a builder
``build(config, version) -> CacheableRanker`` that makes a fresh, untrained model. The
built-in ranker is registered the same way (``onetrans``, by kvrank's own distribution).
Code never comes from an artifact or a URL: an artifact only names an architecture and the
distribution + version that wrote it, and loading refuses any other installed version.
Tests register builders in-process with :func:`register`. No weights are read here.

While a model is written, before it is packaged, ``--plugin module:builder`` (``kvrank serve``
and ``check-model``; the server's ``plugin`` setting) names a builder in a module importable
here (the working directory included): :func:`use_plugin` makes it build every artifact's
architecture, and its source files' digest is part of the model's identity, so a changed
module never reads another's cache entries.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata as md
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
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
    code: str = ""
    """A digest of the code that builds it when no distribution says (a ``--plugin``)."""


_REGISTERED: dict[str, Architecture] = {}
_PLUGIN: tuple[str, Builder, str] | None = None
"""``(module:builder, builder, source digest)`` of :func:`use_plugin`."""
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


def use_plugin(target: str | None) -> None:
    """Build every artifact's architecture with ``target`` (``module:builder``; ``None``:
    the installed ones again). ``ArtifactError`` naming what is missing when the module does
    not import or has no such builder."""
    global _PLUGIN
    if target is None:
        _PLUGIN = None
        return
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ArtifactError(f"plugin {target!r}: expected module:builder, e.g. my_model:build")
    if os.getcwd() not in sys.path:  # a module next to the command, as `python -m` finds it
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ArtifactError(f"plugin {target!r}: cannot import {module_name}: {exc!r}") from exc
    builder = getattr(module, attr, None)
    if not callable(builder):
        raise ArtifactError(f"plugin {target!r}: {module_name} has no callable {attr!r}")
    _PLUGIN = (target, builder, _source_digest(module))


def _source_digest(module: ModuleType) -> str:
    """SHA-256 over the module's source files (a package's every ``.py``), by relative path."""
    origin = Path(inspect.getfile(module))
    root = origin.parent if origin.name == "__init__.py" else None
    files = sorted(root.rglob("*.py")) if root is not None else [origin]
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relative_to(root) if root else f.name}\0".encode() + f.read_bytes())
    return h.hexdigest()


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
    """The architecture ``name`` (the plugin's builder while one is in use);
    ``ArtifactError`` listing the known ones if missing."""
    if _PLUGIN is not None:
        target, builder, code = _PLUGIN
        return Architecture(name, builder, None, None, code=f"{target} {code}")
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
