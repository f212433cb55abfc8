"""The checkpoint page (``weir ui``): one self-contained HTML document, like the
checkpoint tab of Flink's web UI — overview counts, the min/avg/max summary, a plot of
duration and size over time, the history, and per-operator, per-subtask details.

No script and no external resource: the page renders the same when served by ``weir ui``
and when written to a file with ``--output``. Every number shown also sits, unformatted,
in a ``data-*`` attribute of its element (what the browser test compares with the
checkpoint metadata).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from weir.checkpoint.stats import CheckpointStats
from weir.cli.common import readable_size, readable_time
from weir.processor.history import History, Stat, operator_summary

__all__ = ["render_page"]

_DETAILS = 20  # completed checkpoints whose per-subtask details are on the page

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1f2933;background:#fafbfc}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px}
.sub{color:#616e7c;margin-bottom:16px}
table{border-collapse:collapse;background:#fff;margin-bottom:8px}
th,td{border:1px solid #d9e2ec;padding:4px 10px;text-align:right;white-space:nowrap}
th{background:#f0f4f8;font-weight:600} td.l,th.l{text-align:left}
.completed{color:#1b7f3b}.pending{color:#b7791f}.incomplete{color:#c53030}.empty{color:#616e7c}
.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{background:#fff;border:1px solid #d9e2ec;border-radius:6px;padding:8px 14px}
.card b{display:block;font-size:20px}
details{margin:6px 0;background:#fff;border:1px solid #d9e2ec;border-radius:6px;padding:6px 10px}
summary{cursor:pointer;font-weight:600} svg{background:#fff;border:1px solid #d9e2ec}
"""


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} ms" if value < 100 else f"{value:,.0f} ms"


def _size(value: float | None) -> str:
    return "-" if value is None else readable_size(round(value))


def _num(value: float | int | None) -> str:
    return "" if value is None else repr(value)


def _td(text: str, value: float | int | None = None, cls: str = "", **data: object) -> str:
    attrs = "".join(f' data-{k.replace("_", "-")}="{_esc(v)}"' for k, v in data.items())
    if value is not None:
        attrs += f' data-value="{_num(value)}"'
    return f'<td{f" class={cls!r}" if cls else ""}{attrs}>{_esc(text)}</td>'


def _summary(history: History) -> str:
    rows = [("End-to-end duration", "end_to_end_duration_ms", _ms),
            ("Checkpointed data size (changed)", "checkpointed_size", _size),
            ("Full checkpoint data size", "state_size", _size),
            ("Sync duration (per subtask)", "sync_ms", _ms),
            ("Async duration (per subtask)", "async_ms", _ms),
            ("Alignment (per task, continuous runtime)", "alignment_ms", _ms),
            ("Records in flight stored (unaligned)", "channel_state_bytes", _size)]
    out = ['<table id="summary"><tr><th class="l"></th><th>minimum</th><th>average</th>'
           '<th>maximum</th></tr>']
    for label, key, fmt in rows:
        stat = history.summary.get(key)
        cells = "".join(
            _td("-", None, stat=f"{key}-{part}") if stat is None else
            _td(fmt(getattr(stat, part)), getattr(stat, part), stat=f"{key}-{part}")
            for part in ("min", "avg", "max"))
        out.append(f'<tr><th class="l">{_esc(label)}</th>{cells}</tr>')
    out.append("</table>")
    return "".join(out)


