"""Where each file of a node-local source (`locality = "node"`) lives, and which Dask workers serve the
nodes: the same pure answer for the ingest that reads the files on their nodes (ckptvault/ingest/nodes.py)
and the restore that puts them back there (ckptvault/restore/nodes.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ckptvault.checkpoint.manifest import NodePlacement
from ckptvault.config import SourceConfig
from ckptvault.errors import CkptvaultError


class NodeError(CkptvaultError):
    """A node-local source cannot be read as configured: the message names the node and the fix."""


@dataclass(frozen=True)
class Placement:
    """Where each file of a node-local source lives. A pure value: the same answer on every node."""

    nodes: int
    pattern: str
    ranks_per_node: int = 1

    @classmethod
    def of(cls, source: SourceConfig) -> Placement:
        assert source.locality == "node" and source.nodes is not None and source.node_pattern is not None
        return cls(source.nodes, source.node_pattern, source.ranks_per_node)

    def node_of(self, rel: str) -> int:
        """The node index that holds the file at `rel` (its path inside the checkpoint)."""
        m = re.search(self.pattern, rel)
        if m is None:
            return 0
        groups = m.groupdict()
        key = "rank" if "rank" in groups else "node"
        value = groups.get(key)
        if value is None or not re.fullmatch(r"[0-9]+", value):
            raise NodeError(
                f"{rel}: node_pattern {self.pattern!r} matches it, but its {key} group is {value!r}, not a number; "
                f"make the group match digits only, e.g. (?P<{key}>\\d+)"
            )
        node = int(value) // self.ranks_per_node if key == "rank" else int(value)
        if not 0 <= node < self.nodes:
            raise NodeError(
                f"{rel}: node_pattern places it on node {node}, but the source has nodes = {self.nodes} "
                f"(node-0 .. node-{self.nodes - 1}); raise nodes or fix ranks_per_node"
            )
        return node

    def record(self) -> NodePlacement:
        """What the manifest keeps of it (docs/FORMAT.md, `placement`)."""
        return NodePlacement(self.nodes, self.pattern, self.ranks_per_node)

    @classmethod
    def from_record(cls, record: NodePlacement) -> Placement:
        return cls(record.nodes, record.node_pattern, record.ranks_per_node)

    @staticmethod
    def name(node: int) -> str:
        """The node's name: its CKPTVAULT_NODE, and the Dask worker resource that pins work to it."""
        return f"node-{node}"

    def names(self) -> list[str]:
        return [self.name(i) for i in range(self.nodes)]


def missing_workers(placement: Placement, worker_resources: list[dict[str, float]]) -> list[str]:
    """The nodes no Dask worker serves (no worker advertises the node's resource): their files cannot
    be read, and work pinned to them would wait for such a worker for ever."""
    served = {name for resources in worker_resources for name, amount in resources.items() if amount > 0}
    return [n for n in placement.names() if n not in served]


def require_workers(placement: Placement, worker_resources: list[dict[str, float]] | None, run: str,
                    step: int, done: str = "read") -> None:  # fmt: skip
    """NodeError, naming the fix, unless every node of the source has a Dask worker to read its files.
    `worker_resources` None: the pass runs without Dask (threads, or no Prefect at all)."""
    if worker_resources is None:
        raise NodeError(
            f'run {run!r}: locality = "node" has each node\'s files {done} on that node, by its Dask worker; '
            "this pass has no Dask cluster: set [scale] dask_address (or --dask-address) to a cluster with "
            f"a worker per node, started with --resources node-I=1 ({', '.join(placement.names()[:3])}, ...)"
        )
    missing = missing_workers(placement, worker_resources)
    if missing:
        raise NodeError(
            f"{run} step {step}: no Dask worker for {', '.join(missing)}, so "
            f"{'their' if len(missing) > 1 else 'its'} files cannot be {done}; start one on each such node "
            f"(`dask worker ADDRESS --resources {missing[0]}=1`, infra/local/dask.sh up)"
        )
