"""Readiness check for kafka.sh: exits 0 once every listed node serves requests, non-zero with a
one-line reason otherwise.

usage: wait_ready.py BOOTSTRAP TIMEOUT_S NODE_ID:PID:LOG_PATH:LOG_OFFSET...

A node is ready when (1) its server.log, past LOG_OFFSET (its size when this launch began), contains
"Kafka Server started", which a KRaft broker logs only after it is unfenced, and (2) an AdminClient
metadata request lists it among the brokers. (2) alone is not enough: a node killed a moment ago is
still listed until its broker session times out. Fails early if a node's process exits.
"""

from __future__ import annotations

import os
import sys
import time

from confluent_kafka.admin import AdminClient

STARTED = b"Kafka Server started"


def has_started(log_path: str, offset: int) -> bool:
    try:
        with open(log_path, "rb") as f:
            if os.fstat(f.fileno()).st_size >= offset:  # smaller: the log rolled over, read it all
                f.seek(offset)
            return STARTED in f.read()
    except FileNotFoundError:
        return False


def main(argv: list[str]) -> int:
    bootstrap, timeout_s = argv[0], float(argv[1])
    nodes = [arg.split(":", 3) for arg in argv[2:]]  # node_id, pid, log path, log offset
    wanted = {int(node[0]) for node in nodes}
    deadline = time.monotonic() + timeout_s
    # log_level 0: connection-refused noise while the JVMs boot is expected, not worth printing.
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0,
                         "socket.connection.setup.timeout.ms": 2000})
    visible: set[int] = set()
    while time.monotonic() < deadline:
        for node_id, pid, _, _ in nodes:
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                print(f"node {node_id} (pid {pid}) exited during startup", file=sys.stderr)
                return 1
        if all(has_started(path, int(offset)) for _, _, path, offset in nodes):
            try:
                visible = set(admin.list_topics(timeout=2).brokers)
            except Exception:  # noqa: BLE001 - not reachable yet; retry until the deadline
                visible = set()
            if wanted <= visible:
                return 0
        time.sleep(0.2)
    print(f"not ready after {timeout_s:.0f}s: nodes {sorted(wanted)} wanted, {sorted(visible)} visible "
          "to an AdminClient", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
