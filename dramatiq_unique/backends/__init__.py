"""Lock backends: where locks are stored."""

from .base import Acquisition, Holder, LockBackend, LockRecord, MessagesInHand
from .redis import RedisBackend
from .stub import StubBackend

__all__ = ["Acquisition", "Holder", "LockBackend", "LockRecord", "MessagesInHand", "RedisBackend", "StubBackend"]
