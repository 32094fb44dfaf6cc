"""What several commands' handlers share: the dependency checks they start with, the champions,
a stop on SIGTERM, and lines that keep a terminal's reader informed."""

from __future__ import annotations

import sys
import time

from pipelines.config import SentinelConfig

# One default for every command that simulates a training dataset.
JOBS_PER_SCENARIO = 3


def require_kafka(config: SentinelConfig) -> None:
    """Bounded by ``kafka.connect_timeout_s``, before anything is printed or started."""
    from pipelines.io.kafka_clients import check_reachable

    check_reachable(config.kafka.bootstrap_servers, config.kafka.connect_timeout_s)


def require_mlflow(config: SentinelConfig) -> None:
    """A tracking or registry server that does not answer ends the command here, naming its key."""
    from pipelines.io.reachability import check_mlflow

    check_mlflow(config.mlflow.tracking_uri, config.mlflow.registry_uri)


def require_champions(config: SentinelConfig, held: bool = False):
    """The champions, loaded; ``held``: the detection job's, which a restart while the registry is
    down resumes with (the copies the job keeps beside its checkpoints)."""
    from pipelines.detection.champions import ChampionCache, held_champions

    cache = ChampionCache(config, held=held_champions(config) if held else None)
    cache.require()
    print("scoring with " + ", ".join(f"{m.name} v{m.version}" for m in cache.models.values()), flush=True)
    return cache


def stop_on_signals():
    """An event SIGTERM and SIGINT set: the command finishes the work under way and stops cleanly
    (the detection job at a batch boundary, a lab session cancelling its jobs and its cluster)."""
    import signal
    import threading

    stop = threading.Event()

    def request_stop(signum, frame):
        print(f"\n{signal.Signals(signum).name}: stopping after the work under way", flush=True)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop


class Progress:
    """``[3/12] 25% eta 4m10s  what``: one line per step on a terminal, rewritten in place; nothing
    when stderr is not a terminal (a log file or a pipe gets the command's own lines only).

    ``total`` steps are expected; :meth:`step` counts one done. The ETA is the mean time per step
    so far times the steps left.
    """

    def __init__(self, total: int, label: str = "", stream=None, clock=time.monotonic, enabled: bool | None = None):
        self.total, self.label, self.done, self.what, self.closed = max(total, 1), label, 0, "", False
        self.stream = stream if stream is not None else sys.stderr
        self.clock, self.started = clock, clock()
        self.enabled = self.stream.isatty() if enabled is None else enabled

    def eta_s(self) -> float | None:
        if not self.done:
            return None
        return (self.clock() - self.started) / self.done * (self.total - self.done)

    def text(self, what: str = "") -> str:
        eta = self.eta_s()
        shown = "eta ?" if eta is None else f"eta {_clock_time(eta)}"
        return (f"[{self.done}/{self.total}] {100 * self.done // self.total:>3}% {shown:<10} "
                f"{(self.label + ' ' if self.label else '')}{what}").rstrip()

    def step(self, what: str = "") -> None:
        self.update(self.done + 1, what)

    def update(self, done: int, what: str = "") -> None:
        self.done, self.what = min(max(done, 0), self.total), what
        self.show()

    def show(self) -> None:
        """Draw the line again; the last time (all done) it ends with a newline and stays."""
        if self.enabled and not self.closed:
            self.closed = self.done >= self.total
            self.stream.write("\r\x1b[2K" + self.text(self.what)[:200] + ("\n" if self.closed else ""))
            self.stream.flush()

    def say(self, line: str) -> None:
        """Print one of the command's own lines above the progress line, which is drawn again below it."""
        if self.enabled and not self.closed:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
        print(line, flush=True)
        self.show()


def _clock_time(seconds: float) -> str:
    """``45s``, ``6m40s``, ``1h05m``: a reader's ETA."""
    s = max(1, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s % 60 else f"{s // 60}m"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class GridProgress:
    """The ``progress`` of a lab grid: prints each line of the session, and counts as done the
    grid's runs the dataset has recorded (``recorded()``: their ids), whatever the lines say."""

    def __init__(self, run_ids: list[str], recorded, **progress_options):
        self.run_ids, self.recorded = set(run_ids), recorded
        self.before = len(self.run_ids & set(recorded()))
        self.progress = Progress(len(self.run_ids) - self.before, "runs recorded", **progress_options)

    def __call__(self, line: str) -> None:
        self.progress.done = len(self.run_ids & set(self.recorded())) - self.before
        self.progress.say(line)
