"""The ``model.py`` of the front benchmark's Triton model repository: on import, puts the
benchmark's Python path in place (the backend's stub starts with its own, and imports its
utilities, which need numpy, before it calls the model), from ``paths.json`` beside it —
``site_dirs``, the benchmark interpreter's site-packages, and ``sys_path``, the directories
it imports kvrank and the engine from; then it hands every call to
:class:`triton_engine.Engine`, made from the ``settings`` parameter (config.pbtxt: the
engine's ``ServerConfig`` fields as JSON)."""

from __future__ import annotations

import json
import site
import sys
from pathlib import Path
from typing import Any

_paths = json.loads((Path(__file__).parent / "paths.json").read_text())
# ahead of the stub's own site-packages (the base interpreter's, with older packages)
sys.path[:0] = _paths["sys_path"] + _paths["site_dirs"]
for _directory in _paths["site_dirs"]:
    site.addsitedir(_directory)  # its .pth files


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
        from triton_engine import Engine

        config = json.loads(args["model_config"])
        settings = json.loads(config["parameters"]["settings"]["string_value"])
        self.pb = pb_utils
        self.engine = Engine(settings)

    def execute(self, requests: list[Any]) -> list[Any]:
        return self.engine.execute(self.pb, requests)

    def finalize(self) -> None:
        self.engine.close()
