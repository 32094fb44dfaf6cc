"""kafka-python clients built from the config, and the offset queries the Spark source needs.

This is the only module that knows how to talk to the broker; everything else asks it for a
producer, a consumer or offsets. The callers hand over ``kafka.client_kwargs()``: the options of
``kafka.security`` (TLS, SASL) and ``kafka.client_options``, passed through unchanged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import Cancelled, KafkaError, KafkaTimeoutError, OffsetOutOfRangeError, TopicAlreadyExistsError

from pipelines.errors import SetupError

log = logging.getLogger(__name__)


class KafkaUnavailable(SetupError, RuntimeError):
    """The broker could not be reached; the message says what to check."""


def normalise_client_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """kafka-python names: Java-style ``security.protocol`` becomes ``security_protocol``, so
    settings can be copied from a Spark or Java Kafka config."""
    return {key.replace(".", "_"): value for key, value in options.items()}


def _common(bootstrap_servers: str | list[str], client_options: Mapping[str, Any]) -> dict[str, Any]:
    servers = bootstrap_servers.split(",") if isinstance(bootstrap_servers, str) else list(bootstrap_servers)
    return {"bootstrap_servers": servers, **normalise_client_options(client_options)}


class _ErrorsOfOwnClose(logging.Filter):
    """Drops kafka-python's ERROR reports of what closing its own client did.

    kafka-python 3's network thread runs on while ``close()`` on the caller's thread drops the
    sockets and cancels what was in flight. It can then log, about connections nobody uses any
    more, "Error receiving network data" with a traceback (``'NoneType' object has no attribute
    'recv'``: a read just after the socket went) or "Metadata refresh: failed Cancelled" (a
    refresh the close cancelled). The record's arguments say which: a transport closed on purpose,
    or the ``Cancelled`` error a close gives what it cuts short.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not isinstance(record.args, tuple):
            return True
        return not any(isinstance(arg, Cancelled) or getattr(arg, "_closed", False) is True for arg in record.args)


# The modules of kafka-python that log about a client's connections and requests.
_KAFKA_LOGGERS = ("kafka.cluster", "kafka.net.transport", "kafka.net.connection", "kafka.net.manager",
                  "kafka.consumer.fetcher", "kafka.coordinator", "kafka.admin.client", "kafka.producer.sender")
for _name in _KAFKA_LOGGERS:
    logging.getLogger(_name).addFilter(_ErrorsOfOwnClose())


class _BootstrapFailures(logging.Handler):
    """Keeps what kafka-python says while a client bootstraps, instead of letting it through.

    A broker that refuses the client (TLS without the certificate it wants, a wrong CA, plaintext
    to a TLS port) makes kafka-python log a traceback per retry and then give up with only
    "Unable to bootstrap". The reason it kept retrying belongs in the one error the user sees.
    """

    _FAILED = re.compile(r"connection to \S+ failed: (.+?)(?: \(backoff [\d.]+ secs\))?$")

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if match := self._FAILED.search(record.getMessage()):
            self.reasons.append(match.group(1))


# Clients may bootstrap in several threads at once: the first to start quiets kafka-python's
# logger, the last to finish restores it.
_quiet_lock = threading.Lock()
_quiet_depth = 0
_quiet_saved: tuple[bool, int] = (True, logging.NOTSET)


@contextlib.contextmanager
def _quiet_bootstrap() -> Iterator[_BootstrapFailures]:
    global _quiet_depth, _quiet_saved
    kafka_log = logging.getLogger("kafka")
    failures = _BootstrapFailures()
    with _quiet_lock:
        if _quiet_depth == 0:
            _quiet_saved = kafka_log.propagate, kafka_log.level
            kafka_log.propagate = False
            if kafka_log.getEffectiveLevel() > logging.WARNING:
                kafka_log.setLevel(logging.WARNING)
        _quiet_depth += 1
        kafka_log.addHandler(failures)
    try:
        yield failures
    finally:
        with _quiet_lock:
            kafka_log.removeHandler(failures)
            _quiet_depth -= 1
            if _quiet_depth == 0:
                kafka_log.propagate, kafka_log.level = _quiet_saved


def _bootstrapped(bootstrap_servers: Any, make: Callable[[], Any]) -> Any:
    """``make()`` a kafka-python client; if it cannot bootstrap, say why in a KafkaUnavailable."""
    with _quiet_bootstrap() as failures:
        try:
            return make()
        except KafkaTimeoutError as exc:
            raise _unreachable(bootstrap_servers, exc, failures.reasons) from exc


