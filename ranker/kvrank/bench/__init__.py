"""Benchmarks that print a table and write JSON: ``kvrank bench`` (see :mod:`.runner`)."""
