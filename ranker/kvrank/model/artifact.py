"""Model artifacts on disk: ``config.json`` + ``model.safetensors`` (no pickle anywhere).

``config.json`` holds the :class:`ModelConfig`, the model version string and a format
number; weights are loaded with safetensors and ``load_state_dict(strict=True)``, so a
file that does not match the config is an :class:`ArtifactError`, never a partial model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pydantic import ValidationError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from kvrank.errors import ArtifactError
from kvrank.model.config import ModelConfig
from kvrank.model.ranker import RankerModel

ARTIFACT_FORMAT = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def save_model(model: RankerModel, directory: Path, extra: dict[str, object] | None = None) -> Path:
    """Write ``model`` to ``directory`` (created if missing); returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(directory / WEIGHTS_FILE))
    doc = {
        "format": ARTIFACT_FORMAT,
        "model_version": model.version,
        "config": model.cfg.model_dump(mode="json"),
        "extra": extra or {},
    }
    (directory / CONFIG_FILE).write_text(json.dumps(doc, indent=2) + "\n")
    return directory


def load_model(directory: Path, device: str | torch.device = "cpu") -> RankerModel:
    """Load an artifact written by :func:`save_model`, in eval mode on ``device``."""
    cfg_path, weights = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for path in (cfg_path, weights):
        if not path.is_file():
            raise ArtifactError(f"model artifact {directory}: missing {path.name}")
    try:
        doc = json.loads(cfg_path.read_text())
        if doc.get("format") != ARTIFACT_FORMAT:
            raise ArtifactError(f"{cfg_path}: format {doc.get('format')!r} != {ARTIFACT_FORMAT}")
        cfg = ModelConfig.model_validate(doc["config"])
        version = str(doc["model_version"])
    except (ValueError, KeyError, ValidationError) as exc:
        raise ArtifactError(f"{cfg_path}: invalid config: {exc}") from exc
    model = RankerModel(cfg, version=version)
    try:
        state = load_file(str(weights), device="cpu")
        model.load_state_dict(state, strict=True)
    except (SafetensorError, RuntimeError) as exc:
        raise ArtifactError(f"{weights}: weights do not match the config: {exc}") from exc
    return model.to(device).eval()