def _unreachable(bootstrap_servers: Any, exc: Exception, failures: Sequence[str] = ()) -> KafkaUnavailable:
    # The last few distinct reasons, latest last: a refused TLS handshake shows up as the
    # broker's alert on one try and as a bare EOF on the next.
    distinct = list(dict.fromkeys(reversed(failures)))[:3][::-1]
    cause = f"tries failed with: {'; '.join(distinct)}" if distinct else f"{type(exc).__name__}: {exc}"
    return KafkaUnavailable(
        f"Kafka at {bootstrap_servers} is unreachable ({cause}). "
        "Start the embedded broker with `sentinel up`, or set kafka.bootstrap_servers "
        "(SENTINEL_KAFKA__BOOTSTRAP_SERVERS) to a reachable cluster; a broker that wants TLS or SASL needs them "
        "in kafka.security (its CA, client certificate, user and password)."
    )


def make_consumer(
    bootstrap_servers: str | list[str], client_options: Mapping[str, Any] = {}, **overrides: Any
) -> KafkaConsumer:
    """A group-less consumer for manual assignment (the Spark checkpoint owns offsets, not Kafka)."""
    kwargs = {
        "group_id": None,
        "enable_auto_commit": False,
        "auto_offset_reset": "none",
        **_common(bootstrap_servers, client_options),
        **overrides,
    }
    return _bootstrapped(bootstrap_servers, lambda: KafkaConsumer(**kwargs))


def make_producer(
    bootstrap_servers: str | list[str], client_options: Mapping[str, Any] = {}, **overrides: Any
) -> KafkaProducer:
    kwargs = {
        "acks": "all",
        # Throughput over latency: metrics arrive every few seconds, and kafka-python's sink is
        # faster with larger batches (see BENCHMARKS.md, "Kafka I/O for Spark (`benchmarks/kafka_io.py`)").
        "linger_ms": 20,
        "batch_size": 256 * 1024,
        "retries": 5,
        **_common(bootstrap_servers, client_options),
        **overrides,
    }
    return _bootstrapped(bootstrap_servers, lambda: KafkaProducer(**kwargs))


def close_quietly(producer: KafkaProducer | None, timeout_s: float = 5.0) -> None:
    """Close a producer whose broker may be gone: what it still held is given up on (its sender
    sends it again), and no error of the broker's is raised here."""
    if producer is not None:
        try:
            producer.close(timeout=timeout_s)
        except Exception:  # the broker is why the producer is being closed
            pass


def make_admin(bootstrap_servers: str | list[str], client_options: Mapping[str, Any] = {}) -> KafkaAdminClient:
    return _bootstrapped(bootstrap_servers, lambda: KafkaAdminClient(**_common(bootstrap_servers, client_options)))


def check_reachable(bootstrap_servers: str, timeout_s: float) -> None:
    """Fail fast with a clear message when no bootstrap server accepts a TCP connection.

    kafka-python would otherwise retry for its whole api-version timeout and report only
    ``NoBrokersAvailable``; a plain socket check gives a bounded, explicit answer first.
    """
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        for server in bootstrap_servers.split(","):
            host, _, port = server.rpartition(":")
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=min(2.0, timeout_s)):
                    return
            except OSError as exc:
                last_error = exc
        if time.monotonic() >= deadline:
            raise _unreachable(bootstrap_servers, last_error or OSError("no address"))
        time.sleep(0.25)


def ensure_topics(
    bootstrap_servers: str, client_options: Mapping[str, Any], topics: Iterable[str], partitions: int
) -> list[str]:
    """Create the topics that do not exist yet; returns the ones created."""
    admin = make_admin(bootstrap_servers, client_options)
    try:
        existing = set(admin.list_topics())
        missing = [t for t in dict.fromkeys(topics) if t not in existing]
        if missing:
            try:
                admin.create_topics([NewTopic(t, partitions, 1) for t in missing])
            except TopicAlreadyExistsError:
                pass  # created concurrently: the goal is reached
        return missing
    finally:
        admin.close()


