"""One Ming-Image shard: per sample the student's rows of the raw prompt, the Ling prompt ids (one
slot each) with the direct rows as their targets, the 256 caption rows, and the input image's Ling
vision rows (packs-contract-more §D.1 6, in our layout: docs/SHARDS.md, read by stream.collate_bridge).

Keys: the common ids / len / q_pack (the student over the raw prompt, as the engine feeds it);
slot_ids int32 [ΣP] and t_len = P per sample, t_pack [ΣP, out_dim] (direct rows), stat_* over every
slot; b_pack [S·256, cap_dim] (caption rows), bank_rows = bank_real = 256 per sample, bank_slots [256],
bstat_* over every caption row; v_pack [ΣV, vis_dim] with vis_sample / vis_start / vis_len per image.
Samples are sorted by their Ling length. One input image per sample, as the engine takes (more are
ignored with a log line); a prompt longer than train.max_slots Ling tokens is left out with a log
line (the engine refuses it at inference).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from trainer_core.base.errors import TrainerError
from trainer_core.contract.batching import greedy_batches
from trainer_core.contract.shards import target_moments
from trainer_core.packs.common.slot_settings import render_fitting
from trainer_core.packs.ming_image.template import FACTOR, IMAGE_PATCH, NUM_QUERIES, build_prompt_ids, preprocess_image

__all__ = ["MingSession", "build_shard"]

_GENERATION_ROWS = NUM_QUERIES + 2          # <image> + 256 queries + </image> after every prompt


@dataclass
class MingSession:
    """What precompute fixes once per stage (pack.prepare)."""

    encode: Callable[[str], list[int]]            # the Ling tokenizer on a whole string
    max_slots: int = 1280
    log: Callable[[str], None] = print
    skipped: list[str] = field(default_factory=list)
    extra_images: int = 0                         # samples whose images after the first were ignored


def _render(sample: dict[str, Any], session: MingSession) -> tuple[list[int], int, Any]:
    """(Ling prompt ids, first <imagePatch> slot or −1, the preprocessed input image or None)."""
    image = None
    if sample["images"]:
        if len(sample["images"]) > 1:
            session.extra_images += 1
        path = sample["images"][0]
        try:
            image = preprocess_image(path)
        except (OSError, ValueError) as e:
            raise TrainerError(f"The input image {path} cannot be read ({e}); reset the corpus so it is built again "
                               "without it.") from None
    n = (image.shape[0] // FACTOR) * (image.shape[1] // FACTOR) if image is not None else 0
    ids, start = build_prompt_ids(session.encode, sample["text"], n)
    return ids, start, image


def build_shard(samples: list[dict[str, Any]], student: Any, teacher: Any, budgets: Any, session: MingSession,
                max_len_student: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    def fit(sample: dict[str, Any]) -> Any:
        r = _render(sample, session)
        return r if len(r[0]) <= session.max_slots else (
            f"left out a sample of {len(r[0])} Ling tokens, more than train.max_slots = {session.max_slots} "
            "(the engine refuses such a prompt)")
    kept, rendered = render_fitting(samples, fit, session)

    with_image = [i for i, r in enumerate(rendered) if r[2] is not None]
    encoded = teacher.encode_images([rendered[i][2] for i in with_image], budgets.vis_tok_budget) \
        if with_image else []
    vis_rows: list[torch.Tensor | None] = [None] * len(kept)
    for i, rows in zip(with_image, encoded):
        ids, start, image = rendered[i]
        if start < 0 or rows.shape[0] != ids.count(IMAGE_PATCH):
            raise TrainerError(f"The vision tower gave {rows.shape[0]} rows for an image of "
                               f"{image.shape[1]}×{image.shape[0]} px, which the template does not hold.")
        vis_rows[i] = rows

    S, Q = len(kept), teacher.num_queries
    # both packs are written a batch at a time into their place (no per-sample copies, no concatenation:
    # the direct rows of a 256-sample shard are ~700 MB)
    caption = torch.empty(S * Q, teacher.cap_dim, dtype=torch.bfloat16)
    lens = [len(r[0]) for r in rendered]
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    t_pack: torch.Tensor | None = None
    for batch in greedy_batches([n + _GENERATION_ROWS for n in lens], budgets.teacher_batch, budgets.tok_budget):
        prompts = [(rendered[i][0], rendered[i][1], vis_rows[i], None if vis_rows[i] is None
                    else (rendered[i][2].shape[0] // FACTOR, rendered[i][2].shape[1] // FACTOR)) for i in batch]
        cap, rows = teacher.targets(prompts)
        if t_pack is None:
            t_pack = torch.empty(starts[-1], rows[0].shape[-1], dtype=torch.bfloat16)
        for j, i in enumerate(batch):
            if rows[j].shape[0] != lens[i]:
                raise TrainerError(f"The teacher gave {rows[j].shape[0]} direct rows for a prompt of {lens[i]} "
                                   "Ling tokens; this is a bug.")
            caption[i * Q:(i + 1) * Q] = cap[j]
            t_pack[starts[i]:starts[i + 1]] = rows[j]

    tokens = [student.tokenize(s["text"]) for s in kept]             # the raw prompt, as the engine
    tokens, q_rows, truncated = student.rows(tokens, max_len_student, budgets.student_batch,
                                             budgets.student_tok_budget)
    vis_dim = int(getattr(teacher, "vis_dim"))
    images = [i for i in range(S) if vis_rows[i] is not None]
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    tensors = {
        "ids": i32([t for ts in tokens for t in ts]), "len": i32([len(t) for t in tokens]),
        "q_pack": torch.cat(q_rows), "slot_ids": i32([t for r in rendered for t in r[0]]),
        "t_len": i32([len(r[0]) for r in rendered]), "t_pack": t_pack, **target_moments(t_pack),
        "b_pack": caption, "bank_rows": i32([Q] * S), "bank_real": i32([Q] * S), "bank_slots": i32([Q]),
        **target_moments(caption, "bstat"),
        "v_pack": (torch.cat([vis_rows[i] for i in images]) if images
                   else torch.zeros(0, vis_dim, dtype=torch.bfloat16)),
        "vis_sample": i32(images), "vis_start": i32([rendered[i][1] for i in images]),
        "vis_len": i32([int(vis_rows[i].shape[0]) for i in images]),
        "n_images": i32([1 if vis_rows[i] is not None else 0 for i in range(S)]),
    }
    meta = {"max_slots": session.max_slots, "skipped": len(samples) - len(kept), "n_cap": Q,
            "images": [s["rel"][:1] for s in kept]}
    return tensors, {"prompts": [s["text"] for s in kept], "num_queries": 0, "truncated_student": truncated,
                     "meta": meta}
