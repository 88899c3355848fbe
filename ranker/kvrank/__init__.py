"""kvrank: serve ranking models with a cached user-side K/V (L1 on device, L2 in Redis)."""

__version__ = "0.1.0"
