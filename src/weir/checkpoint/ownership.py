"""Who owns a checkpoint storage: a chain of claims, extended by compare-and-set.

One mechanism for both runtimes (the place of Flink's leader election and
``CheckpointIDCounter``: one writer per checkpoint storage at a time). The claims live
in ``claims/`` of the storage they guard: on the Spark runtime each operator uid's
directory (``stages/<uid-dir>/``, :mod:`weir.checkpoint.epochs`), on the continuous
runtime the job's checkpoint storage root (:mod:`weir.checkpoint.protocol`)::

    claims/<token>.json      a claim (token: 10 digits, from 1), created exclusively:
                             of several writers of token n+1 exactly one succeeds, so
                             the chain never forks. JSON:
                             {"format": "weir-claim", "version": 1, "token": n,
                              "kind": "query" | "recovery",
                              "query": <owner: a Spark query id, a continuous run id> | null,
                              "batch": <first epoch of the claim: a Spark batch, a
                                        continuous checkpoint id> | null,
                              "source": <checkpoint/savepoint URL> | null (empty state),
                              "source_note": <what the source is, for people>,
                              "claimed_ms": ..., "reason": ...,
                              "lineage": <continuous runtime: the job's lineage id> (optional),
                              "host": ..., "pid": ..., "process": ... (optional: the
                              owner's driver)}
    claims/<token>.alive     {"ms": ...}: the owner ran then (renewed at most every
                             lease_timeout / 4: by a Spark query's tasks, by a continuous
                             job's driver, which adds "last_completed": <id> | null)
    claims/<token>.released  {"ms": ...}: the owner stopped (weir.spark.finish, the
                             driver's listener when the query terminated, the end of a
                             continuous job, which adds "next_id", "last_completed",
                             "savepoint": <its stop savepoint's URL> | absent, and
                             "discarded": true when it deleted its checkpoints)
    claims/stopped-<query>.json  {"ms": ...}: that query stopped; every claim of it
                             counts as released, also one a task still running when
                             the query stopped writes afterwards (Spark lets a killed
                             task's Python worker run on for up to
                             ``spark.python.task.killTimeout``). Written by the driver
                             on stages a takeover could reach; deleted by the next
                             claim of another query

The claim with the highest token is the *head*; its owner owns the storage. A Spark
query claims a stage in its first batch (``batch`` = that batch; ``source`` = the state
it starts from: ``restore_from``, the previous owner's newest completed checkpoint, or
empty), and from then on continues from its own batches. A *recovery* claim, written
by :func:`weir.spark.recover`, is adopted by the next query that runs the stage. A
continuous job claims its checkpoint storage when it starts (``batch`` = its first
checkpoint id) and keeps it for every restart of the run.

Rules enforced (by :mod:`weir.runtime.spark.plan` in every Spark task, by
:mod:`weir.checkpoint.protocol` in a continuous job's driver):

* **one owner** — a query may claim only if the head is released, or was not renewed
  within ``lease_timeout`` (its query is gone); otherwise :class:`OwnershipError`;
* **fencing** — once a newer claim exists, every task of an older owner stops with
  :class:`FencedError` before it publishes anything (a part is published only if its
  token is still the head); a fenced query can never claim again;
* **lineage** — a new owner starts from the state its claim names; nothing reads a
  fenced query's later checkpoints.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

from weir.checkpoint.storage import CheckpointStorage
from weir.errors import CorruptCheckpointError

__all__ = ["Claim", "Lineage", "QUERY", "RECOVERY"]

QUERY, RECOVERY = "query", "recovery"
_CLAIM = re.compile(r"^(\d{10})\.json$")
_FORMAT = "weir-claim"


def wall_ms() -> int:
    """The wall clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000


def _stopped_name(query: str) -> str:
    return f"claims/stopped-{query}.json"


