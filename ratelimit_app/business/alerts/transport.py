"""One webhook POST within one deadline: connect, send and read the answer's head, all together
within ``timeout_s``.

A socket timeout bounds each read, not the exchange: a receiver that sends one byte a second
would hold a sender for as long as it likes. Here every step is given what is left of one
deadline, so the whole exchange ends by it. Only the status line and the headers are read (the
body is not used), and at most MAX_HEAD_BYTES of them. The connection goes to an address that
``destinations.resolve_checked`` allowed, never to the name resolved again. Redirects are
answers: they are not followed.
"""

import socket
import ssl
import time
import urllib.parse

from .destinations import resolve_checked

__all__ = ["post", "MAX_HEAD_BYTES"]

# the answer's status line and headers; longer is an error
MAX_HEAD_BYTES = 64 * 1024


class _Deadline:
    def __init__(self, timeout_s):
        self.timeout_s = timeout_s
        self.end = time.monotonic() + timeout_s

    def expired(self):
        return TimeoutError(f"timed out: no whole answer within WEBHOOK_TIMEOUT_S "
                            f"({self.timeout_s:g} s)")

    def left_s(self):
        """Return the seconds left; raises TimeoutError once there are none."""
        left = self.end - time.monotonic()
        if left <= 0:
            raise self.expired()
        return left


def _connect(targets, deadline):
    error = OSError("the host resolves to no address")
    for family, sockaddr in targets:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(deadline.left_s())
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
            if isinstance(exc, TimeoutError):
                break
    raise error


def _send_all(sock, data, deadline):
    view = memoryview(data)
    while view:
        sock.settimeout(deadline.left_s())
        view = view[sock.send(view):]


def _status(head):
    """The status code of a response head (bytes up to the blank line)."""
    status_line = head.split(b"\r\n", 1)[0]
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit() \
            or len(parts[1]) != 3:
        raise ConnectionError(f"not an HTTP answer: {status_line[:80]!r}")
    return int(parts[1])


def _read_status(sock, deadline):
    """Read answer heads until a final one (1xx heads are skipped); return its status code."""
    received = b""
    while True:
        end = received.find(b"\r\n\r\n")
        if end >= 0:
            code = _status(received[:end])
            if code >= 200 or code < 100:
                return code
            received = received[end + 4:]
            continue
        if len(received) > MAX_HEAD_BYTES:
            raise ConnectionError(f"the answer's head is longer than {MAX_HEAD_BYTES} bytes")
        sock.settimeout(deadline.left_s())
        chunk = sock.recv(16 * 1024)
        if not chunk:
            raise ConnectionError("the receiver closed the connection before its answer's "
                                  "headers ended")
        received += chunk


def _request(parts, body, headers):
    host = parts.netloc.rpartition("@")[2]  # never send credentials written in the URL
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    # an IRI's characters outside ASCII, percent-encoded (what is encoded already stays)
    target = urllib.parse.quote(target, safe="/?=&;:@!$'()*+,%-._~")
    lines = [f"POST {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}",
             "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    for line in lines:
        if "\r" in line or "\n" in line:
            raise ValueError("a header or the URL holds a line break")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body


def post(url, body, headers, timeout_s, networks, resolve=socket.getaddrinfo):
    """POST ``body`` (bytes) to ``url`` with ``headers``; return the answer's status code.

    Raises TimeoutError when the whole exchange is not over within ``timeout_s``,
    ``destinations.RefusedDestination`` when the host is an address outside ``networks``
    and not public, OSError (refused, reset, DNS, TLS), or ValueError (a URL it cannot use).
    The connection is closed either way."""
    deadline = _Deadline(timeout_s)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL with a host")
    try:
        host = parts.hostname.encode("idna").decode("ascii")
        request = _request(parts._replace(netloc=parts.netloc.encode("idna").decode("ascii")),
                           body, headers)
    except UnicodeError as exc:
        raise ValueError(f"the URL cannot be sent as ASCII: {exc}") from None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    targets = resolve_checked(host, port, networks, resolve)
    try:
        sock = _connect(targets, deadline)
        try:
            if parts.scheme == "https":
                sock = ssl.create_default_context().wrap_socket(
                    sock, server_hostname=host, do_handshake_on_connect=False)
                sock.settimeout(deadline.left_s())
                sock.do_handshake()
            _send_all(sock, request, deadline)
            return _read_status(sock, deadline)
        finally:
            sock.close()
    except TimeoutError:  # a socket's own (its timeout was what was left): the same deadline
        raise deadline.expired() from None
