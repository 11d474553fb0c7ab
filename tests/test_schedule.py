"""contract/schedule.py: the optimizer the stage builds (the schedule itself is tested with the stage)."""
from __future__ import annotations

import copy

import torch

from trainer_core.contract.schedule import load_optimizer, make_optimizer


def _train(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
        opt.zero_grad(set_to_none=True)
        ((model(x) - y) ** 2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        for group in opt.param_groups:
            group["lr"] = 1e-3 * (step + 1) / steps
        opt.step()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))


def test_the_optimizer_is_the_fused_adamw_and_updates_as_the_per_parameter_loop():
    model = _model()
    twin = copy.deepcopy(model)
    ours = make_optimizer(model.parameters(), 1e-3, 0.01)
    loop = torch.optim.AdamW(twin.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01, foreach=False)
    assert ours.defaults["fused"] is True and ours.defaults["betas"] == (0.9, 0.95)
    _train(model, ours, 12, seed=1)
    _train(twin, loop, 12, seed=1)
    assert not torch.equal(model[0].weight, _model()[0].weight)                     # it trained
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_a_checkpoint_of_the_multi_tensor_update_resumes_on_the_fused_one_exactly_as_a_fused_run():
    """Resume = uninterrupted, whichever update saved the state dict (the flags are the resuming optimizer's)."""
    a, b = _model(), _model()
    old = torch.optim.AdamW(a.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01, foreach=True)
    _train(a, old, 6, seed=2)
    b.load_state_dict(a.state_dict())
    resumed = make_optimizer(b.parameters(), 1e-3, 0.01)
    load_optimizer(resumed, copy.deepcopy(old.state_dict()))
    assert all(g["fused"] is True and not g["foreach"] for g in resumed.param_groups)
    assert all(torch.equal(resumed.state[q]["exp_avg"], old.state[p]["exp_avg"])
               for p, q in zip(a.parameters(), b.parameters()))
    # from here both go on with the fused update: the same steps give the same weights, bit for bit
    c = copy.deepcopy(b)
    twin = make_optimizer(c.parameters(), 1e-3, 0.01)
    load_optimizer(twin, copy.deepcopy(resumed.state_dict()))      # as from a checkpoint file: no shared tensors
    _train(b, resumed, 5, seed=3)
    _train(c, twin, 5, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(b.parameters(), c.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))    # it did train on
