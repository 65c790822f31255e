"""Network namespaces as "nodes" on one machine (multi-node tests, ring bench).

``Nodes(n)`` creates n namespaces joined by veth pairs on a bridge that it
also creates; node i has address 10.<x>.0.(i+1)/24 on its ``eth0``. Needs
root. Traffic stays inside the namespaces: the bridge has no address, unless
a test gives it one (``host_address``) to serve the nodes from its own
namespace.
"""

from __future__ import annotations

import os
import subprocess


class Nodes:
    _made = 0

    @staticmethod
    def prefix(pid: int) -> str:
        """What the namespaces, veths and bridge of process ``pid`` are named
        after (``tce<prefix>…``, ``tcebr<prefix>…``)."""
        return f"{pid % 10000}x"

    def __init__(self, n: int) -> None:
        Nodes._made += 1
        tag = f"{Nodes.prefix(os.getpid())}{Nodes._made}"
        self.bridge = f"tcebr{tag}"
        self.names = [f"tce{tag}n{i}" for i in range(n)]
        self.host_veths = [f"tce{tag}v{i}" for i in range(n)]
        self.subnet = 40 + (os.getpid() + Nodes._made) % 200
        self.addresses = [f"10.{self.subnet}.0.{i + 1}" for i in range(n)]
        try:
            self._setup()
        except Exception:
            self.close()
            raise

    def _setup(self) -> None:
        self._ip("link", "add", self.bridge, "type", "bridge")
        self._ip("link", "set", self.bridge, "up")
        for name, veth, addr in zip(self.names, self.host_veths, self.addresses):
            self._ip("netns", "add", name)
            self._ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
            self._ip("link", "set", veth, "master", self.bridge)
            self._ip("link", "set", veth, "up")
            self._ip("-n", name, "addr", "add", f"{addr}/24", "dev", "eth0")
            self._ip("-n", name, "link", "set", "eth0", "up")
            self._ip("-n", name, "link", "set", "lo", "up")

    @staticmethod
    def _ip(*args: str) -> None:
        p = subprocess.run(["ip", *args], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")

    def cut(self, i: int) -> None:
        """Takes node i's link down (as a pulled cable would)."""
        self._ip("link", "set", self.host_veths[i], "down")

    def restore(self, i: int) -> None:
        self._ip("link", "set", self.host_veths[i], "up")

    def host_address(self) -> str:
        """Gives the bridge the address 10.<x>.0.254 (once), so the nodes reach
        a server of this namespace there (an S3 server); returns it. It goes
        with the bridge."""
        addr = f"10.{self.subnet}.0.254"
        if not getattr(self, "_host", None):
            self._ip("addr", "add", f"{addr}/24", "dev", self.bridge)
            self._host = addr
        return addr

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[i]]

    def close(self) -> None:
        for veth in self.host_veths:
            subprocess.run(["ip", "link", "del", veth], capture_output=True)
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
