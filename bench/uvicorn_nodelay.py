"""uvicorn for the benchmarks' two-worker server, with TCP_NODELAY on its connections.

With ``--workers N`` uvicorn binds the listening socket itself and leaves its protocol at 0;
accepted sockets inherit that, and asyncio turns TCP_NODELAY on only for ``IPPROTO_TCP``, so
every keep-alive request after a connection's first waited ~40 ms for the client's delayed ACK
(Kludex/uvicorn#3149, open as of uvicorn 0.54). Camp's own deployments run one uvicorn process
per container (no ``--workers``: Dockerfile, docker-compose, the Helm chart) and are not
affected; ``bench/api_load.py`` runs two workers on one machine, and its latencies carried the
40 ms until it used this wrapper (docs/BENCHMARKS.md §15). Same command line as ``uvicorn``.
"""

from __future__ import annotations

import socket
import sys

import uvicorn.config
from uvicorn.main import main

_bind_socket = uvicorn.config.Config.bind_socket


def _bind_tcp_socket(self: uvicorn.config.Config) -> socket.socket:
    sock = _bind_socket(self)
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.proto == 0:
        sock = socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
        sock.set_inheritable(True)
    return sock


uvicorn.config.Config.bind_socket = _bind_tcp_socket  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
