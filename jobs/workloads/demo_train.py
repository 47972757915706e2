"""Volt's demo training job: data-parallel training of a small MLP on data it generates.

Runs ON a cluster as a Ray job (plain Python; ray and torch imported where used; no Django):

    python demo_train.py --steps 60 --checkpoint-every 10 --seed 0 [--step-sleep 0.2]

One rank per alive Ray node: a STRICT_SPREAD placement group with one bundle per node and one actor
in each bundle (rank = bundle index), a torch.distributed group rooted at rank 0's node IP, gloo on
CPU and NCCL when every rank sees CUDA, DistributedDataParallel with volt_ckpt's timing comm hook.

Deterministic given --seed: rank r's batch at step s is drawn from a generator seeded by
(seed, step, rank); no dropout, one thread per rank, deterministic algorithms, and a zero-loss warm-up
backward before the first real step so DDP's gradient buckets have their final layout on every step
(a resumed run's first step then all-reduces exactly as the uninterrupted run's). A resumed run
(VOLT_RESUME_FROM = a synchronized checkpoint folder) reloads model, optimizer state and step, and
ends bitwise equal to the uninterrupted run (the `done` event's params_sha256).

Checkpoints (every --checkpoint-every steps, default VOLT_CHECKPOINT_EVERY) go to
VOLT_CHECKPOINT_DIR through volt_ckpt: rank r's shard holds every world-th entry of the model and
optimizer state (starting at r), so resuming needs every shard — and works on any world size.

Events on stdout (`VOLT_EVENT {...}`, printed by the driver from what rank 0 sends it): step
(the first step, every --log-every steps and the last), busbw (every --busbw-every steps), checkpoint,
resumed, done. Exit 0 on success, 1 when a rank fails (its error is printed on stderr).

`--local N` runs N ranks as processes on this machine (no Ray; 127.0.0.1), for tests and trials.
`--fail-at-step S --fail-rank R` makes rank R exit abruptly at step S (drills and tests).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

try:
    import volt_ckpt  # shipped next to this file in the job's working dir
except ImportError:  # imported as a package module (tests)
    from . import volt_ckpt  # type: ignore[no-redef]

GROUP_TIMEOUT = timedelta(seconds=120)
PLACEMENT_TIMEOUT_S = 180.0
INPUT_DIM = 256
CLASSES = 16


@dataclass(frozen=True)
class TrainConfig:
    """Everything a rank needs to train; the same on every rank."""

    steps: int = 60
    checkpoint_every: int = 0
    checkpoint_dir: str = ""
    resume_from: str = ""
    seed: int = 0
    step_sleep: float = 0.0
    batch: int = 32
    hidden: int = 512
    lr: float = 1e-3
    log_every: int = 5
    busbw_every: int = 5
    fail_at_step: int = 0
    fail_rank: int = -1
    backend: str = "auto"


# ----------------------------------------------------------------------------- the training


def _derived_seed(*parts: int) -> int:
    digest = hashlib.sha256(":".join(str(int(part)) for part in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def make_model(config: TrainConfig) -> Any:
    import torch

    torch.manual_seed(_derived_seed(config.seed, -1))
    return torch.nn.Sequential(
        torch.nn.Linear(INPUT_DIM, config.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(config.hidden, config.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(config.hidden, CLASSES),
    )


def make_batch(config: TrainConfig, step: int, rank: int) -> tuple[Any, Any]:
    """Rank `rank`'s batch at `step`: inputs from (seed, step, rank), labels from a fixed teacher."""
    import torch

    teacher = torch.Generator().manual_seed(_derived_seed(config.seed, -2))
    weights = torch.randn(INPUT_DIM, CLASSES, generator=teacher)
    generator = torch.Generator().manual_seed(_derived_seed(config.seed, step, rank))
    inputs = torch.randn(config.batch, INPUT_DIM, generator=generator)
    return inputs, (inputs @ weights).argmax(dim=1)


def shard_of(model: Any, optimizer: Any, step: int, rank: int, world: int) -> dict[str, Any]:
    """Rank `rank`'s shard: every world-th model tensor and optimizer state entry, from `rank` on."""
    model_state = model.state_dict()
    optim_state = optimizer.state_dict()
    return {
        "step": step,
        "rank": rank,
        "world_size": world,
        "model": {k: v for i, (k, v) in enumerate(model_state.items()) if i % world == rank},
        "optimizer_state": {k: v for k, v in optim_state["state"].items() if int(k) % world == rank},
        "param_groups": optim_state["param_groups"],
    }


