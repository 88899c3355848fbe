"""The OpenAPI document, with ``/v1/score``'s body the loaded model's request schema.

Each model brings its own features, so the body is known only once the model is; until
then the route is listed without it (and the document is not cached).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from kvrank.metrics import SCORE_ROUTE
from kvrank.server.state import AppState


def openapi(app: FastAPI, state: AppState) -> dict[str, Any]:
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    if state.service is None or state.request_model is BaseModel:
        return doc
    body = state.request_model.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas |= body.pop("$defs", {})
    schemas["ScoreRequest"] = body
    doc["paths"][SCORE_ROUTE]["post"]["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ScoreRequest"}}},
    }
    app.openapi_schema = doc
    return doc
