"""Where models run: the device a setting names, and the memory budgets of §A.5."""
from __future__ import annotations

import torch

from trainer_core.base.errors import UsageError
from trainer_core.contract.placement import card_budget_gib, teacher_mode

__all__ = ["pick_device", "gpu_budget_gib", "cpu_budget_gib", "is_big_card", "place_teacher"]


def pick_device(setting: str) -> torch.device:
    """"auto": the CUDA device with the most memory, else the CPU; "cuda", "cuda:N", "cpu" as named."""
    if setting == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        best = max(range(torch.cuda.device_count()),
                   key=lambda i: torch.cuda.get_device_properties(i).total_memory)
        return torch.device("cuda", best)
    device = torch.device(setting)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f'The device "{setting}" was chosen but this machine has no CUDA GPU that '
                             f'torch can use; choose "auto" or "cpu".')
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise UsageError(f'The device "{setting}" does not exist: this machine has '
                             f'{torch.cuda.device_count()} CUDA device(s).')
        return torch.device("cuda", index)
    return device


def is_big_card(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_properties(device).total_memory > 24e9


def gpu_budget_gib(device: torch.device, setting: float) -> float:
    """The teacher's GPU budget: the setting, or (0) the card's total minus 1.5 GiB, at least 1."""
    if setting > 0:
        return setting
    if device.type != "cuda":
        return 0.0
    return card_budget_gib(torch.cuda.get_device_properties(device).total_memory / 2**30, setting)


def place_teacher(mode: str, device: torch.device, gpu_mem_gib: float, need_gib: float) -> str:
    """contract/placement.py's rule on `device`: the card's budget is read only when `auto` needs it."""
    cuda = device.type == "cuda"
    return teacher_mode(mode, cuda, gpu_budget_gib(device, gpu_mem_gib) if cuda and mode == "auto" else 0.0,
                        need_gib)


def cpu_budget_gib(setting: float) -> float:
    """The CPU RAM budget: the setting, or (0) available RAM minus 6 GiB, at least 4."""
    if setting > 0:
        return setting
    import psutil
    return max(4.0, psutil.virtual_memory().available / 2**30 - 6.0)
