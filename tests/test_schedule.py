"""contract/schedule.py: the optimizer the stage builds (the schedule itself is tested with the stage)."""
from __future__ import annotations

import copy

import torch

from trainer_core.contract.schedule import make_optimizer


def test_the_optimizer_is_the_multi_tensor_adamw_and_updates_exactly_as_the_per_parameter_loop():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))
    twin = copy.deepcopy(model)
    ours = make_optimizer(model.parameters(), 1e-3, 0.01)
    loop = torch.optim.AdamW(twin.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01, foreach=False)
    assert ours.defaults["foreach"] is True and ours.defaults["betas"] == (0.9, 0.95)
    for step in range(12):
        x, y = torch.randn(4, 16), torch.randn(4, 8)
        for net, opt in ((model, ours), (twin, loop)):
            opt.zero_grad(set_to_none=True)
            ((net(x) - y) ** 2).mean().backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            for group in opt.param_groups:
                group["lr"] = 1e-3 * (step + 1) / 12
            opt.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)
    # a state dict of one resumes in the other
    loop.load_state_dict(ours.state_dict())
    assert all(torch.equal(loop.state[b]["exp_avg"], ours.state[a]["exp_avg"])
               for a, b in zip(model.parameters(), twin.parameters()))
