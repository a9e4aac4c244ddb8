"""A TCP proxy for fault tests: it forwards a local port to a real server (PostgreSQL, a Kafka
broker) and can make that server unreachable for a while without touching it, so tests can cause
real outages while other tests share the server.

    proxy = FaultProxy("127.0.0.1", 5432).start()   # clients connect to 127.0.0.1:proxy.port
    proxy.stop()                  # an outage: new connections are refused, open ones are cut
    proxy.start()                 # the server is back
    proxy.outage(3.0)             # stop now, start again in 3 s (a timer thread)
    proxy.frozen = True           # a black hole: connections stay open, nothing gets through
                                  # (a network that drops packets: a client waits without end)
    proxy.lose_answers_to(b"Q\\x00\\x00\\x00\\x0bCOMMIT\\x00", 1)  # the next connection that sends
                                  # this gets its answer cut: the server did it, the client never hears

Kafka: a client connects to the bootstrap address, then to the address each broker advertises,
so a proxy in front of a broker that advertises its own port is bypassed after the first request;
put it in front of a broker that advertises the proxy's port.
"""

from __future__ import annotations

import socket
import threading


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = int(probe.getsockname()[1])
    probe.close()
    return port


class FaultProxy:
    """Forwards 127.0.0.1:``port`` (a free one by default) to ``host``:``upstream_port``."""

    def __init__(self, host: str, upstream_port: int, port: int | None = None) -> None:
        self.upstream = (host, upstream_port)
        self.port = port or free_port()
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None
        self.pairs: list[list] = []  # [client, server, answer to be lost]
        self.accepted = 0  # connections forwarded so far
        self.refusing = False
        self.frozen = False
        self._acceptor: threading.Thread | None = None
        self._lose_pattern = b""
        self._lose_count = 0
        self.lost_answers = 0

    # -- outages ------------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        """Open the port (again)."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(0.1)
        self.listener, self.refusing = listener, False
        self._acceptor = threading.Thread(target=self._accept, args=(listener,), daemon=True, name="fault-proxy")
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Close the port (a new connection is refused) and cut every open connection."""
        listener, self.listener = self.listener, None
        self.refusing = True
        if listener is not None:
            listener.close()
            if self._acceptor is not threading.current_thread():
                self._acceptor.join()  # its accept() holds the port until it returns
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for pair in pairs:
            self._cut(pair)

    def outage(self, seconds: float) -> threading.Timer:
        """Stop now and start again after ``seconds``."""
        self.stop()
        timer = threading.Timer(seconds, self.start)
        timer.daemon = True
        timer.start()
        return timer

    def lose_answers_to(self, pattern: bytes, count: int = 1) -> None:
        """Cut the next ``count`` connections that send ``pattern`` once the server answers it."""
        with self.lock:
            self._lose_pattern, self._lose_count = pattern, count

    # -- forwarding ---------------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        while self.listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                self._cut([client])
                continue
            server.settimeout(None)
            pair = [client, server, False]
            with self.lock:
                if self.listener is not listener:  # stopped meanwhile
                    self._cut(pair)
                    return
                self.pairs.append(pair)
                self.accepted += 1
            threading.Thread(target=self._up, args=(pair,), daemon=True).start()
            threading.Thread(target=self._down, args=(pair,), daemon=True).start()

    @staticmethod
    def _cut(pair: list) -> None:
        for end in pair[:2]:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()

    def _up(self, pair: list) -> None:
        tail = b""
        while True:
            try:
                data = pair[0].recv(65536)
            except OSError:
                data = b""
            if not data:
                return self._cut(pair)
            if self.frozen:
                continue
            pattern = self._lose_pattern
            if self._lose_count and pattern and pattern in tail + data:
                pair[2] = True
            tail = data[-len(pattern):] if pattern else b""
            try:
                pair[1].sendall(data)
            except OSError:
                return self._cut(pair)

    def _down(self, pair: list) -> None:
        while True:
            try:
                data = pair[1].recv(65536)
            except OSError:
                data = b""
            if not data:
                return self._cut(pair)
            if self.frozen:
                continue
            if pair[2]:
                pair[2] = False
                with self.lock:
                    lose = self._lose_count > 0
                    if lose:
                        self._lose_count -= 1
                        self.lost_answers += 1
                if lose:
                    return self._cut(pair)
            try:
                pair[0].sendall(data)
            except OSError:
                return self._cut(pair)
