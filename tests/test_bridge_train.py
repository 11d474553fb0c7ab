"""The Qwen3.5 bridge's training side: shard reader, masked batch vs the engine's unpadded single
sample, the MOSS head trained as the engine runs it, the loss, the seed table's PCA."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer_core.contract.kinds import AdapterConfig, build_adapter
from trainer_core.contract.bridge import bank_length, bridge_forward, bridge_loss
from trainer_core.contract.shards import write_shard
from trainer_core.contract.stream import ShardRows, val_batches
from trainer_core.packs.common.seed_table import fit_seed_table, load_seed_table, save_seed_table

IN, OUT, VIS, BANK, NB, VOCAB = 24, 20, 12, 16, 80, 50


def _config(n_bank: int = NB) -> AdapterConfig:
    return AdapterConfig("qwen35_bridge", in_dim=IN, out_dim=OUT, width=64, depth=2, seed_vocab=VOCAB, seed_rank=6,
                         vis_dim=VIS, max_slots=40, n_bank=n_bank, bank_dim=BANK if n_bank else 0, bank_align=True)


def _samples() -> list[dict]:
    """(student rows, slot ids, slot targets, images [(start, rows)], bank rows (a Klein sample's) or None, body)."""
    g = torch.Generator().manual_seed(3)
    out = []
    for n_student, n_slots, images, klein in ((5, 9, [], True), (3, 14, [(4, 4)], False), (7, 20, [(4, 3), (9, 6)],
                                                                                             True), (1, 6, [], True)):
        body = n_student if n_student > 1 else 0                  # the last is an "empty" prompt
        real = 3 + body + 5
        out.append({"h": torch.randn(n_student, IN, generator=g), "ids": torch.randint(0, VOCAB, (n_slots,),
                                                                                          generator=g),
                    "t": torch.randn(n_slots, OUT, generator=g),
                    "vis": [(s, torch.randn(n, VIS, generator=g)) for s, n in images],
                    "bank": torch.randn(real + 1, BANK, generator=g) if klein else None, "real": real, "body": body})
    return out


def _write(path, samples, n_bank=NB, flag="has_bank_target", drop=()) -> None:
    bf = lambda t: t.to(torch.bfloat16)  # noqa: E731
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    t = torch.cat([s["t"] for s in samples]).double()
    blocks = [(i, st, v) for i, s in enumerate(samples) for st, v in s["vis"]]
    tensors = {"ids": i32([1] * sum(len(s["h"]) for s in samples)), "len": i32([len(s["h"]) for s in samples]),
               "q_pack": bf(torch.cat([s["h"] for s in samples])), "slot_ids": i32(torch.cat([s["ids"] for s in
                                                                                             samples]).tolist()),
               "t_len": i32([len(s["ids"]) for s in samples]), "t_pack": bf(torch.cat([s["t"] for s in samples])),
               "stat_s": t.sum(0), "stat_s2": (t * t).sum(0), "stat_n": torch.tensor([t.shape[0]]),
               "v_pack": bf(torch.cat([v for _, _, v in blocks])), "vis_sample": i32([b[0] for b in blocks]),
               "vis_start": i32([b[1] for b in blocks]), "vis_len": i32([len(b[2]) for b in blocks]),
               flag: torch.tensor([s["bank"] is not None for s in samples], dtype=torch.int8)}
    if n_bank:
        banks = [s["bank"] for s in samples if s["bank"] is not None]
        tensors.update({"b_pack": bf(torch.cat(banks)),
                        "bank_rows": i32([0 if s["bank"] is None else len(s["bank"]) for s in samples]),
                        "bank_real": i32([0 if s["bank"] is None else s["real"] for s in samples]),
                        "bank_body": i32([0 if s["bank"] is None else s["body"] for s in samples]),
                        "bank_slots": i32([n_bank]), "bstat_s": torch.zeros(BANK, dtype=torch.float64),
                        "bstat_s2": torch.ones(BANK, dtype=torch.float64), "bstat_n": torch.tensor([1])})
    for key in drop:
        del tensors[key]
    write_shard(path, tensors, {"pack": "qwen35_bridge", "kind": "qwen35_bridge"}, ["p"] * len(samples))


def _bf(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).float()


@pytest.mark.parametrize("flag", ["has_bank_target", "klein"])       # "klein": a shard of an earlier version
def test_reader_expands_the_bank_and_places_vision(tmp_path, flag):
    samples = _samples()
    _write(tmp_path / "val-00000.safetensors", samples, flag=flag)
    batch = ShardRows(tmp_path / "val-00000.safetensors").collate([0, 1, 2, 3])
    b = batch.bridge
    assert batch.seed_ids.shape == (4, 20) and batch.tmask.sum(1).tolist() == [9, 14, 20, 6]
    assert torch.equal(batch.seed_ids[2, :20], samples[2]["ids"])
    assert torch.equal(b.has_bank_target, torch.tensor([True, False, True, True])) and b.n_bank_targets == 3
    # vision: under its slots and as keys, in image order
    assert torch.equal(b.vis_slot[2, 9:15], _bf(samples[2]["vis"][1][1]))
    assert torch.equal(b.vis_kv[2, :9], _bf(torch.cat([v for _, v in samples[2]["vis"]])))
    assert b.vis_keep.sum(1).tolist() == [0, 4, 9, 0] and not b.vis_slot[0].any()
    # bank: the real rows, then the stored pad row up to ceil80, nothing past it
    for k, i in enumerate((0, 2, 3)):
        s = samples[i]
        n80 = bank_length(s["real"], NB)
        assert b.bank_mask[k].sum() == n80 == 80
        assert torch.equal(b.bank_target[k, :s["real"]], _bf(s["bank"][:s["real"]]))
        assert torch.equal(b.bank_target[k, s["real"]:n80], _bf(s["bank"][s["real"]]).expand(n80 - s["real"], -1))
        body = s["body"]
        assert torch.equal(b.bank_hidden[k, 3:3 + body], batch.h[i, :body])
        assert not b.bank_hidden[k, :3].any() and not b.bank_hidden[k, 3 + body:].any()
    # a micro-batch slice keeps the Klein rows that belong to it
    part = b[slice(1, 3)]
    assert part.has_bank_target.tolist() == [False, True] and torch.equal(part.bank_target, b.bank_target[1:2])


def test_a_bank_shard_without_its_bank_rows_is_refused_by_name(tmp_path):
    import re

    from trainer_core.base.errors import ModelFileError
    path = tmp_path / "p" / "shards" / "val" / "val-00000.safetensors"
    path.parent.mkdir(parents=True)
    _write(path, _samples(), drop=("b_pack",))
    with pytest.raises(ModelFileError, match=re.escape(
            f"The shard {path} has no `b_pack` tensor, which a Qwen3.5 bridge adapter reads from its shards; run "
            f"`gguf-trainer run --project {tmp_path / 'p'} --only precompute_val` to compute it again.")):
        ShardRows(path)


def test_bank_length_is_the_engines():
    assert [bank_length(n, 240) for n in (8, 80, 81, 160, 239, 240)] == [80, 80, 160, 160, 240, 240]
    assert bank_length(300, 240) == 240


@pytest.mark.parametrize("n_bank", [NB, 0])
def test_batched_equals_unpadded_single_samples_as_the_engine_runs_them(tmp_path, n_bank):
    """Slot rows: the engine's MOSS path (no masks, batch 1, bank = bank_query alone); bank rows of a Klein
    sample: the FLUX.3 path (bank_hidden from the student's rows)."""
    torch.manual_seed(0)
    samples = _samples()
    _write(tmp_path / "val-00000.safetensors", samples, n_bank)
    model = build_adapter(_config(n_bank)).eval()
    batch = next(val_batches([tmp_path / "val-00000.safetensors"], 4))
    with torch.no_grad():
        slots, plain, aligned = bridge_forward(model, batch)
        k = 0
        for i, s in enumerate(samples):
            h = _bf(s["h"])[None]
            vis = [(st, _bf(v)) for st, v in s["vis"]]
            vis_slot = torch.zeros(1, len(s["ids"]), VIS)
            for st, v in vis:
                vis_slot[0, st:st + len(v)] = v
            kv = torch.cat([v for _, v in vis])[None] if vis else None
            bank, single = model(h, seed_ids=s["ids"][None], vis_slot=vis_slot, vis_kv=kv)
            assert torch.allclose(slots[i, :len(s["ids"])], single[0], atol=1e-5), i
            if n_bank and s["bank"] is not None:
                hidden = torch.zeros(1, NB, IN)
                hidden[0, 3:3 + s["body"]] = h[0, :s["body"]]
                bank_ff, _ = model(h, seed_ids=s["ids"][None], vis_slot=vis_slot, vis_kv=kv, bank_hidden=hidden)
                assert torch.allclose(aligned[k], bank_ff[0], atol=1e-5), i
                assert torch.allclose(plain[i], bank[0], atol=1e-5)
                k += 1
    assert (aligned is None) == (n_bank == 0)


def test_the_moss_head_is_trained_without_bank_hidden(tmp_path):
    """The slot loss's gradient is that of the engine's MOSS path: bank_in gets gradient from the bank loss
    alone."""
    torch.manual_seed(1)
    _write(tmp_path / "val-00000.safetensors", _samples())
    model = build_adapter(_config())
    batch = next(val_batches([tmp_path / "val-00000.safetensors"], 4))
    ones, zeros = torch.ones(OUT), torch.zeros(OUT)
    slots_only, parts = bridge_loss(batch, bridge_forward(model, batch), zeros, ones, None, 0.5)
    slots_only.backward()
    assert model.bank_in.weight.grad is None or not model.bank_in.weight.grad.any()
    assert set(parts) == {"mse", "cos", "rel_mse"}
    model.zero_grad()
    both, _ = bridge_loss(batch, bridge_forward(model, batch), zeros, ones, (torch.zeros(BANK), torch.ones(BANK)),
                          0.5)
    both.backward()
    assert model.bank_in.weight.grad.abs().sum() > 0 and both > slots_only


def test_seed_table_is_the_pca_of_the_embeddings(tmp_path):
    g = torch.Generator().manual_seed(5)
    table = torch.randn(300, 16, generator=g) @ torch.randn(16, 16, generator=g) + 3.0
    fitted, kept = fit_seed_table(table, 4)
    assert fitted.dtype == torch.float16 and fitted.shape == (300, 4)
    x = table.double().numpy()
    x = x - x.mean(0)
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    ref = x @ vt[:4].T
    ref /= np.sqrt((ref ** 2).mean())
    got = fitted.double().numpy()
    for j in range(4):                       # each component up to its sign
        sign = np.sign((got[:, j] * ref[:, j]).sum())
        assert np.allclose(got[:, j], sign * ref[:, j], atol=2e-3)
    assert kept == pytest.approx(float((s[:4] ** 2).sum() / (s ** 2).sum()), rel=1e-6)
    save_seed_table(tmp_path / "seed_table.pt", fitted, kept, "qwen35_bridge")
    record, why = load_seed_table(tmp_path / "seed_table.pt", 300, 4, "qwen35_bridge")
    assert torch.equal(record["table"], fitted) and why == ""
    record, why = load_seed_table(tmp_path / "seed_table.pt", 300, 8, "qwen35_bridge")
    assert record is None and "[300, 8]" in why
    (tmp_path / "seed_table.pt").write_bytes(b"garbage")
    assert load_seed_table(tmp_path / "seed_table.pt", 300, 4, "qwen35_bridge")[0] is None
