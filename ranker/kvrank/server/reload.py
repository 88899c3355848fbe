"""Hot reload, without a restart, of the config file's live sections (``ttl``, ``shadow``)
and of the cache-entry secrets file.

The operator rewrites the ranker ConfigMap when it tunes the TTL; the kubelet updates the
mounted file; this task notices the new mtime within ``CONFIG_POLL_S`` and hands the new
sections over (the service's ``set_ttl``, the app state's shadow section). The same goes for
``entry_secret_file`` (the deployment's cache-key Secret, mounted): a rotation's steps (the
new secret added, then put first, then the old one dropped) take effect in a running pod.
A file that does not parse, or secrets below the minimum, keep what is in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from kvrank.cache import TTLSettings
from kvrank.server.config import entry_secrets, read_file
from kvrank.server.shadow import ShadowConfig
from kvrank.server.state import AppState

log = logging.getLogger("kvrank.server")
CONFIG_POLL_S = 1.0


def remember_mtime(state: AppState) -> None:
    """The files' mtimes at start: only a later change is a reload."""
    for path, _ in _watched(state):
        with contextlib.suppress(OSError):
            state.watched_mtimes[str(path)] = path.stat().st_mtime


def _watched(state: AppState) -> list[tuple[Path, Callable[[AppState, Path], None]]]:
    cfg = state.cfg
    files: list[tuple[Path, Callable[[AppState, Path], None]]] = []
    if cfg.config_file:
        files.append((Path(cfg.config_file), _reload))
    if cfg.entry_secret_file:
        files.append((Path(cfg.entry_secret_file), _reload_secrets))
    return files


async def watch_config(state: AppState) -> None:
    files = _watched(state)
    while files:
        await asyncio.sleep(CONFIG_POLL_S)
        for path, reload in files:
            with contextlib.suppress(OSError, ValueError):
                mtime = path.stat().st_mtime
                if mtime != state.watched_mtimes.get(str(path)):
                    state.watched_mtimes[str(path)] = mtime
                    reload(state, path)


def _reload_secrets(state: AppState, path: Path) -> None:
    secrets = entry_secrets(state.cfg)  # ValueError: the ones in force stay
    if state.service is not None:
        state.service.cache.set_secrets(secrets)
        log.info("cache-entry secrets reloaded from %s: %d in force", path, len(secrets))


def _reload(state: AppState, path: Path) -> None:
    doc = read_file(path)
    ttl = TTLSettings.model_validate(doc.get("ttl", {}))
    state.shadow_config = ShadowConfig.model_validate(doc.get("shadow", {}))
    if state.service is not None:
        state.service.set_ttl(ttl)
        shadow = state.shadow_config.model_dump()
        log.info("config reloaded: ttl %s, shadow %s", ttl.model_dump(), shadow)
