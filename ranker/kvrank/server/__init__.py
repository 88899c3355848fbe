"""The HTTP boundary: FastAPI app, request schemas, configuration (see ``app``)."""
