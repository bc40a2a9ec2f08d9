"""Device and cluster specs, and the loader of the bundled device YAMLs (`hardware_specs/*.yaml`).

Units are SI inside (FLOP/s, bytes, bytes/s, seconds, watts). A YAML file may write a quantity as a number in those
units or as a string with a unit ("192GB", "5.3TB/s", "400Gbps", "1307.4 TFLOP/s", "2us"); `projection.units` converts.
FLOP/s peaks are dense (no structured sparsity). Every numeric value must cite where it comes from in `sources`
(field path -> text starting with a trust tag: R read from a source, R2 secondary transcription, D derived, A assumed;
the tags of /work/shared/reference/hardware.md §0).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, BeforeValidator, Field, ValidationError, field_validator, model_validator

from projection.errors import ConfigError, Problem
from projection.fileio import MAX_YAML_KEYS, YAML_LOADER, YamlTooDeep, not_regular, parse_yaml, require_regular
from projection.paths import HARDWARE_DIR, is_device_path
from projection.specs.base import Spec
from projection.units import parse_bandwidth, parse_bytes, parse_duration, parse_flop_rate

Dtype = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4"]


def _number(parse: Callable[[str], float] | None = None, *, integer: bool = False) -> BeforeValidator:
    """Before-validator of a number field: strings go through `parse` (a units.py parser); booleans are refused."""

    def convert(value: object) -> object:
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got the boolean {value!r}")
        if isinstance(value, str) and parse is not None:
            number = parse(value)  # unit arithmetic leaves float noise ("5.3GB"); bytes are whole
            if not math.isfinite(number):  # "1e400GiB": a typo, and int(inf) would raise OverflowError
                raise ValueError("expected a finite number")
            return int(round(number)) if integer else number
        return value

    return BeforeValidator(convert)


# Physical ranges, far wider than any part's (a GPU's dense peak is ~1e15-1e16 FLOP/s, links 1e9-1e13 B/s, latencies
# and issue times microseconds): a value outside them is a typo or a unit slip, and would overflow the pricing
# (a host issue time of 1e300 s) rather than project anything
FlopPerS = Annotated[float, _number(parse_flop_rate), Field(ge=1e6, le=1e18)]
Bytes = Annotated[int, _number(parse_bytes, integer=True), Field(gt=0)]
# a device's memory: at least 256 MiB (every accelerator here holds GiBs; a bare '192' or '40' is a unit slip)
MemoryBytes = Annotated[int, _number(parse_bytes, integer=True), Field(ge=2**28, le=2**50)]
BytesPerS = Annotated[float, _number(parse_bandwidth), Field(ge=1e3, le=1e15)]
Seconds = Annotated[float, _number(parse_duration), Field(gt=0, le=3600)]
# a message's latency across a link or fabric: at most 100 ms (GPU fabrics' are microseconds, a CPU's gloo a few
# hundred; a bare 5, meant as 5 us, is a unit slip)
Latency = Annotated[float, _number(parse_duration), Field(gt=0, le=0.1)]
Count = Annotated[int, _number(), Field(gt=0)]
Watts = Annotated[float, _number(), Field(gt=0)]


class IntraNodeLinkSpec(Spec):
    """GPU-to-GPU fabric inside one node (xGMI / Infinity Fabric, NVLink, PCIe).

    topology: mesh = point-to-point links to each peer (a pair gets one link's share); switch = any-to-any at the full
    per-GPU bandwidth (NVSwitch). bandwidth_per_direction_bytes_per_s: bytes/s per GPU, all its links together, one
    direction (a datasheet 'bidirectional' figure halved). latency_s: per-message latency (alpha), seconds."""

    kind: Literal["xgmi", "nvlink", "pcie"]
    topology: Literal["mesh", "switch"]
    links_per_gpu: Count
    bandwidth_per_direction_bytes_per_s: BytesPerS
    latency_s: Latency
    efficiency: Annotated[float, _number(), Field(gt=0, le=1)] | None = None
    """The bus-bandwidth fraction of the per-direction line rate a ring collective reaches (protocol overhead);
    None = line rate."""


class NicSpec(Spec):
    """Scale-out network interfaces of one node. bandwidth_bytes_per_s: each NIC, one direction (400 Gb/s = 5e10
    bytes/s); latency_s: per-message latency across the scale-out fabric (alpha), seconds; efficiency: the bus
    bandwidth NCCL/RCCL ring collectives reach through one NIC as a fraction of its line rate (a published or measured
    figure with its source; None = line rate)."""

    count_per_node: Count
    bandwidth_bytes_per_s: BytesPerS
    latency_s: Latency
    efficiency: Annotated[float, _number(), Field(gt=0, le=1)] | None = None


class FlopEfficiencyPoint(Spec):
    """One point of a compute efficiency curve: achieved / datasheet-peak FLOP/s for a kernel of `flop` FLOP."""

    flop: Annotated[float, _number(), Field(gt=0)]
    efficiency: float = Field(gt=0, le=1)
    source: str = Field(min_length=1)  # citation starting with a tag R / R2 / D / A, like `sources`


class BytesEfficiencyPoint(Spec):
    """One point of the memory efficiency curve: achieved / datasheet HBM bandwidth for an op moving `bytes`."""

    bytes: Annotated[float, _number(parse_bytes), Field(gt=0)]
    efficiency: float = Field(gt=0, le=1)
    source: str = Field(min_length=1)


class EfficiencySpec(Spec):
    """Size-dependent efficiency curves (Calculon-style: efficiency as a function of the work of one kernel), used by
    the roofline cost model (projection/cost/roofline.py) between and beyond the points: linear in log(size), flat
    outside. gemm: per dtype, vs. FLOP of one GEMM; attention: per dtype, vs. the forward FLOP of one flash-attention
    call; memory: vs. bytes read + written by one bandwidth-bound op. Points strictly increasing in size."""

    gemm: dict[Dtype, tuple[FlopEfficiencyPoint, ...]] = Field(default_factory=dict)
    attention: dict[Dtype, tuple[FlopEfficiencyPoint, ...]] = Field(default_factory=dict)
    memory: tuple[BytesEfficiencyPoint, ...] = ()

    @model_validator(mode="after")
    def _increasing(self) -> EfficiencySpec:
        curves = [(f"gemm.{k}", [p.flop for p in v]) for k, v in self.gemm.items()]
        curves += [(f"attention.{k}", [p.flop for p in v]) for k, v in self.attention.items()]
        curves.append(("memory", [p.bytes for p in self.memory]))
        bad = [name for name, sizes in curves if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False))]
        if bad:
            raise ValueError(f"efficiency points must be strictly increasing in size: {', '.join(bad)}")
        return self


class DeviceSpec(Spec):
    """One accelerator model: peak dense FLOP/s per dtype, HBM, and the links of its typical node, with sources."""

    name: str = Field(min_length=1)  # short identifier, e.g. 'mi300x' (the file's stem for bundled devices)
    vendor: Literal["amd", "nvidia"]
    marketing_name: str = Field(min_length=1)
    aliases: tuple[str, ...] = ()
    """Other names `load_device` accepts (compared case-insensitively, ignoring '-', '_' and spaces)."""
    gpu_arch: str | None = None
    """The ISA name a ROCm tool prints for the part (gfx942, gfx950; not unique: MI300X and MI325X share gfx942).
    A calibration whose device name carries it is taken as measured on this part (benchmark logs often print
    'AMD Radeon Graphics gfx942' rather than the product name)."""
    mx_formats: bool = False
    """Whether the matrix cores run OCP microscaling (MXFP8) GEMMs natively (Blackwell, CDNA4): torchao's and
    Transformer Engine's MXFP8 recipes need it."""
    peak_flop_per_s: dict[Dtype, FlopPerS] = Field(min_length=1)
    """Datasheet peak, dense, FLOP/s per dtype. A dtype the part cannot run (or whose peak is unknown) is absent."""
    hbm_bytes: MemoryBytes
    hbm_bandwidth_bytes_per_s: BytesPerS
    gpus_per_node: Count  # GPUs in the typical node of this part (8 for every bundled device)
    intra_node: IntraNodeLinkSpec
    nic: NicSpec
    tdp_w: Watts | None = None  # board power in watts (vendors' TDP / TBP), if known
    host_kernel_issue_s: Seconds | None = None
    """Host seconds to issue one kernel from eager PyTorch training code on this device's typical node (Python,
    dispatcher and launch call), for the framework-overhead model of projection/perf; None = not modelled."""
    host_link_bytes_per_s: BytesPerS | None = None
    """The GPU's host interface (PCIe), bytes/s per direction: offloaded activations and optimizer state cross it
    (projection/perf); None = those copies are not priced (the projection says so)."""
    sources: dict[str, Annotated[str, Field(min_length=1)]] = Field(default_factory=dict)
    """Field path ('peak_flop_per_s.bf16', 'nic.latency_s') -> citation, starting with a tag R / R2 / D / A."""
    efficiency: EfficiencySpec | None = None
    """Optional efficiency curves (each point carries its own source); None = the roofline runs at peak."""

    @field_validator("sources")
    @classmethod
    def _every_number_has_a_source(cls, sources: dict[str, str], info: Any) -> dict[str, str]:
        needed = [p for key, value in info.data.items() for p in _numeric_paths(value, key)]
        missing = [p for p in needed if p not in sources]
        unknown = sorted(set(sources) - set(_source_keys()))
        errors = [f"{what}: {', '.join(keys)}" for what, keys in
                  (("numeric fields without a source", missing), ("sources name no field", unknown)) if keys]
        if errors:
            raise ValueError("; ".join(errors))
        return sources

    @model_validator(mode="after")
    def _mesh_reaches_every_peer(self) -> DeviceSpec:
        """A mesh gives each GPU a link to every peer of its node (Fabric.intra_bandwidth prices a pair at one link's
        share): fewer links than peers would be a node the mesh formula cannot price."""
        links, peers = self.intra_node.links_per_gpu, self.gpus_per_node - 1
        if self.intra_node.topology == "mesh" and links < peers:
            raise ValueError(f"{MESH_LINKS}: a mesh needs a link to each of the node's {peers} other GPUs, not "
                             f"{links} (give links_per_gpu >= gpus_per_node - 1 = {peers}, or topology: switch)")
        return self


MESH_LINKS = "intra_node.links_per_gpu"  # the key DeviceSpec's mesh rule names (whole-model errors carry no loc)


def model_error_key(err: Any) -> tuple[str | None, str]:
    """(the field a whole-model error names at the head of its message, the message after it), else (None, it)."""
    detail = str(err.get("ctx", {}).get("error", err["msg"])).removeprefix("Value error, ")
    head, _, rest = detail.partition(": ")
    return (head, rest) if head == MESH_LINKS else (None, detail)


class ClusterSpec(Spec):
    """A homogeneous cluster: `nodes` nodes of `gpus_per_node` devices, joined by a rail-optimized or fat-tree
    scale-out fabric whose upper tiers may be oversubscribed (1.0 = full bisection bandwidth)."""

    device: DeviceSpec
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(default=0, ge=1)  # if not given: the device's typical node, filled in before validation
    inter_node_topology: Literal["rail_optimized", "fat_tree"] = "rail_optimized"
    # taper of the upper fabric tiers; real fabrics run 1:1 to about 8:1, so 64 bounds typos, not designs
    oversubscription: float = Field(default=1.0, ge=1.0, le=64.0)

    @model_validator(mode="before")
    @classmethod
    def _default_gpus_per_node(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("gpus_per_node") is None:
            device = data.get("device")
            per_node = device.get("gpus_per_node") if isinstance(device, dict) else getattr(device, "gpus_per_node", 0)
            data = {**data, "gpus_per_node": per_node} if per_node else data
        return data

    @property
    def world_size(self) -> int:
        """Total number of devices (ranks)."""
        return self.nodes * self.gpus_per_node


def _numeric_paths(value: object, prefix: str) -> list[str]:
    """Dotted paths of the numbers (not booleans) inside a validated value."""
    value = value.model_dump() if isinstance(value, BaseModel) else value
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _numeric_paths(v, f"{prefix}.{k}")]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [prefix]
    return []


def _field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every leaf path of a model's schema; dicts keyed by a Literal expand to one path per key."""
    out: list[str] = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _field_paths(ann, path + ".")
        elif get_origin(ann) is dict and get_origin(get_args(ann)[0]) is Literal:
            out += [f"{path}.{k}" for k in get_args(get_args(ann)[0])]
        else:
            out.append(path)
    return out


def _source_keys() -> list[str]:
    return [p for p in _field_paths(DeviceSpec) if p != "sources"]


_EXAMPLES = {  # dotted key, else leaf key -> an example value for the fix line; unit strings or SI numbers both work
    "peak_flop_per_s": "{bf16: 1307.4 TFLOP/s}", "hbm_bytes": "192GB or 1.92e+11", "tdp_w": "750",
    "hbm_bandwidth_bytes_per_s": "5.3TB/s or 5.3e+12", "bandwidth_per_direction_bytes_per_s": "448GB/s or 4.48e+11",
    "bandwidth_bytes_per_s": "400Gbps or 5.0e+10", "latency_s": "2us or 2.0e-6", "gpus_per_node": "8",
    "links_per_gpu": "7", "count_per_node": "8", "nic.efficiency": "0.96",
    "host_link_bytes_per_s": "63GB/s or 6.3e+10"}


def value_example(loc: tuple[str, ...]) -> str:
    """An example value for a device field's fix line ('' where none is listed)."""
    return _EXAMPLES.get(".".join(loc), _EXAMPLES.get(loc[-1] if loc else "", ""))


def list_devices(search_dir: Path = HARDWARE_DIR) -> list[str]:
    """Names (file stems) of the device YAML files in `search_dir`, sorted; [] if the folder does not exist."""
    if not search_dir.is_dir():
        return []
    return sorted(p.stem for p in search_dir.glob("*.yaml") if p.is_file())


def load_device(name_or_path: str | Path, search_dir: Path = HARDWARE_DIR, *, key: str = "device",
                file: str | None = None, line: int | None = None) -> DeviceSpec:
    """Load a DeviceSpec from a bundled name ('mi300x', 'MI300X', 'h100', 'a100' ...) or a path to a YAML file.

    Raises ConfigError naming the file, the line, the key and the fix for a missing or malformed file, an unknown or
    mistyped key, a number without a source, or an unknown device name (the error lists the available ones).
    key / file / line: where the name was given, for an unknown or ambiguous name (e.g. key '--hardware' in file
    '<command line>', or key 'cluster.hardware' at a scenario file's line); default: key 'device' in `search_dir`."""
    path = _resolve(name_or_path, search_dir, key=key, file=file, line=line)
    if file is not None:  # a path written in a scenario or on the command line: a problem is located there
        kind = "not found" if not path.exists() else not_regular(path)
        if kind is not None:
            raise ConfigError(Problem(f"device file {str(name_or_path)!r} is {kind}" if kind != "not found" else
                                      f"device file {str(name_or_path)!r} not found", key=key, file=file, line=line,
                                      fix="give the path of a device YAML file (relative paths are taken from the "
                                      f"current directory), or a bundled device name: {', '.join(list_devices())}"))
    data, lines = _read_yaml(path)
    try:
        return DeviceSpec.model_validate(data)
    except ValidationError as err:
        raise ConfigError([_problem(e, path, lines) for e in err.errors()]) from None


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _resolve(name_or_path: str | Path, search_dir: Path, *, key: str = "device", file: str | None = None,
             line: int | None = None) -> Path:
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or is_device_path(text):
        return Path(text).expanduser()
    want = _norm(text)
    stems = list_devices(search_dir)
    by_norm = {_norm(stem): stem for stem in stems}
    if want in by_norm:
        return search_dir / f"{by_norm[want]}.yaml"
    matches = []
    for stem in stems:
        try:
            header = yaml.load((search_dir / f"{stem}.yaml").read_text(encoding="utf-8"), Loader=YAML_LOADER)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # a broken file is reported when it is loaded by path or by its own name
        if isinstance(header, dict):
            names = [header.get("name")] + list(header.get("aliases") or [])
            if any(isinstance(n, str) and _norm(n) == want for n in names):
                matches.append(stem)
    if len(matches) == 1:
        return search_dir / f"{matches[0]}.yaml"
    available = ", ".join(stems) or f"(no device YAML files in {search_dir})"
    where = file or str(search_dir)
    if matches:
        raise ConfigError(Problem(f"device name {text!r} is ambiguous: aliases of {', '.join(matches)}", key=key,
                                  file=where, line=line, fix=f"use the exact name, one of: {available}"))
    unknown = f"unknown device {text!r}" + (f" (not among the devices in {search_dir})" if file else "")
    raise ConfigError(Problem(unknown, key=key, file=where, line=line,
                              fix=f"use one of: {available}; or give the path to a device YAML file"))


def _read_yaml(path: Path) -> tuple[dict[str, Any], dict[tuple[str, ...], int]]:
    """Parse a YAML mapping; also return the 1-based line of each key path (from yaml.compose)."""
    file = str(path)
    require_regular(path)  # `cluster.hardware: /dev/zero` would be read until memory runs out
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        if isinstance(err, FileNotFoundError):
            raise ConfigError(Problem("device file not found", file=file, fix="check the path, or give a bundled "
                                      f"device name: {', '.join(list_devices())}")) from None
        raise ConfigError(Problem(f"cannot read device file: {err}", file=file, fix="give a UTF-8 YAML file")) from None
    try:
        root, data = parse_yaml(text)
    except YamlTooDeep:
        raise ConfigError(Problem("the device YAML is nested too deeply to read (more than 100 levels of lists or "
                                  "mappings)", file=file, fix="flatten the nesting (a device file needs a few levels); "
                                  "check that this is the file you meant")) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError(Problem(f"invalid YAML: {problem}", file=file,
                                  line=mark.line + 1 if mark is not None else None,
                                  fix="fix the YAML syntax (indentation, quotes, ':' after each key)")) from None
    if not isinstance(data, dict) or root is None:
        raise ConfigError(Problem("the file must hold a YAML mapping of device fields", file=file,
                                  line=root.start_mark.line + 1 if root is not None else None,
                                  fix="start with 'name: <device>' (see hardware_specs/README.md)"))
    lines: dict[tuple[str, ...], int] = {}
    duplicates: list[Problem] = []
    _index_lines(root, (), lines, duplicates, file)
    if duplicates:
        raise ConfigError(duplicates)
    return data, lines


def _index_lines(node: yaml.Node, path: tuple[str, ...], lines: dict[tuple[str, ...], int],
                 duplicates: list[Problem], file: str) -> None:
    lines.setdefault(path, node.start_mark.line + 1)  # a key's own line is set first, by its parent
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            sub = (*path, str(key_node.value))
            if sub in lines:  # keys of a mapping are indexed only here, so a second sighting is a duplicate
                duplicates.append(Problem("duplicate key", key=".".join(sub), file=file,
                                          line=key_node.start_mark.line + 1, fix="keep only one of them"))
            lines.setdefault(sub, key_node.start_mark.line + 1)
            if len(lines) > MAX_YAML_KEYS:  # aliases of aliases expand without bound
                raise ConfigError(Problem(f"the device YAML expands to more than {MAX_YAML_KEYS:,} keys (anchors and "
                                          "aliases repeated into each other)", file=file,
                                          fix="write the device out without nested aliases"))
            _index_lines(value_node, sub, lines, duplicates, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, (*path, str(i)), lines, duplicates, file)


def _problem(err: Any, path: Path, lines: dict[tuple[str, ...], int]) -> Problem:
    """Turn one pydantic error into a Problem at the key's file and line."""
    loc = tuple(str(x) for x in err["loc"] if x != "[key]")
    named, said = model_error_key(err) if not loc else (None, "")
    if named is not None:  # a rule over several fields, said at the field it names
        loc = tuple(named.split("."))
        line = next((lines[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in lines), None)
        return Problem(said, key=named, file=str(path), line=line, fix="see hardware_specs/README.md")
    key = ".".join(loc) or None
    line = next((lines[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in lines), None)
    kind = err["type"]
    example = value_example(loc)
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        message = "unknown key"
        fix = "remove it or fix its spelling" + (f"; allowed here: {', '.join(allowed)}" if allowed else "")
    elif kind == "missing":
        message = "required key is missing"
        fix = f"add it{f', e.g. {loc[-1]}: {example}' if example else ''} (see hardware_specs/README.md)"
    elif key == "sources":
        message = str(err.get("ctx", {}).get("error", err["msg"]))
        fix = "give each number a citation under 'sources:', e.g. hbm_bytes: 'R2: hardware.md §1 MI300X row'"
        if "name no field" in message:
            fix += "; valid keys: " + ", ".join(_source_keys())
    elif kind == "literal_error":
        message = f"{err['msg']} (got {err.get('input')!r})"
        fix = f"use one of {err.get('ctx', {}).get('expected', 'the values listed')}"
    else:
        detail = err.get("ctx", {}).get("error") if kind == "value_error" else None
        message = f"{detail or err['msg']} (got {err.get('input')!r})"
        fix = f"write e.g. {example}" if example else "give a value of the right type"
    return Problem(message, key=key, file=str(path), line=line, fix=fix)


def _allowed_keys(loc: tuple[str, ...]) -> list[str]:
    prefix = "".join(f"{part}." for part in loc)
    return sorted({p[len(prefix):].split(".")[0] for p in _field_paths(DeviceSpec) if p.startswith(prefix)})
