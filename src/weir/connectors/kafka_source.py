"""Kafka in on the continuous runtime: :class:`KafkaSource` (Flink's ``KafkaSource``),
with ``confluent-kafka`` (librdkafka) and standard Kafka client semantics only.

**Splits and positions.** The topics' partitions are split across the source's
subtasks by Flink's rule (``KafkaSourceEnumerator.getSplitOwner``: a topic's partitions
go round the subtasks from one its name's hash picks), so the same partitions land on
the same subtasks as in Flink; each split's next offset is the reader's position, so it
goes into every checkpoint and a restore resumes exactly there. A restore hands every
reader all the checkpointed positions (``union_positions``) and each keeps the ones the
rule gives it: at another parallelism the splits are redistributed, and no partition is
read twice or dropped.

**Partition discovery** (Flink's ``partition.discovery.interval.ms``, for an unbounded
source): every ``partition_discovery_interval`` (default 5 minutes; ``None``: never)
each reader lists the topics again (a pattern matches new topics too) and starts
reading, from the earliest offset as Flink does, the partitions that are new and that
the rule gives it. A bounded source reads the partitions it had at the start.

**Where a fresh start begins** is ``starting_offsets``: ``"earliest"``, ``"latest"``,
``"committed"`` (the consumer group's, else earliest), a dict ``{(topic, partition):
offset}`` (other partitions: earliest), or a time — ``KafkaSource.timestamp(ms)``
(milliseconds since the epoch) or an aware ``datetime``: each partition's first record
whose timestamp is at or after it, a partition with none starting at its end
(Flink's ``OffsetsInitializer.timestamp``, Spark's ``startingTimestamp``).
``bounded=True`` stops each split at the end offset it had when the job started (what
tests and backfills use). It reads with
``isolation.level=read_committed``: records of open or aborted transactions are never
seen, and "end" is the last stable offset.

**Event time per partition.** With a watermark strategy (``env.from_source(...,
watermarks=)``) each partition has its own watermark and idleness, and a subtask's
watermark is the smallest over its partitions that are not idle, as in Flink: a
partition behind holds event time back, a partition with no record holds it back until
it is idle (``with_idleness``, counted from its assignment), and a subtask is idle only
once all its partitions are. A bounded partition at its end is released.

**Offsets committed to the consumer group** (Flink's ``commit.offsets.on.checkpoint``):
with a ``group_id``, each reader commits the offsets it had at a checkpoint's trigger
once that checkpoint completes — asynchronously; a failed commit is logged, never
fails the job. This is for monitoring (consumer lag) and for ``starting_offsets=
"committed"`` of another job: a restore uses the checkpoint's offsets, never the
group's. ``commit_offsets_on_checkpoint=False`` turns it off.

Records are ``(key, value)`` bytes, or what ``deserializer`` makes of a
:class:`~weir.connectors.kafka_offsets.KafkaRecord` (topic, partition, offset,
timestamp, key, value, headers). Extra client settings go in ``properties``
(librdkafka's names, e.g. ``{"security.protocol": "SSL"}``).
"""

from __future__ import annotations

import datetime
import logging
import re
import time
import uuid
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from weir.api.connectors import Source, SourceReader
from weir.api.durations import duration_ms
from weir.api.watermarks import WatermarkStrategy
from weir.connectors.kafka_offsets import KafkaRecord, offset_bounds, record_of
from weir.connectors.kafka_transactions import TIMEOUT_S, kafka_client
from weir.errors import ConfigurationError, SourceError

__all__ = ["KafkaSource", "StartingTimestamp", "check_servers", "split_owner"]

log = logging.getLogger("weir")

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _plain(record: KafkaRecord) -> Any:
    return (record.key, record.value)


