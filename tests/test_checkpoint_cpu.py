"""The CPU time a process spends on checkpoints (weir.runtime.checkpoint_cpu): thread
CPU time of the blocks counted, nested blocks once, waits not, from any thread. Run in
a fresh interpreter: the count is the process's, and a test process may still have
another test's upload threads counting."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import threading, time
from weir.runtime.checkpoint_cpu import checkpoint_cpu_ns, counted, counting

def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

with counting():
    spin(0.02)
    with counting():
        spin(0.02)
nested = checkpoint_cpu_ns()
with counting():
    time.sleep(0.05)
waited = checkpoint_cpu_ns() - nested
worker = threading.Thread(target=counted(lambda: spin(0.03)))
worker.start()
worker.join()
print(nested, waited, checkpoint_cpu_ns() - nested - waited)
"""


def test_blocks_count_their_threads_cpu_once_and_waits_not_at_all() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    nested, waited, other_thread = (int(v) for v in out.split())
    assert 40e6 <= nested < 55e6  # 40 ms of CPU counted once, not 60
    assert waited < 10e6  # a sleep (an fsync, a lock) is not CPU
    assert 30e6 <= other_thread < 45e6  # counted() in another thread
