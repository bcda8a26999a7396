"""``python -m tuner`` runs the CLI (where the console script is not installed)."""

from tuner.cli import app

app(prog_name="tuner")
