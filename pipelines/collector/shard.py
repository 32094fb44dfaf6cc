"""Which collector process polls which job: shard ``i`` of ``N`` (``collector.shard``), and the
name of its ledger file.

Several collector processes can share a fleet with the same clusters and the same
``collector.state_dir``: each polls only the jobs a rendezvous hash of the job id gives to its
shard, and keeps a ledger file of its own (docs/COLLECTOR.md, "One collector or several").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count``: the jobs a rendezvous (highest random weight) hash of
    ``<cluster>/<job id>`` gives to it. Going from N to N+1 shards moves about 1/(N+1) of the jobs,
    each to the new shard; every job has exactly one owner.

    >>> shards = [Shard(i, 3) for i in range(3)]
    >>> [sum(s.owns("eu", f"{n:032x}") for s in shards) for n in range(5)]
    [1, 1, 1, 1, 1]
    """

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str | None) -> "Shard":
        """``"i/N"`` (0 <= i < N), or None for the whole fleet."""
        if not text:
            return cls()
        index, _, count = text.partition("/")
        if not (index.strip().isdigit() and count.strip().isdigit()) or not 0 <= int(index) < int(count):
            raise ValueError(f"shard {text!r}: expected i/N with 0 <= i < N, e.g. 0/4")
        return cls(int(index), int(count))

    def owns(self, cluster: str, job_id: str) -> bool:
        if self.count == 1:
            return True
        return max(range(self.count), key=lambda k: _weight(k, cluster, job_id)) == self.index

    def ledger_name(self, cluster: str) -> str:
        base = ledger_base_name(cluster)
        return f"{base}.json" if self.count == 1 else f"{base}.shard-{self.index}-of-{self.count}.json"

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def _weight(shard: int, cluster: str, job_id: str) -> bytes:
    return hashlib.blake2b(f"{shard}/{cluster}/{job_id}".encode(), digest_size=8).digest()


def ledger_base_name(cluster: str) -> str:
    """The cluster's name as a file name: what its ledger files are named after."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in cluster)
