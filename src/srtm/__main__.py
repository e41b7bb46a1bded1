"""``python -m srtm`` is the ``srtm`` command line."""

from srtm.cli import app

app()