def _java_hash(text: str) -> int:
    """Java's ``String.hashCode`` of ``text`` (UTF-16 code units), as a signed int."""
    data, h = text.encode("utf-16-be"), 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def split_owner(topic: str, partition: int, parallelism: int) -> int:
    """The subtask that reads ``topic``'s ``partition`` (Flink's
    ``KafkaSourceEnumerator.getSplitOwner``)."""
    start = ((_java_hash(topic) * 31) & 0x7FFFFFFF) % parallelism
    return (start + partition) % parallelism


def check_servers(bootstrap_servers: object, what: str) -> str:
    """``bootstrap_servers`` as librdkafka takes it ("host:port,..."), or a
    ConfigurationError naming ``what``."""
    if isinstance(bootstrap_servers, list | tuple):
        bootstrap_servers = ",".join(str(s) for s in bootstrap_servers)
    if not isinstance(bootstrap_servers, str) or not bootstrap_servers:
        raise ConfigurationError(f"{what}: bootstrap_servers must be 'host:port[,...]', got "
                                 f"{bootstrap_servers!r}")
    return bootstrap_servers


@dataclass(frozen=True)
class StartingTimestamp:
    """Where a :class:`KafkaSource` starts (``starting_offsets=``): in each partition,
    the first record whose timestamp is at or after ``ms`` (milliseconds since the
    epoch); a partition without one starts at its end. Made by
    :meth:`KafkaSource.timestamp`."""

    ms: int

    def __post_init__(self) -> None:
        if isinstance(self.ms, bool) or not isinstance(self.ms, int) or self.ms < 0:
            raise ConfigurationError(
                f"KafkaSource: a starting timestamp must be milliseconds since the epoch "
                f"(an int >= 0; Kafka reads -1 and -2 as latest and earliest) or an aware "
                f"datetime, got {self.ms!r}")


