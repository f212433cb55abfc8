"""The card fraud pipeline on the continuous runtime, Kafka in and Kafka out.

1. Start a Kafka broker of its own (noida-db, on a free 127.0.0.1 port, in a temporary
   data directory: :mod:`._kafka_broker`), create the topics ``payments`` (4
   partitions), ``rules`` (1), ``alerts`` and ``dead-letters``, and produce the
   demo's deterministic card transactions (:mod:`.fraud_stream`: fixed seed, planted
   fraud, out of order by up to 20 s, some invalid) into ``payments`` as JSON, keyed
   by card (a card's payments are in one partition, in arrival order), and the
   versioned per-category limits into ``rules``.
2. Run the job (the detector is :mod:`.fraud_continuous`'s, unchanged)::

       KafkaSource(payments) ─ watermarks per partition (30 s) ─ key_by card ┐
                                                                             ├─ CardFraudDetector ┐
       KafkaSource(rules) ─ broadcast(CATEGORY_LIMITS) ──────────────────────┘   (RocksDB)        │
                                                                                                  │
       alerts ─────── KafkaSink(alerts, EXACTLY_ONCE) ◄───────────────────────────────────────────┤
       dead letters ─ KafkaSink(dead-letters, EXACTLY_ONCE) ◄─────────────────────────────────────┘

   with checkpoints every 200 ms; each partition has its own watermark, so payments
   interleaved across partitions are never late. With ``--kill``, one of the
   detector's task processes is killed with SIGKILL once checkpoints have completed:
   the job restarts from its latest checkpoint (Kafka offsets rewound, the sinks'
   pending transactions committed once).
3. Read ``alerts`` and ``dead-letters`` back (``read_committed``) and compare them, and
   every card's state in the final checkpoint, with the plain-Python oracle (no weir,
   no Kafka). Exit 1 unless every count is zero. The broker and every file are
   removed at the end (on Ctrl-C and errors too).

``python -m weir.examples.fraud_kafka [--kill] [--events N] [--cards C] [--seed S]
[--kill-after K] [--work DIR] [--keep]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

import weir
from weir.connectors.kafka import DeliveryGuarantee, KafkaRecord, KafkaSink, KafkaSource
from weir.examples._kafka_broker import Broker, noida_db
from weir.examples.fraud import CATEGORY_LIMITS, CardFraudDetector, InvalidTransaction
from weir.examples.fraud_continuous import (
    UID,
    card_of,
    check_state,
    event_time,
    kill_a_detector,
)
from weir.examples.fraud_job import WATERMARK_DELAY_MS
from weir.examples.fraud_stream import MAX_DELAY_MS, Expected, Stream, generate, oracle
from weir.examples.fraud_verify import (
    check_alerts,
    check_dead_letters,
    in_work_directory,
    verification_table,
)

PARALLELISM = 2
PAYMENTS, RULES, ALERTS, DEAD_LETTERS = "payments", "rules", "alerts", "dead-letters"
TOPICS = {PAYMENTS: 4, RULES: 1, ALERTS: 2, DEAD_LETTERS: 1}
GROUP = "weir-fraud-detector"


def from_json(record: KafkaRecord) -> Any:
    """A record's value, as the JSON it holds."""
    return json.loads(record.value or b"null")


def to_json(row: dict[str, Any]) -> tuple[bytes | None, bytes]:
    """A row as a Kafka record: keyed by its card (if it has one), the row as JSON."""
    card = row.get("card_id")
    return (card.encode() if isinstance(card, str) else None), json.dumps(row).encode()


