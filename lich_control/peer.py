"""Who answers on a loopback connection: the owner (uid) of the socket that
accepted it, as Linux lists it in /proc/net/tcp and /proc/net/tcp6.

While lich is down, any local user can listen on its port; the token must
not go to them. The kernel gives the socket that accepted a connection the
uid of its listening socket, and lists it with our connection's address as
its remote end: that row names the program on the other end exactly, whichever
listener (127.0.0.1, 0.0.0.0, a dual-stack ::) took the connection.

`peer_uid` answers None where it cannot tell (not Linux, /proc unreadable,
no such row): the caller then goes ahead, as it did before the check.
"""
from __future__ import annotations

import ipaddress
import socket
import struct
from typing import Iterable, Optional, Tuple

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def peer_uid(sock: socket.socket, tables: Iterable[str] = TABLES) -> Optional[int]:
    """The uid owning the far end of `sock`, a connected loopback TCP socket, or None."""
    try:
        ours, theirs = sock.getsockname(), sock.getpeername()
    except OSError:
        return None
    # The far end's row: its local address is the peer's, its remote ours,
    # in either table (an IPv4 connection a dual-stack listener took is in tcp6).
    wanted = {(_row_address(theirs[:2], v6), _row_address(ours[:2], v6)) for v6 in (False, True)}
    for table in tables:
        try:
            with open(table, encoding="ascii", errors="replace") as rows:
                next(rows, None)  # the column names
                for row in rows:
                    fields = row.split()
                    # A connection in TIME_WAIT (timer 3) has no owner left and
                    # shows uid 0: an earlier connection's, not the one we made.
                    if len(fields) > 7 and (fields[1], fields[2]) in wanted and not fields[5].startswith("03:") and fields[7].isdigit():
                        return int(fields[7])
        except OSError:
            continue
    return None


def _row_address(address: Tuple[str, int], v6: bool) -> str:
    """`address` as the kernel prints it: the address as 32-bit words in the
    machine's byte order, each in hex, then the port in hex."""
    host, port = address
    ip = ipaddress.ip_address(host)
    if v6 and ip.version == 4:
        ip = ipaddress.IPv6Address(f"::ffff:{ip}")
    elif not v6 and ip.version == 6:
        mapped = ip.ipv4_mapped
        if mapped is None:
            return ""
        ip = mapped
    words = struct.unpack(f"={len(ip.packed) // 4}I", ip.packed)
    return "".join(f"{word:08X}" for word in words) + f":{port:04X}"
