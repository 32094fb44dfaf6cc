"""Dead letters on their way to the dead-letter topic, without ever holding the job back.

A micro-batch hands its dead letters to a :class:`DeadLetterSpool`: they are written to a file in
the spool's folder for their topic (one per micro-batch) before the batch counts as done, and a
thread of their own sends them to the topic and deletes the file once the broker has acknowledged
every letter in it (a batch Spark runs again sends its letters again, as it does its incidents). A dead-letter topic that is missing, slow or down
delays neither incidents nor micro-batches and loses nothing: the letters wait in the spool (also
across a restart of the job), the ``dead_letters_pending`` metric and the log say so, and they go
out when the topic takes them. A letter the broker refuses for its size is sent again without its
value (its size and hash stay), so no letter can block the ones behind it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

import orjson
from kafka.errors import MessageSizeTooLargeError, RecordListTooLargeError

from pipelines.io.kafka_clients import close_quietly

log = logging.getLogger(__name__)

TOO_LARGE = (MessageSizeTooLargeError, RecordListTooLargeError)

SUFFIX = ".jsonl"


class DeadLetterSpool:
    """``put`` a micro-batch's letters (``(key, payload)`` pairs); a thread sends them on.

    ``producer_factory`` makes a kafka-python producer; ``metrics`` is a
    :class:`~pipelines.telemetry.DetectionMetrics` or None."""

    def __init__(self, spool: Path, topic: str, producer_factory: Callable[[], object], metrics=None,
                 send_timeout_s: float = 30.0, max_backoff_s: float = 30.0):
        self.folder = Path(spool) / topic  # a topic name is a safe folder name (Kafka allows [a-zA-Z0-9._-])
        self.folder.mkdir(parents=True, exist_ok=True)
        self.topic = topic
        self.producer_factory = producer_factory
        self.metrics = metrics
        self.send_timeout_s = send_timeout_s
        self.max_backoff_s = max_backoff_s
        self.sent = 0
        self.failures = 0
        self.last_error: str | None = None
        self._producer = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = 0
        self._moved(self._count_on_disk())  # what an earlier run left

    # --- the micro-batch's side ---------------------------------------------------------------

    def put(self, batch_id: int, letters: list[tuple[str | None, bytes]]) -> None:
        """Keep ``letters`` durably (the batch's file, written whole or not at all) and wake the sender."""
        if not letters:
            return
        path = self.folder / f"{time.time_ns():020d}-{batch_id}{SUFFIX}"
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        with open(tmp, "wb") as handle:
            for key, payload in letters:
                handle.write(orjson.dumps({"key": key, "payload": payload.decode()}) + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
        self._moved(len(letters))
        self._wake.set()

    def pending(self) -> int:
        """Letters in the spool that the topic has not acknowledged yet."""
        return self._pending

    def _count_on_disk(self) -> int:
        count = 0
        for path in self._files():
            try:
                with open(path, "rb") as handle:
                    count += sum(1 for _ in handle)
            except FileNotFoundError:
                continue
        return count

    # --- the sender ---------------------------------------------------------------------------

    def start(self) -> "DeadLetterSpool":
        self._thread = threading.Thread(target=self._run, name="dead-letter-sender", daemon=True)
        self._thread.start()
        return self

    def drain(self, timeout_s: float) -> bool:
        """Send what is spooled now, in this thread; True when nothing is left."""
        deadline = time.monotonic() + timeout_s
        while self._files() and time.monotonic() < deadline:
            if not self._send_oldest():
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        return not self._files()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the sender and send what is spooled for up to ``timeout_s`` (what is left stays
        spooled for the next start)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self.send_timeout_s * 3)
        if not self.drain(timeout_s):
            log.warning("%d dead letters stay in %s until the job starts again (the topic %s did not take them: "
                        "%s)", self.pending(), self.folder, self.topic, self.last_error)
        self._reset_producer()

    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            if not self._files():
                self._wake.wait(5.0)
                self._wake.clear()
                continue
            if self._send_oldest():
                backoff = 1.0
                continue
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    def _files(self) -> list[Path]:
        return sorted(self.folder.glob(f"*{SUFFIX}"))

    def _send_oldest(self) -> bool:
        files = self._files()
        if not files:
            return True
        path = files[0]
        try:
            lines = path.read_bytes().splitlines()
        except FileNotFoundError:
            return True
        try:
            self._send([orjson.loads(line) for line in lines if line.strip()])
        except Exception as exc:
            self.failures += len(lines)
            if self.metrics is not None:
                self.metrics.dead_letter_publish_failures.inc(len(lines))
            message = f"{type(exc).__name__}: {exc}"
            if message != self.last_error:
                log.warning("the dead-letter topic %s did not take %d dead letters (%s); they wait in %s and are "
                            "sent again; incidents are not held back", self.topic, len(lines), message, self.folder)
            self.last_error = message
            self._reset_producer()
            return False
        path.unlink(missing_ok=True)
        self.sent += len(lines)
        if self.last_error is not None:
            log.info("the dead-letter topic %s takes dead letters again", self.topic)
            self.last_error = None
        self._moved(-len(lines))
        return True

    def _send(self, letters: list[dict]) -> None:
        if self._producer is None:
            self._producer = self.producer_factory()
        futures = [(letter, self._send_one(letter)) for letter in letters]
        self._producer.flush(timeout=self.send_timeout_s)
        for letter, future in futures:
            try:
                future.get(timeout=self.send_timeout_s)
            except TOO_LARGE:
                self._send_one(letter, without_value=True).get(timeout=self.send_timeout_s)

    def _send_one(self, letter: dict, without_value: bool = False):
        """The send's future; a letter too large for the producer or the broker goes without the
        record's bytes (its size and hash stay), so it cannot block the letters behind it."""
        payload = letter["payload"].encode()
        if without_value:
            document = orjson.loads(payload)
            document.update(value=None, value_truncated=True)
            payload = orjson.dumps(document)
        try:
            return self._producer.send(self.topic, key=_key(letter), value=payload)
        except TOO_LARGE:
            if without_value:
                raise
            return self._send_one(letter, without_value=True)

    def _reset_producer(self) -> None:
        close_quietly(self._producer)
        self._producer = None

    def _moved(self, letters: int) -> None:
        """Count ``letters`` more (fewer) waiting; the batch's thread and the sender's both move it."""
        with self._lock:
            self._pending += letters
            if self.metrics is not None:
                self.metrics.dead_letters_pending.set(self._pending)


def _key(letter: dict) -> bytes | None:
    return None if letter["key"] is None else letter["key"].encode()
