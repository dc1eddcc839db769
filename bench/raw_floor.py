"""The physical floor of one decision: take.lua with the very bytes our path sends, on a socket
held open, its reply read with a hiredis reader, and nothing else (no redis-py, no Django).

``bench/naive.py``'s "floor" goes through redis-py's ordinary client, whose per-command layers
now cost more than our whole path; this one is what no Redis-backed limiter in Python can beat
for the same script and arguments: one write, one read, one reply parsed.
"""

import socket

import hiredis

from ratelimit_app.runtime.limiter import default_limiter


class RawTake:
    """One EVALSHA of take.lua on a held TCP socket. ``command`` is the packed command (bytes)."""

    def __init__(self, host, port, command):
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()
        self.buffer = bytearray(16384)
        self.command = command

    def __call__(self):
        """Send the command once; return its parsed reply (a list)."""
        sock, reader, buffer = self.sock, self.reader, self.buffer
        sock.sendall(self.command)
        while True:
            reply = reader.gets()
            if reply is not False:
                return reply
            received = sock.recv_into(buffer)
            if not received:
                raise ConnectionError("Redis closed the connection")
            reader.feed(buffer, 0, received)

    def close(self):
        self.sock.close()


def raw_take_like(decide, host, port):
    """Run ``decide`` (our whole path) once and return a RawTake sending exactly the EVALSHA it
    sent: the store keeps each decision's encoded command, so the bytes are taken from there
    (same keys, same arguments, the server's clock)."""
    store = default_limiter().store
    store.encoded_takes.commands.clear()
    decide()
    commands = list(store.encoded_takes.commands.values())
    if len(commands) != 1:
        raise RuntimeError(f"expected our path to send one take, it cached {len(commands)}")
    command = commands[0][0]  # (the encoded command, its fold: see stores.ban_checks)
    packed = command if isinstance(command, bytes) else b"".join(command)
    raw = RawTake(host, port, packed)
    reply = raw()
    if not isinstance(reply, list) or reply[0] != 2:
        raise RuntimeError(f"the raw take was not allowed: {reply!r}")
    return raw