class KafkaSource(Source[Any]):
    """Records of Kafka topics (``topics``: names, or a ``re.Pattern`` matched against
    the cluster's topics as the job starts), partitions split across the subtasks with
    each one's offset in the checkpoint; ``read_committed``.

    ``starting_offsets`` — where a fresh start begins: ``"earliest"`` (default),
    ``"latest"``, ``"committed"`` (the ``group_id``'s offsets, else earliest), ``{(topic,
    partition): offset}`` (other partitions earliest), or ``KafkaSource.timestamp(ms)``
    / an aware ``datetime``: each partition's first record at or after that time, its
    end if it has none. ``bounded`` — stop each partition at its end offset as the job
    starts. ``group_id`` — the consumer group: with it, the offsets of every completed
    checkpoint are committed to the group (for monitoring and ``"committed"``; restores
    use the checkpoint), unless ``commit_offsets_on_checkpoint=False``. With a watermark
    strategy, each partition has its own watermark and idleness and a subtask's
    watermark is the smallest over its partitions that are not idle.
    ``watermarks`` — the event-time strategy (as ``from_source(watermarks=)``; per
    partition). ``partition_discovery_interval`` — how often an unbounded source looks for new
    partitions and topics (a duration; default 5 minutes; ``None``: never). See
    :mod:`weir.connectors.kafka_source`."""

    #: a restore hands every reader all positions; each keeps those it owns
    #: (:func:`split_owner`), so a discovered partition has exactly one reader
    union_positions = True

    def __init__(
        self, bootstrap_servers: str | Sequence[str], topics: str | Sequence[str] | re.Pattern[str],
        *, group_id: str | None = None,
        starting_offsets: (str | dict[tuple[str, int], int] | StartingTimestamp
                           | datetime.datetime) = "earliest",
        bounded: bool = False, deserializer: Callable[[KafkaRecord], Any] | None = None,
        commit_offsets_on_checkpoint: bool | None = None,
        partition_discovery_interval: str | int | datetime.timedelta | None = "5 min",
        watermarks: WatermarkStrategy | None = None,
        properties: dict[str, Any] | None = None,
    ) -> None:
        self.bootstrap_servers = check_servers(bootstrap_servers, "KafkaSource")
        if isinstance(topics, str):
            topics = [topics]
        if not isinstance(topics, re.Pattern) and (
                not topics or not all(isinstance(t, str) and t for t in topics)):
            raise ConfigurationError(f"KafkaSource: topics must be topic names or a "
                                     f"re.Pattern, got {topics!r}")
        self.topics: list[str] | re.Pattern[str] = (
            topics if isinstance(topics, re.Pattern) else list(topics))
        if isinstance(starting_offsets, datetime.datetime):
            starting_offsets = KafkaSource.timestamp(starting_offsets)
        if not (isinstance(starting_offsets, dict | StartingTimestamp)
                or starting_offsets in ("earliest", "latest", "committed")):
            raise ConfigurationError(
                f"KafkaSource: starting_offsets must be 'earliest', 'latest', 'committed', "
                f"{{(topic, partition): offset}} or KafkaSource.timestamp(ms), got "
                f"{starting_offsets!r}")
        if starting_offsets == "committed" and not group_id:
            raise ConfigurationError("KafkaSource: starting_offsets='committed' needs the "
                                     "group_id whose offsets to start from")
        if commit_offsets_on_checkpoint is not None and not isinstance(
                commit_offsets_on_checkpoint, bool):
            raise ConfigurationError(f"KafkaSource: commit_offsets_on_checkpoint must be "
                                     f"True, False or None, got {commit_offsets_on_checkpoint!r}")
        if commit_offsets_on_checkpoint and not group_id:
            raise ConfigurationError(
                "KafkaSource: commit_offsets_on_checkpoint=True needs the group_id to "
                "commit the offsets to (give group_id=, or leave it None: committed when "
                "there is a group_id)")
        self.group_id = group_id
        self.starting_offsets: str | dict[tuple[str, int], int] | StartingTimestamp = (
            starting_offsets)
        self.bounded = bounded
        self.deserializer = deserializer or _plain
        #: whether readers commit a completed checkpoint's offsets to ``group_id``
        self.commit_offsets = (bool(group_id) if commit_offsets_on_checkpoint is None
                               else commit_offsets_on_checkpoint)
        #: milliseconds between two looks for new partitions (None: never)
        self.discovery_ms = (None if partition_discovery_interval is None or bounded else
                             duration_ms(partition_discovery_interval,
                                         "KafkaSource partition_discovery_interval"))
        if watermarks is not None and not isinstance(watermarks, WatermarkStrategy):
            raise ConfigurationError(f"KafkaSource: watermarks must be a WatermarkStrategy, "
                                     f"got {type(watermarks).__name__}")
        self.watermarks = watermarks
        self.properties = dict(properties or {})

    @staticmethod
    def timestamp(at: int | datetime.datetime) -> StartingTimestamp:
        """``starting_offsets=`` at a time (Flink's ``OffsetsInitializer.timestamp``):
        ``at`` in milliseconds since the epoch, or an aware ``datetime``."""
        if isinstance(at, datetime.datetime):
            if at.tzinfo is None or at.utcoffset() is None:
                raise ConfigurationError(
                    f"KafkaSource: a starting time must be an aware datetime (with its "
                    f"tzinfo, e.g. datetime.UTC: a naive one is ambiguous), got {at!r}")
            return StartingTimestamp((at - _EPOCH) // datetime.timedelta(milliseconds=1))
        return StartingTimestamp(at)

    def __repr__(self) -> str:
        return f"KafkaSource({self.bootstrap_servers!r}, {self.topics!r})"

    def _consumer(self, on_commit: Callable[[Any, list[Any]], None] | None = None) -> Any:
        config = {"bootstrap.servers": self.bootstrap_servers,
                  "group.id": self.group_id or f"weir-source-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "enable.auto.offset.store": False,
                  "isolation.level": "read_committed", "enable.partition.eof": False,
                  **self.properties,
                  # a split's offset out of range (deleted by retention, a broker that
                  # lost data) is an error, never a silent jump to another offset
                  "auto.offset.reset": "error"}
        if on_commit is not None:
            config["on_commit"] = on_commit
        return kafka_client().Consumer(config)

    def partitions(self, consumer: Any) -> list[tuple[str, int]]:
        """Every (topic, partition) of the source's topics, sorted."""
        found = consumer.list_topics(timeout=TIMEOUT_S).topics
        if isinstance(self.topics, re.Pattern):
            names = sorted(t for t in found if self.topics.fullmatch(t))
        else:
            missing = [t for t in self.topics if t not in found or found[t].error is not None]
            if missing:
                raise SourceError(f"KafkaSource: topics {missing} do not exist on "
                                  f"{self.bootstrap_servers}; create them first")
            names = sorted(self.topics)
        return [(t, p) for t in names for p in sorted(found[t].partitions)]

    def reader(self, subtask: int, parallelism: int, positions: list[Any] | None
               ) -> SourceReader[Any]:
        commits = _Commits(self) if self.commit_offsets else None
        consumer = self._consumer(on_commit=commits)
        try:
            if positions is None:  # a fresh start: this subtask's partitions
                known: set[tuple[str, int]] = set()
                splits = [(t, p) for t, p in self.partitions(consumer)
                          if split_owner(t, p, parallelism) == subtask]
                positions = self._start(consumer, splits)
            else:  # a restore: every subtask's positions; this one keeps its own
                known = {(str(p[0]), int(p[1])) for p in positions}
                positions = [p for p in positions
                             if split_owner(str(p[0]), int(p[1]), parallelism) == subtask]
            return _KafkaReader(self, consumer, [list(p) for p in positions], commits,
                                _Discovery(self, subtask, parallelism, known)
                                if self.discovery_ms is not None else None)
        except BaseException:
            consumer.close()
            raise

    def _start(self, consumer: Any, splits: list[tuple[str, int]]) -> list[list[Any]]:
        """[topic, partition, next offset, end offset or None] of each split."""
        kafka = kafka_client()
        out = []
        chosen = {}  # (topic, partition) -> the offset asked for (-1: none, the end)
        if self.starting_offsets == "committed" and splits:
            for tp in consumer.committed([kafka.TopicPartition(t, p) for t, p in splits],
                                         timeout=TIMEOUT_S):
                if tp.offset >= 0:
                    chosen[(tp.topic, tp.partition)] = tp.offset
        elif isinstance(self.starting_offsets, StartingTimestamp) and splits:
            ms = self.starting_offsets.ms
            for tp in consumer.offsets_for_times(
                    [kafka.TopicPartition(t, p, ms) for t, p in splits], timeout=TIMEOUT_S):
                if tp.error is not None:
                    raise SourceError(f"KafkaSource {self.bootstrap_servers}, {tp.topic}"
                                      f"[{tp.partition}]: the offset at timestamp {ms} "
                                      f"could not be found: {tp.error}")
                chosen[(tp.topic, tp.partition)] = tp.offset
        bounds = offset_bounds(self.bootstrap_servers, splits, self.properties)
        for topic, partition in splits:
            low, stable = bounds[(topic, partition)]
            if self.starting_offsets == "latest":
                start = stable
            elif isinstance(self.starting_offsets, dict):
                start = self.starting_offsets.get((topic, partition), low)
            elif isinstance(self.starting_offsets, StartingTimestamp):
                start = chosen[(topic, partition)]
                if start < 0:  # (no record at or after the time: from the end, as Flink)
                    start = stable
            else:
                start = chosen.get((topic, partition), low)
            out.append([topic, partition, max(low, int(start)),
                        stable if self.bounded else None])
        return out


class _Discovery:
    """When a reader looks for new partitions next, and which partitions are not new
    (those the job knew when the reader started: a restore's positions)."""

    def __init__(self, source: KafkaSource, subtask: int, parallelism: int,
                 known: set[tuple[str, int]]) -> None:
        assert source.discovery_ms is not None
        self.source, self.subtask, self.parallelism = source, subtask, parallelism
        self.known, self.every_s = known, source.discovery_ms / 1000
        self.next = time.monotonic() + self.every_s

    def new_splits(self, consumer: Any, have: Iterable[tuple[str, int]]
                   ) -> list[list[Any]]:
        """The partitions this reader is to start reading now (from their earliest
        offset, as Flink's discovered partitions), once an interval has passed."""
        now = time.monotonic()
        if now < self.next:
            return []
        self.next = now + self.every_s
        try:
            found = self.source.partitions(consumer)
        except Exception as exc:  # (a topic of a list deleted, the broker away: later)
            log.warning("weir: KafkaSource %s: looking for new partitions failed: %s "
                        "(tried again in %.0f s)", self.source.bootstrap_servers, exc,
                        self.every_s)
            return []
        skip = self.known.union(have)
        new = [(t, p) for t, p in found if (t, p) not in skip
               and split_owner(t, p, self.parallelism) == self.subtask]
        if not new:
            return []
        low = offset_bounds(self.source.bootstrap_servers, new, self.source.properties)
        return [[t, p, low[(t, p)][0], None] for t, p in new]


class _Commits:
    """The consumer's ``on_commit``: the offsets the group acknowledged, per split (a
    failed commit is logged: the offsets are for monitoring, never for a restore)."""

    def __init__(self, source: KafkaSource) -> None:
        self.source = source
        #: (topic, partition) -> the offset the group has
        self.done: dict[tuple[str, int], int] = {}

    def __call__(self, error: Any, partitions: list[Any]) -> None:
        if error is not None:
            log.warning("weir: KafkaSource %s: committing offsets to group %r failed: %s "
                        "(the group's offsets lag; the job's checkpoints are unaffected)",
                        self.source.bootstrap_servers, self.source.group_id, error)
            return
        for tp in partitions:
            if tp.error is None:
                self.done[(tp.topic, tp.partition)] = tp.offset
            else:
                log.warning("weir: KafkaSource %s: committing the offset of %s[%d] to "
                            "group %r failed: %s", self.source.bootstrap_servers, tp.topic,
                            tp.partition, self.source.group_id, tp.error)


class _KafkaReader(SourceReader[Any]):
    """A subtask's splits: (topic, partition) each, read by one consumer."""

    def __init__(self, source: KafkaSource, consumer: Any, positions: list[list[Any]],
                 commits: _Commits | None, discovery: _Discovery | None) -> None:
        self.source, self.consumer, self.commits = source, consumer, commits
        self.discovery = discovery
        self._kafka = kafka_client()
        #: (topic, partition) -> [topic, partition, next offset, end or None]
        self._splits = {(p[0], int(p[1])): p for p in positions}
        #: checkpoint id -> the positions at its trigger, to commit once it completes
        self._to_commit: dict[int, list[list[Any]]] = {}
        live = [p for p in positions if not self._done(p)]
        if live:
            consumer.assign([self._kafka.TopicPartition(t, int(p), int(o))
                             for t, p, o, _ in live])

    @staticmethod
    def _done(split: list[Any]) -> bool:
        return split[3] is not None and split[2] >= split[3]

    def _consume(self, max_records: int) -> list[Any] | None:
        """The next messages of the live splits (their positions moved past them);
        None once every split of a bounded source is at its end."""
        splits = self._splits.values()
        if self.source.bounded and all(self._done(s) for s in splits):
            return None
        if self.discovery is not None:
            new = self.discovery.new_splits(self.consumer, self._splits)
            if new:
                for split in new:
                    self._splits[(split[0], split[1])] = split
                self.consumer.incremental_assign(
                    [self._kafka.TopicPartition(t, p, o) for t, p, o, _ in new])
        if all(self._done(s) for s in splits):
            return []  # (no split here: an idle reader of an unbounded source)
        messages = self.consumer.consume(num_messages=max(1, max_records), timeout=0.05)
        out = []
        ended = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == self._kafka.KafkaError._PARTITION_EOF:
                    continue
                raise SourceError(
                    f"KafkaSource {self.source.bootstrap_servers}, {message.topic()}"
                    f"[{message.partition()}]: {error} (an offset out of range: its records "
                    f"were deleted by retention or lost by the broker; to skip them, "
                    f"restore from a savepoint rewritten with other offsets)")
            split = self._splits[(message.topic(), message.partition())]
            if split[3] is not None and message.offset() >= split[3]:
                # past the end of a bounded split: every offset before it is read (the
                # ones not seen were transaction markers or aborted records)
                if split[2] < split[3]:
                    split[2] = split[3]
                    ended.append(split)
                continue
            split[2] = message.offset() + 1
            out.append(message)
        if ended:
            self.consumer.incremental_unassign(
                [self._kafka.TopicPartition(s[0], int(s[1])) for s in ended])
        if not messages:  # (control records move the position without a message)
            self._catch_up()
        return out

    def poll(self, max_records: int) -> list[Any] | None:
        messages = self._consume(max_records)
        if messages is None:
            return None
        deserialize = self.source.deserializer
        return [deserialize(record_of(message)) for message in messages]

    def poll_splits(self, max_records: int) -> list[tuple[Hashable, list[Any]]] | None:
        messages = self._consume(max_records)
        if messages is None:
            return None
        deserialize = self.source.deserializer
        groups: dict[Hashable, list[Any]] = {}
        for message in messages:
            split = (message.topic(), message.partition())
            records = groups.get(split)
            if records is None:
                records = groups[split] = []
            records.append(deserialize(record_of(message)))
        return list(groups.items())

    def live_splits(self) -> list[Hashable] | None:
        """Every (topic, partition) not at the end of a bounded read."""
        return [split for split, s in self._splits.items() if not self._done(s)]

    def _catch_up(self) -> None:
        """Take each bounded split's position from the consumer (past transaction markers)
        and stop reading the splits at their end."""
        bounded = [s for s in self._splits.values() if s[3] is not None and not self._done(s)]
        if not bounded:
            return
        for tp in self.consumer.position([self._kafka.TopicPartition(s[0], int(s[1]))
                                          for s in bounded]):
            split = self._splits[(tp.topic, tp.partition)]
            if tp.offset >= 0 and tp.offset > split[2]:
                split[2] = tp.offset
        done = [s for s in bounded if self._done(s)]
        if done:
            self.consumer.incremental_unassign(
                [self._kafka.TopicPartition(s[0], int(s[1])) for s in done])

    def positions(self) -> list[Any]:
        return [list(p) for p in self._splits.values()]

    def snapshot_positions(self, checkpoint_id: int) -> list[Any]:
        positions = self.positions()
        if self.commits is not None:
            self._to_commit[checkpoint_id] = positions
        return positions

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Commit the offsets of checkpoint ``checkpoint_id``'s trigger to the consumer
        group, asynchronously (Flink's KafkaSourceReader): those the group does not have
        yet. Earlier checkpoints' offsets are dropped (this one's supersede them)."""
        positions = self._to_commit.pop(checkpoint_id, None)
        for older in [c for c in self._to_commit if c < checkpoint_id]:
            del self._to_commit[older]
        if positions is None or self.commits is None:
            return
        have = self.commits.done
        offsets = [self._kafka.TopicPartition(t, int(p), int(o)) for t, p, o, _ in positions
                   if have.get((t, int(p))) != o]
        if not offsets:
            return
        try:
            self.consumer.commit(offsets=offsets, asynchronous=True)
        except Exception as exc:  # (e.g. the broker unreachable: for monitoring only)
            log.warning("weir: KafkaSource %s: committing the offsets of checkpoint %d to "
                        "group %r failed: %s (the group's offsets lag; the job's "
                        "checkpoints are unaffected)", self.source.bootstrap_servers,
                        checkpoint_id, self.source.group_id, exc)

    def close(self) -> None:
        self.consumer.close()
