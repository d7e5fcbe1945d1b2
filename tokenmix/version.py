"""The package version (read by pyproject.toml and recorded in every saved config)."""

__version__ = "0.2.0"
