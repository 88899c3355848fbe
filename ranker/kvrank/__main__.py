"""``python -m kvrank``: the ``kvrank`` command, where its console script is not installed."""

from kvrank.cli import app

app()
