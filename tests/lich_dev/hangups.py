"""HangupWatch: tells a held poll that its client went away, as lich's "client gone" does.

A connection thread parked on a condition cannot also block on its socket,
so one thread watches every parked socket for the peer's close. Changes to
the watched set are handed to that thread through a list and a wake-up
socket: only it touches the selector.
"""
from __future__ import annotations

import select
import selectors
import socket
import threading
from typing import Callable, List, Tuple


class HangupWatch:
    def __init__(self):
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._changes: List[Tuple[str, socket.socket, Callable[[], None]]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="lich-stub-hangups", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def watch(self, sock: socket.socket, on_gone: Callable[[], None]) -> None:
        """Call `on_gone` once if the peer closes `sock` before `forget`."""
        self._change("watch", sock, on_gone)

    def forget(self, sock: socket.socket) -> None:
        self._change("forget", sock, lambda: None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(2.0)
        else:  # never started: nobody else will close the sockets
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _change(self, op: str, sock: socket.socket, callback: Callable[[], None]) -> None:
        with self._lock:
            self._changes.append((op, sock, callback))
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    changes, self._changes = self._changes, []
                    if self._closed:
                        return
                for op, sock, callback in changes:
                    self._apply(op, sock, callback)
                for key, _ in self._selector.select():
                    if key.data is None:
                        self._drain_wake()
                    else:
                        # Closed: tell the poll. Sent more: stop watching,
                        # or the readable socket would spin this loop.
                        self._selector.unregister(key.fileobj)
                        if _peer_gone(key.fileobj):
                            key.data()
        finally:
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _apply(self, op: str, sock: socket.socket, callback: Callable[[], None]) -> None:
        try:
            if op == "watch":
                self._selector.register(sock, selectors.EVENT_READ, callback)
            else:
                self._selector.unregister(sock)
        except (KeyError, ValueError, OSError):
            pass  # forgotten after it hung up, or closed already

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass


def _peer_gone(sock: socket.socket) -> bool:
    """Readable while a poll is held: either the peer closed, or it sent more."""
    try:
        # select first, then a peek that cannot wait (no MSG_DONTWAIT on Windows).
        return bool(select.select([sock], [], [], 0)[0]) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):  # ValueError: closed meanwhile (select takes no fd -1)
        return True
