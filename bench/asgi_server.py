"""The bench's ASGI server: uvicorn worker processes, each accepting on a listening socket of its
own (SO_REUSEPORT), with TCP_NODELAY on every connection.

``uvicorn --workers N`` measures badly here, for two reasons found with the fixed-rate client:

- Its workers share one listening socket, and asyncio accepts every pending connection at once:
  when wrk opens its 32 keep-alive connections, one worker takes all 32 and the other serves
  nothing (checked with ``ss``: 32/0 in four runs out of four). The server then runs on one
  worker with the machine half idle, and a rare even split doubles its throughput.
  With a socket per worker, the kernel spreads the connections over the workers.
- It binds that socket with ``proto`` 0, and asyncio turns Nagle's algorithm off only on
  connections whose socket says ``IPPROTO_TCP``: the body of every keep-alive response then
  waits for the client's delayed ACK, about 40 ms on Linux (uvicorn issue #3149), and every
  variant's p50 was about 44 ms.

The sockets are bound here, before the workers start, so a port error shows at once and every
worker's queue exists from the start. SIGTERM or SIGINT stops the workers and then this process.

    python -m bench.asgi_server project.asgi:application --host 127.0.0.1 --port P --workers 2
"""

import argparse
import os
import signal
import socket
import sys
import traceback


def listening_socket(host, port, backlog):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    return sock


def serve_one(app, sock, backlog):
    """Run one uvicorn worker on ``sock`` (in a forked child, until SIGTERM)."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, backlog=backlog)
    uvicorn.Server(config).run(sockets=[sock])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("app")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backlog", type=int, default=2048)
    args = parser.parse_args(argv)
    sockets = [listening_socket(args.host, args.port, args.backlog) for _ in range(args.workers)]
    workers = []
    for sock in sockets:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                serve_one(args.app, sock, args.backlog)
            except BaseException:
                traceback.print_exc()  # into the server's log
                code = 1
            finally:
                os._exit(code)  # never back into this loop
        workers.append(pid)
    for sock in sockets:
        sock.close()  # the workers hold them

    def stop(signum, frame):
        for pid in workers:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    status = 0
    for pid in workers:
        _, code = os.waitpid(pid, 0)
        status = status or os.waitstatus_to_exitcode(code)
    return status


if __name__ == "__main__":
    sys.exit(main())
