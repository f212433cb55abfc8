"""A task's event time from its input channels' watermarks and idleness: Flink's
``StatusWatermarkValve`` (see :class:`WatermarkValve`)."""

from __future__ import annotations

from typing import Any

from weir.runtime.operator_base import MIN_WATERMARK

__all__ = ["WatermarkValve"]


class WatermarkValve:
    """The event time of a task's input: the watermark and idleness events of its
    channels in, the events to forward (in order) out. A copy of the rules of Flink's
    ``StatusWatermarkValve`` (flink-streaming-java,
    org/apache/flink/streaming/runtime/watermarkstatus/StatusWatermarkValve.java):

    * every channel starts active, at the minimum watermark, and *aligned*; the valve's
      watermark is the minimum of its aligned channels' watermarks, output when it rises
      above the last one output; a channel's watermark only rises (lower ones are
      ignored);
    * a channel that goes idle is no longer aligned (it holds event time back no more);
      when it was the one at the valve's watermark, the minimum of the aligned ones
      left is output if higher;
    * when the last active channel goes idle, no channel moves event time any more: if
      that channel was at the valve's watermark, the **largest watermark of all
      channels** is output (``findAndOutputMaxWatermarkAcrossAllChannels``), then the
      valve itself goes idle (``{"kind": "idle"}``);
    * a channel active again is aligned at once if its watermark is not behind the
      valve's, else only once a watermark of it catches up with the valve's; the first
      active channel makes the valve active again (``{"kind": "active"}``);
    * watermarks of an idle channel (or while the valve is idle) are ignored.

    The one addition: weir's sources end their idleness by sending a watermark (as
    Flink's source output marks itself active before it emits one), so a watermark on
    an idle channel first makes it active. Pure: no clock, no I/O."""

    def __init__(self, channels: int) -> None:
        #: per channel: its largest watermark, whether idle, whether aligned
        self.watermarks = [MIN_WATERMARK] * channels
        self.idle = [False] * channels
        self.aligned = [True] * channels
        #: the last watermark output, and whether the valve is idle
        self.watermark = MIN_WATERMARK
        self.is_idle = False

    def on_event(self, channel: int, event: dict[str, Any]) -> list[dict[str, Any]]:
        """Feed ``event`` of ``channel`` (``watermark``, ``idle`` or ``active``); the
        events to forward, in order."""
        kind = event.get("kind")
        if kind == "watermark":
            return self.on_watermark(channel, int(event["ts"]))
        if kind == "idle":
            return self.on_idle(channel)
        if kind == "active":
            return self.on_active(channel)
        raise ValueError(f"not a watermark or idleness event: {event!r}")

    def on_watermark(self, channel: int, ts: int) -> list[dict[str, Any]]:
        """Watermark ``ts`` came on ``channel`` (Flink's ``inputWatermark``)."""
        out = self.on_active(channel) if self.idle[channel] else []
        if self.is_idle or self.idle[channel] or ts <= self.watermarks[channel]:
            return out
        self.watermarks[channel] = ts
        if not self.aligned[channel] and ts >= self.watermark:
            self.aligned[channel] = True  # it caught up
        return out + self._min_across_aligned()

    def on_idle(self, channel: int) -> list[dict[str, Any]]:
        """``channel`` went idle (Flink's ``inputWatermarkStatus(IDLE)``)."""
        if self.idle[channel]:
            return []
        self.idle[channel] = True
        self.aligned[channel] = False
        at_watermark = self.watermarks[channel] == self.watermark
        if all(self.idle):  # no channel advances any more: flush the largest watermark
            out = self._max_across_all() if at_watermark else []
            self.is_idle = True
            return [*out, {"kind": "idle"}]
        return self._min_across_aligned() if at_watermark else []

    def on_active(self, channel: int) -> list[dict[str, Any]]:
        """``channel`` is active again (Flink's ``inputWatermarkStatus(ACTIVE)``)."""
        if not self.idle[channel]:
            return []
        self.idle[channel] = False
        if self.watermarks[channel] >= self.watermark:
            self.aligned[channel] = True
        if self.is_idle:
            self.is_idle = False
            return [{"kind": "active"}]
        return []

    def _min_across_aligned(self) -> list[dict[str, Any]]:
        aligned = [w for w, a in zip(self.watermarks, self.aligned, strict=True) if a]
        if aligned and min(aligned) > self.watermark:
            self.watermark = min(aligned)
            return [{"kind": "watermark", "ts": self.watermark}]
        return []

    def _max_across_all(self) -> list[dict[str, Any]]:
        if self.watermarks and max(self.watermarks) > self.watermark:
            self.watermark = max(self.watermarks)
            return [{"kind": "watermark", "ts": self.watermark}]
        return []
