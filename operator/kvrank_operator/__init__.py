"""kvrank_operator: a kopf operator reconciling ``RankerDeployment`` resources."""

from importlib.metadata import version

__version__ = version("kvrank")
"""The one version of kvrank (pyproject.toml): the packages', the images' tag, the chart's
appVersion (a test holds them equal)."""
