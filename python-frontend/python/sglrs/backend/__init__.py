"""Backends: `RuntimeEndpoint` (HTTP) and `Engine` (in-process, through PyO3)."""

from sglrs.backend.base import BackendError, BaseBackend, GenerateApiBackend
from sglrs.backend.runtime_endpoint import RuntimeEndpoint

__all__ = ["BackendError", "BaseBackend", "GenerateApiBackend", "RuntimeEndpoint"]
