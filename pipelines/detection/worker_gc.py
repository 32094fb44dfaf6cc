"""The cyclic garbage collector of the detection job's Python workers, between their tasks.

Imported by the stateful processor's workers and by the feature log writer's, which import
nothing heavier (no models, no scikit-learn): see :mod:`pipelines.detection.outputs`.
"""

from __future__ import annotations

import gc
import threading
import time
from contextlib import contextmanager
from typing import Iterator

# What a worker holds between tasks (its jobs' parsed states, the champions and their libraries)
# is frozen out of the cyclic garbage collector, which PySpark's daemon runs in full after every
# task of a reused worker: walking it cost each worker a large share of its time in an aged fleet,
# and a full collection could hold the next task past its trigger (see BENCHMARKS.md, "2026-11-27,
# 71e3346: PySpark's own garbage collection after every task (Intel Xeon)").
# The end of that collection, which has freed the task's cyclic garbage (PySpark's recursive
# closures), freezes what survived (CollectorBetweenTasks.after_collection) before automatic
# collections come back on; should none come (a worker not reused, a PySpark that does not
# collect), a thread collects and freezes a moment after the task, while the worker waits on its
# socket. The states a task parses are frozen as they are made (frozen_as_made). What this gives
# up, a few small cycles frozen with the rest and never freed, is in BENCHMARKS.md, "2026-11-26,
# 8701f5f, 422f8fd and 4866f04: the workers' garbage collection off the trigger's path (Intel Xeon)".
COLLECTION_AFTER_S = 0.5  # PySpark's collection, right after the task, comes first as a rule
RELEASED_AT_ONCE = 50  # stale parsed states freed at once between tasks: a few milliseconds
GARBAGE_HELD_AT_MOST = 5_000  # stale parsed states (tens of KiB each) left for between tasks
COLLECTION_AT_LEAST_EVERY_S = 60.0


class CollectorBetweenTasks:
    """The cyclic garbage collector of a Python worker that runs detection tasks: off while a task
    runs; between tasks, once a full collection has freed what the tasks left, what survives is
    frozen (above)."""

    def __init__(self):
        # Reentrant: a collection started under it calls after_collection back on the same thread.
        self.lock = threading.RLock()
        self.tasks = 0
        self.enabled_before: bool | None = None  # before the first task since the last freeze
        self.collected_at = time.monotonic()
        self.watching = False
        # What tasks let go of that takes long to free (stale parsed states: half a thousand
        # objects each), freed between tasks instead (release).
        self.garbage: list = []

    def task_started(self) -> None:
        with self.lock:
            if not self.watching:
                gc.callbacks.append(self.after_collection)
                self.watching = True
            if self.enabled_before is None:
                self.enabled_before = gc.isenabled()
            gc.disable()
            self.tasks += 1

    def task_ended(self) -> threading.Timer | None:
        """Collect a moment from now, on a thread (returned, started), unless a task runs then or a
        collection came first (PySpark's, after every task); now, in the task, if none came for a
        while (tasks back to back), so that cyclic garbage does not pile up. Likewise what was
        handed to :meth:`free_later`: now if it has grown past a bound."""
        with self.lock:
            self.tasks -= 1
            overdue = time.monotonic() - self.collected_at > COLLECTION_AT_LEAST_EVERY_S
        if len(self.garbage) > GARBAGE_HELD_AT_MOST:
            self.release()
        if overdue:
            self.collect()
            return None
        collection = threading.Timer(COLLECTION_AFTER_S, self.collect)
        collection.daemon = True
        collection.start()
        return collection

    @contextmanager
    def frozen_as_made(self) -> Iterator[None]:
        """Within a task: what the block makes, which must be free of cycles (parsed job states,
        JSON trees), is frozen at its end, not walked by the collection after the task; what the
        task made before the block is collected first, so that no cyclic garbage is frozen with
        it (PySpark's own calls leave some: recursive closures of ``Row.asDict`` and
        ``StructField.getCollationMetadata``, dropped as the calls return)."""
        if not self.enabled_before:  # the worker had no automatic collections: left as it was
            yield
            return
        gc.collect()
        yield
        gc.freeze()

    def free_later(self, thing: object) -> None:
        """Within a task: drop ``thing`` between tasks, not now (freeing it is slow, and nothing
        else holds it)."""
        self.garbage.append(thing)

    def release(self) -> None:
        """Free what tasks handed to :meth:`free_later`, a few at a time, stopping as soon as a
        task starts (its end releases the rest)."""
        while self.garbage and not self.tasks:
            del self.garbage[-RELEASED_AT_ONCE:]

    def collect(self) -> None:
        self.release()
        with self.lock:
            if self.tasks or self.enabled_before is None:
                return  # a task runs (its end collects what both made), or a collection came first
            if self.enabled_before:
                gc.collect()  # calls after_collection back (unless another thread's collection ran)
            self._freeze_survivors()

    def after_collection(self, phase: str, info: dict) -> None:
        """A ``gc.callbacks`` entry: at the end of a full collection between tasks, what survived
        is frozen and automatic collections are back, as they were before the tasks."""
        if phase != "stop" or info["generation"] != 2:
            return
        with self.lock:
            self._freeze_survivors()

    def _freeze_survivors(self) -> None:
        """Under the lock, after a full collection."""
        if self.tasks or self.enabled_before is None:
            return  # within a task (frozen_as_made's), or nothing made since the last freeze
        if self.enabled_before:
            gc.freeze()
            gc.enable()
        self.enabled_before = None
        self.collected_at = time.monotonic()


COLLECTOR = CollectorBetweenTasks()
