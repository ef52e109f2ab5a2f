"""A TCP proxy the tests control: the network between a process and a server, cut and restored."""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    """Forwards connections from a local port to ``target``, until :meth:`cut`.

    While cut, the connections it forwarded are closed and new ones are closed as soon as they
    are accepted: the client sees its server go away and refuse to come back, as across a network
    partition that resets connections. :meth:`restore` forwards again.
    """

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._mutex = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._cut = False
        self._closed = False
        threading.Thread(target=self._accept, name="test-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def cut(self) -> None:
        with self._mutex:
            self._cut = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close(sock)

    def restore(self) -> None:
        with self._mutex:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._mutex:
                if self._cut:
                    _close(client)
                    continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._mutex:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), name="test-proxy-pump", daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    _close(source)
    _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
