"""FSDP2's copies around its collectives, measured: the test decoder of test_fsdp2_unsharded_cpu.py under
`fully_shard` (each layer a unit, bf16 compute over fp32 shards, resharded after forward) on 2 gloo processes,
one training step recorded under a TorchDispatchMode on rank 0. For every all-gather and reduce-scatter of a decoder
layer, the bytes its copies read and write must be what projection/perf/fsdp_sizes.py prices for a unit of the
layer's elements (projection's own count, `layer_params`, which must also be the gathered buffer's size):
* copy-in: the `_foreach_copy_` before `fsdp.all_gather_copy_in` (the fp32 shard cast to bf16) and the copy-in
  itself (its inputs copied into the gather buffer) against `copy_in_op`;
* copy-out: `fsdp.split_with_sizes_copy` against `copy_out_op`;
* reduce-scatter copy-in: `fsdp.chunk_cat` against `chunk_cat_op`;
* the reduced shard's cast to fp32 (`_to_copy` after the reduce-scatter) with a bf16 reduce against
  `reduce_cast_op`, and none with an fp32 reduce.
Which stream each runs on is read from torch's source (2.6 and 2.13, module docstring of fsdp_sizes.py): a CPU has
no streams to measure it on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from projection.perf.fsdp_sizes import chunk_cat_op, copy_in_op, copy_out_op, reduce_cast_op  # noqa: E402
from projection.workload.params import Sharding, layer_params  # noqa: E402
from tests.oracle.spawn import free_port, require_gloo, run_spawned  # noqa: E402
from tests.oracle.test_fsdp2_unsharded_cpu import MODEL, SEQ, _sharded_decoder  # noqa: E402

require_gloo()
pytestmark = pytest.mark.slow
OPS = ("aten._foreach_copy_.default", "fsdp.all_gather_copy_in.default", "fsdp.split_with_sizes_copy.default",
       "fsdp.chunk_cat.default", "c10d._reduce_scatter_base_.default", "aten._to_copy.default")


def _worker(rank: int, port: int, out: str, reduce_name: str) -> None:
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    def sizes(x: Any) -> list[tuple[int, int]]:
        items = x if isinstance(x, (list, tuple)) else [x]
        return [(t.numel(), t.element_size()) for t in items if isinstance(t, torch.Tensor)]

    class Record(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[tuple[str, list[list[tuple[int, int]]], list[list[tuple[int, int]]], Any]] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            if str(func) in OPS:
                self.ops.append((str(func), [sizes(a) for a in args], [sizes(v) for v in kwargs.values()],
                                 sizes(result)))
            return result

    model = _sharded_decoder(rank, port, getattr(torch, reduce_name), reshard=True)
    ids = torch.randint(0, MODEL.vocab_size, (1, SEQ))
    model(ids, ids).backward()  # the first step initialises FSDP's state
    for p in model.parameters():
        p.grad = None
    rec = Record()
    with rec:
        model(ids, ids).backward()
    if rank == 0:
        Path(out).write_text(json.dumps(rec.ops))
    dist.barrier()
    dist.destroy_process_group()


def _nbytes(sizes: list[tuple[int, int]]) -> int:
    return sum(n * b for n, b in sizes)


@pytest.mark.parametrize("reduce_name", ["float32", "bfloat16"])
def test_fsdp2_copies_match_the_priced_ops(reduce_name: str, tmp_path: Path) -> None:
    out = tmp_path / "ops.json"
    run_spawned(_worker, (free_port(), str(out), reduce_name), 2, 120, "FSDP2 copies")
    ops = json.loads(out.read_text())
    layer = sum(layer_params(MODEL, 0, Sharding(1, 1, 1)).values())  # a decoder layer's elements, by projection
    reduce_b = 4 if reduce_name == "float32" else 2
    gathers = scatters = 0
    pending: list[Any] = []  # the foreach copies since the last all_gather_copy_in
    for k, (name, args, kwargs, result) in enumerate(ops):
        if name == "aten._foreach_copy_.default":
            pending.append((args, result))
        elif name == "fsdp.all_gather_copy_in.default":
            gathered = args[1] if len(args) > 1 and args[1] else result[1:]
            numel = sum(n for n, _ in gathered)
            if numel == layer:  # a decoder layer's gather (the root unit holds the embedding and output)
                # the cast: each _foreach_copy_(dsts, srcs) reads its sources and writes its destinations; the
                # copy-in (fsdp.all_gather_copy_in, whose own foreach copy runs below this mode) reads its inputs
                # and writes as many bytes into the gather buffer
                read = sum(_nbytes(a[1]) for a, _ in pending) + _nbytes(args[0])
                written = sum(_nbytes(a[0]) for a, _ in pending) + _nbytes(args[0])
                want = copy_in_op(layer, 2 * layer, 4, 2)
                assert (read, written) == (want.bytes_read, want.bytes_written), pending
                gathers += 1
            pending = []
        elif name == "fsdp.split_with_sizes_copy.default" and sum(n for n, _ in args[0]) == layer:
            want = copy_out_op("layer", 2 * layer)
            assert (_nbytes(args[0]), _nbytes(kwargs[0])) == (want.bytes_read, want.bytes_written)
        elif name == "fsdp.chunk_cat.default" and _nbytes(kwargs[0]) == layer * reduce_b:
            want = chunk_cat_op("layer", layer, 2, reduce_b)
            assert (_nbytes(args[0]), _nbytes(kwargs[0])) == (want.bytes_read, want.bytes_written)
            scatters += 1
            rs = ops[k + 1]
            assert rs[0] == "c10d._reduce_scatter_base_.default"
            cast = next((o for o in ops[k + 2:k + 4] if o[0] == "aten._to_copy.default"
                         and _nbytes(o[1][0]) == layer // 2 * reduce_b), None)
            want_cast = reduce_cast_op(layer, reduce_b, 4, 2)
            if want_cast is None:
                assert cast is None
            else:
                assert cast is not None and (_nbytes(cast[1][0]), _nbytes(cast[3])) == (
                    want_cast.bytes_read, want_cast.bytes_written)
    # 3 layers, each gathered in forward and again in backward (resharded after forward), each reduced once
    assert (gathers, scatters) == (2 * MODEL.num_layers, MODEL.num_layers)
