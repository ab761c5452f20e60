"""The package's version, where the cli reads it without importing the package's API."""

__version__ = "0.1.0"