def restore(model: Any, optimizer: Any, shards: list[dict[str, Any]]) -> int:
    """Load the merged shards into model and optimizer; returns the checkpoint's step."""
    model_state: dict[str, Any] = {}
    optim_state: dict[Any, Any] = {}
    for shard in shards:
        model_state.update(shard["model"])
        optim_state.update(shard["optimizer_state"])
    model.load_state_dict(model_state)
    optimizer.load_state_dict({"state": optim_state, "param_groups": shards[0]["param_groups"]})
    return int(shards[0]["step"])


def train_rank(config: TrainConfig, rank: int, world: int, store: Any, sink: Any = None) -> dict[str, Any]:
    """Train as `rank` of `world` (process group from `store`); rank 0 emits events through `sink`.

    Returns {"step", "params_sha256"}.
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    backend = config.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cuda:0" if backend == "nccl" else "cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=GROUP_TIMEOUT)
    try:
        return _train(config, rank, world, device, sink, DistributedDataParallel)
    finally:
        dist.destroy_process_group()


def _train(
    config: TrainConfig, rank: int, world: int, device: Any, sink: Any, ddp_class: Any
) -> dict[str, Any]:
    import torch

    def emit(fn: Any, *args: Any) -> None:
        if rank == 0:
            fn(*args, sink=sink)

    model = make_model(config).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    step = 0
    if config.resume_from:
        _, shards = volt_ckpt.load(config.resume_from)
        step = restore(model, optimizer, shards)
        emit(volt_ckpt.emit_resumed, step, config.resume_from)
    ddp = ddp_class(model, device_ids=[device.index] if device.type == "cuda" else None)
    timer = volt_ckpt.AllReduceTimer(world, every=config.busbw_every)
    ddp.register_comm_hook(None, timer.hook)
    # Zero-loss warm-up: DDP fixes its bucket layout after the first backward; do that here so every
    # real step (the first of a resumed run too) all-reduces the same layout. Changes no state.
    inputs, _ = make_batch(config, 0, rank)
    (ddp(inputs.to(device)).sum() * 0.0).backward()
    optimizer.zero_grad(set_to_none=True)
    timer.reset()
    loss_fn = torch.nn.CrossEntropyLoss()
    first = step + 1
    while step < config.steps:
        step += 1
        if config.fail_at_step == step and config.fail_rank in (rank, -2):
            print(
                f"demo_train: rank {rank} fails at step {step} (--fail-at-step)", file=sys.stderr, flush=True
            )
            os._exit(3)
        inputs, labels = make_batch(config, step, rank)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(inputs.to(device)), labels.to(device))
        loss.backward()
        optimizer.step()
        timer.step_done(step, sink=sink, emit_event=rank == 0)
        if step == first or step % config.log_every == 0 or step == config.steps:
            emit(volt_ckpt.emit_step, step, loss.item())
        if config.checkpoint_every and config.checkpoint_dir and step % config.checkpoint_every == 0:
            shard = shard_of(model, optimizer, step, rank, world)
            # The event once the checkpoint is synchronized: at once on shared storage, after the background
            # upload in Volt's store (an s3:// dir).
            volt_ckpt.save(config.checkpoint_dir, step, shard, rank=rank, world_size=world,
                           meta={"seed": config.seed, "workload": "demo_train"},
                           on_synchronized=lambda manifest, path: emit(
                               volt_ckpt.emit_checkpoint, int(manifest["step"]), path, manifest))  # fmt: skip
        if config.step_sleep > 0:
            time.sleep(config.step_sleep)
    if config.checkpoint_dir:  # the last checkpoint is in the store (or given up) before "done"
        volt_ckpt.finish_uploads(config.checkpoint_dir, rank, world)
    digest = volt_ckpt.params_sha256(model)
    emit(volt_ckpt.emit_done, step, digest)
    return {"step": step, "params_sha256": digest}


# ------------------------------------------------------------------------------ networking


def interface_of(ip: str) -> str | None:
    """The name of the network interface holding `ip` (Linux), or None."""
    try:
        import fcntl

        for _, name in socket.if_nameindex():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                try:
                    packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                except OSError:
                    continue
                if socket.inet_ntoa(packed[20:24]) == ip:
                    return name
    except (ImportError, OSError):
        return None
    if ip.startswith("127."):
        return "lo"
    return None


def pin_gloo_interface(node_ip: str) -> None:
    """Gloo binds to what the hostname resolves to unless told: keep it on the node's own interface."""
    if not os.environ.get("GLOO_SOCKET_IFNAME"):
        name = interface_of(node_ip)
        if name:
            os.environ["GLOO_SOCKET_IFNAME"] = name


