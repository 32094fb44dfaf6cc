"""The labelled dataset layout every producer writes and every consumer reads.

``<dataset>/<split>/events.jsonl[.gz]`` (input-contract events in time order),
``<dataset>/<split>/ground_truth.jsonl`` (one line per job: scenario, families, each fault's
family, onset, vertex and subtask) and ``<dataset>/manifest.json``. The simulator writes plain
JSON lines; the lab writes its events gzip-compressed (the committed corpus under ``data/lab``).
Spark reads either directly. A dataset the lab records run by run gains a run with
:func:`record_run` or :func:`merge_runs` and loses one with :func:`remove_runs`; its manifest lists
the runs (``runs``) besides the splits.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

SPLITS = ("train", "validation", "test")
EVENT_FILES = ("events.jsonl.gz", "events.jsonl")
DATASET_FORMAT = "checkpoint-sentinel dataset v1"


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
    manifest = {"format": DATASET_FORMAT, "source": f"subset of {Path(dataset).name}", "splits": {}}
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


# --- a dataset recorded run by run (the lab's) ---------------------------------------------------


def run_manifest(dataset: Path) -> dict:
    """The manifest of a dataset recorded run by run (the lab's), or a new one."""
    return load_manifest(dataset) or {"format": DATASET_FORMAT, "source": "lab", "splits": {},
                                      "scenarios": [], "runs": {}}


def recorded_runs(dataset: Path) -> set[str]:
    return set(run_manifest(dataset).get("runs", {}))


def remove_runs(dataset: Path, run_ids: Sequence[str]) -> list[str]:
    """Take runs out of a dataset folder (events, ground truth, manifest); returns those removed."""
    manifest = run_manifest(dataset)
    runs = manifest.get("runs", {})
    gone = [r for r in run_ids if r in runs]
    for split in {runs[r]["split"] for r in gone}:
        jobs = {runs[r]["job_id"] for r in gone if runs[r]["split"] == split}
        path = events_path(dataset, split)
        write_jsonl(path, [e for e in read_jsonl(path) if e["job_id"] not in jobs])
        truth_path = dataset / split / "ground_truth.jsonl"
        truths = [t for t in read_jsonl(truth_path) if t["job_id"] not in jobs]
        write_jsonl(truth_path, truths)
        manifest["splits"][split] = {"jobs": len(truths), "events": sum(1 for _ in read_jsonl(path)),
                                     "job_ids": sorted(t["job_id"] for t in truths)}
    for run_id in gone:
        del runs[run_id]
    (dataset / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return gone


def merge_runs(source: Path, target: Path, complete_entry: Callable[[dict], None] | None = None) -> list[str]:
    """Add the runs recorded in the dataset folder ``source`` to ``target`` (each in the split it
    was recorded in; a run ``target`` holds already is replaced); returns their run ids.
    ``complete_entry`` as for :func:`record_run`."""
    runs = run_manifest(source).get("runs", {})
    for split in sorted({run["split"] for run in runs.values()}):
        path = events_path(source, split)
        events: dict[str, list[dict]] = {}
        for event in read_jsonl(path) if path else ():
            events.setdefault(event["job_id"], []).append(event)
        truths = {t["job_id"]: t for t in read_jsonl(source / split / "ground_truth.jsonl")}
        for run_id, info in sorted(runs.items()):
            held = run_manifest(target).get("runs", {}).get(run_id)
            if held is not None and held["job_id"] != info["job_id"]:
                remove_runs(target, [run_id])  # recorded again since: the new recording replaces it
            if info["split"] == split:
                record_run(target, split, events.get(info["job_id"], []), truths[info["job_id"]], info,
                           complete_entry)
    return sorted(runs)


def record_run(dataset: Path, split: str, events: list[dict], truth: dict, info: dict | None = None,
               complete_entry: Callable[[dict], None] | None = None) -> None:
    """Add one run to the dataset folder: its events merged in time order into the split's
    events, one ground-truth line, and its entry in the manifest (a run recorded again replaces
    itself). ``complete_entry`` fills in, in place, what the producer's older manifest entries lack."""
    folder = dataset / split
    previous = events_path(dataset, split)
    events_file, truth_path = folder / "events.jsonl.gz", folder / "ground_truth.jsonl"
    kept = [e for e in read_jsonl(previous) if e["job_id"] != truth["job_id"]] if previous else []
    merged = sorted(kept + events, key=lambda e: (e["ts"], e["job_id"], e["kind"]))
    write_jsonl(events_file, merged)
    if previous is not None and previous != events_file:
        previous.unlink()
    truths = [t for t in (read_jsonl(truth_path) if truth_path.is_file() else []) if t["job_id"] != truth["job_id"]]
    write_jsonl(truth_path, truths + [truth])
    manifest = run_manifest(dataset)
    manifest.setdefault("runs", {})
    if info is not None:
        manifest["runs"][info["run_id"]] = info
    if complete_entry is not None:
        for entry in manifest["runs"].values():
            complete_entry(entry)
    manifest["splits"][split] = {"jobs": len(truths) + 1, "events": len(merged),
                                 "job_ids": sorted([t["job_id"] for t in truths] + [truth["job_id"]])}
    manifest["scenarios"] = sorted({t["scenario"] for s in manifest["splits"]
                                    for t in read_jsonl(dataset / s / "ground_truth.jsonl")})
    (dataset / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
