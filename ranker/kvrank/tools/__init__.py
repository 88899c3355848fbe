"""Tooling around the product, never on the serving path: synthetic workloads, replay and
load tests, the train/demo jobs and a local stack of real processes for them.

The serving path (``kvrank.server``, ``kvrank.service``, ``kvrank.cache``, ``kvrank.model``)
never imports from here; an import contract holds it to that.
"""
