"""kvrank: serve ranking models with a cached user-side K/V (L1 on device, L2 in Redis)."""

from importlib.metadata import version

__version__ = version("kvrank")
"""The one version of kvrank (pyproject.toml): the packages', the images' tag, the chart's
appVersion (a test holds them equal)."""
