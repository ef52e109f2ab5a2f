"""Native threads in a process that gevent monkey-patched, such as a ``dramatiq-gevent`` worker.

Monkey-patching turns a ``threading.Thread`` into a greenlet: it runs only when the gevent hub of
the process gets control back. A job that keeps the hub busy (a CPU-bound loop, a C driver gevent
has not patched) then keeps such a thread from running for as long as it likes, and the run locks
whose leases that thread renews lapse while their messages still run.

A native thread, started with the ``_thread`` functions gevent saved before it patched them, is
an OS thread: the interpreter switches to it at least every few milliseconds while another thread
holds the GIL in Python code. It must do its I/O on sockets that are not gevent's (see
:meth:`~dramatiq_unique.backends.LockBackend.for_native_thread`): a gevent socket belongs to the
hub of the thread that opened it.

In a process that is not monkey-patched, none of this is used: the threads are ``threading.Thread``.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol


def gevent_patched() -> bool:
    """Whether gevent monkey-patched ``threading`` in this process."""
    if "gevent.monkey" not in sys.modules:
        return False
    return bool(_gevent("gevent.monkey").is_module_patched("threading"))


def original(module: str, name: str) -> Any:
    """``module.name`` as it was before gevent patched it (as it is, if gevent did not)."""
    if "gevent.monkey" in sys.modules:
        return _gevent("gevent.monkey").get_original(module, name)
    return getattr(importlib.import_module(module), name)


def _gevent(module: str) -> Any:
    """A module of gevent, which is imported only where it is in use (and has no type stubs)."""
    return importlib.import_module(module)


class StopEvent(Protocol):
    """What a thread of the runtime waits on between two rounds."""

    def set(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class BackgroundThread(Protocol):
    """A started thread of the runtime: a :class:`threading.Thread` or a :class:`NativeThread`."""

    def start(self) -> None: ...

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...


class NativeEvent:
    """A :class:`threading.Event` built on the original lock, waited on in a native thread
    and set from anywhere."""

    def __init__(self) -> None:
        self._flag = original("_thread", "allocate_lock")()
        self._flag.acquire()

    def set(self) -> None:
        if self._flag.locked():
            try:
                self._flag.release()
            except RuntimeError:
                pass  # set twice at once

    def is_set(self) -> bool:
        return not self._flag.locked()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the event is set, after waiting ``timeout`` seconds at most for it."""
        if not self._flag.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            return False
        try:  # leave it set, for the next wait
            self._flag.release()
        except RuntimeError:
            pass  # a set() in between released it already
        return True


class NativeThread:
    """An OS thread in a monkey-patched process, with the part of :class:`threading.Thread`'s
    interface that the runtime uses.

    Parameters:
      name(str): Its name, for reports.
      target(collections.abc.Callable): What it runs; given ``stop``.
      stop(NativeEvent): Set to tell it to end.
    """

    def __init__(self, *, name: str, target: Callable[[NativeEvent], None], stop: NativeEvent):
        self.name = name
        self._target = target
        self._stop = stop
        self._finished = NativeEvent()
        self._started = False
        self._ident: int | None = None

    def start(self) -> None:
        self._started = True
        original("_thread", "start_new_thread")(self._run, ())

    def is_alive(self) -> bool:
        return self._started and not self._finished.is_set()

    def join(self, timeout: float | None = None) -> None:
        if self._started:
            self._finished.wait(timeout)

    def is_current(self) -> bool:
        """Whether it is the calling thread."""
        return bool(self._ident == original("_thread", "get_ident")())

    def _run(self) -> None:
        self._ident = original("_thread", "get_ident")()
        try:
            self._target(self._stop)
        finally:
            self._finished.set()


def start_in_hub(hub: Any, function: Callable[..., None], *args: Any) -> None:
    """Run ``function(*args)`` in a new greenlet of ``hub``'s thread, from any thread: for work
    that uses the process's gevent sockets (a broker's connection), which only that thread may use.
    """
    hub.loop.run_callback_threadsafe(_gevent("gevent").spawn, function, *args)


def current_hub() -> Any:
    """The gevent hub of the calling thread."""
    return _gevent("gevent").get_hub()


def current_greenlet() -> Any:
    """The greenlet that calls it."""
    return _gevent("gevent").getcurrent()


def is_current(thread: BackgroundThread) -> bool:
    """Whether ``thread`` is the calling thread."""
    if isinstance(thread, NativeThread):
        return thread.is_current()
    return thread is threading.current_thread()
