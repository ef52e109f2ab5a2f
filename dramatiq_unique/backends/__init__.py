"""Lock backends: where locks are stored."""

from .base import Acquisition, Holder, LockBackend
from .redis import RedisBackend
from .stub import StubBackend

__all__ = ["Acquisition", "Holder", "LockBackend", "RedisBackend", "StubBackend"]