@dataclass(frozen=True)
class Claim:
    """One link of a stage's ownership chain."""

    token: int
    kind: str
    query: str | None
    batch: int | None
    source: str | None
    source_note: str
    claimed_ms: int
    reason: str
    #: the job lineage the owner continues (continuous runtime; None on Spark)
    lineage: str | None = None
    #: where the owner's driver runs (continuous runtime; None on Spark): host, pid and
    #: ``process``: boot id, pid namespace and start time of that pid, so a takeover
    #: judges the pid only where it means that process
    host: str | None = None
    pid: int | None = None
    process: str | None = None

    def to_json(self) -> dict[str, Any]:
        """As stored."""
        doc: dict[str, Any] = {
            "format": _FORMAT, "version": 1, "token": self.token, "kind": self.kind,
            "query": self.query, "batch": self.batch, "source": self.source,
            "source_note": self.source_note, "claimed_ms": self.claimed_ms,
            "reason": self.reason,
        }
        for name in ("lineage", "host", "pid", "process"):
            if getattr(self, name) is not None:
                doc[name] = getattr(self, name)
        return doc

    @staticmethod
    def from_json(doc: Any, where: str) -> Claim:
        """Parse a stored claim (``where`` names the file)."""
        try:
            if doc["format"] != _FORMAT or doc["kind"] not in (QUERY, RECOVERY):
                raise ValueError("not a weir claim")
            batch = doc["batch"]
            return Claim(
                int(doc["token"]), str(doc["kind"]),
                None if doc["query"] is None else str(doc["query"]),
                None if batch is None else int(batch),
                None if doc["source"] is None else str(doc["source"]),
                str(doc["source_note"]), int(doc["claimed_ms"]), str(doc["reason"]),
                None if doc.get("lineage") is None else str(doc["lineage"]),
                None if doc.get("host") is None else str(doc["host"]),
                None if doc.get("pid") is None else int(doc["pid"]),
                None if doc.get("process") is None else str(doc["process"]),
            )
        except (TypeError, KeyError, ValueError) as exc:
            raise CorruptCheckpointError(f"{where}: malformed claim ({exc!r})") from exc


