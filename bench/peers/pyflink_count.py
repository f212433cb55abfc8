"""PyFlink peer of ``bench/continuous_keyed_count.py``: a running count per key.

The numbers ``0 .. N-1`` from Flink's ``NumberSequenceSource`` (parallel, in the JVM),
keyed by ``(n * 7919) % K`` (a Python key selector, as weir's bench keys them), into a
Python ``KeyedProcessFunction`` holding the count in a ``ValueState``; it emits nothing,
into Flink's ``DiscardingSink``. Parallelism 2, Python in thread mode
(``python.execution-mode: thread``: the functions run in a CPython embedded in the
JVM through pemja; locally that is the JVM the client starts, so it gets ``PYTHONPATH``
to this interpreter's site-packages). ``--checkpoint-ms`` > 0: exactly-once
checkpoints at that interval into a local directory (the default hash-map state
backend); 0: checkpointing off.

Run it with the peers' interpreter (``make peers``):
``.venv-peers/bin/python bench/peers/pyflink_count.py --records 1000000 --keys 200000``.
Prints one JSON line: ``records``, ``seconds`` (from starting the JVM to the end of
``execute()``: the start-up a user's run pays), ``records_per_s``, ``startup_s`` (the
JVM gateway start alone) and ``checkpoints`` (the last checkpoint id, with
checkpointing on). ``--marks DIR``: every subtask of the count writes
``(monotonic time, records so far)`` every ``--mark-every`` records into DIR (the
caller computes a steady-state rate from them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=200_000)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--checkpoint-ms", type=int, default=0, help="0: checkpointing off")
    p.add_argument("--marks", default=None, help="directory for progress marks")
    p.add_argument("--mark-every", type=int, default=20_000)
    args = p.parse_args(argv)

    try:
        from pyflink.common import Types, WatermarkStrategy
        from pyflink.datastream import (
            KeyedProcessFunction,
            RuntimeContext,
        )
        from pyflink.datastream.connectors.base import Sink
        from pyflink.datastream.connectors.number_seq import NumberSequenceSource
        from pyflink.datastream.state import ValueStateDescriptor
        from pyflink.java_gateway import get_gateway
    except ImportError as e:
        raise SystemExit(f"pyflink_count: cannot import PyFlink ({e}); run `make peers` and "
                         f"use .venv-peers/bin/python") from e

    class Count(KeyedProcessFunction):  # type: ignore[misc]
        """A running count per key in a ValueState; emits nothing."""

        def __init__(self, marks: str | None, every: int) -> None:
            self.marks_dir, self.every = marks, every

        def open(self, runtime_context: RuntimeContext) -> None:
            self.count = runtime_context.get_state(
                ValueStateDescriptor("count", Types.LONG()))
            self.n = 0
            self.marks: list[tuple[float, int]] = []

        def process_element(self, value: int, ctx: Any) -> None:
            c = self.count.value()
            self.count.update(1 if c is None else c + 1)
            self.n += 1
            if self.n % self.every == 0:
                self.marks.append((time.monotonic(), self.n))

        def close(self) -> None:
            if self.marks_dir:
                import json as _json
                import uuid

                path = Path(self.marks_dir) / f"pyflink-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
                path.write_text(_json.dumps(self.marks))

    keys = args.keys
    checkpoints = Path(tempfile.mkdtemp(prefix="weir-bench-pyflink-"))
    started = time.perf_counter()
    env = thread_mode_environment(
        args.parallelism, args.checkpoint_ms, checkpoints,
        # (kept, so the last checkpoint's id can be read from its directory)
        {"execution.checkpointing.externalized-checkpoint-retention":
         "RETAIN_ON_CANCELLATION"} if args.checkpoint_ms > 0 else {})
    startup = time.perf_counter() - started
    discard = Sink(get_gateway().jvm.org.apache.flink.streaming.api.functions.sink.v2
                   .DiscardingSink())
    (env.from_source(NumberSequenceSource(0, args.records - 1),
                     WatermarkStrategy.no_watermarks(), "numbers", type_info=Types.LONG())
        .key_by(lambda n: (n * 7919) % keys, key_type=Types.LONG())
        .process(Count(args.marks, args.mark_every))
        .sink_to(discard))
    env.execute("weir-bench-pyflink-count")
    seconds = time.perf_counter() - started

    last = None
    if args.checkpoint_ms > 0:
        ids = [int(m.group(1)) for d in checkpoints.rglob("chk-*")
               if (m := re.fullmatch(r"chk-(\d+)", d.name))]
        last = max(ids, default=0)
    import shutil

    shutil.rmtree(checkpoints, ignore_errors=True)
    print(json.dumps({"peer": "pyflink", "records": args.records, "keys": keys,
                      "seconds": round(seconds, 2),
                      "records_per_s": round(args.records / seconds),
                      "startup_s": round(startup, 2), "checkpoints": last}), flush=True)
    return 0


def thread_mode_environment(parallelism: int, checkpoint_ms: int, checkpoints: Path,
                            settings: dict[str, str]) -> Any:
    """PyFlink's ``StreamExecutionEnvironment`` in thread mode at ``parallelism``, with
    the Flink ``settings`` and, when ``checkpoint_ms`` > 0, exactly-once checkpoints at
    that interval into ``checkpoints``. Thread mode embeds CPython in the JVM, which gets
    ``PYTHONPATH`` to this interpreter's site-packages to find pyflink there."""
    from pyflink.common import Configuration
    from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment

    site = sysconfig.get_paths()["purelib"]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        x for x in (site, os.environ.get("PYTHONPATH")) if x)
    config = Configuration()
    for key, value in {"python.execution-mode": "thread",
                       "parallelism.default": str(parallelism),
                       "python.executable": sys.executable,
                       "python.client.executable": sys.executable, **settings}.items():
        config.set_string(key, value)
    if checkpoint_ms > 0:
        config.set_string("execution.checkpointing.dir", checkpoints.as_uri())
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(parallelism)
    if checkpoint_ms > 0:
        env.enable_checkpointing(checkpoint_ms, CheckpointingMode.EXACTLY_ONCE)
    return env


if __name__ == "__main__":
    raise SystemExit(main())
