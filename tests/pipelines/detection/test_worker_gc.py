"""The Python workers' garbage collector between tasks (pipelines/detection/worker_gc.py), in
this interpreter: what it collects, when, and what it freezes."""

from __future__ import annotations

import gc
import weakref

from pipelines.detection import worker_gc


def test_stale_states_are_freed_between_tasks_a_few_at_a_time_or_at_a_tasks_end_past_a_bound(collector, monkeypatch):
    collector.task_started()
    for i in range(3 * worker_gc.RELEASED_AT_ONCE):
        collector.free_later([i])
    collector.task_ended().join(timeout=30)  # the thread's, a moment after the task
    assert collector.garbage == []
    monkeypatch.setattr(worker_gc, "COLLECTION_AFTER_S", 30.0)  # the thread: not in this test
    collector.task_started()
    for i in range(worker_gc.GARBAGE_HELD_AT_MOST):
        collector.free_later([i])
    collector.task_ended().cancel()
    assert len(collector.garbage) == worker_gc.GARBAGE_HELD_AT_MOST  # at the bound: left for later
    collector.task_started()
    collector.free_later(["one more"])
    collector.task_ended().cancel()
    assert collector.garbage == []  # past it (tasks back to back): freed at the task's end


class _Node:
    pass


def _made_in_a_task():
    held = _Node()  # kept, as a parsed job state is
    garbage = _Node()
    garbage.itself = garbage  # a cycle: only the cyclic collector frees it
    return held, weakref.ref(garbage)


def _frozen(thing) -> bool:
    return not any(o is thing for o in gc.get_objects())  # in no generation: in the permanent one


def test_between_tasks_a_worker_collects_what_its_tasks_made_then_freezes_what_survives(collector, monkeypatch):
    assert gc.isenabled()
    collector.task_started()
    assert not gc.isenabled()  # no collections while a task runs
    held, freed = _made_in_a_task()
    monkeypatch.setattr(worker_gc, "COLLECTION_AFTER_S", 3.0)  # "a moment", even on a loaded machine
    collection = collector.task_ended()  # on a thread, a moment after the task
    collector.task_started()  # the next task came first: nothing collected under it
    collection.join(timeout=30)
    monkeypatch.undo()
    assert freed() is not None and not _frozen(held) and not gc.isenabled()
    collector.task_ended().join(timeout=30)  # this task's end: both tasks' objects
    assert freed() is None  # the cycle was collected
    assert _frozen(held)  # what survived is left out of collections from now on
    assert gc.isenabled()  # and automatic collections are back, for what comes next
    collector.collected_at -= worker_gc.COLLECTION_AT_LEAST_EVERY_S  # tasks back to back since
    collector.task_started()
    _, freed = _made_in_a_task()
    assert collector.task_ended() is None and freed() is None  # collected at once, in the task


def test_the_full_collection_pyspark_makes_after_a_task_is_the_one_whose_survivors_are_frozen(collector, monkeypatch):
    """PySpark's daemon collects in full after every task of a reused worker: the end of that
    collection freezes what survived, and the worker's own collection, later, finds nothing to do."""
    collector.task_started()
    held, freed = _made_in_a_task()
    gc.collect()  # a collection within the task (frozen_as_made's) freezes nothing
    assert freed() is None and not _frozen(held) and not gc.isenabled()
    _, freed = _made_in_a_task()
    monkeypatch.setattr(worker_gc, "COLLECTION_AFTER_S", 30.0)  # the worker's own collection: not yet
    fallback = collector.task_ended()
    monkeypatch.undo()
    assert freed() is not None and not _frozen(held)
    gc.collect()  # as pyspark/daemon.py after the task
    assert freed() is None and _frozen(held) and gc.isenabled()
    later = _Node()
    collector.collect()  # the thread's, when it comes: nothing made since by a task, nothing done
    assert not _frozen(later)
    fallback.cancel()


def test_states_parsed_in_a_task_are_frozen_as_made_after_the_task_s_garbage_so_far_is_collected(collector):
    """A task's parsed job states are left out of the collection after it (which walked up to
    370,000 objects in a fleet of aged jobs), without freezing the cyclic garbage made before."""
    collector.task_started()
    _, freed = _made_in_a_task()  # e.g. PySpark's recursive closures, dropped as its calls return
    with collector.frozen_as_made():
        parsed = [_Node() for _ in range(3)]
    assert freed() is None  # collected before the block, not frozen for ever
    assert all(_frozen(node) for node in parsed)
    assert not gc.isenabled()  # still no automatic collections while the task runs
    later = _Node()
    collector.task_ended().join(timeout=30)
    assert _frozen(later)  # the usual collection after the task, then frozen
    gc.disable()  # a worker whose collections were off before its first task: left as it was
    collector.task_started()
    _, freed = _made_in_a_task()
    with collector.frozen_as_made():
        parsed = _Node()
    assert freed() is not None and not _frozen(parsed)
    collector.task_ended().join(timeout=30)
    assert not gc.isenabled()
