"""The stream's batch gather against a row-by-row reading of the same shard."""
from __future__ import annotations

import pytest
import torch

import trainer_core.contract.batch as batch_module
import trainer_core.contract.stream as stream_module
from trainer_core.contract.shards import Shard, write_shard
from trainer_core.contract.stream import ShardStream, StreamPosition, val_batches


def _shard(path, lens, t_lens, in_dim=6, out_dim=5, seeded=False, seed=0, drop=()):
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lens, dtype=torch.int32)
    t_lens = torch.tensor(t_lens, dtype=torch.int32)
    tensors = {
        "ids": torch.randint(0, 100, (int(lens.sum()),), generator=g, dtype=torch.int32),
        "len": lens,
        "q_pack": torch.randn(int(lens.sum()), in_dim, generator=g).bfloat16(),
        "t_pack": torch.randn(int(t_lens.sum()), out_dim, generator=g).bfloat16(),
        "t_len": t_lens,
        "stat_s": torch.zeros(out_dim, dtype=torch.float64),
        "stat_s2": torch.zeros(out_dim, dtype=torch.float64),
        "stat_n": torch.tensor([int(t_lens.sum())]),
    }
    if seeded:
        tensors["seed_ids"] = torch.randint(0, 50, (len(lens), 4), generator=g, dtype=torch.int32)
        tensors["seed_len"] = t_lens.clone()
    kind = "seeded_resampler" if seeded else "resampler"
    for key in drop:
        del tensors[key]
    write_shard(path, tensors, {"samples": len(lens), "kind": kind}, [f"p{i}" for i in range(len(lens))])
    return path


def _naive(path, rows, window=None):
    """Each sample's rows read one at a time from fully loaded tensors."""
    s = Shard(path)
    lens, t_lens = s["len"].long(), s["t_len"].long()
    q, t = s["q_pack"].float(), s["t_pack"].float()
    q_off, t_off = torch.cumsum(lens, 0) - lens, torch.cumsum(t_lens, 0) - t_lens
    L = int(max(lens[r] for r in rows))
    R = window or int(max(t_lens[r] for r in rows))
    h = torch.zeros(len(rows), L, q.shape[1])
    target = torch.zeros(len(rows), R, t.shape[1])
    mask = torch.zeros(len(rows), L, dtype=torch.bool)
    tmask = torch.zeros(len(rows), R, dtype=torch.bool)
    for b, r in enumerate(rows):
        n, m = int(lens[r]), int(t_lens[r])
        h[b, :n] = q[q_off[r]:q_off[r] + n]
        mask[b, :n] = True
        target[b, :m] = t[t_off[r]:t_off[r] + m]
        tmask[b, :m] = True
    return h, mask, target, tmask


@pytest.mark.parametrize("big", [False, True], ids=["one-gather", "per-sample-copies"])
def test_a_gathered_batch_equals_the_rows_read_one_by_one(tmp_path, monkeypatch, big):
    if big:     # the path batches of the reference size take
        monkeypatch.setattr(batch_module, "BIG", 0)
    path = _shard(tmp_path / "a.safetensors", [3, 7, 1, 5, 2, 9, 4], [2, 4, 1, 3, 2, 6, 1])
    rows = [5, 0, 3, 2]
    batch = ShardStream([path], 4, seed=1)._rows(0).collate(rows)
    h, mask, target, tmask = _naive(path, rows)
    assert torch.equal(batch.h, h) and torch.equal(batch.mask, mask)
    assert torch.equal(batch.target, target) and torch.equal(batch.tmask, tmask)
    assert batch.seed_ids is None


def test_seeded_batches_pad_targets_to_the_window_and_carry_seed_ids(tmp_path):
    path = _shard(tmp_path / "s.safetensors", [4, 2, 6], [3, 1, 4], seeded=True)
    batch = next(val_batches([path], 2))
    h, mask, target, tmask = _naive(path, [0, 1], window=4)
    assert torch.equal(batch.h, h) and torch.equal(batch.target, target)
    assert torch.equal(batch.mask, mask) and torch.equal(batch.tmask, tmask)
    assert torch.equal(batch.seed_ids, Shard(path)["seed_ids"][:2].long())
    assert batch.seed_len.tolist() == [3, 1]


@pytest.mark.parametrize("seeded, key", [(True, "seed_ids"), (False, "t_len")])
def test_a_shard_without_a_tensor_its_kind_reads_is_refused_naming_it_and_the_command(tmp_path, seeded, key):
    import re

    from trainer_core.base.errors import ModelFileError
    path = tmp_path / "p" / "shards" / "train" / "train-00000.safetensors"
    path.parent.mkdir(parents=True)
    _shard(path, [4, 2], [3, 1], seeded=seeded, drop=(key,))
    title = "seeded resampler" if seeded else "resampler"
    with pytest.raises(ModelFileError, match=re.escape(
            f"The shard {path} has no `{key}` tensor, which a {title} adapter reads from its shards; run "
            f"`gguf-trainer run --project {tmp_path / 'p'} --only precompute_train` to compute it again.")):
        next(val_batches([path], 2))


