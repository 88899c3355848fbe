"""The two-level K/V cache: L1 in the serving process, L2 in Redis, and their policies.

Data flows one way: ``tiered`` composes ``l1`` and ``redis_tier``; both store ``UserKV``
(``l1`` as objects on the model's device, ``redis_tier`` as bytes made by ``entry``).
Every tier failure is a miss, never an exception that reaches a request.
"""
