"""Hold every packet of an NFQUEUE queue for a fixed time, then let it go: latency on a link, without netem.

The kernels Sluice's CI runs on may lack ``sch_netem``; netfilter's queue target is built in everywhere
nftables is. A rule ``queue num Q`` (tests/support/network.py writes it) hands each matching packet to this
process, which answers "accept" ``delay_ms`` later. Packets keep their order (one delay for all, answered
first in, first out). Run inside the network namespace whose rule feeds the queue::

    ip netns exec NS python -m tests.support.nfqueue_delay --queue 0 --delay-ms 200

It speaks netlink itself (NETLINK_NETFILTER, subsystem NFNL_SUBSYS_QUEUE): the packet contents are never
copied (copy mode "meta"), only their ids. It stops on SIGTERM; the rule's ``bypass`` flag lets packets
through unheld once no process listens.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import struct
import sys
import time
from collections import deque

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NF_ACCEPT = 1
QUEUE_MAXLEN = 8192


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(msg: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, seq, 0) + body


def _attrs(data: bytes) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    at = 0
    while at + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, at)
        if length < 4:
            break
        found[kind & 0x3FFF] = data[at + 4: at + length]
        at += (length + 3) & ~3
    return found


def bind(sock: socket.socket, queue: int) -> None:
    """Bind ``queue`` to this socket, metadata only; raises OSError with the kernel's errno if refused."""
    config = [_attr(NFQA_CFG_CMD, struct.pack("=BBH", NFQNL_CFG_CMD_BIND, 0, 0)),
              _attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META) + b"\0" * 3),
              _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", QUEUE_MAXLEN))]
    for seq, attr in enumerate(config, start=1):
        sock.send(_message(NFQNL_MSG_CONFIG, queue, attr, NLM_F_REQUEST | NLM_F_ACK, seq))
        reply = sock.recv(65536)
        _, kind, _, _, _ = struct.unpack_from("=IHHII", reply)
        if kind == NLMSG_ERROR:
            (errno,) = struct.unpack_from("=i", reply, 16)
            if errno != 0:
                raise OSError(-errno, f"NFQUEUE config {seq} for queue {queue}: {os.strerror(-errno)}")


def packet_ids(data: bytes) -> list[int]:
    """The ids of the queued packets in one netlink read (several messages may share it)."""
    ids: list[int] = []
    at = 0
    while at + 16 <= len(data):
        length, kind, _, _, _ = struct.unpack_from("=IHHII", data, at)
        if length < 16:
            break
        if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            hdr = _attrs(data[at + 20: at + length]).get(NFQA_PACKET_HDR)
            if hdr is not None:
                ids.append(struct.unpack_from(">I", hdr)[0])
        at += (length + 3) & ~3
    return ids


def _accept(sock: socket.socket, queue: int, packet_id: int) -> None:
    verdict = struct.pack(">II", NF_ACCEPT, packet_id)
    sock.send(_message(NFQNL_MSG_VERDICT, queue, _attr(NFQA_VERDICT_HDR, verdict)))


def run(queue: int, delay_ms: float) -> None:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((0, 0))
    bind(sock, queue)
    held: deque[tuple[float, int]] = deque()
    delay_s = delay_ms / 1000
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"holding queue {queue} for {delay_ms:g} ms", flush=True)
    while not stopping:
        now = time.monotonic()
        while held and held[0][0] <= now:
            _accept(sock, queue, held.popleft()[1])
        wait = max(0.0, held[0][0] - now) if held else 0.5
        try:
            ready, _, _ = select.select([sock], [], [], wait)
        except InterruptedError:
            continue
        if ready:
            arrived = time.monotonic() + delay_s
            held.extend((arrived, packet_id) for packet_id in packet_ids(sock.recv(1 << 20)))
    for _, packet_id in held:  # let the rest go at once
        _accept(sock, queue, packet_id)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queue", type=int, default=0, help="the NFQUEUE number the rule feeds (default 0)")
    parser.add_argument("--delay-ms", type=float, required=True, help="how long each packet is held")
    args = parser.parse_args(argv)
    run(args.queue, args.delay_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
