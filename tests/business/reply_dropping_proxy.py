"""A TCP proxy on a free 127.0.0.1 port in front of a real server, for the network fault a
timeout or a killed server cannot make on demand: the server ran the command, its reply never
arrived. While ``drop_replies_to`` is set (bytes), the first reply the server sends on a
connection whose client sent those bytes (a command's name, say) closes that connection instead
of reaching the client (``dropped`` counts them); anything else passes both ways unchanged (the
client's handshake, other commands)."""

import socket
import threading

from ratelimit_app.testing import HOST


class ReplyDroppingProxy:
    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.drop_replies_to = None
        self.dropped = 0
        self._listener = None
        self._sockets = []
        self._lock = threading.Lock()

    @property
    def port(self):
        return self._listener.getsockname()[1]

    def start(self):
        self._listener = socket.create_server((HOST, 0))
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self):
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def _accept(self):
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # stopped
            server = socket.create_connection((HOST, self.upstream_port))
            with self._lock:
                self._sockets += [client, server]
            sent = []  # what this connection's client sent so far
            threading.Thread(target=self._pump, args=(client, server, sent, None),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, None, sent),
                             daemon=True).start()

    def _pump(self, source, target, record, requests):
        try:
            while data := source.recv(65536):
                if record is not None:
                    record.append(data)
                elif self.drop_replies_to and self.drop_replies_to in b"".join(requests):
                    with self._lock:
                        self.dropped += 1
                    break
                target.sendall(data)
        except OSError:
            pass
        for sock in (source, target):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
