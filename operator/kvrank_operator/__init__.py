"""kvrank_operator: a kopf operator reconciling ``RankerDeployment`` resources."""

__version__ = "0.1.0"