def partitions_of(consumer: KafkaConsumer, topic: str, timeout_s: float = 30.0) -> list[int]:
    """The topic's partition ids; waits for metadata, fails clearly if the topic does not exist."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = consumer.partitions_for_topic(topic)
        if found:
            return sorted(found)
        if time.monotonic() >= deadline:
            raise KafkaError(f"topic {topic!r} does not exist (or has no partitions) on the broker")
        time.sleep(0.2)


def earliest_offsets(consumer: KafkaConsumer, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    tps = [TopicPartition(topic, p) for p in partitions]
    return {tp.partition: offset for tp, offset in consumer.beginning_offsets(tps).items()}


def latest_offsets(
    consumer: KafkaConsumer, topic: str, partitions: Iterable[int], timeout_s: float = 10.0,
    known: Mapping[int, int] | None = None,
) -> dict[int, int]:
    """The end (high-watermark) offset of each partition.

    ``ListOffsets(latest)`` can come back short on some Kafka-compatible brokers (Tansu reports the
    base offset of the last batch), while the high-watermark in a fetch response is exact. So we
    ask ListOffsets first, then fetch from there with a tiny size limit and take the larger of
    the two. Assignments are reset first because kafka-python keeps a stale high-watermark
    across re-assignment of the same partition.

    ``known``: an offset of each partition that the caller already has and that is not past its
    end (a streaming query's last end): the fetch starts there and ListOffsets is not asked, one
    broker round trip fewer (each is slow on a broker busy with a producer).
    Where one is out of range after all (a re-created topic, retention), ListOffsets is asked.
    """
    tps = [TopicPartition(topic, p) for p in partitions]
    if known is not None and all(tp.partition in known for tp in tps):
        try:
            return _highwaters(consumer, {tp: known[tp.partition] for tp in tps}, timeout_s)
        except OffsetOutOfRangeError:
            pass
    return _highwaters(consumer, consumer.end_offsets(tps), timeout_s)


def _highwaters(consumer: KafkaConsumer, starts: Mapping[TopicPartition, int], timeout_s: float) -> dict[int, int]:
    """Each partition's high-watermark, from fetches at ``starts`` (or the start, if none comes)."""
    consumer.assign([])
    consumer.assign(list(starts))
    try:
        for tp, offset in starts.items():
            consumer.seek(tp, offset)
        deadline = time.monotonic() + timeout_s
        while any(consumer.highwater(tp) is None for tp in starts) and time.monotonic() < deadline:
            # A short poll: one with nothing to return waits out its whole timeout although the
            # (empty) fetch response already set the high-watermark, and a streaming query that has
            # caught up asks at the end of the partition every micro-batch, each time waiting it out.
            consumer.poll(timeout_ms=10)
        # The fetch's high-watermark where one came (below ``starts`` only when the partition
        # lost data, which the caller must see), else the start.
        return {tp.partition: offset if consumer.highwater(tp) is None else consumer.highwater(tp)
                for tp, offset in starts.items()}
    finally:
        consumer.assign([])


def assign_from(consumer: KafkaConsumer, topic: str, offsets: Mapping[int, int]) -> None:
    """Assign ``topic``'s partitions to ``consumer``, each positioned at its offset in ``offsets``."""
    tps = [TopicPartition(topic, p) for p in offsets]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, offsets[tp.partition])


def metadata_consumer(bootstrap_servers: str, client_options: Mapping[str, Any]) -> KafkaConsumer:
    """A consumer for offset queries: small, fast fetches so a high-watermark comes back at once."""
    return make_consumer(
        bootstrap_servers,
        client_options,
        fetch_max_wait_ms=10,
        max_partition_fetch_bytes=1024,
        fetch_max_bytes=64 * 1024,
    )


def read_records(consumer: KafkaConsumer, topic: str, timeout_s: float = 60.0,
                 keep: Callable[[Any], bool] | None = None) -> list:
    """Every record of ``topic`` from the beginning up to its current end, partition by partition
    (only those ``keep`` accepts, when given: the others are not held in memory).

    For checks, tools and tests; the streaming job reads through the Spark source instead.
    Raises ``TimeoutError`` if the records below the end offsets do not arrive in time.
    """
    partitions = partitions_of(consumer, topic)
    end = latest_offsets(consumer, topic, partitions)
    tps = [TopicPartition(topic, p) for p in partitions]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    records: list = []
    deadline = time.monotonic() + timeout_s
    while any(consumer.position(tp) < end[tp.partition] for tp in tps):
        if time.monotonic() > deadline:
            raise TimeoutError(f"reading {topic} up to {end} took longer than {timeout_s:.0f}s")
        for batch in consumer.poll(timeout_ms=500).values():
            records.extend(r for r in batch if r.offset < end[r.partition] and (keep is None or keep(r)))
    consumer.assign([])
    return records


