"""contract/shards.py: the running target moments a shard stores (the rest is tested through precompute)."""
from __future__ import annotations

import pytest
import torch

from trainer_core.contract.shards import target_moments


@pytest.mark.parametrize("rows, dim", [(0, 8), (1, 8), (300, 64), (7, 1 << 20)])   # the last: 2 rows a block, 4 blocks
def test_target_moments_equal_one_float64_pass(rows, dim):
    x = (torch.randn(rows, dim, generator=torch.Generator().manual_seed(rows)) * 30 + 5).bfloat16()
    got = target_moments(x, prefix="bstat")
    x64 = x.double()
    assert set(got) == {"bstat_s", "bstat_s2", "bstat_n"}
    assert got["bstat_s"].dtype == got["bstat_s2"].dtype == torch.float64 and got["bstat_s"].shape == (dim,)
    torch.testing.assert_close(got["bstat_s"], x64.sum(0), rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(got["bstat_s2"], (x64 * x64).sum(0), rtol=1e-12, atol=1e-9)
    assert got["bstat_n"].tolist() == [rows] and got["bstat_n"].dtype == torch.int64
