"""The compiled part of sglrs (PyO3)."""

__version__: str
