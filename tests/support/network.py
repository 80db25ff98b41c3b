"""A private network of hosts on this machine, and the faults a real one has: partitions, latency and loss.

Each host is a Linux network namespace with one veth link to a bridge in a switch namespace; the test
process (the root namespace) is host ``.1`` on the same switch, so it reaches every host and they reach it.
Brokers (``kafka.sh --netns``) and ``sluice run`` processes (:meth:`Network.command`) each get a host,
and a fault on one host's link touches nothing else.

Faults, each undone by its pair:

* :meth:`cut` / :meth:`join` -- a silent partition between two groups of hosts: each host drops what
  arrives from the other side (iptables INPUT), so packets leave and vanish -- no reset, no "unreachable",
  no error from ``connect`` -- as when a switch or a firewall drops them. Connections already open stall
  until their own timeouts fire, the case Jepsen found most revealing.
* :meth:`degrade` / :meth:`restore` -- latency and loss on one host's link: iptables drops a random share of
  its packets both ways, and holds every packet it sends for the delay (NFQUEUE, tests/support/
  nfqueue_delay.py; this kernel need not have netem).

Needs root, iproute2 and iptables (Debian: ``apt-get install iproute2 iptables``; .ci/run installs them).
:func:`missing_tools` says what is absent. Names carry this process's pid, so a run killed before its
teardown is cleaned up by the next one (:meth:`Network.create`).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_PREFIX = "slnet"
DRIVER = "driver"  # the root namespace, host .1: the test process, and whatever it runs outside namespaces


def missing_tools() -> str | None:
    """Why this machine cannot build a :class:`Network` (not root, a tool absent), or None if it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    absent = [tool for tool in ("ip", "iptables") if shutil.which(tool) is None]
    if absent:
        return f"{' and '.join(absent)} not installed (Debian: apt-get install iproute2 iptables)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


