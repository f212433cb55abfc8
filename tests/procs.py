"""Processes by ``/proc`` for the fault tests (Linux)."""

from __future__ import annotations

import os
from pathlib import Path


def descendants(root: int) -> set[int]:
    """Every process below ``root`` now (by the parent pids in ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(raw[raw.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
