"""Processes by ``/proc`` for the fault tests (Linux)."""

from __future__ import annotations

import os
from pathlib import Path


def parent(pid: int) -> int | None:
    """The parent pid of ``pid`` (None: it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(raw[raw.rindex(")") + 2:].split()[1])


def descendants(root: int) -> set[int]:
    """Every process below ``root`` now (by the parent pids in ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        ppid = parent(int(entry))
        if ppid is not None:
            children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
