"""Parse nccl-tests `all_reduce_perf` output, as a provider ran it on its own hosts. Pure Python (no Django).

Real output (nccl-tests 2.x; here 2 nodes x 8 GPUs under mpirun, one GPU per rank)::

    # nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
    #
    # Using devices
    #  Rank  0 Group  0 Pid  41877 on    dgx-a01 device  0 [0x18] NVIDIA H100 80GB HBM3
    ...
    #  Rank 15 Group  0 Pid  39052 on    dgx-a02 device  7 [0xdb] NVIDIA H100 80GB HBM3
    #
    #                                                              out-of-place                       in-place
    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
               8             2     float     sum      -1    35.81    0.00    0.00      0    35.52    0.00    0.00      0
    ...
      8589934592    2147483648     float     sum      -1    47535  180.71  338.82      0    47743  179.92  337.35      0
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 70.742
    #

Besides these, blank lines, bare `#` lines, the `# nccl-tests version ...` banner, `# Collective test
starting/concluded: all_reduce_perf`, `# Reducing maxBytes to ...` and NCCL's own log lines
(NCCL_DEBUG=INFO: `dgx-a01:41877:41877 [0] NCCL INFO ...`) are accepted. Anything else, a table of another
collective, a failed check or output that stops before `# Avg bus bandwidth` is refused with a ParseError
naming the line.

Checks that the text is one whole all-reduce run: every rank 0..n-1 listed once; each row's size is
count x the type's size with a reduction op and root -1 (an all-reduce's row; all_gather, reduce_scatter,
reduce and broadcast rows are not); no wrong values; busbw = algbw x 2(n-1)/n for the n ranks listed
(nccl-tests' definition, so the device list and the table agree); and the printed average is the mean of
every busbw in the table (so no row went missing).

The figure Volt keeps is `busbw_gbps`: the busbw at the largest message size (the better of out-of-place
and in-place), as Volt's own probe reports large-message busbw. nccl-tests' "Avg bus bandwidth" averages
every size, tiny ones included, so it is kept for display only (70.7 against 338.8 GB/s above).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from inventory.discovery.types import ParseError

TYPE_BYTES = {
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "uint32": 4,
    "int64": 8,
    "uint64": 8,
    "half": 2,
    "float": 4,
    "double": 8,
    "bfloat16": 2,
    "f8e4m3": 1,
    "f8e5m2": 1,
}
REDUCTIONS = ("sum", "prod", "max", "min", "avg")
COLUMNS = "size count type redop root time algbw busbw #wrong time algbw busbw #wrong".split()
UNITS = "(B) (elements) (us) (GB/s) (GB/s) (us) (GB/s) (GB/s)".split()

_HEADER = re.compile(r"^# nThread (\d+) nGpus (\d+) minBytes (\d+) maxBytes (\d+)\b")
_RANK = re.compile(
    r"^#\s+Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s+(\S.*?)\s*$"
)
_NCCL_LOG = re.compile(r"^\S+:\d+:\d+ \[\d+\] NCCL (INFO|WARN|TRACE)\b")
_SKIPPED = re.compile(
    r"^#\s*$|^# Using devices\s*$|^# nccl-tests version\b|^# Reducing maxBytes to \d+\b|"
    r"^# Collective test (starting|concluded): all_reduce_perf\s*$"
)
_COLLECTIVE = re.compile(r"^# Collective test (?:starting|concluded): (\S+)\s*$")
_OUT_OF_BOUNDS = re.compile(r"^# Out of bounds values\s*:\s*(\d+)\s+(\S+)\s*$")
_AVERAGE = re.compile(r"^# Avg bus bandwidth\s*:\s*(\d+(?:\.\d+)?)\s*$")
_BUSBW_TOLERANCE = 0.02  # printed to 2 decimals: rows of >= 1 GB/s agree within 0.5%
_AVERAGE_TOLERANCE = 0.02


@dataclass(frozen=True)
class Rank:
    """One `# Rank` line: which machine and GPU a rank ran on."""

    rank: int
    hostname: str
    device: int
    gpu_name: str  # "NVIDIA H100 80GB HBM3"


@dataclass(frozen=True)
class Row:
    """One size of the table: out-of-place and in-place figures (GB/s; time in microseconds)."""

    size_bytes: int
    count: int
    dtype: str
    redop: str
    out_of_place_us: float
    out_of_place_algbw: float
    out_of_place_busbw: float
    in_place_us: float
    in_place_algbw: float
    in_place_busbw: float


@dataclass(frozen=True)
class AllReduceRun:
    """One whole `all_reduce_perf` run."""

    ranks: tuple[Rank, ...]
    rows: tuple[Row, ...]
    average_busbw_gbps: float  # nccl-tests' "Avg bus bandwidth": every size, tiny ones included
    min_bytes: int
    max_bytes: int

    @property
    def hostnames(self) -> tuple[str, ...]:
        """The machines the ranks ran on, in rank order."""
        return tuple(dict.fromkeys(rank.hostname for rank in self.ranks))

    @property
    def gpus_per_host(self) -> dict[str, int]:
        return dict(Counter(rank.hostname for rank in self.ranks))

    @property
    def gpu_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(rank.gpu_name for rank in self.ranks))

    @property
    def largest(self) -> Row:
        return max(self.rows, key=lambda row: row.size_bytes)

    @property
    def busbw_gbps(self) -> float:
        """The busbw at the largest message size, the better of out-of-place and in-place (GB/s)."""
        row = self.largest
        return max(row.out_of_place_busbw, row.in_place_busbw)


def _ref(number: int, line: str) -> str:
    shown = line if len(line) <= 160 else line[:157] + "..."
    return f"line {number}: {shown!r}"


class _Parser:
    """Reads the output line by line: header, devices, table header, rows, footer."""

    def __init__(self) -> None:
        self.header: re.Match | None = None
        self.ranks: list[Rank] = []
        self.table_lines = 0  # of the three table header lines seen
        self.rows: list[Row] = []
        self.out_of_bounds: int | None = None
        self.average: float | None = None

    def feed(self, number: int, raw: str) -> None:
        line = raw.rstrip()
        if not line.strip() or _NCCL_LOG.match(line):
            return
        if self.header is None:
            self._first(number, line)
        elif self.average is not None:
            self._after_footer(number, line)
        elif self.table_lines < 3:
            self._devices_or_table(number, line)
        else:
            self._row_or_footer(number, line)

    def _first(self, number: int, line: str) -> None:
        if _SKIPPED.match(line) and not line.startswith("# Collective test concluded"):
            return
        collective = _COLLECTIVE.match(line)
        if collective:
            raise ParseError(f"{_ref(number, line)}: this is {collective.group(1)}, not all_reduce_perf")
        self.header = _HEADER.match(line)
        if self.header is None:
            raise ParseError(
                f"{_ref(number, line)}: expected all_reduce_perf's header '# nThread 1 nGpus 1 minBytes ... "
                "maxBytes ...' (upload the output of nccl-tests' all_reduce_perf, as it printed it)"
            )

    def _devices_or_table(self, number: int, line: str) -> None:
        rank = _RANK.match(line)
        if rank:
            if self.table_lines:
                raise ParseError(f"{_ref(number, line)}: a rank listed inside the table's header")
            self.ranks.append(Rank(int(rank.group(1)), rank.group(4), int(rank.group(5)), rank.group(7)))
            return
        if _SKIPPED.match(line) and not self.table_lines:
            return
        words = line.lstrip("#").split()
        expected = (["out-of-place", "in-place"], COLUMNS, UNITS)[self.table_lines]
        if not line.startswith("#") or words != expected:
            want = " ".join(expected)
            raise ParseError(f"{_ref(number, line)}: expected the table's header line '# {want}'")
        if not self.ranks:
            raise ParseError(f"{_ref(number, line)}: the table begins before any '#  Rank ...' device line")
        self.table_lines += 1

    def _row_or_footer(self, number: int, line: str) -> None:
        out_of_bounds = _OUT_OF_BOUNDS.match(line)
        if out_of_bounds:
            return self._out_of_bounds(number, line, out_of_bounds)
        average = _AVERAGE.match(line)
        if average:
            if self.out_of_bounds is None:
                raise ParseError(f"{_ref(number, line)}: the average comes before '# Out of bounds values'")
            self.average = float(average.group(1))
            return None
        if self.out_of_bounds is not None:
            raise ParseError(f"{_ref(number, line)}: expected '# Avg bus bandwidth : <GB/s>'")
        self.rows.append(self._row(number, line))
        return None

    def _out_of_bounds(self, number: int, line: str, match: re.Match) -> None:
        if not self.rows:
            raise ParseError(f"{_ref(number, line)}: the footer comes before any result row")
        if int(match.group(1)) or match.group(2) != "OK":
            raise ParseError(
                f"{_ref(number, line)}: the run found {match.group(1)} out-of-bounds values: its results are "
                "wrong, so its figures are not a measurement"
            )
        self.out_of_bounds = 0

    def _row(self, number: int, line: str) -> Row:
        words = line.split()
        if line.startswith("#") or len(words) != len(COLUMNS):
            raise ParseError(
                f"{_ref(number, line)}: expected a result row of {len(COLUMNS)} columns "
                f"({' '.join(COLUMNS)}) or '# Out of bounds values'; the output may be cut short"
            )
        size, count, dtype, redop, root, *figures = words
        try:
            size_bytes, elements = int(size), int(count)
            times = [float(figures[i]) for i in (0, 4)]
            bandwidths = [float(figures[i]) for i in (1, 2, 5, 6)]
            wrong = [0 if figures[i] == "N/A" else int(figures[i]) for i in (3, 7)]
        except ValueError:
            raise ParseError(f"{_ref(number, line)}: a column that should be a number is not") from None
        self._check_row(number, line, size_bytes, elements, dtype, redop, root, wrong)
        return Row(size_bytes, elements, dtype, redop, times[0], *bandwidths[:2], times[1], *bandwidths[2:])

    def _check_row(self, number, line, size_bytes, elements, dtype, redop, root, wrong) -> None:
        if dtype not in TYPE_BYTES:
            raise ParseError(f"{_ref(number, line)}: unknown data type {dtype!r}")
        if redop not in REDUCTIONS or root != "-1" or size_bytes != elements * TYPE_BYTES[dtype]:
            raise ParseError(
                f"{_ref(number, line)}: not an all-reduce row (an all-reduce has a reduction op, root -1 and "
                f"size = count x {TYPE_BYTES[dtype]} bytes of {dtype}): upload all_reduce_perf's output"
            )
        if any(wrong):
            raise ParseError(f"{_ref(number, line)}: {max(wrong)} wrong values: the run failed its own check")
        if self.rows and size_bytes <= self.rows[-1].size_bytes:
            raise ParseError(f"{_ref(number, line)}: sizes must grow down the table")

    def _after_footer(self, number: int, line: str) -> None:
        if _SKIPPED.match(line):
            return
        if _HEADER.match(line):
            raise ParseError(f"{_ref(number, line)}: a second run begins; upload one run at a time")
        raise ParseError(f"{_ref(number, line)}: unexpected after '# Avg bus bandwidth'")

    def result(self, last: int, last_line: str) -> AllReduceRun:
        if self.average is None:
            where = _ref(last, last_line) if last else "line 1"
            missing = "the header" if self.header is None else "'# Avg bus bandwidth'"
            raise ParseError(f"the output ends at {where} before {missing}: it is cut short")
        run = AllReduceRun(
            tuple(self.ranks),
            tuple(self.rows),
            self.average,
            int(self.header.group(3)),
            int(self.header.group(4)),
        )
        _check_ranks(run)
        _check_figures(run)
        return run


def _check_ranks(run: AllReduceRun) -> None:
    numbers = sorted(rank.rank for rank in run.ranks)
    if numbers != list(range(len(numbers))):
        raise ParseError(
            f"the device list names ranks {numbers}; expected each of 0..{len(numbers) - 1} once"
        )


def _check_figures(run: AllReduceRun) -> None:
    """busbw = algbw x 2(n-1)/n for the n ranks listed, and the average is the mean of every busbw."""
    n = len(run.ranks)
    factor = 2 * (n - 1) / n
    for row in run.rows:
        for algbw, busbw in (
            (row.out_of_place_algbw, row.out_of_place_busbw),
            (row.in_place_algbw, row.in_place_busbw),
        ):
            if algbw >= 1.0 and abs(busbw - algbw * factor) > _BUSBW_TOLERANCE * busbw + 0.01:
                raise ParseError(
                    f"the row of {row.size_bytes} bytes has busbw {busbw:g} and algbw {algbw:g}: for the {n} ranks "
                    f"listed busbw is algbw x {factor:.4g}; the device list and the table disagree"
                )
    figures = [bw for row in run.rows for bw in (row.out_of_place_busbw, row.in_place_busbw)]
    mean = sum(figures) / len(figures)
    if abs(mean - run.average_busbw_gbps) > _AVERAGE_TOLERANCE * mean + 0.01:
        raise ParseError(
            f"'# Avg bus bandwidth' says {run.average_busbw_gbps:g} GB/s but the table's busbw average "
            f"{mean:.3f}: rows are missing or altered"
        )


def parse_all_reduce(text: str) -> AllReduceRun:
    """Parse one `all_reduce_perf` run; ParseError names the line that is not what it should be."""
    parser = _Parser()
    last, last_line = 0, ""
    for number, raw in enumerate(text.splitlines(), start=1):
        parser.feed(number, raw)
        if raw.strip():
            last, last_line = number, raw.rstrip()
    return parser.result(last, last_line)