class Lineage:
    """The claims of one stage (``stage`` is the stage's directory)."""

    def __init__(self, stage: CheckpointStorage, lease_timeout_ms: int = 60_000) -> None:
        self.stage = stage
        self.lease_timeout_ms = lease_timeout_ms

    @staticmethod
    def _name(token: int) -> str:
        return f"claims/{token:010d}"

    def _where(self, token: int) -> str:
        return f"{self.stage.url.rstrip('/')}/{self._name(token)}.json"

    # reading ----------------------------------------------------------------------------
    def tokens(self) -> list[int]:
        """Every claim token, ascending."""
        out = []
        for name in self.stage.list_dir("claims"):
            match = _CLAIM.match(name)
            if match:
                out.append(int(match.group(1)))
        return sorted(out)

    def read(self, token: int) -> Claim:
        """The claim with ``token``."""
        where = self._where(token)
        data = self.stage.read_bytes(f"{self._name(token)}.json", where)
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise CorruptCheckpointError(f"{where}: malformed claim ({exc})") from exc
        claim = Claim.from_json(doc, where)
        if claim.token != token:
            raise CorruptCheckpointError(f"{where}: holds token {claim.token}")
        return claim

    def head(self) -> Claim | None:
        """The newest claim (None: the stage was never claimed here)."""
        tokens = self.tokens()
        return self.read(tokens[-1]) if tokens else None

    def claims(self) -> list[Claim]:
        """The whole chain, oldest first."""
        return [self.read(t) for t in self.tokens()]

    def is_head(self, token: int) -> bool:
        """Whether no newer claim than ``token`` exists (one existence check)."""
        return not self.stage.exists(f"{self._name(token + 1)}.json")

    # liveness ---------------------------------------------------------------------------
    def _stamp(self, token: int, what: str) -> int | None:
        path = f"{self._name(token)}.{what}"
        if not self.stage.exists(path):
            return None
        try:
            return int(json.loads(self.stage.read_bytes(path, path))["ms"])
        except (ValueError, KeyError, TypeError, CorruptCheckpointError):
            return None

    def last_seen_ms(self, claim: Claim) -> int:
        """When the claim's query was last known to run."""
        return max(claim.claimed_ms, self._stamp(claim.token, "alive") or 0)

    def released(self, claim: Claim) -> bool:
        """Whether the claim's query stopped and gave the stage up."""
        if self._stamp(claim.token, "released") is not None:
            return True
        return claim.query is not None and self.stopped(claim.query)

    def stopped(self, query: str) -> bool:
        """Whether ``query`` was recorded as stopped (:meth:`mark_stopped`)."""
        return self.stage.exists(_stopped_name(query))

    def alive(self, claim: Claim, now_ms: int | None = None) -> bool:
        """Whether the claim's query may still be running: not released, and renewed
        within the lease timeout. A recovery claim is never alive."""
        if claim.kind != QUERY or self.released(claim):
            return False
        now = wall_ms() if now_ms is None else now_ms
        return now - self.last_seen_ms(claim) < self.lease_timeout_ms

    # writing ----------------------------------------------------------------------------
    def try_claim(
        self, token: int, kind: str, query: str | None, batch: int | None,
        source: str | None, source_note: str, reason: str, *, lineage: str | None = None,
        host: str | None = None, pid: int | None = None, process: str | None = None,
    ) -> Claim | None:
        """Create claim ``token`` (compare-and-set); None if another writer created it."""
        claim = Claim(token, kind, query, batch, source, source_note, wall_ms(), reason,
                      lineage, host, pid, process)
        data = json.dumps(claim.to_json(), sort_keys=True).encode()
        if not self.stage.create_exclusive(f"{self._name(token)}.json", data):
            return None
        for name in self.stage.list_dir("claims"):  # stopped queries are behind it now
            if name.startswith("stopped-") and (query is None or name != _stopped_name(
                    query).removeprefix("claims/")):
                self.stage.delete(f"claims/{name}")
        return claim

    def mark_stopped(self, query: str) -> None:
        """Record that ``query`` stopped: its claims, present and future, count as
        released (see the module documentation)."""
        self.stage.write(_stopped_name(query), json.dumps({"ms": wall_ms()}).encode())

    def renew(self, token: int, facts: dict[str, Any] | None = None) -> None:
        """Record that the owner of ``token`` runs now (``facts``: what else the owner
        records of its progress, e.g. a continuous job's ``last_completed`` id)."""
        doc = {**(facts or {}), "ms": wall_ms()}
        self.stage.write(f"{self._name(token)}.alive", json.dumps(doc).encode())

    def release(self, token: int, *, discarded: bool = False,
                facts: dict[str, Any] | None = None) -> None:
        """Record that the owner of ``token`` stopped (others may claim at once); once
        (the listener and ``finish()`` both release a stopped query's stages).
        ``discarded``: it deleted its state on the way (a continuous job cancelled
        without retained checkpoints): the next owner starts from empty state.
        ``facts``: what the owner records of its end (a continuous job: ``next_id``,
        ``last_completed``, the ``savepoint`` it stopped with)."""
        doc: dict[str, Any] = {**(facts or {}), "ms": wall_ms()}
        if discarded:
            doc["discarded"] = True
        # compare-and-set, never exists-then-write: the first release stands
        self.stage.create_exclusive(f"{self._name(token)}.released", json.dumps(doc).encode())

    def record(self, claim: Claim, what: str) -> dict[str, Any]:
        """The claim's ``.released`` or ``.alive`` record ({} if absent or unreadable)."""
        path = f"{self._name(claim.token)}.{what}"
        if not self.stage.exists(path):
            return {}
        try:
            doc = json.loads(self.stage.read_bytes(path, path))
        except (ValueError, CorruptCheckpointError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def discarded(self, claim: Claim) -> bool:
        """Whether the claim's owner deleted its state as it stopped."""
        return bool(self.record(claim, "released").get("discarded"))
