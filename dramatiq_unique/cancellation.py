"""Running messages asked to stop, and their interruption.

A holder is asked to stop by a mark in its own record in the lock store
(``LockBackend.request_stop``); its worker learns it in the answer to the lease
renewal its heartbeat thread makes anyway, and interrupts the message with
:class:`~dramatiq_unique.Cancelled`: in a worker thread as Dramatiq's ``TimeLimit``
does, and under gevent by throwing it into the message's greenlet from the gevent
hub that runs it (the heartbeat thread is then a native thread, which cannot touch
a greenlet). The runtime owns one :class:`Cancellations` per process; the heartbeat
thread hands it plain data only: how to interrupt the message (an :data:`Interrupter`,
made by the thread that runs it), what the lock is about and who asked.

Who asked is a phrase a person reads after "by": ``message <message_id>`` for a
newer message, ``operator <who>`` for an operator's cancel.
"""

from __future__ import annotations

import getpass
import logging
import socket
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from dramatiq.middleware import raise_thread_exception

from .errors import Cancelled
from .events import EventSubject
from .forks import reset_in_child
from .native import current_greenlet, current_hub, gevent_patched, original

#: How to interrupt one running message from another thread, given what says, at the moment it
#: would, whether the message still runs (see :func:`interrupter`).
Interrupter = Callable[[Callable[[], bool]], None]


def interrupter() -> Interrupter:
    """How to interrupt the message that the calling thread runs, from the heartbeat thread."""
    if gevent_patched():
        return partial(_throw_from_hub, current_greenlet(), current_hub())
    return partial(_raise_in_thread, threading.get_ident())


def _raise_in_thread(thread: int, running: Callable[[], bool]) -> None:
    if running():
        raise_thread_exception(thread, Cancelled)  # type: ignore[no-untyped-call, unused-ignore]


def _throw_from_hub(greenlet: Any, hub: Any, running: Callable[[], bool]) -> None:
    # Only the hub's own thread may switch to its greenlets: it throws when it next gets control.
    hub.loop.run_callback_threadsafe(_throw, greenlet, running)


def _throw(greenlet: Any, running: Callable[[], bool]) -> None:
    # The hub runs this while the greenlets of its thread wait on it: the message cannot leave
    # between the check and the throw, which lands where the greenlet waits.
    if not greenlet.dead and running():
        greenlet.throw(Cancelled)


def asked_by_message(message_id: str) -> str:
    """Who asks, for a newer message that asks a running holder to stop."""
    return f"message {message_id}"


def asked_by_operator(who: str | None = None) -> str:
    """Who asks, for an operator: ``who``, or else the user and host of this process. A
    character that is not printable shows as U+FFFD: the worker's log lines name who asked,
    and a line break in a name (a web server's ``REMOTE_USER``) must not make a line of its own."""
    if who is None:
        try:
            who = f"{getpass.getuser()}@{socket.gethostname()}"
        except Exception:  # no user name in this process's environment nor in its passwd
            who = socket.gethostname()
    return "operator " + "".join(c if c.isprintable() else "\ufffd" for c in who)


class Cancellations:
    """The messages of this process interrupted because their holder was asked to stop.

    Parameters:
      logger(logging.Logger): Where to tell of each interruption.
    """

    def __init__(self, *, logger: logging.Logger):
        self.logger = logger
        # A lock of the OS even under gevent: a greenlet that takes it never waits on the hub.
        self._mutex = original("_thread", "allocate_lock")()
        #: The messages interrupted, by message_id, with their lock's digest, until they left.
        self._interrupted: dict[str, str] = {}
        #: Who asked each message of :attr:`_interrupted` to stop, the first who asked.
        self._asked_by: dict[str, str] = {}
        reset_in_child(self._reset_in_child)

    def _reset_in_child(self) -> None:
        self._mutex = original("_thread", "allocate_lock")()
        self._interrupted = {}
        self._asked_by = {}

    def interrupt(self, target: Interrupter, subject: EventSubject, running: Callable[[], bool], by: str) -> None:
        """Interrupt the message of ``subject`` with ``target``: its holder was asked to stop,
        ``by`` whom. Called by the heartbeat thread while the message still holds its lease;
        ``running`` says whether it still does when ``target`` interrupts it, later under
        gevent. A message is interrupted once."""
        with self._mutex:
            self._asked_by.setdefault(subject.message_id, by)
            if subject.message_id in self._interrupted or not running():
                return  # interrupted already, or its actor returned: it ends by itself
            self._interrupted[subject.message_id] = subject.digest
        self.logger.warning(
            "Message %r of actor %r was asked to stop by %s while it ran (lock %r): it is interrupted with Cancelled.",
            subject.message_id,
            subject.actor_name,
            by,
            subject.digest,
        )
        target(partial(self._still_running, subject.message_id, running))

    def _still_running(self, message_id: str, running: Callable[[], bool]) -> bool:
        if running():
            return True
        self.forget(message_id)  # it left before it could be interrupted
        return False

    def interrupted(self, message_id: str) -> bool:
        """Whether the message was interrupted and has not left yet."""
        return message_id in self._interrupted

    def asked_by(self, message_id: str) -> str | None:
        """Who asked the message to stop, until it left; ``None`` for a message not asked."""
        return self._asked_by.get(message_id)

    def forget(self, message_id: str) -> None:
        """The message left the worker."""
        if self._interrupted or self._asked_by:
            with self._mutex:
                self._interrupted.pop(message_id, None)
                self._asked_by.pop(message_id, None)
