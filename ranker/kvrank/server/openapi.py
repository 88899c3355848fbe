"""The OpenAPI document, with the bodies of ``/v1/score`` and ``/v1/prefetch`` the loaded
model's request schemas.

Each model brings its own features, so the body is known only once the model is; until
then the route is listed without it (and the document is not cached).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from kvrank.metrics import PREFETCH_ROUTE, SCORE_ROUTE
from kvrank.server.state import AppState


def openapi(app: FastAPI, state: AppState) -> dict[str, Any]:
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    if state.service is None or state.request_model is BaseModel:
        return doc
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for route, name, model in (
        (SCORE_ROUTE, "ScoreRequest", state.request_model),
        (PREFETCH_ROUTE, "PrefetchRequest", state.prefetch_model),
    ):
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas |= body.pop("$defs", {})
        schemas[name] = body
        doc["paths"][route]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        }
    app.openapi_schema = doc
    return doc