def _plot(entries: Sequence[CheckpointStats], series: Sequence[tuple[str, str, str]],
          title: str, fmt: Callable[[float | None], str], plot_id: str) -> str:
    """An SVG line plot over the completed checkpoints: one polyline per (attribute,
    label, colour) in ``series``, a point with a tooltip per checkpoint."""
    width, height, left, right, top, bottom = 540, 200, 78, 12, 26, 30
    values = [[float(getattr(e, attr) or 0) for e in entries] for attr, _, _ in series]
    top_value = max((v for vs in values for v in vs), default=0.0) or 1.0
    n = len(entries)

    def x(i: int) -> float:
        return left + (width - left - right) * (i / (n - 1) if n > 1 else 0.5)

    def y(v: float) -> float:
        return top + (height - top - bottom) * (1 - v / top_value)

    parts = [f'<svg id="{plot_id}" width="{width}" height="{height}" role="img" '
             f'aria-label="{_esc(title)}" xmlns="http://www.w3.org/2000/svg">',
             f'<text x="{left}" y="16" font-size="13" font-weight="600">{_esc(title)}</text>',
             f'<line x1="{left}" y1="{y(0)}" x2="{width - right}" y2="{y(0)}" stroke="#9aa5b1"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{y(0)}" stroke="#9aa5b1"/>',
             f'<text x="{left - 6}" y="{top + 4}" font-size="11" text-anchor="end">'
             f'{_esc(fmt(top_value))}</text>',
             f'<text x="{left - 6}" y="{y(0) + 4}" font-size="11" text-anchor="end">0</text>']
    if n:
        for i in sorted({0, n - 1}):
            parts.append(f'<text x="{x(i)}" y="{height - 10}" font-size="11" '
                         f'text-anchor="middle">#{entries[i].checkpoint_id}</text>')
    for (attr, label, colour), vs in zip(series, values, strict=True):
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(vs))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
                     f'points="{points}"/>')
        for i, v in enumerate(vs):
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="2.5" fill="{colour}" '
                         f'data-series="{attr}" data-id="{entries[i].checkpoint_id}" '
                         f'data-value="{v!r}">'
                         f'<title>#{entries[i].checkpoint_id} {_esc(label)}: {_esc(fmt(v))}</title>'
                         f'</circle>')
    for k, (_, label, colour) in enumerate(series):
        lx = left + 180 + 120 * k
        parts.append(f'<text x="{lx}" y="16" font-size="11" fill="{colour}">'
                     f'&#9632; {_esc(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _history_table(entries: Sequence[CheckpointStats]) -> str:
    out = ['<table id="history"><tr><th class="l">query</th><th class="l">operators</th>'
           '<th>id</th><th class="l">status</th><th class="l">kind</th>'
           '<th class="l">completed (UTC)</th><th>end-to-end duration</th>'
           '<th>checkpointed size</th><th>full size</th><th>in flight</th><th>files</th>'
           '</tr>']
    for e in reversed(entries):
        anchor = _anchor(e)
        ident = (f'<a href="#{anchor}">{e.checkpoint_id}</a>' if e.subtasks
                 else str(e.checkpoint_id))
        status = e.status.value
        out.append(
            f'<tr class="checkpoint" data-query="{_esc(e.query or "")}" '
            f'data-id="{e.checkpoint_id}" data-status="{_esc(status)}">'
            + _query_cell(e.query) + _td(", ".join(e.operators) or "-", cls="l")
            + f"<td>{ident}</td>"
            + _td(status, cls=f"l {status}") + _td(e.kind or "-", cls="l")
            + _td(readable_time(e.completed_timestamp_ms), e.completed_timestamp_ms, cls="l",
                  field="completed_timestamp_ms")
            + _td(_ms(e.end_to_end_duration_ms), e.end_to_end_duration_ms,
                  field="end_to_end_duration_ms")
            + _td(_size(e.checkpointed_size), e.checkpointed_size, field="checkpointed_size")
            + _td(_size(e.state_size), e.state_size, field="state_size")
            + _td(_size(e.channel_state_bytes) if e.channel_state_bytes else "-",
                  e.channel_state_bytes, field="channel_state_bytes")
            + _td("-" if e.files is None else str(e.files), e.files, field="files")
            + "</tr>")
    out.append("</table>")
    return "".join(out)


def _query_cell(query: str | None) -> str:
    if query is None:
        return _td("-", cls="l")
    short = query if len(query) <= 12 else query[:8] + "…"
    return f'<td class="l" title="{_esc(query)}">{_esc(short)}</td>'


def _anchor(entry: CheckpointStats) -> str:
    return f"chk-{entry.query or 'root'}-{entry.checkpoint_id}"


def _stat_cells(stat: Stat | None, fmt: Callable[[float | None], str], part: str) -> str:
    return _td("-") if stat is None else _td(fmt(getattr(stat, part)), getattr(stat, part))


def _details(entry: CheckpointStats, is_open: bool) -> str:
    out = [f'<details id="{_esc(_anchor(entry))}" class="details" data-query="'
           f'{_esc(entry.query or "")}" data-id="{entry.checkpoint_id}"'
           f'{" open" if is_open else ""}>'
           f"<summary>checkpoint {entry.checkpoint_id}"
           f"{f' of query {_esc(entry.query[:8])}' if entry.query else ''} — "
           f"{_esc(readable_time(entry.completed_timestamp_ms))}, "
           f"{_esc(_ms(entry.end_to_end_duration_ms))}, "
           f"{_esc(_size(entry.checkpointed_size))} checkpointed</summary>"]
    for uid in entry.operators:
        subs = [s for s in entry.subtasks if s.operator == uid]
        if not subs:
            continue
        out.append(f'<h3>operator <code>{_esc(uid)}</code> ({len(subs)} subtasks)</h3>'
                   f'<table class="operator" data-uid="{_esc(uid)}"><tr><th>subtask</th>'
                   "<th>sync duration</th><th>async duration</th><th>checkpointed size</th>"
                   "<th>full size</th><th>entries</th></tr>")
        for s in subs:
            out.append(f'<tr class="subtask" data-uid="{_esc(uid)}" data-subtask="{s.subtask}">'
                       + _td(str(s.subtask), s.subtask)
                       + _td(_ms(s.sync_ms), s.sync_ms, field="sync_ms")
                       + _td(_ms(s.async_ms), s.async_ms, field="async_ms")
                       + _td(_size(s.checkpointed_size), s.checkpointed_size,
                             field="checkpointed_size")
                       + _td(_size(s.state_size), s.state_size, field="state_size")
                       + _td(f"{s.entries or 0:,}", s.entries, field="entries") + "</tr>")
        stats = operator_summary(entry, uid)
        for part in ("min", "avg", "max"):
            out.append(f'<tr class="operator-{part}"><th>{part}</th>'
                       + _stat_cells(stats["sync_ms"], _ms, part)
                       + _stat_cells(stats["async_ms"], _ms, part)
                       + _stat_cells(stats["checkpointed_size"], _size, part)
                       + _stat_cells(stats["state_size"], _size, part) + "<td></td></tr>")
        out.append("</table>")
    out.append("</details>")
    return "".join(out)


def render_page(history: History, *, generated_ms: int, refresh_s: int = 0) -> str:
    """The page for ``history``; ``refresh_s`` > 0 makes the browser reload it that often
    (``weir ui`` serving a running query)."""
    done = history.completed()
    latest = done[-1] if done else None
    cards = "".join(
        f'<div class="card" data-count="{_esc(status)}">{_esc(status)}<b>{n}</b></div>'
        for status, n in sorted(history.counts.items()))
    if latest is not None:
        cards += (f'<div class="card" id="latest" data-id="{latest.checkpoint_id}">latest '
                  f"completed<b>#{latest.checkpoint_id}</b>"
                  f"{_esc(readable_time(latest.completed_timestamp_ms))}</div>")
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s > 0 else ""
    details = "".join(_details(e, i == 0) for i, e in enumerate(reversed(done[-_DETAILS:])))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"{refresh}<title>weir checkpoints — {_esc(history.location)}</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<h1>Checkpoints</h1><div class=\"sub\">{_esc(history.location)} · "
        f"{len(history.entries)} shown · generated {_esc(readable_time(generated_ms))}</div>"
        f'<div class="cards" id="counts">{cards}</div>'
        f"<h2>Summary (completed checkpoints shown)</h2>{_summary(history)}"
        "<h2>Over time</h2>"
        + _plot(done, [("end_to_end_duration_ms", "end-to-end duration", "#2563eb")],
                "End-to-end duration", _ms, "plot-duration")
        + " "
        + _plot(done, [("checkpointed_size", "checkpointed", "#16a34a"),
                       ("state_size", "full size", "#9333ea")],
                "Checkpoint size", _size, "plot-size")
        + f"<h2>History</h2>{_history_table(history.entries)}"
        f"<h2>Details (the {min(len(done), _DETAILS)} newest completed)</h2>{details}"
        "</body></html>")
