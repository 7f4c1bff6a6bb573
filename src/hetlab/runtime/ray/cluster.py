"""A connection to a Ray cluster: `local` (one started in this process), `auto` (the cluster this
machine belongs to, started with `ray start`) or an address `host:port`. Everything that can be
wrong with one — the extra missing, nothing listening, too few CPUs for the collectors — is a
one-line UserError before any work starts.
"""

from __future__ import annotations

import logging
import socket

from hetlab.errors import UserError
from hetlab.extras import require

LOCAL = "local"
CONNECT_TIMEOUT_S = 5.0


class RayCluster:
    """Connected on construction; `close()` disconnects (and stops a `local` cluster)."""

    def __init__(self, address: str):
        self.ray = require("ray", "ray", "--ray")
        self.address = address
        if address not in (LOCAL, "auto"):
            _check_listening(address)
        try:
            self.ray.init(address=None if address == LOCAL else address, include_dashboard=False,
                          logging_level=logging.WARNING, configure_logging=True)
        except (ConnectionError, RuntimeError, ValueError) as e:
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            hint = "start one with `ray start --head` or use --ray local" if address == "auto" else "check the address"
            raise UserError(f"cannot connect to the Ray cluster at {address!r} ({first_line}); {hint}") from e
        self.driver_node = self.ray.get_runtime_context().get_node_id()

    def nodes(self) -> list[dict]:
        """The live nodes: id, address, CPUs, GPUs, memory (GiB), and whether the learner runs there."""
        return [{
            "node": node["NodeID"],
            "address": node["NodeManagerAddress"],
            "cpus": node["Resources"].get("CPU", 0.0),
            "gpus": node["Resources"].get("GPU", 0.0),
            "memory_gib": round(node["Resources"].get("memory", 0.0) / 2**30, 1),
            "learner": node["NodeID"] == self.driver_node,
        } for node in self.ray.nodes() if node["Alive"]]

    def check_capacity(self, collectors: int) -> None:
        """UserError unless the cluster has a CPU for each collector actor."""
        cpus = sum(node["cpus"] for node in self.nodes())
        if collectors > cpus:
            raise UserError(f"{collectors} collectors need {collectors} CPUs, but the Ray cluster at {self.address!r} has "
                            f"{cpus:g}; use fewer collectors (--ray.collectors) or add nodes")

    def close(self) -> None:
        self.ray.shutdown()


def _check_listening(address: str) -> None:
    """Fail fast on an address nothing answers at: Ray itself retries for a minute."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--ray {address!r} is not local, auto or host:port")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise UserError(f"no Ray cluster answers at {address} ({e.strerror or e}); start one there with "
                        "`ray start --head`, or use --ray local") from e
