"""Input validation per record: the compiled accept path against the precise validator alone.

Every input record goes through :func:`pipelines.detection.validation.check_event`. Its schema
check accepts on the compiled validator (``jsonschema-rs``, Rust) and asks the precise one
(``jsonschema``) only to explain a refusal. This measures ``check_event`` over the same records
both ways (the precise validator alone is how the job validated before), in one process, on
one core, with the records already in memory: the cost of validation alone, not of Kafka or Spark.

Usage: ``.venv/bin/python benchmarks/validation.py [--events 50000] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.kafka_io import machine  # noqa: E402
from pipelines.contracts import INPUT  # noqa: E402
from pipelines.contracts.examples import example_events  # noqa: E402
from pipelines.detection import validation  # noqa: E402


class PreciseOnly:
    """The input contract with the compiled check replaced by the precise validator's verdict."""

    def __init__(self, contract):
        self.contract = contract

    def accepts(self, document) -> bool:
        return not self.contract.errors(document)

    def errors(self, document):
        return self.contract.errors(document)


def records_per_second(records: list[bytes], repeats: int) -> tuple[float, int]:
    best = float("inf")
    accepted = 0
    for _ in range(repeats):
        started = time.perf_counter()
        accepted = sum(validation.check_event(r, now_ms=2**62)[1] is None for r in records)
        best = min(best, time.perf_counter() - started)
    return len(records) / best, accepted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    records = [json.dumps(e).encode() for e in example_events(args.events, seed=11)]
    # One record in a hundred broken, as a producer bug would: the refusals pay for their explanation.
    for i in range(0, len(records), 100):
        event = json.loads(records[i])
        event["ts"] = "yesterday"
        records[i] = json.dumps(event).encode()
    print(machine())
    print(f"{len(records):,} records, mean {sum(map(len, records)) / len(records):,.0f} B, 1% schema violations")
    compiled, accepted = records_per_second(records, args.repeats)
    validation.INPUT = PreciseOnly(INPUT)
    try:
        precise, accepted_precise = records_per_second(records, args.repeats)
    finally:
        validation.INPUT = INPUT
    assert accepted == accepted_precise, (accepted, accepted_precise)
    print("| check_event schema check | records/s | us/record |")
    print("|---|---:|---:|")
    print(f"| precise validator alone (jsonschema) | {precise:,.0f} | {1e6 / precise:,.0f} |")
    print(f"| compiled accept path (jsonschema-rs), precise on refusal | {compiled:,.0f} | {1e6 / compiled:,.0f} |")
    print(f"speed-up {compiled / precise:.1f}x; both accepted {accepted:,} of {len(records):,}")


if __name__ == "__main__":
    main()
