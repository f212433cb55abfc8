"""Task processes forked by the zygote: exit statuses reported as Popen's, a killed
zygote replaced and its tasks killed, and no task outliving a driver that died."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from weir.runtime.continuous import zygote


class Sleep:
    """Unpickling it sleeps: the graph file of a task that runs until killed."""

    def __reduce__(self) -> tuple[object, tuple[float]]:
        return time.sleep, (120.0,)


class Fail:
    """Unpickling it raises: the graph file of a task that fails."""

    def __reduce__(self) -> tuple[object, tuple[int, int]]:
        return divmod, (1, 0)


def graph_file(tmp_path: Path, content: object) -> str:
    path = tmp_path / f"{type(content).__name__}.pickle"
    path.write_bytes(pickle.dumps(content))
    return str(path)


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while running(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.01)


def test_exit_statuses_are_reported_like_popen(tmp_path: Path) -> None:
    failing = zygote.launch([graph_file(tmp_path, Fail()), "v", "0", "0"], dict(os.environ))
    assert failing.wait(timeout=30) == 1 and failing.poll() == 1
    sleeping = zygote.launch([graph_file(tmp_path, Sleep()), "v", "0", "0"],
                             dict(os.environ))
    assert sleeping.poll() is None and running(sleeping.pid)
    with pytest.raises(subprocess.TimeoutExpired):
        sleeping.wait(timeout=0.1)
    sleeping.kill()
    assert sleeping.wait(timeout=10) == -signal.SIGKILL
    sleeping.kill()  # (already ended: nothing happens)


def test_a_task_is_killed_by_its_zygote_never_by_pid_from_the_driver(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The zygote, the task's parent, sends the SIGKILL: a task it has not reaped still
    holds its pid. A driver that signalled the pid itself could hit another process
    that got the pid of a task that had just ended (a CI run lost a fresh task so)."""
    def no_kill_by_pid(pid: int, sig: int) -> None:
        raise AssertionError(f"the driver signalled pid {pid} itself")

    sleeping = zygote.launch([graph_file(tmp_path, Sleep()), "v", "0", "0"],
                             dict(os.environ))
    monkeypatch.setattr(zygote.os, "kill", no_kill_by_pid)
    sleeping.kill()
    assert sleeping.wait(timeout=10) == -signal.SIGKILL
    failed = zygote.launch([graph_file(tmp_path, Fail()), "v", "0", "0"], dict(os.environ))
    assert failed.wait(timeout=30) == 1
    monkeypatch.undo()
    assert zygote._zygote is not None
    zygote._zygote._request({"kill": failed._launch})  # (reaped: the zygote ignores it)
    again = zygote.launch([graph_file(tmp_path, Fail()), "v", "0", "0"], dict(os.environ))
    assert again.wait(timeout=30) == 1 and zygote._zygote.alive


def test_a_zygote_that_does_not_answer_is_killed_before_it_is_replaced(tmp_path: Path
                                                                      ) -> None:
    """A hung zygote (SIGSTOP) would fork the pending task once it woke up: nobody would
    track that task. The launch kills it (and what it forked) and forks on a new one."""
    first = zygote.launch([graph_file(tmp_path, Sleep()), "v", "0", "0"], dict(os.environ))
    hung = zygote._zygote
    assert hung is not None
    hung.answer_timeout_s = 0.5  # (its replacement waits as long as it needs to start)
    os.kill(hung.proc.pid, signal.SIGSTOP)
    try:
        again = zygote.launch([graph_file(tmp_path, Fail()), "v", "0", "0"], dict(os.environ))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(hung.proc.pid, signal.SIGCONT)
    assert zygote._zygote is not hung and hung.proc.poll() == -signal.SIGKILL
    assert first.wait(timeout=10) == -signal.SIGKILL  # (it died with its zygote)
    wait_gone(first.pid)
    assert again.wait(timeout=30) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG: Linux")