# -------------------------------------------------------------------------------------- Ray


class TrainRank:
    """One rank: a Ray actor in its own placement-group bundle (one per node)."""

    def __init__(self, events: Any) -> None:
        import ray

        self.events = events
        self.node_ip = ray.util.get_node_ip_address()
        self._store = None
        pin_gloo_interface(self.node_ip)

    def info(self) -> dict[str, Any]:
        return {"node_ip": self.node_ip, "hostname": socket.gethostname(), "pid": os.getpid()}

    def host_store(self, world: int) -> int:
        """Rank 0: the rendezvous store on this node's IP; returns its (kernel-chosen) port."""
        from torch.distributed import TCPStore

        self._store = TCPStore(self.node_ip, 0, world, is_master=True, wait_for_workers=False,
                               timeout=GROUP_TIMEOUT)  # fmt: skip
        return self._store.port

    def train(self, config: dict[str, Any], rank: int, world: int, master: str, port: int) -> dict[str, Any]:
        from torch.distributed import TCPStore

        store = self._store or TCPStore(master, port, world, is_master=False, timeout=GROUP_TIMEOUT)
        sink = self.events.put if rank == 0 else None
        return train_rank(TrainConfig(**config), rank, world, store, sink)


def run_on_ray(config: TrainConfig, nodes: int | None, timeout_s: float) -> int:
    """Train with one rank per alive node of the Ray cluster this job runs on; the exit code."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.queue import Empty, Queue
    from ray.util.scheduling_strategies import (
        NodeAffinitySchedulingStrategy,
        PlacementGroupSchedulingStrategy,
    )

    ray.init(address="auto", log_to_driver=True)
    alive = [node for node in ray.nodes() if node["Alive"]]
    world = nodes or len(alive)
    print(f"demo_train: {world} ranks ({len(alive)} alive nodes), seed {config.seed}, {config.steps} steps",
          flush=True)  # fmt: skip
    group = placement_group([{"CPU": 1}] * world, strategy="STRICT_SPREAD")
    try:
        ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - GetTimeoutError or a scheduling failure
        print(f"demo_train: no placement for {world} ranks on distinct nodes within {PLACEMENT_TIMEOUT_S:.0f} s: "
              f"{error!r}", file=sys.stderr, flush=True)  # fmt: skip
        return 1
    # Events travel to the driver through a queue pinned to the driver's node (a worker node may die).
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    events = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
    remote_rank = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(TrainRank)
    ranks = [
        remote_rank.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
        ).remote(events)
        for index in range(world)
    ]
    try:
        infos = ray.get([rank.info.remote() for rank in ranks], timeout=PLACEMENT_TIMEOUT_S)
        port = ray.get(ranks[0].host_store.remote(world), timeout=PLACEMENT_TIMEOUT_S)
        print("demo_train: ranks on " + ", ".join(f"{i}={info['node_ip']}" for i, info in enumerate(infos)),
              flush=True)  # fmt: skip
        payload = asdict(config)
        pending = [
            rank.train.remote(payload, i, world, infos[0]["node_ip"], port) for i, rank in enumerate(ranks)
        ]
        return _follow(pending, events, Empty, timeout_s)
    finally:
        for rank in ranks:
            ray.kill(rank)
        remove_placement_group(group)


def _follow(pending: list[Any], events: Any, empty: type, timeout_s: float) -> int:
    """Print rank 0's events as they come until every rank is done; 1 as soon as one fails."""
    import ray

    deadline = time.monotonic() + timeout_s

    def drain() -> None:
        while True:
            try:
                print(events.get_nowait(), flush=True)
            except empty:
                return

    while pending:
        if time.monotonic() > deadline:
            drain()
            print(
                f"demo_train: ranks still running after {timeout_s:.0f} s; giving up",
                file=sys.stderr,
                flush=True,
            )
            return 1
        ready, pending = ray.wait(pending, num_returns=1, timeout=0.5)
        drain()
        for ref in ready:
            try:
                ray.get(ref)
            except Exception as error:  # noqa: BLE001 - any rank's failure fails the job
                drain()
                print(f"demo_train: a rank failed: {error}", file=sys.stderr, flush=True)
                return 1
    drain()
    return 0


