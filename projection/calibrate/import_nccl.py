"""nccl-tests / rccl-tests log parser (hardware.md §5).

Reads both column layouts: new `size count type redop root | time algbw busbw #wrong | ...` (nccl-tests >= 2.13,
rccl-tests) and old `size count type [redop] [root] | time algbw busbw error | ...`; a column left blank (old
alltoall prints a `redop` header over no values) is fine because a row is read from both ends: size, count and
type from the left, one or two halves of (time, algbw, busbw, #wrong) from the right, `N/A` allowed in #wrong.
Skipped anywhere: `#` comments, NCCL/RCCL INFO lines, launcher noise, prose, Markdown fences. Several runs per file
(a README with fenced blocks, an egrep excerpt) are split at a new header, a footer, a fence or `=== ... ===` banner,
or a size that goes down.

Per run: the collective comes from `# Collective test starting: all_reduce_perf`, else from the last binary name
seen (`all_reduce_perf`, `alltoall_perf_mpi` ...), else from the columns and the busbw / algbw ratio. The rank count
comes from the `# Using devices` list, else `nranks N` (NCCL INFO), else the ratio (for kinds whose bus factor
depends on it); the node count from the distinct host names of the list, or an `N-node` banner.

Refused (CalibrationError, exit code 2): a `cputime` column (-C 1), ranks split unevenly over the hosts of the
`# Using devices` list (8 on one node and 4 on another: the fits price even placements only), a run that ended in a
`Test NCCL failure` / `Test failure` line (the run aborted: the fabric or library failed, so its rows do not stand
for a working setup). Skipped with a provenance note: halves that failed nccl-tests' data check (a non-zero `#wrong`
count, or an error column starred, `error ? "*" : ""` in common.cu: the collective computed wrong data, so its time
is not that of a correct collective) and rows whose values do not validate (a 20-digit size).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from projection.calibrate.calibration import Calibration, CollectiveRow, Provenance, normalize_dtype
from projection.calibrate.errors import CalibrationError
from projection.calibrate.import_common import Skipped, build_row
from projection.cost.collectives import CollectiveKind, bus_factor
from projection.errors import Problem

_BINARY = re.compile(r"(?<![\w])(all_reduce|all_gather|reduce_scatter|alltoall|alltoallv|sendrecv|broadcast|reduce|"
                     r"gather|scatter|hypercube)_perf(?:_mpi)?\b")
_KINDS: dict[str, CollectiveKind | None] = {
    "all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all", "alltoallv": "all_to_all", "sendrecv": "send_recv", "broadcast": "broadcast",
    "reduce": "reduce", "gather": None, "scatter": None, "hypercube": None}
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s*(.*)$")
_VERSIONS = {"nccl": re.compile(r"NCCL version\s*:?\s*([\w.+:-]+)"), "rccl": re.compile(r"RCCL version\s*:\s*(\S+)"),
             "rccl-tests": re.compile(r"rccl-tests: Version\s+(\S+)"), "hip": re.compile(r"HIP version\s*:\s*(\S+)"),
             "rocm": re.compile(r"ROCm version\s*:\s*(\S+)"),
             "nccl-tests": re.compile(r"nccl-tests.*[Vv]ersion\s+(\S+)")}
_REDOPS = {"sum", "prod", "min", "max", "avg", "none", "mulsum", "premulsum"}
_NCCL_TYPES = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16", "bf16",
               "fp8_e4m3", "fp8_e5m2", "f8e4m3", "f8e5m2", "char", "int", "float16", "float32", "float64"}


@dataclass
class _Half:
    line: int
    size: int
    dtype: str
    mids: tuple[str, ...]
    in_place: bool
    time_us: float
    algbw_gb_s: float
    busbw_gb_s: float
    wrong: bool = False  # failed the data check: #wrong > 0, or an error column starred as over the tolerance


@dataclass
class _Run:
    kind_name: str | None = None
    header: list[str] = field(default_factory=list)
    ranks: dict[int, tuple[str, str]] = field(default_factory=dict)
    nranks_hint: int | None = None
    nodes_hint: int | None = None
    versions: dict[str, str] = field(default_factory=dict)
    command: str | None = None
    halves: list[_Half] = field(default_factory=list)


def looks_like_nccl(text: str) -> bool:
    """True if the text holds at least one nccl-tests data row."""
    return any(_data_row(line, 0) for line in text.splitlines())


def import_nccl(path: str | Path, text: str | None = None) -> Calibration:
    """Collective rows (both halves of every data row) from an nccl-tests / rccl-tests log."""
    file = str(path)
    if text is None:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    return parse_nccl_text(text, file)


def parse_nccl_text(text: str, source: str = "<text>") -> Calibration:
    """Parse log text; `source` names it in the rows and in errors. CalibrationError if no run can be read."""
    runs: list[_Run] = []
    run = _Run()

    def close(same_table: bool = False) -> None:
        """End the current run. What was read before any row (devices, header, versions) belongs to the next rows;
        a table that restarts its sizes (several data types) keeps its header and devices."""
        nonlocal run
        if not run.halves:
            return
        runs.append(run)
        keep = run
        run = _Run(kind_name=keep.kind_name, command=keep.command)
        if same_table:
            run.header, run.ranks, run.nranks_hint, run.nodes_hint = keep.header, keep.ranks, keep.nranks_hint, \
                keep.nodes_hint
            run.versions = keep.versions

    malformed: list[int] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if _FAILURE.search(line):
            raise CalibrationError(Problem(f"the benchmark failed: {line[:120]!r}", file=source, line=number,
                                           fix="fix the failure (NCCL_DEBUG=INFO says more) and run the benchmark "
                                               "again; the rows before it come from a setup that then failed"))
        half = _data_row(line, number)
        if half:
            if run.halves and half[0].size < run.halves[-1].size:
                close(same_table=True)
            run.halves.extend(half)
            continue
        tokens = line.split()
        if len(tokens) >= 3 and tokens[0].isdecimal() and tokens[1].isdecimal() and tokens[2] in _NCCL_TYPES:
            malformed.append(number)  # a data row's start, but its numbers cannot be read: said, not dropped silently
            continue
        for lib, pattern in _VERSIONS.items():
            if m := pattern.search(line):
                run.versions.setdefault(lib, m.group(1))
        starting = re.search(r"Collective test starting:\s*(\S+)", line)
        binary = _BINARY.search(starting.group(1) if starting else line)
        if line.startswith("```") or re.match(r"^=+.*=+$", line) or "Avg bus bandwidth" in line:
            close()
            if m := re.search(r"(\d+)[- ]nodes?\b", line):
                run.nodes_hint = int(m.group(1))
        elif binary:
            close()
            run.kind_name = binary.group(1)
            if not line.startswith("#"):
                run.command = line.lstrip("+$ ").strip()
        elif line.startswith("# nThread") or line.startswith("# Using devices"):
            close()
            if line.startswith("# Using devices"):
                run.ranks = {}
        elif m := _RANK.match(line):
            run.ranks[int(m.group(1))] = (m.group(2), m.group(3).strip())
        elif line.startswith("#") and " size " in f" {line} " and "busbw" in line:
            run.header = line.lstrip("#").split()
        elif m := re.search(r"\bnranks (\d+)", line):
            run.nranks_hint = int(m.group(1))
    close()
    if not runs:
        raise CalibrationError(Problem("no nccl-tests / rccl-tests data rows found", file=source,
                                       fix="give the stdout of an nccl-tests or rccl-tests binary (e.g. "
                                           "all_reduce_perf -b 8 -e 8G -f 2)"))
    rows: list[CollectiveRow] = []
    provenance: list[Provenance] = []
    skipped = Skipped(source)
    for r in runs:
        if "cputime" in r.header:
            # -C 1 (report_cputime): the time column is the host's; nccl-tests / rccl-tests print it as `cputime`
            # while algbw and busbw stay the GPU's, so the row's time and bandwidth disagree
            raise CalibrationError(Problem(f"the run at lines {r.halves[0].line}-{r.halves[-1].line} reports CPU time "
                                           "(the column is `cputime`: the benchmark ran with -C 1)", file=source,
                                           fix="run the benchmark again without -C 1 (GPU time is its default)"))
        kind = _kind_of(r, source)
        n_ranks = _n_ranks(r, kind, source)
        ratio = _ratio(r)
        if ratio is not None and abs(bus_factor(kind, n_ranks) - ratio) > 0.01 * max(ratio, 0.1):
            raise CalibrationError(Problem(f"busbw / algbw = {ratio:.3f} at lines {r.halves[0].line}-"
                                           f"{r.halves[-1].line} does not match {kind} over {n_ranks} ranks (bus "
                                           f"factor {bus_factor(kind, n_ranks):.3f})", file=source,
                                           fix="keep each run's header (binary name, '# Using devices') with its rows"))
        per_host = Counter(host for host, _ in r.ranks.values())
        n_nodes = len(per_host) if per_host else r.nodes_hint
        even = "import runs with the same GPUs on every node (the fits price even placements)"
        if n_nodes is not None and (n_nodes > n_ranks or n_ranks % n_nodes):
            raise CalibrationError(Problem(f"the run at lines {r.halves[0].line}-{r.halves[-1].line} has {n_ranks} "
                                           f"ranks on {n_nodes} nodes, not the same number on each", file=source,
                                           fix=even))
        if len(set(per_host.values())) > 1:  # 12 ranks on 2 hosts as 8 + 4: divisible, yet not 6 on each
            split = ", ".join(f"{n} on {host}" for host, n in per_host.items())
            raise CalibrationError(Problem(f"the run at lines {r.halves[0].line}-{r.halves[-1].line} has its ranks "
                                           f"split unevenly over the hosts ({split})", file=source, fix=even))
        names = Counter(dev for _, dev in r.ranks.values() if dev)
        device = names.most_common(1)[0][0] if names else None
        for h in r.halves:
            if h.wrong:
                skipped.add("half-row(s) that failed the data check (#wrong non-zero or a starred error)", h.line)
                continue
            row, why = build_row(CollectiveRow, dict(
                kind=kind, n_ranks=n_ranks, n_nodes=n_nodes, size_bytes=h.size, time_s=h.time_us * 1e-6,
                algbw_bytes_per_s=h.algbw_gb_s * 1e9, busbw_bytes_per_s=h.busbw_gb_s * 1e9, in_place=h.in_place,
                dtype=normalize_dtype(h.dtype), device=device, source=f"{source}:{h.line}"))
            if row is None:
                skipped.add("half-row(s) with impossible values", h.line, why or "")
            else:
                rows.append(row)
        provenance.append(Provenance(device_name=device, library_versions=r.versions, command=r.command,
                                     source_files=(source,),
                                     notes=(f"{kind}, {n_ranks} ranks, {n_nodes or '?'} nodes: lines "
                                            f"{r.halves[0].line}-{r.halves[-1].line}",)))
    if malformed:
        lines = ", ".join(map(str, malformed[:10])) + (f" (+{len(malformed) - 10} more)" if len(malformed) > 10 else "")
        provenance.append(Provenance(source_files=(source,), notes=(
            f"skipped {len(malformed)} malformed data row(s) of {source} (numbers that cannot be read) at lines "
            f"{lines}",)))
    if not rows:
        raise CalibrationError(Problem(f"no data row of the log can be used ({skipped.notes()[0].notes[0]})",
                                       file=source, fix="run the benchmark again (with the data check passing)"))
    return Calibration(provenance=(*provenance, *skipped.notes()), collective=tuple(rows))


_FAILURE = re.compile(r"\bTest (?:NCCL |CUDA |HIP |RCCL )?failure\b")  # nccl-tests / rccl-tests common.h on an abort
_STAMP = re.compile(r"\d{4}-\d{2}-\d{2}")  # `-S 1`: a `%Y-%m-%d %H:%M:%S` timestamp after the halves


def _data_row(line: str, number: int) -> list[_Half]:
    """The one or two halves of a data row, or [] if the line is not one."""
    tokens = line.split()
    if len(tokens) > 2 and _STAMP.fullmatch(tokens[-2]) and re.fullmatch(r"\d{2}:\d{2}:\d{2}", tokens[-1]):
        tokens = tokens[:-2]
    if len(tokens) < 7 or not tokens[0].isdecimal() or not tokens[1].isdecimal() or tokens[2] not in _NCCL_TYPES:
        return []
    tail = tokens[3:]
    for halves in (2, 1):
        mids = len(tail) - 4 * halves
        if 0 <= mids <= 2 and all(t in _REDOPS or re.fullmatch(r"-?\d+", t) for t in tail[:mids]):
            groups = [tail[mids + 4 * i: mids + 4 * i + 4] for i in range(halves)]
            if all(_numbers(g) for g in groups):
                return [_Half(number, int(tokens[0]), tokens[2], tuple(tail[:mids]), i == 1, float(g[0]), float(g[1]),
                              float(g[2]), g[3].endswith("*") or (g[3].isdecimal() and int(g[3]) > 0))
                        for i, g in enumerate(groups)]
    return []


def _numbers(group: list[str]) -> bool:
    """time algbw busbw and the check column: three floats, then N/A, a count of wrong elements (newer
    nccl-tests) or a maximum error printed with %le (older ones: 0e+00, 5e-07), either starred when over the limit."""
    try:
        time_us, algbw, busbw = (float(x) for x in group[:3])
    except ValueError:
        return False
    if not (math.isfinite(time_us) and time_us > 0 and math.isfinite(algbw) and algbw >= 0 and math.isfinite(busbw)
            and busbw >= 0):  # a time of 0, negative, nan or inf: not a measurement (counted as a malformed row)
        return False
    return group[3] == "N/A" or re.fullmatch(r"\d+\*?|\d(\.\d+)?e[-+]\d+\*?", group[3]) is not None


def _kind_of(run: _Run, source: str) -> CollectiveKind:
    where = f"lines {run.halves[0].line}-{run.halves[-1].line}"
    if run.kind_name is not None:
        kind = _KINDS.get(run.kind_name)
        if kind is None:
            raise CalibrationError(Problem(f"{run.kind_name}_perf ({where}) is not a collective the model prices",
                                           file=source, fix="remove that run; supported: all_reduce, all_gather, "
                                           "reduce_scatter, alltoall, sendrecv, broadcast, reduce"))
        return kind
    ratio = _ratio(run)
    header = set(run.header)
    mids = {m for h in run.halves for m in h.mids}
    if ratio is not None and ratio > 1.05:
        return "all_reduce"
    if ratio is not None and ratio < 0.995:  # (n-1)/n
        if "redop" not in header and not mids:
            return "all_gather"
        if "sum" in mids and not [m for m in mids if re.fullmatch(r"-?\d+", m)]:
            return "reduce_scatter"
        if "redop" in header and not mids:
            return "all_to_all"
    elif ratio is not None:
        roots = {m for m in mids if re.fullmatch(r"-?\d+", m)}
        if roots == {"-1"}:
            return "send_recv"
        if roots and mids - roots <= {"none"}:
            return "broadcast"
        if roots and "sum" in mids or {"redop", "root"} <= header:
            return "reduce"
    raise CalibrationError(Problem(f"cannot tell which collective the run at {where} measured", file=source,
                                   fix="keep the '# Collective test starting' line or the command line with the "
                                       "*_perf binary name in the log"))


def _ratio(run: _Run) -> float | None:
    best = max(run.halves, key=lambda h: h.algbw_gb_s)
    return best.busbw_gb_s / best.algbw_gb_s if best.algbw_gb_s >= 1.0 else None


def _n_ranks(run: _Run, kind: CollectiveKind, source: str) -> int:
    if run.ranks:
        return max(len(run.ranks), max(run.ranks) + 1)
    if run.nranks_hint:
        return run.nranks_hint
    ratio = _ratio(run)
    if ratio is not None and kind == "all_reduce" and ratio < 1.999:
        return round(2.0 / (2.0 - ratio))
    if ratio is not None and kind in ("all_gather", "reduce_scatter", "all_to_all") and ratio < 0.9995:
        return round(1.0 / (1.0 - ratio))
    raise CalibrationError(Problem(f"cannot tell how many ranks ran the {kind} at lines {run.halves[0].line}-"
                                   f"{run.halves[-1].line}", file=source,
                                   fix="keep the '# Using devices' list (or NCCL_DEBUG=INFO 'nranks' lines) in the "
                                       "log"))