def test_a_task_asks_linux_to_kill_it_when_its_zygote_dies(tmp_path: Path) -> None:
    """A task reads back its parent-death signal (``PR_GET_PDEATHSIG``): SIGKILL, so the
    driver never needs to kill a dead zygote's tasks by pid."""
    code = ("import ctypes, pathlib; v = ctypes.c_int(); "
            "ctypes.CDLL('libc.so.6').prctl(2, ctypes.byref(v)); "
            "pathlib.Path('pdeathsig').write_text(str(v.value))")

    class Run:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return exec, (code,)

    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        task = zygote.launch([graph_file(tmp_path, Run()), "v", "0", "0"], dict(os.environ))
    finally:
        os.chdir(here)
    task.wait(timeout=30)
    assert zygote._DIE_WITH_ZYGOTE
    assert (tmp_path / "pdeathsig").read_text() == str(int(signal.SIGKILL))


def test_a_task_gets_the_environment_and_directory_it_asked_for(tmp_path: Path) -> None:
    code = ("import os, pathlib; pathlib.Path('seen').write_text("
            "os.environ['ONLY_THIS'] + ' ' + str('HOME' in os.environ))")

    class Run:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return exec, (code,)

    work = tmp_path / "work"
    work.mkdir()
    here = os.getcwd()
    os.chdir(work)
    try:
        task = zygote.launch([graph_file(tmp_path, Run()), "v", "0", "0"],
                             {"ONLY_THIS": "yes"})
    finally:
        os.chdir(here)
    task.wait(timeout=30)
    assert (work / "seen").read_text() == "yes False"


def test_a_killed_zygote_takes_its_tasks_along_and_is_replaced(tmp_path: Path) -> None:
    task = zygote.launch([graph_file(tmp_path, Sleep()), "v", "0", "0"], dict(os.environ))
    first = zygote._zygote
    assert first is not None
    os.kill(first.proc.pid, signal.SIGKILL)
    assert task.wait(timeout=10) == -signal.SIGKILL  # it died with its zygote
    wait_gone(task.pid)
    again = zygote.launch([graph_file(tmp_path, Fail()), "v", "0", "0"], dict(os.environ))
    assert zygote._zygote is not first and again.wait(timeout=30) == 1


def test_no_task_outlives_a_driver_that_died(tmp_path: Path) -> None:
    driver = textwrap.dedent(f"""
        import os, pickle, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_continuous_zygote import Sleep, graph_file
        from pathlib import Path
        from weir.runtime.continuous import zygote
        task = zygote.launch([graph_file(Path({str(tmp_path)!r}), Sleep()), "v", "0", "0"],
                             dict(os.environ))
        print(task.pid, zygote._zygote.proc.pid, flush=True)
        os._exit(0)  # no clean-up: as if killed
    """)
    out = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    task_pid, zygote_pid = map(int, out.split())
    wait_gone(zygote_pid)
    wait_gone(task_pid)


def test_a_task_that_gets_the_pid_of_an_ended_one_is_not_taken_for_ended() -> None:
    """Linux reuses a pid once its process is reaped; a driver that launched many tasks
    must not read an old task's exit status as a new one's (seen in a full run: a
    sleeping task's ``wait`` returned an earlier task's 0 at once)."""
    read, write = os.pipe()
    follower = zygote._Zygote.__new__(zygote._Zygote)
    follower._follow(os.fdopen(read, "rb"))
    with os.fdopen(write, "w", buffering=1) as replies:
        replies.write('{"pid": 4242}\n')
        first = follower._answer()
        replies.write('{"exit": 4242, "status": 0}\n')
        assert first.wait(timeout=10) == 0
        replies.write('{"pid": 4242}\n')  # the same pid, handed out again
        second = follower._answer()
        assert second.pid == 4242 and second.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            second.wait(timeout=0.1)
        replies.write('{"exit": 4242, "status": -9}\n')
        assert second.wait(timeout=10) == -signal.SIGKILL
        assert first.poll() == 0
    follower.reader.join(timeout=10)
    assert not follower.alive and not follower.running
