"""Which TCP sockets a process tree listens on, read from /proc (Linux): for the loopback-only tests.

/proc/<pid>/fd/* -> socket:[inode] --matched against--> /proc/<pid>/net/tcp{,6} rows in state LISTEN (0A)
"""

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

_LISTEN_STATE = "0A"


@dataclass(frozen=True)
class Listener:
    pid: int
    command: str
    address: str
    port: int

    @property
    def is_loopback(self) -> bool:
        address = ipaddress.ip_address(self.address)
        # An IPv6 socket bound to ::ffff:127.0.0.1 serves IPv4 loopback; Python 3.11 does not count it as loopback.
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        return (mapped or address).is_loopback


def process_tree(root_pid: int) -> list[int]:
    """`root_pid` and every live descendant (children are read from /proc/<pid>/task/*/children)."""
    found, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        found.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                todo.extend(int(child) for child in (task / "children").read_text().split())
            except OSError:
                continue  # the thread or the process ended while we looked
    return found


def listeners(pids: list[int]) -> list[Listener]:
    """Every socket in state LISTEN that one of `pids` holds open."""
    found: list[Listener] = []
    for pid in pids:
        try:
            inodes = _socket_inodes(pid)
            table = _listen_table(pid)
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # the process ended while we looked
        found.extend(
            Listener(pid, command[:120], address, port) for inode, (address, port) in table.items() if inode in inodes
        )
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed between listdir and readlink
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _listen_table(pid: int) -> dict[str, tuple[str, int]]:
    """inode -> (address, port) of the LISTEN rows of the process's network namespace."""
    table: dict[str, tuple[str, int]] = {}
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != _LISTEN_STATE:
                continue
            hex_address, hex_port = fields[1].split(":")
            table[fields[9]] = (_address(hex_address, family), int(hex_port, 16))
    return table


def _address(hex_address: str, family: int) -> str:
    # The kernel prints each 32-bit word in host (little-endian) byte order.
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[index : index + 4][::-1] for index in range(0, len(raw), 4))
    return socket.inet_ntop(family, words)
