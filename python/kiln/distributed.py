"""torch.distributed on kiln tensors: the "kiln" process-group backend (docs/distributed.md).

    import torch, torch.distributed as dist, kiln
    kiln.connect(socket, job="train")            # this worker's kilnd, rank r of a distributed job
    dist.init_process_group("kiln", store=..., rank=r, world_size=n)
    dist.all_reduce(grad)                         # grad on kiln: reduced across the job's daemons

The collectives run where kiln.all_reduce runs them: between the kilnd daemons of the worker's
distributed job (kilnd --dist-*), through the daemons' own rendezvous and Gloo; torch's store
only serves init_process_group. The group's rank and size must be the daemon's rank and world
size (checked when the group is made: a mismatch would reduce with the wrong peers). A worker in
process, or on a daemon whose distributed job is not the worker's, is a world of one.

Each collective is one of kiln's IR ops (docs/decisions.md):
    allreduce       AllReduce
    broadcast       Broadcast from the root rank
    allgather       AllGather along dim 0 (of a [1, ...] view of each rank's tensor)
    reduce_scatter  ReduceScatter along dim 0 (of the ranks' inputs stacked, or the flat input)
    barrier         an all-reduce of one element, then a sync
Collectives are lazy like every kiln op: the returned work is complete at once, and a failed
collective (a peer's daemon gone) raises KilnError at the next sync or read of its result.
Other collectives (alltoall, send/recv, gather, scatter, reduce, subgroups of the world) raise
NotImplementedError naming what is supported.
"""

import json

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    _create_work_from_future,
    AllgatherOptions,
    AllreduceOptions,
    BarrierOptions,
    BroadcastOptions,
    ReduceOp,
    ReduceScatterOptions,
)
from torch.futures import Future

__all__ = ["KilnProcessGroup", "world_of_this_worker"]

# opts.reduceOp is a ReduceOp object, ReduceOp.SUM and the others its RedOpType: keyed by the
# latter (ReduceOp.op).
_REDUCE_OPS = {
    ReduceOp.SUM: "sum",
    ReduceOp.AVG: "mean",
    ReduceOp.MIN: "min",
    ReduceOp.MAX: "max",
    ReduceOp.PRODUCT: "prod",
}
_SUPPORTED = "allreduce and reduce_scatter (sum, avg, min, max, product), broadcast, allgather, barrier"


def world_of_this_worker():
    """(rank, world_size) of the daemon job this process's kiln tensors belong to: the daemon's
    distributed rank and world when its distributed job is this worker's job, else (0, 1).
    Starts the device as the first kiln op would."""
    import kiln

    if kiln.device_info()["where"] != "kilnd":
        return 0, 1
    status = json.loads(kiln.daemon_status(json=True))  # starts the device: a client id from here
    info = kiln.device_info()
    group = status.get("distributed")
    mine = [c for c in status.get("clients", []) if c.get("id") == info["client_id"]]
    if not group or not mine or mine[0].get("job") != group["job"]:
        return 0, 1
    return group["rank"], group["world_size"]


def _done(result):
    future = Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _check_on_kiln(name, tensors):
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type != "kiln":
            where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"kiln backend: {name}: a tensor is on {where}, not kiln")


def _scatter(stacked, op, world):
    """This rank's part of the ranks' `stacked` ([world, ...]) reduced; bool travels as u8, as in _reduce."""
    if stacked.dtype == torch.bool:
        part = torch.ops.kiln.reduce_scatter(stacked.to(torch.uint8), "max" if op == "sum" else op, world)
        return part.bool()
    return torch.ops.kiln.reduce_scatter(stacked, op, world)


def _reduce(tensor, op):
    # kiln's AllReduce takes numbers; a bool tensor travels as u8 (sum: any rank's True).
    import kiln

    if tensor.dtype == torch.bool:
        wide = tensor.to(torch.uint8)
        kiln.all_reduce(wide, "max" if op == "sum" else op)
        tensor.copy_(wide.bool())
        return tensor
    return kiln.all_reduce(tensor, op)


class KilnProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group whose collectives are kiln's, across the daemons of the
    worker's distributed job. Made by init_process_group("kiln", ...) (or new_group with the
    whole world); see the module's docstring."""

    def __init__(self, rank, world_size):
        super().__init__(rank, world_size)
        kiln_rank, kiln_world = world_of_this_worker()
        if (rank, world_size) != (kiln_rank, kiln_world):
            raise ValueError(
                f"kiln backend: the group is rank {rank} of {world_size}, but this worker's kilnd job is rank "
                f"{kiln_rank} of {kiln_world} (kilnd --dist-rank/--dist-world-size; in process, or outside the "
                "daemon's distributed job, a world of one); subgroups of the world are not formed")
        self._rank = rank
        self._world_size = world_size

    def getBackendName(self):
        return "kiln"

    def size(self):
        return self._world_size

    def rank(self):
        return self._rank

    def allreduce(self, tensors, opts=AllreduceOptions()):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        _check_on_kiln("allreduce", tensors)
        op = self._reduce_op(opts)
        with torch.no_grad():
            for t in tensors:
                _reduce(t, op)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=AllreduceOptions()):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=BroadcastOptions()):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        _check_on_kiln("broadcast", tensors)
        if not 0 <= opts.rootRank < self._world_size:
            raise ValueError(f"kiln backend: broadcast from rank {opts.rootRank}, the world has {self._world_size}")
        with torch.no_grad():
            for t in tensors:
                t.copy_(torch.ops.kiln.broadcast(t, opts.rootRank, self._world_size))
        return _done(tensors)

    def allgather(self, output_lists, inputs, opts=AllgatherOptions()):
        if isinstance(inputs, torch.Tensor):
            inputs, output_lists = [inputs], [output_lists]
        _check_on_kiln("allgather", list(inputs) + [o for outs in output_lists for o in outs])
        with torch.no_grad():
            for outs, x in zip(output_lists, inputs, strict=True):
                self._check_per_rank("allgather into", len(outs))
                stacked = self._gather(x)
                for r, out in enumerate(outs):
                    out.copy_(stacked[r])
        return _done(output_lists)

    def _allgather_base(self, output, x, opts=AllgatherOptions()):
        _check_on_kiln("allgather", [output, x])
        self._check_flat("allgather", x.numel(), output.numel())
        with torch.no_grad():
            output.copy_(self._gather(x).reshape(output.shape))
        return _done([output])

    def _gather(self, x):
        """[world, *x.shape]: every rank's x, rank 0 first."""
        gathered = torch.ops.kiln.all_gather(x.reshape(1, *x.shape), self._world_size)
        return gathered.reshape(self._world_size, *x.shape)

    def reduce_scatter(self, outputs, input_lists, opts=ReduceScatterOptions()):
        if isinstance(outputs, torch.Tensor):
            outputs, input_lists = [outputs], [input_lists]
        _check_on_kiln("reduce_scatter", list(outputs) + [t for ins in input_lists for t in ins])
        op = self._reduce_op(opts)
        with torch.no_grad():
            for out, ins in zip(outputs, input_lists, strict=True):
                self._check_per_rank("reduce_scatter of", len(ins))
                out.copy_(_scatter(torch.stack(list(ins)), op, self._world_size).reshape(out.shape))
        return _done(outputs)

    def _reduce_scatter_base(self, output, x, opts=ReduceScatterOptions()):
        _check_on_kiln("reduce_scatter", [output, x])
        self._check_flat("reduce_scatter", output.numel(), x.numel())
        op = self._reduce_op(opts)
        with torch.no_grad():
            output.copy_(_scatter(x.reshape(self._world_size, -1), op, self._world_size).reshape(output.shape))
        return _done([output])

    def _check_per_rank(self, what, count):
        """A list form's tensors: one per rank."""
        if count != self._world_size:
            raise ValueError(f"kiln backend: {what} {count} tensors, the world has {self._world_size}")

    def _check_flat(self, name, per_rank, total):
        """A flat form's sizes: `total` elements hold `per_rank` of every rank."""
        if total != per_rank * self._world_size:
            raise ValueError(f"kiln backend: {name} of {per_rank} elements per rank over {total}, expected "
                             f"{per_rank * self._world_size}")

    @staticmethod
    def _reduce_op(opts):
        kind = getattr(opts.reduceOp, "op", opts.reduceOp)
        op = _REDUCE_OPS.get(kind)
        if op is None:
            raise NotImplementedError(f"kiln backend: reduce op {kind} is not supported (supported: {_SUPPORTED})")
        return op

    def barrier(self, opts=BarrierOptions()):
        import kiln

        kiln.all_reduce(torch.zeros(1, device="kiln"), "sum")
        kiln.synchronize()  # returns once every rank reached the reduction
        return _done(None)


def _refused(name):
    def collective(self, *args, **kwargs):
        raise NotImplementedError(f"kiln backend: {name} is not supported (supported: {_SUPPORTED})")

    return collective


for _method, _name in (("alltoall", "alltoall"), ("alltoall_base", "alltoall"), ("gather", "gather"),
                       ("scatter", "scatter"), ("reduce", "reduce"), ("send", "send"), ("recv", "recv")):
    setattr(KilnProcessGroup, _method, _refused(_name))


def _create(store, rank, world_size, timeout):
    return KilnProcessGroup(rank, world_size)


def register():
    """Registers the "kiln" backend with torch.distributed (import kiln does it once)."""
    if "kiln" not in dist.Backend.backend_list:
        dist.Backend.register_backend("kiln", _create, devices=["kiln"])
