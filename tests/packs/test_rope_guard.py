"""The rotary-table guard: an uninitialised table is found and rebuilt, an unrepairable one makes
the teacher refuse with the module's name, and the "default" rope type exists in transformers 5."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trainer_core.packs.common.rope_guard import (RopeError, check_rope_tables, default_rope_init, default_rope,
                                           repair_rope_tables, rope_modules, table_problem)

CONFIG = SimpleNamespace(hidden_size=64, num_attention_heads=4, head_dim=16, rope_theta=600000.0,
                         partial_rotary_factor=0.5)


class Rotary(nn.Module):
    """Shaped like remote-code rotary modules: rope_init_fn, config, a non-persistent inv_freq."""

    def __init__(self, init=default_rope_init, table: torch.Tensor | None = None):
        super().__init__()
        self.config, self.rope_init_fn = CONFIG, init
        self.register_buffer("inv_freq", table if table is not None else init(CONFIG)[0], persistent=False)


class Model(nn.Module):
    def __init__(self, **rotary):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
        self.rotary_emb = Rotary(**rotary)


def expected() -> torch.Tensor:
    dim = int(16 * 0.5)
    return torch.tensor([1.0 / 600000.0 ** (i / dim) for i in range(0, dim, 2)])


def test_the_default_table_is_the_formula():
    torch.testing.assert_close(default_rope_init(CONFIG)[0], expected())
    assert table_problem(expected()) is None


@pytest.mark.parametrize("garbage", [torch.tensor([1e27, 0.0, 0.0, 0.0]), torch.tensor([1.0, 2.0, 0.5, 0.1]),
                                     torch.tensor([1.0, float("nan"), 0.1, 0.01]), torch.tensor([1.0, 0.5, 0.0, -1.0]),
                                     torch.empty(0)])
def test_an_uninitialised_table_is_detected_and_repaired(garbage):
    model = Model(table=garbage.clone())
    assert [name for name, _ in rope_modules(model)] == ["rotary_emb"]
    assert table_problem(model.rotary_emb.inv_freq) is not None
    logs = []
    assert repair_rope_tables(model, logs.append) == ["rotary_emb"]
    torch.testing.assert_close(model.rotary_emb.inv_freq, expected())
    assert model.rotary_emb.attention_scaling == 1.0 and "rotary_emb" in logs[0]
    check_rope_tables(model)                                   # sane now: no error


def test_a_meta_table_is_replaced():
    model = Model(table=torch.empty(4, device="meta"))
    repair_rope_tables(model)
    assert model.rotary_emb.inv_freq.device.type == "cpu"
    torch.testing.assert_close(model.rotary_emb.inv_freq, expected())


def test_an_unrepairable_table_makes_the_teacher_refuse_naming_the_module():
    broken_init = lambda config, device=None: (torch.full((4,), math.inf), 1.0)  # noqa: E731
    model = Model(init=broken_init, table=torch.tensor([1e27, 0.0, 0.0, 0.0]))
    repair_rope_tables(model)
    with pytest.raises(RopeError, match=r"rotary_emb: not finite.*refuses to run"):
        check_rope_tables(model)


def test_transformers_5_gets_a_default_rope_type(monkeypatch):
    from transformers import modeling_rope_utils
    monkeypatch.setattr(modeling_rope_utils, "ROPE_INIT_FUNCTIONS",
                        {k: v for k, v in modeling_rope_utils.ROPE_INIT_FUNCTIONS.items() if k != "default"})
    with default_rope() as added:
        assert added is True
        assert modeling_rope_utils.ROPE_INIT_FUNCTIONS["default"] is default_rope_init
        with default_rope() as again:
            assert again is False
        assert modeling_rope_utils.ROPE_INIT_FUNCTIONS["default"] is default_rope_init
    assert "default" not in modeling_rope_utils.ROPE_INIT_FUNCTIONS      # transformers' own models keep theirs
