"""The labelled dataset layout every producer writes and every consumer reads.

``<dataset>/<split>/events.jsonl[.gz]`` (input-contract events in time order),
``<dataset>/<split>/ground_truth.jsonl`` (one line per job: scenario, families, each fault's
family, onset, vertex and subtask) and ``<dataset>/manifest.json``. The simulator writes plain
JSON lines; the lab writes its events gzip-compressed (the committed corpus under ``data/lab``).
Spark reads either directly.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterable, Iterator, Sequence

SPLITS = ("train", "validation", "test")
EVENT_FILES = ("events.jsonl.gz", "events.jsonl")


def open_text(path: Path, mode: str = "rt"):
    """A JSON-lines file, gzip-compressed when its name ends in ``.gz``."""
    if str(path).endswith(".gz"):
        return gzip.open(path, mode, encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def read_jsonl(path: Path) -> Iterator[dict]:
    with open_text(path) as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def write_jsonl(path: Path, records: Iterable[dict]) -> int:
    """Write records one JSON per line (gzip when the name ends in ``.gz``); returns how many.

    Written to a temporary file and moved into place; compressed files carry no timestamp, so
    the same records always give the same bytes (a re-recorded split diffs cleanly).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with open(tmp, "wb") as raw:
        out = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if path.suffix == ".gz" else raw
        with out:
            for record in records:
                out.write((json.dumps(record, separators=(",", ":")) + "\n").encode())
                count += 1
    tmp.replace(path)
    return count


def events_path(dataset: Path, split: str) -> Path | None:
    """A split's events file, compressed or not; None when the split has none."""
    for name in EVENT_FILES:
        if (Path(dataset) / split / name).is_file():
            return Path(dataset) / split / name
    return None


def dataset_files(dataset_dir: str | Path, splits: Sequence[str] = SPLITS) -> tuple[list[Path], list[Path]]:
    """The events and ground-truth files of a dataset folder (simulator or lab layout)."""
    root = Path(dataset_dir)
    if not (root / "manifest.json").is_file():
        raise FileNotFoundError(f"{root} is not a dataset folder (no manifest.json); make one with "
                                "`sentinel simulate --dataset DIR` or `sentinel lab`")
    present = [(s, events_path(root, s)) for s in splits]
    present = [(s, path) for s, path in present if path is not None]
    return [path for _, path in present], [root / s / "ground_truth.jsonl" for s, _ in present]


def read_truths(paths: Iterable[Path]) -> list[dict]:
    return [truth for path in paths for truth in read_jsonl(Path(path))]


def load_manifest(dataset: Path) -> dict:
    path = Path(dataset) / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def subset(dataset: Path, runs: Sequence[str], destination: Path) -> Path:
    """A dataset of only the named runs (a lab run id or a job name), each in its own split."""
    wanted = set(runs)
    found: set[str] = set()
    manifest = {"format": "checkpoint-sentinel dataset v1", "source": f"subset of {Path(dataset).name}", "splits": {}}
    for split in SPLITS:
        path = events_path(dataset, split)
        if path is None:
            continue
        truths = [t for t in read_jsonl(Path(dataset) / split / "ground_truth.jsonl")
                  if (t.get("run_id") or t["job_name"]) in wanted]
        if not truths:
            continue
        jobs = {t["job_id"] for t in truths}
        found |= {t.get("run_id") or t["job_name"] for t in truths}
        count = write_jsonl(Path(destination) / split / path.name, (e for e in read_jsonl(path) if e["job_id"] in jobs))
        write_jsonl(Path(destination) / split / "ground_truth.jsonl", truths)
        manifest["splits"][split] = {"jobs": len(truths), "events": count, "job_ids": sorted(jobs)}
    missing = wanted - found
    if missing:
        raise ValueError(f"{dataset} has no run {', '.join(sorted(missing))}")
    source = Path(dataset) / "manifest.json"
    described = json.loads(source.read_text()).get("runs", {}) if source.is_file() else {}
    if described:
        manifest["runs"] = {run: entry for run, entry in described.items() if run in found}
    (Path(destination) / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return Path(destination)
