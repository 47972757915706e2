"""A job's log as people read it: one pure function (`readable`) used by the job page, the API's
`readable=1` and, through the API, `volt jobs logs`. The stored log and its download stay raw.

    raw line                                              readable line
    \\x1b[36m(TrainRank pid=7)\\x1b[0m hello                 (TrainRank pid=7) hello
    VOLT_EVENT {"kind": "step", "step": 120, "loss": ...}  step 120  loss 0.4321
    VOLT_EVENT {"kind": "checkpoint", "step": 120, ...}    checkpoint step 120 saved (2 shards, 1.6 MB)
    10%|█   \\r 20%|██  \\r 30%|███                          30%|███

Line by line, one readable line per raw line (line endings kept), so a line count is the same in both
and text may be rendered a page at a time: callers slice the stored text by its own offsets first and
render the slice (jobs.services.read_log), never the other way round. No Django, no Volt imports.
"""

from __future__ import annotations

import json
import re
from typing import Any

EVENT_MARK = "VOLT_EVENT "
# ANSI escape sequences: CSI (colours "\x1b[31m", cursor moves "\x1b[2K"), OSC ("\x1b]...\x07", e.g. a
# terminal title or a hyperlink), a sequence cut off at the end of the text, and the short escapes
# (a character set "\x1b(B", "\x1b=").
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*|[ -/]*)$"
    r"|\x1b[ -/]*[0-~]"
)
# Other control characters show as glyphs (or nothing useful): tab and line ends stay.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def readable(text: str) -> str:
    """`text` (any slice of a log) with colours stripped, carriage-return overwrites resolved and
    VOLT_EVENT lines as sentences; one output line per input line, line endings kept."""
    # Split on "\n" alone (str.splitlines also splits on "\r", form feeds, ...): one line per line.
    return "\n".join(_line(line) for line in text.split("\n"))


def _line(body: str) -> str:
    body = _ANSI.sub("", body.removesuffix("\r"))  # "\r\n" ends a line as "\n" does
    if "\r" in body:  # a progress bar redrawn in place: what a terminal would show last
        body = body.rsplit("\r", 1)[1]
    body = _CONTROL.sub("", body)
    index = body.find(EVENT_MARK)
    if index >= 0:
        event = _parse(body[index + len(EVENT_MARK) :])
        if event is not None:
            body = body[:index] + event_text(event)
    return body


def _parse(payload: str) -> dict[str, Any] | None:
    try:
        event = json.loads(payload.strip())
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("kind"), str) else None


def event_text(event: dict[str, Any]) -> str:
    """One event (volt_ckpt's step, busbw, checkpoint, resumed, done, or any other kind) as a sentence."""
    kind = event["kind"]
    step = _int(event.get("step"))
    if kind == "step" and step is not None:
        loss = _number(event.get("loss"))
        return f"step {step}" + (f"  loss {_figure(loss)}" if loss is not None else "")
    if kind == "checkpoint" and step is not None:
        shards, size = _int(event.get("shards")), _int(event.get("bytes"))
        what = [f"{shards} shard{'s' if shards != 1 else ''}"] if shards is not None else []
        what += [file_size(size)] if size is not None else []
        return f"checkpoint step {step} saved" + (f" ({', '.join(what)})" if what else "")
    if kind == "busbw" and step is not None and _number(event.get("busbw_gbps")) is not None:
        parts = [f"step {step}  all-reduce busbw {_number(event.get('busbw_gbps')):.3f} GB/s"]
        algbw, ranks = _number(event.get("algbw_gbps")), _int(event.get("world_size"))
        detail = [f"algbw {algbw:.3f} GB/s"] if algbw is not None else []
        detail += [f"{ranks} ranks"] if ranks is not None else []
        return parts[0] + (f" ({', '.join(detail)})" if detail else "")
    if kind == "resumed" and step is not None:
        return f"resumed from the checkpoint of step {step}"
    if kind == "done" and step is not None:
        digest = event.get("params_sha256")
        return f"done at step {step}" + (f"  params sha256 {digest}" if isinstance(digest, str) else "")
    fields = "  ".join(
        f"{key} {_value(value)}" for key, value in event.items() if key not in ("kind", "time")
    )
    return f"{kind}{'  ' + fields if fields else ''}"


def file_size(size: int) -> str:
    """Bytes as the console's tables write them (Django's filesizeformat: 1024-based, one decimal)."""
    if size < 1024:
        return f"{size} byte{'s' if size != 1 else ''}"
    for unit in ("KB", "MB", "GB", "TB"):
        size /= 1024
        if size < 1024 or unit == "TB":
            return f"{size:.1f} {unit}"
    raise AssertionError("unreachable")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


def _int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number == int(number) else None


def _figure(value: float) -> str:
    """A loss: four decimals, or scientific where four decimals would hide it."""
    return f"{value:.4f}" if value == 0 or 1e-3 <= abs(value) < 1e6 else f"{value:.3e}"


def _value(value: Any) -> str:
    if isinstance(value, float):
        return _figure(value)
    return value if isinstance(value, str) else json.dumps(value)