def test_the_stream_visits_every_row_once_per_epoch_and_resumes_in_place(tmp_path):
    files = [_shard(tmp_path / f"{i}.safetensors", [2 + i, 3, 1, 4, 2], [1, 2, 1, 3, 2], seed=i)
             for i in range(3)]
    stream = ShardStream(files, 2, seed=7)
    # 3 shards of 5 rows in batches of 2 -> 3 batches per shard, 9 per epoch
    first = [stream.next() for _ in range(9)]
    assert stream.position == StreamPosition(epoch=1, shard_i=0, batch_i=0)
    assert sum(b.size for b in first) == 15
    seen = sorted(round(float(b.h[i][b.mask[i]].sum()), 3) for b in first for i in range(b.size))
    every = sorted(round(float(Shard(f)["q_pack"].float()[o:o + n].sum()), 3)
                   for f in files
                   for o, n in zip((torch.cumsum(Shard(f)["len"].long(), 0) - Shard(f)["len"].long()).tolist(),
                                   Shard(f)["len"].long().tolist()))
    assert seen == every
    resumed = ShardStream(files, 2, seed=7, position=StreamPosition(epoch=0, shard_i=1, batch_i=1))
    assert torch.equal(resumed.next().h, first[4].h)


def test_read_ahead_gives_the_same_batches_and_positions_as_reading_in_step(tmp_path):
    files = [_shard(tmp_path / f"{i}.safetensors", [2 + i, 3, 1, 4, 2, 5, 1], [1, 2, 1, 3, 2, 2, 1], seed=i)
             for i in range(3)]
    plain = ShardStream(files, 3, seed=5)
    ahead = ShardStream(files, 3, seed=5, keep_dtype=True, prefetch=2)
    for _ in range(11):
        a, b = plain.next(), ahead.next()
        assert b.h.dtype == torch.bfloat16 and b.to(torch.device("cpu")).h.dtype == torch.float32
        assert torch.equal(a.h, b.to(torch.device("cpu")).h) and torch.equal(a.target, b.target.float())
        assert torch.equal(a.mask, b.mask) and ahead.position == plain.position
    # assigning a position (a resume) restarts the read-ahead there
    ahead.position = StreamPosition(epoch=0, shard_i=2, batch_i=1)
    plain.position = StreamPosition(epoch=0, shard_i=2, batch_i=1)
    assert torch.equal(ahead.next().target.float(), plain.next().target)
    ahead.close()
    assert ahead._ahead is None


def test_a_damaged_shard_read_ahead_raises_in_the_consumer(tmp_path):
    good = _shard(tmp_path / "0.safetensors", [2, 3], [1, 2])
    bad = tmp_path / "1.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    stream = ShardStream([good, bad], 2, seed=0, prefetch=2)
    from trainer_core.base.errors import ModelFileError
    with pytest.raises(ModelFileError, match="damaged"):
        for _ in range(3):
            stream.next()
    stream.close()


def test_val_batches_read_ahead_match_and_stop_early_cleanly(tmp_path):
    files = [_shard(tmp_path / f"v{i}.safetensors", [3, 1, 4, 2, 2], [2, 1, 3, 1, 2], seed=i) for i in range(2)]
    plain = list(val_batches(files, 2))
    ahead = list(val_batches(files, 2, keep_dtype=True, prefetch=1))
    assert len(plain) == len(ahead) == 6
    for a, b in zip(plain, ahead):
        assert torch.equal(a.h, b.h.float()) and torch.equal(a.tmask, b.tmask)
    gen = val_batches(files, 2, prefetch=1)
    next(gen)
    gen.close()          # the thread is told to stop and joined: no hang


def test_validation_reads_one_shard_at_a_time_never_the_whole_set(tmp_path, monkeypatch):
    """The val set stays on disk: a shard is opened only when its batches are reached (the published
    package holds every val row in RAM, ~4 GB for Qwen-Image 2.1)."""
    files = [_shard(tmp_path / f"v{i}.safetensors", [3, 1, 4], [2, 1, 3], seed=i) for i in range(4)]
    opened = []
    real_init = stream_module.ShardRows.__init__

    def counting_init(self, path):
        opened.append(path)
        real_init(self, path)
    monkeypatch.setattr(stream_module.ShardRows, "__init__", counting_init)
    batches = val_batches(files, 3)
    next(batches)
    assert opened == files[:1]
    next(batches)
    assert opened == files[:2]


def test_docs_shards_lists_the_tensors_every_kind_reads():
    from pathlib import Path

    from trainer_core.contract.kinds import registered
    text = (Path(__file__).resolve().parent.parent / "docs" / "SHARDS.md").read_text(encoding="utf-8")
    rows = [line.split("|") for line in text.splitlines() if line.startswith("| `")]
    for kind in registered().values():
        row = next((r for r in rows if f"`{kind.name}`" in r[1]), None)
        assert row is not None, f"docs/SHARDS.md has no row for the {kind.name} kind's shard tensors"
        assert all(f"`{key}`" in row[2] for key in kind.shard_keys) and all(
            f"`{key}`" in row[3] for key in kind.optional_shard_keys), kind.name
