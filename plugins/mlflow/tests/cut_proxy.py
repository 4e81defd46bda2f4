"""A TCP relay in front of the tracking server that a test can cut: a lost server.

Once :meth:`Relay.cut` ran, every open connection is closed and a new one is
refused, exactly what a client sees of a server that died; the server behind it
keeps its data, so a test reads the run back (or syncs it) there afterwards.
"""

from __future__ import annotations

import socket
import threading


class Relay:
    """Relays 127.0.0.1:<port> to ``target_port`` until :meth:`cut`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.open = True
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        with self.lock:
            self.open = False
            for sock in [self.listener, *self.sockets]:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                if not self.open:
                    client.close()
                    upstream.close()
                    return
                self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
