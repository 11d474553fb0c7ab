"""One bridge shard: the slots of the MOSS template, the raw vision embeds, the Klein bank rows.

Per sample (sorted by the Qwen3.5 template's length): the student's rows of the raw prompt; the
teacher's ids of the MOSS template with references rendered by the engine's resize (template.py),
each slot's target = Qwen3.5's last hidden state; the raw vision embeds of every reference; and for
Klein samples (the Klein head on) the Qwen3-VL-4B stack over [prefix 3] + the student's ids of the
prompt (cut to bank_slots − 8) + [suffix 5] — n_real rows and one pad row. A template longer than
train.max_slots renders its references at half the area (down to 65536 px, or ≤ 64 tokens each)
until it fits; one that never fits is left out with a log line. Layout: contract/bridge.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from trainer_core.base.errors import TrainerError
from trainer_core.contract.batching import greedy_batches
from trainer_core.contract.bridge import BANK_PREFIX, BANK_SUFFIX, bank_length
from trainer_core.contract.image_corpus import BANK_TARGET
from trainer_core.contract.kinds.qwen35_bridge import BANK_TARGET as BANK_TARGET_KEY
from trainer_core.contract.shards import target_moments
from trainer_core.packs.common.slot_settings import render_fitting

__all__ = ["BridgeSession", "build_shard", "MIN_AREA"]

MIN_AREA = 65536            # the engine's min_pixels: references are never shrunk below it
_SMALL_REFERENCE = 64       # merged tokens per reference below which shrinking stops


@dataclass
class BridgeSession:
    """What precompute fixes once per stage (pack.prepare)."""

    encode: Callable[[str], list[int]]            # the teacher's tokenizer on a whole string
    ref_areas: Sequence[Sequence[float]] = ()
    two_image_max_area: int = 0
    max_slots: int = 2304
    n_bank: int = 0                               # 0 = no Klein head
    klein: Any = None                             # the Klein bank teacher (FLUX.3's), when the head is on
    log: Callable[[str], None] = print
    skipped: list[str] = field(default_factory=list)


def _render(sample: dict[str, Any], session: BridgeSession) -> tuple[list[int], list[tuple[int, int]],
                                                                      list[np.ndarray]] | None:
    """(ids, image runs, references) of a sample whose template fits max_slots, else None."""
    from trainer_core.packs.qwen35_bridge.template import build_prompt_ids, load_reference, merged_tokens
    from trainer_core.packs.common.qwen3vl.qwenimage_data import choose_area
    area = choose_area(sample["rel"], sample["text"], session.ref_areas, session.two_image_max_area) \
        if sample["images"] and session.ref_areas else 0
    while True:
        try:
            images = [load_reference(path, area) for path in sample["images"]]
        except (OSError, ValueError) as e:
            raise TrainerError(f"The reference image {sample['images']} cannot be read ({e}); reset the corpus so "
                               "it is built again without it.") from None
        counts = [merged_tokens(*im.shape[:2]) for im in images]
        ids, runs = build_prompt_ids(session.encode, sample["text"], counts)
        if len(ids) <= session.max_slots:
            return ids, runs, images
        if not images or area == MIN_AREA or max(counts) <= _SMALL_REFERENCE:
            return None
        area = max(MIN_AREA, (area or images[0].shape[0] * images[0].shape[1]) // 2)


def build_shard(samples: list[dict[str, Any]], student: Any, teacher: Any, budgets: Any, session: BridgeSession,
                max_len_student: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    kept, rendered = render_fitting(samples, lambda sample: _render(sample, session) or (
        f"left out a sample whose template exceeds train.max_slots = {session.max_slots} even with its "
        f"references at {MIN_AREA} px"), session)
    ids = [r[0] for r in rendered]

    flat = [im for r in rendered for im in r[2]]
    encoded = teacher.encode_images(flat, budgets.vis_tok_budget) if flat else []
    per_sample, k = [], 0
    for r in rendered:
        per_sample.append(encoded[k:k + len(r[2])])
        k += len(r[2])
    t_rows: list[torch.Tensor] = [None] * len(ids)                 # type: ignore[list-item]
    for batch in greedy_batches([len(t) for t in ids], budgets.teacher_batch, budgets.tok_budget):
        out = teacher.hidden([(ids[i], rendered[i][2]) for i in batch])
        for i, rows in zip(batch, out):
            t_rows[i] = rows.to(torch.bfloat16)

    tokens = [student.tokenize(s["text"]) for s in kept]             # the raw prompt, as the engine
    tokens, q_rows, truncated = student.rows(tokens, max_len_student, budgets.student_batch,
                                             budgets.student_tok_budget)
    t_pack = torch.cat(t_rows)
    vis_dim = int(encoded[0].shape[1]) if encoded else int(getattr(teacher, "vis_dim"))
    vis_sample, vis_start, vis_len = [], [], []
    for i, r in enumerate(rendered):
        for (start, n), rows in zip(r[1], per_sample[i]):
            if rows.shape[0] != n:
                raise TrainerError(f"The vision tower gave {rows.shape[0]} rows for a reference of {n} tokens.")
            vis_sample.append(i)
            vis_start.append(start)
            vis_len.append(n)
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    tensors = {
        "ids": i32([t for ts in tokens for t in ts]), "len": i32([len(t) for t in tokens]),
        "q_pack": torch.cat(q_rows), "slot_ids": i32([t for ts in ids for t in ts]),
        "t_len": i32([len(t) for t in ids]), "t_pack": t_pack,
        **target_moments(t_pack),
        "v_pack": (torch.cat([v.to(torch.bfloat16) for v in encoded]) if encoded
                   else torch.zeros(0, vis_dim, dtype=torch.bfloat16)),
        "vis_sample": i32(vis_sample), "vis_start": i32(vis_start), "vis_len": i32(vis_len),
        BANK_TARGET_KEY: torch.tensor([bool(s.get(BANK_TARGET)) and session.n_bank > 0 for s in kept],
                                      dtype=torch.int8),
    }
    if session.n_bank:
        tensors.update(_bank(kept, tokens, session, budgets))
    meta = {"bank_slots": session.n_bank, "klein_target": "prompt" if session.n_bank else "",
            "max_slots": session.max_slots, "skipped": len(samples) - len(kept)}
    return tensors, {"prompts": [s["text"] for s in kept], "num_queries": 0, "truncated_student": truncated,
                     "meta": meta}


def _bank(kept: list[dict[str, Any]], tokens: list[list[int]], session: BridgeSession, budgets: Any
          ) -> dict[str, torch.Tensor]:
    """The Klein rows of the Klein samples: n_real rows + one pad row (none when n_real = n_bank), and the
    bank moments (the pad row weighted by the pads the engine emits, n80 − n_real)."""
    from trainer_core.packs.common.qwen_chat import PREFIX_IDS, SUFFIX_IDS
    NB, room = session.n_bank, session.n_bank - BANK_PREFIX - BANK_SUFFIX
    rows_n, real_n, body_n, templates, members = [], [], [], [], []
    for i, (sample, ids) in enumerate(zip(kept, tokens)):
        if not sample.get(BANK_TARGET):
            rows_n.append(0)
            real_n.append(0)
            body_n.append(0)
            continue
        body = list(ids[:room]) if sample["text"] else []      # an empty prompt has an empty body
        template = [*PREFIX_IDS, *body, *SUFFIX_IDS]
        templates.append(template)
        members.append(i)
        real_n.append(len(template))
        body_n.append(len(body))
        rows_n.append(len(template) + (1 if len(template) < NB else 0))
    outputs: list[torch.Tensor] = []
    for batch in greedy_batches([len(t) + 1 for t in templates], budgets.teacher_batch, budgets.tok_budget):
        outputs += session.klein.hidden([templates[i] for i in batch])
    stored, s, s2, n = [], None, None, 0.0
    if templates:
        for template, rows in zip(templates, outputs):
            real = len(template)
            keep = rows[:real + (1 if real < NB else 0)].to(torch.bfloat16)
            stored.append(keep)
            w = torch.ones(keep.shape[0], dtype=torch.float64)
            if real < NB:
                w[real] = bank_length(real, NB) - real
            x = keep.double()
            s = (w[:, None] * x).sum(0) if s is None else s + (w[:, None] * x).sum(0)
            s2 = (w[:, None] * x * x).sum(0) if s2 is None else s2 + (w[:, None] * x * x).sum(0)
            n += float(w.sum())
    dim = int(stored[0].shape[1]) if stored else int(session.klein.out_dim)
    zeros = torch.zeros(dim, dtype=torch.float64)
    return {"b_pack": torch.cat(stored) if stored else torch.zeros(0, dim, dtype=torch.bfloat16),
            "bank_rows": torch.tensor(rows_n, dtype=torch.int32), "bank_real": torch.tensor(real_n, dtype=torch.int32),
            "bank_body": torch.tensor(body_n, dtype=torch.int32), "bank_slots": torch.tensor([NB], dtype=torch.int32),
            "bstat_s": zeros if s is None else s, "bstat_s2": zeros.clone() if s2 is None else s2,
            "bstat_n": torch.tensor([int(round(n))], dtype=torch.int64)}
