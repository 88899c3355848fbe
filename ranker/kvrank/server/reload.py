"""Hot reload of the config file's live sections (``ttl``, ``shadow``) without a restart.

The operator rewrites the ranker ConfigMap when it tunes the TTL; the kubelet updates the
mounted file; this task notices the new mtime within ``CONFIG_POLL_S`` and hands the new
sections over (the service's ``set_ttl``, the app state's shadow section). A file that does
not parse keeps what is in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from kvrank.cache import TTLSettings
from kvrank.server.config import read_file
from kvrank.server.shadow import ShadowConfig
from kvrank.server.state import AppState

log = logging.getLogger("kvrank.server")
CONFIG_POLL_S = 1.0


def remember_mtime(state: AppState) -> None:
    """The file's mtime at start: only a later change is a reload."""
    if state.cfg.config_file:
        with contextlib.suppress(OSError):
            state.config_mtime = Path(state.cfg.config_file).stat().st_mtime


async def watch_config(state: AppState) -> None:
    path = Path(state.cfg.config_file) if state.cfg.config_file else None
    while path is not None:
        await asyncio.sleep(CONFIG_POLL_S)
        with contextlib.suppress(OSError, ValueError):
            mtime = path.stat().st_mtime
            if mtime != state.config_mtime:
                state.config_mtime = mtime
                _reload(state, path)


def _reload(state: AppState, path: Path) -> None:
    doc = read_file(path)
    ttl = TTLSettings.model_validate(doc.get("ttl", {}))
    state.shadow_config = ShadowConfig.model_validate(doc.get("shadow", {}))
    if state.service is not None:
        state.service.set_ttl(ttl)
        shadow = state.shadow_config.model_dump()
        log.info("config reloaded: ttl %s, shadow %s", ttl.model_dump(), shadow)