@dataclass
class Network:
    """Hosts on one switch; the test owns it and must call :meth:`destroy`."""

    tag: str  # slnet<pid>: prefix of every namespace and root-side link this network made
    subnet: str  # "10.a.b" of 10.a.b.0/24
    hosts: dict[str, int]  # host name -> last octet of its address
    _delayers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _cuts: set[tuple[str, str]] = field(default_factory=set)
    _losses: dict[str, float] = field(default_factory=dict)

    @classmethod
    def create(cls, names: Sequence[str]) -> Network:
        """A network with one namespace per name (addresses .11, .12, ... in order) plus the driver at .1."""
        _remove_stale()
        tag = f"{_PREFIX}{os.getpid()}"
        taken = _ip("-4", "route", "show").stdout
        subnet = next(s for s in (f"10.{random.randrange(64, 250)}.{random.randrange(1, 250)}" for _ in range(100))
                      if f"{s}.0/24" not in taken)
        net = cls(tag, subnet, {DRIVER: 1} | {name: 11 + i for i, name in enumerate(names)})
        try:
            net._build()
        except BaseException:
            net.destroy()
            raise
        return net

    def _build(self) -> None:
        switch = f"{self.tag}-sw"
        _ip("netns", "add", switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for host, octet in self.hosts.items():
            port = f"p{octet}"  # the switch's side of the host's link
            if host == DRIVER:
                _ip("link", "add", self.tag, "type", "veth", "peer", "name", port, "netns", switch)
                _ip("addr", "add", f"{self.address(host)}/24", "dev", self.tag)
                _ip("link", "set", self.tag, "up")
            else:
                ns = self.netns(host)
                _ip("netns", "add", ns)
                _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", switch)
                _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", switch, "link", "set", port, "master", "br0")
            _ip("-n", switch, "link", "set", port, "up")

    def address(self, host: str) -> str:
        return f"{self.subnet}.{self.hosts[host]}"

    def netns(self, host: str) -> str:
        if host == DRIVER:
            raise ValueError("the driver is the root namespace")
        return f"{self.tag}-{host}"

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run on ``host`` (the same process: ``ip netns exec`` execs it in place)."""
        return list(argv) if host == DRIVER else ["ip", "netns", "exec", self.netns(host), *argv]

    # ------------------------------------------------------------------ partitions

    def cut(self, side: Iterable[str], other: Iterable[str]) -> None:
        """No packet passes between any host of ``side`` and any of ``other`` until :meth:`join`."""
        for a in side:
            for b in other:
                for src, dst in ((a, b), (b, a)):
                    if (src, dst) not in self._cuts:
                        self._drop_from(dst, "-A", src)
                        self._cuts.add((src, dst))

    def join(self, side: Iterable[str] | None = None, other: Iterable[str] | None = None) -> None:
        """Undo :meth:`cut` between these groups (both None: every cut)."""
        pairs = set(self._cuts) if side is None or other is None else {
            p for a in side for b in other for p in ((a, b), (b, a))} & self._cuts
        for src, dst in pairs:
            self._drop_from(dst, "-D", src)
            self._cuts.discard((src, dst))

    def _drop_from(self, host: str, verb: str, sender: str) -> None:
        """Add (``-A``) or delete (``-D``) the rule on ``host`` that drops what ``sender`` sends it."""
        where = ["-i", self.tag] if host == DRIVER else ["-i", "eth0"]  # the driver: only its link here
        self._iptables(host, verb, "INPUT", *where, "-s", self.address(sender), "-j", "DROP")

    def _iptables(self, host: str, *rule: str) -> None:
        proc = subprocess.run(self.command(host, ["iptables", "-w", *rule]), capture_output=True, text=True,
                              check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"iptables {' '.join(rule)} on {host}: {proc.stderr.strip()}")

    # ------------------------------------------------------------------ latency and loss

    def degrade(self, host: str, delay_ms: float, loss: float) -> None:
        """Every packet ``host`` sends waits ``delay_ms``; a share ``loss`` of its packets, each way, is lost."""
        if host in self._delayers:
            raise RuntimeError(f"{host} is already degraded")
        ns = self.netns(host)
        delayer = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "tests.support.nfqueue_delay",
                                    "--delay-ms", str(delay_ms)], cwd=ROOT, stdout=subprocess.PIPE)
        self._delayers[host] = delayer
        assert delayer.stdout is not None
        if not delayer.stdout.readline().startswith(b"holding"):  # bound to its queue before packets go there
            raise RuntimeError(f"the packet delayer for {host} did not start (exit {delayer.wait(10)})")
        self._losses[host] = loss
        for rule in _degrade_rules(loss):
            self._iptables(host, "-A", *rule)

    def restore(self, host: str) -> None:
        """Undo :meth:`degrade`: the link is clean again."""
        for rule in _degrade_rules(loss=self._losses.pop(host)):
            self._iptables(host, "-D", *rule)
        delayer = self._delayers.pop(host)
        delayer.terminate()
        delayer.wait(10)

    def destroy(self) -> None:
        """Stop the delayers, lift the cuts, and remove every namespace and link this network made (the
        hosts' processes must be stopped first: a namespace lives on while a process runs in it)."""
        self.join()
        for delayer in self._delayers.values():
            delayer.kill()
            delayer.wait(10)
        self._delayers.clear()
        _remove(self.tag)


def _degrade_rules(loss: float) -> list[list[str]]:
    """iptables rules (without -A / -D) of a degraded link: random loss both ways, then the delay queue."""
    lose = ["-m", "statistic", "--mode", "random", "--probability", str(loss), "-j", "DROP"]
    return [["INPUT", "-i", "eth0", *lose], ["OUTPUT", "-o", "eth0", *lose],
            ["OUTPUT", "-o", "eth0", "-j", "NFQUEUE", "--queue-num", "0", "--queue-bypass"]]


def _remove(tag: str) -> None:
    for ns in _ip("netns", "list", check=False).stdout.split():
        if ns.startswith(f"{tag}-"):
            _ip("netns", "del", ns, check=False)
    _ip("link", "del", tag, check=False)  # gone with its peer already, unless the switch was never made


def _remove_stale() -> None:
    """Namespaces left by a test process that died before its teardown."""
    pids = set(re.findall(rf"\b{_PREFIX}(\d+)-", _ip("netns", "list", check=False).stdout))
    for pid in pids:
        if not Path(f"/proc/{pid}").exists():
            _remove(f"{_PREFIX}{pid}")
