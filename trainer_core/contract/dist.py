"""Several processes for one stage: under `torchrun` / `accelerate launch`, or started by the driver.

A launcher sets RANK, WORLD_SIZE and LOCAL_RANK (and MASTER_ADDR/PORT for collectives). The
precompute stage needs no collective at all: rank r computes the shards whose index ≡ r (mod
world size) under their final names, so any number of processes on any number of machines
sharing the project folder split the work, and a failed rank only redoes its own shards. The
train stage uses DDP (gloo on the CPU, NCCL on CUDA) when the world has more than one process.

`gguf-trainer start --gpus N` runs those stages as `python -m torch.distributed.run --standalone
--nproc_per_node N -m trainer_core.stages.<stage> …` (`launcher_argv`).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from trainer_core.base.errors import UsageError

__all__ = ["Rank", "current", "rank_device", "launcher_argv", "wait_for", "init_group", "close_group"]


@dataclass(frozen=True)
class Rank:
    rank: int = 0
    world: int = 1
    local: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.world}"


def current(env: dict[str, str] | None = None) -> Rank:
    """This process's rank from the launcher's environment (rank 0 of 1 without a launcher)."""
    env = os.environ if env is None else env
    try:
        world = int(env.get("WORLD_SIZE", "1") or 1)
        rank = int(env.get("RANK", "0") or 0)
        local = int(env.get("LOCAL_RANK", str(rank)) or 0)
    except ValueError:
        raise UsageError(f"RANK / WORLD_SIZE / LOCAL_RANK must be integers, got {env.get('RANK')!r} / "
                         f"{env.get('WORLD_SIZE')!r} / {env.get('LOCAL_RANK')!r}; check the launcher's "
                         "command line.") from None
    if world < 1 or not 0 <= rank < world:
        raise UsageError(f"RANK {rank} is not within WORLD_SIZE {world}; check the launcher's command line.")
    return Rank(rank, world, local)


def rank_device(setting: str, rank: Rank) -> Any:
    """The device of this rank: with several processes on a CUDA machine, "auto" / "cuda" mean the
    local rank's card; otherwise the setting as `devices.pick_device` reads it."""
    import torch

    from trainer_core.contract.devices import pick_device
    if rank.distributed and setting in ("auto", "cuda") and torch.cuda.is_available():
        if rank.local >= torch.cuda.device_count():
            raise UsageError(f"Local rank {rank.local} has no GPU: this machine has {torch.cuda.device_count()}; "
                             "start fewer processes per machine.")
        return torch.device("cuda", rank.local)
    return pick_device(setting)


def launcher_argv(module: str, processes: int, args: list[str]) -> list[str]:
    """The command that starts `processes` ranks of `python -m module args` on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
            "-m", module, *args]


def wait_for(done: Callable[[], bool], should_stop: Callable[[], bool], poll_s: float = 1.0,
             on_wait: Callable[[], None] = lambda: None) -> bool:
    """Poll `done` until it holds (True) or a stop is requested (False): files other ranks write are
    the only coordination precompute needs."""
    while not done():
        if should_stop():
            return False
        on_wait()
        time.sleep(poll_s)
    return True


def init_group(device: Any) -> None:
    """Join the launcher's process group (gloo on the CPU, NCCL on CUDA)."""
    import torch.distributed as td
    if not td.is_initialized():
        td.init_process_group("nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda"
                              else None)


def close_group() -> None:
    import torch.distributed as td
    if td.is_initialized():
        td.destroy_process_group()