def read_json_values(bootstrap_servers: str, client_options: Mapping[str, Any], topic: str,
                     timeout_s: float = 60.0, keep: Callable[[Any], bool] | None = None) -> list[Any]:
    """The JSON values of :func:`read_records` in the order they were written (record timestamp);
    a value that is not JSON is skipped and logged (it is not ours to judge here)."""
    consumer = make_consumer(bootstrap_servers, client_options)
    try:
        records = read_records(consumer, topic, timeout_s, keep)
    finally:
        consumer.close()
    values = []
    for record in sorted(records, key=lambda r: (r.timestamp, r.partition, r.offset)):
        try:
            values.append(json.loads(record.value))
        except ValueError:
            log.warning("%s partition %d offset %d is not JSON; skipped", topic, record.partition, record.offset)
    return values


class BrokerProbe:
    """Asks the broker for its cluster's metadata every ``interval_s`` on a thread of its own, and
    sets ``reachable`` (1 or 0) and ``last_contact`` (when it last answered, epoch seconds): two
    gauges, or anything with ``set``. The job's input source cannot tell an absent broker from
    a quiet topic (both give no new offsets), and its reader runs in a Python process the JVM
    owns; this probe runs beside the driver and tells within ``interval_s + timeout_s``.
    Logs once when the broker stops answering and once when it answers again."""

    def __init__(self, bootstrap_servers: str, client_options: Mapping[str, Any], reachable: Any = None,
                 last_contact: Any = None, interval_s: float = 5.0, timeout_s: float = 5.0):
        self.bootstrap_servers, self.client_options = bootstrap_servers, dict(client_options)
        self.reachable_gauge, self.last_contact_gauge = reachable, last_contact
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.reachable: bool | None = None
        self.last_contact: float | None = None
        self.down_since: float | None = None
        self._admin: KafkaAdminClient | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka-broker-probe", daemon=True)

    def start(self) -> "BrokerProbe":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._close_admin()

    def probe(self) -> bool:
        """One metadata request; True when the broker answered it."""
        try:
            if self._admin is None:
                # A client that cannot bootstrap leaves its IO thread behind: made only once a
                # bootstrap server takes a connection (it then reconnects by itself).
                check_reachable(self.bootstrap_servers, self.timeout_s)
                timeout_ms = int(self.timeout_s * 1000)
                # The probe's own timeouts over the configured clients' (a probe must not wait them out).
                kwargs = {**_common(self.bootstrap_servers, self.client_options), "request_timeout_ms": timeout_ms,
                          "bootstrap_timeout_ms": timeout_ms, "reconnect_backoff_max_ms": 1000}
                self._admin = _bootstrapped(self.bootstrap_servers, lambda: KafkaAdminClient(**kwargs))
            self._admin.describe_cluster()
        except Exception as exc:  # whatever the client raises, the answer is "no answer"
            self._record(False, exc)
            return False
        self._record(True, None)
        return True

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.probe()
            self._stopping.wait(self.interval_s)

    def _record(self, reachable: bool, error: Exception | None) -> None:
        now = time.time()
        if reachable:
            self.last_contact = now
            if self.reachable is False:
                log.warning("Kafka at %s answers again, after %.0f s without an answer", self.bootstrap_servers,
                            now - (self.down_since or now))
            self.down_since = None
        else:
            if self.reachable is not False:
                self.down_since = now
                log.error("Kafka at %s does not answer (%s): the job reads no input and publishes nothing "
                          "until it does", self.bootstrap_servers,
                          str(error).splitlines()[0] if str(error) else type(error).__name__)
        self.reachable = reachable
        if self.reachable_gauge is not None:
            self.reachable_gauge.set(1 if reachable else 0)
        if self.last_contact_gauge is not None and self.last_contact is not None:
            self.last_contact_gauge.set(self.last_contact)

    def _close_admin(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()


def broker_answers(bootstrap_servers: str, client_options: Mapping[str, Any], timeout_s: float = 5.0) -> bool:
    """Whether the broker answers one metadata request within about ``timeout_s`` (and a TCP
    connect's wait): a reader that gets no records can tell an absent broker from missing ones."""
    probe = BrokerProbe(bootstrap_servers, client_options, timeout_s=timeout_s)
    try:
        return probe.probe()
    finally:
        probe.stop()
