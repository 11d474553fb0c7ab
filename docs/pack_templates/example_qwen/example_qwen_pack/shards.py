"""The example pack's shard: the token-aligned layout with no images (the kind's schema, docs/SHARDS.md) — per
sample its template's student rows and the teacher's rows at the same places, every row supervised; samples sorted
by length; the target statistics over every stored row."""
from __future__ import annotations

from typing import Any, Callable

import torch

from trainer_core.contract.batching import greedy_batches
from trainer_core.contract.shards import target_moments

__all__ = ["token_aligned_shard"]


def token_aligned_shard(samples: list[str], student: Any, teacher: Any, budgets: Any,
                        chunks: Callable[[str], list[str]], max_len: int) -> tuple[dict[str, Any], dict[str, Any]]:
    full = [student.ids(chunks(text)) for text in samples]
    truncated = sum(len(ids) > max_len for ids in full)
    order = sorted(range(len(samples)), key=lambda i: len(full[i]))
    texts, tokens = [samples[i] for i in order], [full[i][:max_len] for i in order]
    t_rows: list[torch.Tensor] = []
    for batch in greedy_batches([len(t) for t in tokens], budgets.teacher_batch, budgets.tok_budget):
        t_rows += [rows.to(torch.bfloat16) for rows in teacher.hidden([tokens[i] for i in batch])]
    _, q_rows, _ = student.rows(tokens, max_len, budgets.student_batch, budgets.student_tok_budget)
    t_pack = torch.cat(t_rows)
    lens = torch.tensor([len(t) for t in tokens], dtype=torch.int32)
    none = torch.zeros(0, dtype=torch.int32)
    tensors = {"ids": torch.tensor([i for t in tokens for i in t], dtype=torch.int32), "len": lens,
               "q_pack": torch.cat(q_rows), "t_pack": t_pack, "t_len": lens.clone(),
               "v_pack": torch.zeros(0, 0, dtype=torch.bfloat16), "vis_sample": none, "vis_start": none,
               "vis_len": none, "sup_start": torch.zeros(len(tokens), dtype=torch.int32),
               "n_images": torch.zeros(len(tokens), dtype=torch.int32), "t_sparse": torch.tensor([0]),
               **target_moments(t_pack)}
    return tensors, {"prompts": texts, "num_queries": 0, "truncated_student": truncated,
                     "meta": {"supervise": "every_row"}}
