"""train.grad_checkpoint: activation checkpointing recomputes the blocks in the backward pass and trains to
the same weights; the setting decides when it is on."""
from __future__ import annotations

import pytest
import torch

from trainer_core.contract.kinds import AdapterConfig, build_adapter
from trainer_core.stages.train import grad_checkpointing

CONFIGS = {
    "resampler": AdapterConfig("resampler", in_dim=32, out_dim=24, width=64, depth=2, num_queries=8),
    "layerwise": AdapterConfig("token_aligned_layerwise", in_dim=32, out_dim=48, width=64, depth=2, taps=(1, 2, 3)),
    "vision": AdapterConfig("token_aligned_vision", in_dim=32, out_dim=24, width=64, depth=2, vis_dim=16),
    "bridge": AdapterConfig("qwen35_bridge", in_dim=32, out_dim=24, width=64, depth=2, seed_vocab=40, seed_rank=8,
                            vis_dim=16, max_slots=20, n_bank=80, bank_dim=24, bank_align=True),
}


def _train(config: AdapterConfig, on: bool, calls: list[int]) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = build_adapter(config).train()
    model.checkpointing = on
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    g = torch.Generator().manual_seed(1)
    h = torch.randn(3, 7, config.in_dim, generator=g)
    kw = ({"seed_ids": torch.randint(0, 40, (3, 11), generator=g), "vis_kv": torch.randn(3, 4, 16, generator=g),
           "bank_hidden": torch.randn(3, 80, 32, generator=g)} if config.kind == "qwen35_bridge" else {})
    for block in model.blocks:
        original = block.forward

        def counted(*args, _f=original, **kwargs):
            calls.append(1)
            return _f(*args, **kwargs)
        block.forward = counted
    for _ in range(3):
        opt.zero_grad()
        out = model(h, **kw)
        loss = sum((o ** 2).mean() for o in (out if isinstance(out, tuple) else (out,)) if o is not None)
        loss.backward()
        opt.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_checkpointing_recomputes_the_blocks_and_trains_to_the_same_weights(name):
    config = CONFIGS[name]
    plain, again = [], []
    off = _train(config, False, plain)
    on = _train(config, True, again)
    assert len(plain) == 3 * config.depth and len(again) == 2 * 3 * config.depth   # forward + recompute
    assert off.keys() == on.keys() and all(torch.equal(off[k], on[k]) for k in off)


def test_checkpointing_is_off_outside_training(monkeypatch):
    """Evaluation (model.eval(), or no grad) runs the blocks plainly even with checkpointing set."""
    import torch.utils.checkpoint as ckpt
    used = []
    monkeypatch.setattr(ckpt, "checkpoint", lambda *a, **k: used.append(1) or a[0](*a[1:]))
    model = build_adapter(CONFIGS["resampler"])
    model.checkpointing = True
    model.eval()
    model(torch.randn(1, 5, 32))
    model.train()
    with torch.no_grad():
        model(torch.randn(1, 5, 32))
    assert used == []
    model(torch.randn(1, 5, 32))
    assert len(used) == CONFIGS["resampler"].depth


def test_the_setting():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for name, config in CONFIGS.items():
        assert grad_checkpointing("on", config, cpu) and not grad_checkpointing("off", config, cuda)
        assert grad_checkpointing("auto", config, cuda) == (name == "bridge")
        assert not grad_checkpointing("auto", config, cpu)