def produce(bootstrap: str, stream: Stream) -> None:
    """The transactions into ``payments`` (in arrival order) and the rules into
    ``rules``, all acknowledged."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "enable.idempotence": True})
    records = [(PAYMENTS, t) for t in stream.events] + [
        (RULES, r) for rules in stream.rules for r in rules]
    for topic, row in records:
        key, value = to_json(row)
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:  # (the producer's queue is full: let it send)
                producer.poll(0.05)
    left = producer.flush(60)
    if left:
        raise RuntimeError(f"{left} records were not acknowledged by the broker")


def build(bootstrap: str, work: Path) -> Any:
    """The job's environment, with the pipeline declared (checkpoints in
    ``work/checkpoints``)."""
    from weir.stream import (
        CheckpointConfig,
        RestartStrategy,
        StreamEnvironment,
        WatermarkStrategy,
    )

    env = StreamEnvironment(weir.JobConfig(
        work / "checkpoints", parallelism=PARALLELISM, max_parallelism=128,
        state_backend=weir.RocksDBStateBackend(),
        checkpointing=CheckpointConfig(interval="200 ms"),
        restart_strategy=RestartStrategy.fixed_delay(attempts=3, delay="500 ms")))

    def sink(topic: str) -> KafkaSink:
        return KafkaSink(bootstrap, topic, delivery_guarantee=DeliveryGuarantee.EXACTLY_ONCE,
                         transactional_id_prefix=f"weir-fraud-{topic}", serializer=to_json)

    limits = env.from_source(KafkaSource(bootstrap, RULES, bounded=True,
                                         deserializer=from_json), uid="rules", parallelism=1)
    (env.from_source(KafkaSource(bootstrap, PAYMENTS, bounded=True, group_id=GROUP,
                                 deserializer=from_json), uid="payments",
                     watermarks=WatermarkStrategy.bounded_out_of_orderness(
                         WATERMARK_DELAY_MS, event_time))
        .key_by(card_of)
        .connect(limits.broadcast(CATEGORY_LIMITS))
        .process(CardFraudDetector(limits_at_watermark=True), uid=UID,
                 bad_record_exceptions=[InvalidTransaction], dead_letters=sink(DEAD_LETTERS))
        .sink_to(sink(ALERTS), uid="alerts"))
    return env


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m weir.examples.fraud_kafka",
        description="Card fraud detection on weir's continuous runtime, Kafka in and out "
                    "(a broker of its own), exactly once; verified against a plain-Python "
                    "oracle.")
    parser.add_argument("--kill", action="store_true",
                        help="kill one of the detector's task processes with SIGKILL "
                             "mid-run (the job restarts from its latest checkpoint)")
    parser.add_argument("--events", type=int, default=30_000)
    parser.add_argument("--cards", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--kill-after", type=int, default=2,
                        help="with --kill: kill once this many checkpoints completed")
    parser.add_argument("--work", default=None,
                        help="work directory (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (the broker's data is removed)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for the job")
    return parser.parse_args(list(argv))


def main(argv: Sequence[str] = ()) -> int:
    """Run the demo; 0 only if every verified count is zero."""
    args = _parse(argv)
    console = Console()
    try:
        noida_db()
    except RuntimeError as exc:
        console.print(f"[bold red]{exc}[/]")
        return 2
    try:
        return in_work_directory(args.work, args.keep, "weir-fraud-kafka-", console,
                                 lambda work: _demo(args, work.resolve(), console))
    except KeyboardInterrupt:
        console.print("[bold red]interrupted[/] (broker stopped, files removed)")
        return 130


def _demo(args: argparse.Namespace, work: Path, console: Console) -> int:
    t0 = time.perf_counter()
    console.rule("[bold]weir demo: card fraud detection, Kafka in and out, exactly once"
                 + (", kill -9 mid-run" if args.kill else ""))
    stream = generate(args.events, args.cards, args.seed)
    expected = oracle(stream)
    with Broker(work / "kafka") as broker:
        broker.create_topics(TOPICS)
        produce(broker.bootstrap, stream)
        console.print(
            f"[bold]broker[/] noida-db on {broker.bootstrap} (up and "
            f"{len(stream.events):,} payments in {time.perf_counter() - t0:.1f} s)")
        console.print(
            f"[bold]input[/]  {len(stream.events):,} card transactions in '{PAYMENTS}' "
            f"({TOPICS[PAYMENTS]} partitions, keyed by card; seed {args.seed}; "
            f"{args.cards:,} cards; {len(expected.dead)} invalid; out of order by up to "
            f"{MAX_DELAY_MS // 1000} s), {sum(map(len, stream.rules))} versioned limits "
            f"in '{RULES}'")
        console.print(
            f"[bold]job[/]    KafkaSource('{PAYMENTS}', p={PARALLELISM}, watermarks per "
            f"partition, {WATERMARK_DELAY_MS // 1000} s) + KafkaSource('{RULES}', broadcast) "
            f"-> CardFraudDetector (RocksDB, event time) -> KafkaSink('{ALERTS}', "
            f"EXACTLY_ONCE); dead letters -> KafkaSink('{DEAD_LETTERS}', EXACTLY_ONCE); "
            f"checkpoints every 200 ms")
        return _run(args, broker.bootstrap, work, stream, expected, console, t0)


def _run(args: argparse.Namespace, bootstrap: str, work: Path, stream: Stream,
         expected: Expected, console: Console, t0: float) -> int:
    from weir.connectors.kafka import read_kafka
    from weir.errors import JobFailedError

    client = build(bootstrap, work).execute_async("card-fraud-kafka", timeout=args.timeout)
    try:
        victim = None
        killed = kill_a_detector(client, args.kill_after, args.seed) if args.kill else None
        if killed is not None:
            victim, done = killed
            console.print(
                f"[bold red]kill -9[/] task {victim.vertex}[{victim.subtask}] (pid "
                f"{victim.pid}) {time.perf_counter() - t0:.1f} s in, after {len(done)} "
                f"completed checkpoints ({len(read_kafka(bootstrap, ALERTS)):,} of "
                f"{len(expected.alerts):,} alerts committed then)")
        try:
            result = client.wait()
        except JobFailedError as exc:
            console.print(f"[bold red]the job failed: {exc}[/]")
            return 1
    finally:
        if not client.done:  # (Ctrl-C, or an error here: stop its task processes)
            client.cancel()
    if args.kill and victim is None:
        console.print("[bold red]the job finished before it could be killed (raise "
                      "--events or lower --kill-after)[/]")
        return 1
    console.print(
        f"job done in {result.duration_s:.1f} s: {len(result.completed)} checkpoints "
        f"completed, {result.restarts} restarts"
        + (f" ({'; '.join(result.failures)})" if result.failures else ""))

    alert_rows = [from_json(r) for r in read_kafka(bootstrap, ALERTS)]
    letters = [from_json(r) for r in read_kafka(bootstrap, DEAD_LETTERS)]
    alerts = check_alerts(alert_rows, expected)
    dead = check_dead_letters(letters, expected)
    state = check_state(work, expected)
    checks = [alerts, dead, *state]
    console.print(verification_table(
        checks, f"'{ALERTS}' and '{DEAD_LETTERS}' (read_committed) and the final "
                f"checkpoint's state against the plain-Python oracle"))
    kills = 1 if args.kill else 0
    ok = (all(c.ok for c in checks) and alerts.got == alerts.expected > 0
          and result.restarts == kills)
    style = "bold green" if ok else "bold red"
    console.print(f"payments in:    {len(stream.events):,}")
    console.print(f"alerts out:     {alerts.got:,} (oracle: {alerts.expected:,})")
    console.print(f"dead letters:   {dead.got:,} (oracle: {dead.expected:,})")
    console.print(f"checkpoints:    {len(result.completed)}")
    console.print(f"kills:          {kills}, restarts: {result.restarts}")
    console.print(f"[{style}]exactly once: {'yes' if ok else 'NO'}[/] (lost "
                  f"{sum(c.lost for c in checks)}, duplicated "
                  f"{sum(c.duplicated for c in checks)}, wrong {sum(c.wrong for c in checks)}; "
                  f"demo wall time {time.perf_counter() - t0:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