# ------------------------------------------------------------------------- local (no Ray)


def _local_rank(rank: int, world: int, port: int, config: dict[str, Any], results: Any) -> None:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", port, world, is_master=False, timeout=GROUP_TIMEOUT)
    results.put((rank, train_rank(TrainConfig(**config), rank, world, store)))


def run_local(config: TrainConfig, world: int, timeout_s: float = 600.0) -> tuple[int, list[dict[str, Any]]]:
    """Run `world` ranks as processes on this machine (gloo over 127.0.0.1); (exit code, results)."""
    import multiprocessing
    import queue

    from torch.distributed import TCPStore

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False, timeout=GROUP_TIMEOUT)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_local_rank, args=(rank, world, store.port, asdict(config), results))
                 for rank in range(world)]  # fmt: skip
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout_s
    collected: dict[int, dict[str, Any]] = {}
    code = 0
    while len(collected) < world and time.monotonic() < deadline:
        try:
            rank, result = results.get(timeout=0.5)
            collected[rank] = result
        except queue.Empty:
            pass
        if any(p.exitcode not in (None, 0) for p in processes):
            code = 1
            break
    if len(collected) < world:
        code = 1
    for process in processes:
        process.join(timeout=5 if code == 0 else 0.5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
    return code, [collected[rank] for rank in sorted(collected)]


# ------------------------------------------------------------------------------------- main


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        steps=args.steps, checkpoint_every=args.checkpoint_every, checkpoint_dir=args.checkpoint_dir,
        resume_from=args.resume_from, seed=args.seed, step_sleep=args.step_sleep, batch=args.batch,
        hidden=args.hidden, lr=args.lr, log_every=args.log_every, busbw_every=args.busbw_every,
        fail_at_step=args.fail_at_step, fail_rank=args.fail_rank, backend=args.backend,
    )  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(description="Volt demo: data-parallel training of a small MLP.")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=int(env.get("VOLT_CHECKPOINT_EVERY") or 0),
                        help="steps between checkpoints (default VOLT_CHECKPOINT_EVERY; 0: none)")  # fmt: skip
    parser.add_argument("--checkpoint-dir", default=env.get("VOLT_CHECKPOINT_DIR", ""),
                        help="shared storage for checkpoints (default VOLT_CHECKPOINT_DIR)")  # fmt: skip
    parser.add_argument("--resume-from", default=env.get("VOLT_RESUME_FROM", ""),
                        help="a synchronized checkpoint folder (default VOLT_RESUME_FROM)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep after each step")
    parser.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--hidden", type=int, default=512, help="hidden width of the MLP")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--log-every", type=int, default=5, help="steps between step events")
    parser.add_argument("--busbw-every", type=int, default=5, help="steps between busbw events")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument("--nodes", type=int, default=int(env.get("VOLT_NUM_NODES") or 0) or None,
                        help="ranks (default VOLT_NUM_NODES, else every alive node)")  # fmt: skip
    parser.add_argument("--local", type=int, default=0, metavar="N", help="N local processes, no Ray")
    parser.add_argument("--timeout-s", type=float, default=24 * 3600.0, help="give up after this long")
    parser.add_argument("--fail-at-step", type=int, default=0, help="drill: a rank exits at this step")
    parser.add_argument("--fail-rank", type=int, default=-1, help="drill: which rank fails (-2: all)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.checkpoint_every < 0:
        parser.error("--checkpoint-every must be 0 (none) or more")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = config_from_args(args)
    if config.checkpoint_every and not config.checkpoint_dir:
        print("demo_train: no --checkpoint-dir / VOLT_CHECKPOINT_DIR: not checkpointing", file=sys.stderr)
    if args.local:
        code, results = run_local(config, args.local, args.timeout_s)
        return code
    return run_on_ray(config, args.nodes, args.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
