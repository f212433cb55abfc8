"""PyFlink peer of ``bench/continuous_latency.py``: end-to-end latency at a fixed rate.

PyFlink has no Python source, so the rate is set by the first Python operator: Flink's
``NumberSequenceSource`` (parallel, in the JVM) feeds a chained Python ``map`` that
waits until each number is due (``--rate`` records/s in total, ``rate / p`` per
subtask) and stamps it ``[wall-clock seconds, n]``; the source is held back by it
(backpressure), so records enter the pipeline at the rate. Keyed by ``n % K`` into a
Python ``KeyedProcessFunction`` with the count in a ``ValueState`` that forwards the
record, into a Python ``map`` that notes ``(stamp, now - stamp)``, into Flink's
``DiscardingSink``. Parallelism 2, thread mode (as ``pyflink_count.py``). Tuned for
latency as Flink's docs advise: network buffer timeout 10 ms (weir's default; Flink's
is 100 ms) and Python bundles of at most 10 ms (``python.fn-execution.bundle.time``;
the default 1 s holds results back for up to a second). ``--checkpoint-ms`` > 0:
exactly-once checkpoints at that interval (hash-map state backend).

Run it with the peers' interpreter (``make peers``): ``.venv-peers/bin/python
bench/peers/pyflink_latency.py --rate 10000 --seconds 35 --notes DIR``. Each subtask of
the last map writes its notes to ``DIR/pyflink-*.json``; the caller computes
percentiles.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from pyflink_count import thread_mode_environment
except ImportError:  # imported as bench.peers.pyflink_latency
    from bench.peers.pyflink_count import thread_mode_environment

#: Flink's network buffer timeout and Python bundle time, ms (see the module doc)
LATENCY_MS = 10


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=10_000, help="records/s in total")
    p.add_argument("--seconds", type=float, default=35.0)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--checkpoint-ms", type=int, default=1000, help="0: checkpointing off")
    p.add_argument("--notes", required=True, help="directory for the latency notes")
    args = p.parse_args(argv)

    try:
        from pyflink.common import Types, WatermarkStrategy
        from pyflink.datastream import (
            KeyedProcessFunction,
            MapFunction,
            RuntimeContext,
        )
        from pyflink.datastream.connectors.base import Sink
        from pyflink.datastream.connectors.number_seq import NumberSequenceSource
        from pyflink.datastream.state import ValueStateDescriptor
        from pyflink.java_gateway import get_gateway
    except ImportError as e:
        raise SystemExit(f"pyflink_latency: cannot import PyFlink ({e}); run `make peers` "
                         f"and use .venv-peers/bin/python") from e

    per_subtask = args.rate / args.parallelism
    seconds = args.seconds

    class Pace(MapFunction):  # type: ignore[misc]
        """Lets number k of this subtask through at k / rate s after its first."""

        def open(self, runtime_context: RuntimeContext) -> None:
            self.started: float | None = None
            self.emitted = 0

        def map(self, n: int) -> list[float]:
            if self.started is None:
                self.started = time.monotonic()
            wait = self.emitted / per_subtask - (time.monotonic() - self.started)
            if wait > 0:
                time.sleep(wait)
            self.emitted += 1
            return [time.time(), float(n)]

    class Count(KeyedProcessFunction):  # type: ignore[misc]
        def open(self, runtime_context: RuntimeContext) -> None:
            self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

        def process_element(self, value: list[float], ctx: Any) -> Any:
            c = self.count.value()
            self.count.update(1 if c is None else c + 1)
            yield value

    class Note(MapFunction):  # type: ignore[misc]
        def __init__(self, notes: str) -> None:
            self.directory = notes

        def open(self, runtime_context: RuntimeContext) -> None:
            self.notes: list[tuple[float, float]] = []

        def map(self, value: list[float]) -> int:
            self.notes.append((value[0], time.time() - value[0]))
            return 0

        def close(self) -> None:
            import json
            import uuid

            path = Path(self.directory) / f"pyflink-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
            path.write_text(json.dumps(self.notes))

    checkpoints = Path(tempfile.mkdtemp(prefix="weir-bench-pyflink-"))
    env = thread_mode_environment(
        args.parallelism, args.checkpoint_ms, checkpoints,
        {"execution.buffer-timeout.interval": f"{LATENCY_MS} ms",
         "python.fn-execution.bundle.time": str(LATENCY_MS)})
    env.set_buffer_timeout(LATENCY_MS)
    discard = Sink(get_gateway().jvm.org.apache.flink.streaming.api.functions.sink.v2
                   .DiscardingSink())
    count = int(args.rate * seconds)
    keys = args.keys
    row = Types.LIST(Types.DOUBLE())
    (env.from_source(NumberSequenceSource(0, count - 1), WatermarkStrategy.no_watermarks(),
                     "numbers", type_info=Types.LONG())
        .map(Pace(), output_type=row)
        .key_by(lambda r: int(r[1]) % keys, key_type=Types.LONG())
        .process(Count(), output_type=row)
        .map(Note(args.notes), output_type=Types.INT())
        .sink_to(discard))
    env.execute("weir-bench-pyflink-latency")
    import shutil

    shutil.rmtree(checkpoints, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
