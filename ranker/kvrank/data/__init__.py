"""Synthetic ranking data with planted structure (see :mod:`kvrank.data.synthetic`)."""
