"""The Qwen chat template as ggk builds it for its Qwen3 / Qwen3-VL text conditioners (conditioner.hpp; the
families of engine-adapter-families §0.3): the pieces, their ids, the pad, and how a batch of templates runs.

* **Pieces.** `<|im_start|>user\\n` + the prompt + `<|im_end|>\\n<|im_start|>assistant\\n`, each tokenized on
  its own with the Qwen BPE and no special-token handling: the prefix (3 ids), the prompt's chunks after the
  engine's attention parse (emphasis such as `(word:1.2)` is removed; its weights scale the adapter's rows
  afterwards), the suffix (5 ids). A family with a system turn or a think block adds its own pieces around.
* **Pads.** <|endoftext|> (151643), added on the right and masked as attention keys on top of the causal mask:
  no real row attends to a pad, so a real row is that of the template run alone.
* **A cut.** A pack trains on at most `max_len_student` rows: `fit_template` shortens the prompt's body and
  keeps the suffix (the engine itself cuts only past 4096).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from trainer_core.base.errors import ModelFileError
from trainer_core.contract.prompt_attention import parse_prompt_attention
from trainer_core.packs.base import QWEN_PAD_ID, Budgets, TrainerPack

if TYPE_CHECKING:
    import torch

    from trainer_core.base.folder import ProjectFolder

__all__ = ["PREFIX", "SUFFIX", "PREFIX_IDS", "SUFFIX_IDS", "PAD_ID", "chat_chunks", "fit_template",
           "padded_batch", "check_pieces", "check_chat_template", "check_same_ids", "PROBES", "QwenTemplatePack"]

PREFIX = "<|im_start|>user\n"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
PREFIX_IDS = (151644, 872, 198)
SUFFIX_IDS = (151645, 198, 151644, 77091, 198)
PAD_ID = QWEN_PAD_ID            # <|endoftext|>


def chat_chunks(text: str) -> list[str]:
    """PREFIX | the prompt, attention-parsed | SUFFIX, each tokenized on its own (the empty prompt: the two
    template pieces)."""
    body = [chunk for chunk, _ in parse_prompt_attention(text)] if text else []
    return [PREFIX, *body, SUFFIX]


def fit_template(ids: Sequence[int], max_len: int, suffix: Sequence[int] = SUFFIX_IDS) -> list[int]:
    """The template ids cut to `max_len` tokens by shortening the prompt's body, the suffix kept."""
    ids = list(ids)
    if len(ids) <= max_len:
        return ids
    return ids[:max_len - len(suffix)] + list(suffix)


def padded_batch(token_lists: Sequence[Sequence[int]], length: int | None = None, pad_position: int | None = 1
                 ) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """(ids [B, L], key mask [B, L] bool, positions [B, L]) of samples right-padded with PAD_ID to `length`
    (default: the longest + 1, so every sample has a pad row); real rows at 0 … n−1, pads at `pad_position`
    (FLUX.3 Klein: 1), or at their own index when it is None (the other families)."""
    import torch
    length = length or max(len(t) for t in token_lists) + 1
    ids = torch.full((len(token_lists), length), PAD_ID, dtype=torch.long)
    mask = torch.zeros(len(token_lists), length, dtype=torch.bool)
    positions = (torch.arange(length).repeat(len(token_lists), 1) if pad_position is None
                 else torch.full((len(token_lists), length), pad_position, dtype=torch.long))
    for row, tokens in enumerate(token_lists):
        n = len(tokens)
        if n > length:
            raise ValueError(f"a sample of {n} tokens does not fit a batch of {length} rows")
        ids[row, :n] = torch.tensor(list(tokens), dtype=torch.long)
        mask[row, :n] = True
        positions[row, :n] = torch.arange(n)
    return ids, mask, positions


def check_pieces(encode: Callable[[str], Any], what: str, family: str,
                 pieces: Sequence[tuple[str, Sequence[int]]] = ((PREFIX, PREFIX_IDS), (SUFFIX, SUFFIX_IDS))) -> None:
    """Refuse a tokenizer (`encode(text) -> ids`, one piece) that does not give the engine's ids of each
    template piece."""
    for piece, want in pieces:
        got = tuple(encode(piece))
        if got != tuple(want):
            raise ModelFileError(f"The {what} tokenizer encodes the {family} template piece {piece!r} as {list(got)}, "
                                 f"not the engine's {list(want)}; use the Qwen tokenizer of the snapshot.")


def check_chat_template(encode: Callable[[str], Any], what: str) -> None:
    """`check_pieces` of the plain chat template (FLUX.3 Klein, Z-Image)."""
    check_pieces(encode, what, "FLUX.3")


def check_same_ids(student: Any, teacher: Any, chunks: Callable[[str], list[str]], whole: Callable[[str], str],
                   probes: Sequence[str]) -> None:
    """The teacher tokenizer's encoding of each probe's whole template string (`whole(text)`) equals the
    student's piecewise one (`chunks(text)`): the adapter needs one token sequence for both."""
    tok = getattr(teacher, "tokenizer", None)
    if tok is None:
        return
    for text in probes:
        mine = student.ids(chunks(text))
        theirs = tok.encode(whole(text), add_special_tokens=False).ids
        if mine != theirs:
            raise ModelFileError(f"The student and teacher tokenizers disagree on {text!r} ({len(mine)} vs "
                                 f"{len(theirs)} tokens); the adapter needs one token sequence for both: use "
                                 "matching snapshots.")


# prompts whose ids both tokenizers must agree on (the empty one, spaces, a newline, emoji and CJK included)
PROBES = ("a sheep in sunglasses", "", "Add snow, heavy", "  leading spaces\nand a newline", "café ☕ 日本語")


@dataclass(frozen=True)
class QwenTemplatePack(TrainerPack):
    """What the packs whose student and teacher read one Qwen template share: the template's pieces (`chunks`),
    the tokenizer check of its fixed pieces (`check_template(encode, what)`), the probes both tokenizers must
    agree on, and the Qwen teachers' automatic budgets scaled by `budget_scale` (a text-only teacher runs
    batches twice the vision packs' at half the budget scale)."""

    chunks: Callable[[str], list[str]] = chat_chunks
    check_template: Callable[[Callable[[str], Any], str], None] = check_chat_template
    budget_scale: float = 0.5

    def student_chunks(self, text: str) -> list[str]:
        return self.chunks(text)

    def budgets(self, project: "ProjectFolder", device: Any) -> Budgets:
        from trainer_core.packs.common.qwen3vl.teacher import auto_budgets
        p, auto = project.settings.precompute, auto_budgets(device, self.budget_scale)
        return Budgets(p.teacher_batch or auto["teacher_batch"], p.tok_budget or auto["tok_budget"],
                       p.student_batch or auto["student_batch"], p.student_tok_budget or auto["student_tok_budget"])

    def prepare(self, project: "ProjectFolder", student: Any, teacher: Any, report: Any) -> Any:
        """Both tokenizers give the engine's template ids, and the teacher's own encoding of the whole template
        string equals the student's piecewise one on the probes."""
        from trainer_core.packs.lookup import format_prompt
        self.check_template(student.tokenize, "student")
        tok = getattr(teacher, "tokenizer", None)
        if tok is None:
            return None
        self.check_template(lambda s: tok.encode(s, add_special_tokens=False).ids, "teacher")
        check_same_ids(student, teacher, self.student_chunks, lambda text: format_prompt(self, text), PROBES)
        return None
