"""``camp``: the command-line client of Camp's REST API (token-authenticated)."""

__version__ = "0.1.0"
