"""The device engine apart from the request fronts (``kvrank serve --fronts N``).

One engine process owns the model, the cache tiers, the batcher and admission control; N
front processes accept HTTP (and gRPC), parse and validate each body into tensors and hand
them to the engine over a Unix socket (:mod:`~kvrank.engine.wire`). Each front runs the
same app as a single-process server, with a :class:`~kvrank.engine.remote.RemoteService` in
place of the service: the routes cannot tell them apart.
"""
