"""Mock teachers: right shapes, deterministic per prompt, dependent on the prompt, light."""
from __future__ import annotations

import zlib

import torch

from trainer_core.packs.mock_teachers import MockQueryTeacher, MockTokenTeacher, word_ids


def test_word_ids_follow_crc32():
    assert word_ids("a sheep") == [zlib.crc32(b"a") % 4096, zlib.crc32(b"sheep") % 4096]
    assert word_ids("") == [0] and word_ids("   ") == [0]


def test_query_teacher_shapes_and_determinism():
    a, b = MockQueryTeacher(96, 8), MockQueryTeacher(96, 8)
    rows = a.forward_prompts(["a sheep in sunglasses", "", "a castle at night"])
    assert rows.shape == (3, 8, 96) and rows.dtype == torch.float32
    assert torch.equal(rows, b.forward_prompts(["a sheep in sunglasses", "", "a castle at night"]))
    alone = a.forward_prompts(["a castle at night"])[0]
    assert torch.equal(rows[2], alone)                               # independent of the batch
    assert not torch.allclose(rows[0], rows[2])                      # depends on the words
    assert not torch.allclose(rows[0, 0], rows[0, 1])                # and on the query position


def test_query_teacher_is_light_at_reference_size():
    t = MockQueryTeacher(2560, 256)
    assert sum(x.numel() for x in (t.words, t.proj, t.pos, t.mix)) < 1.5e6


def test_token_teacher_is_causal_and_deterministic():
    t = MockTokenTeacher(48)
    (full,) = t.forward_tokens([[5, 9, 13, 2]])
    (prefix,) = MockTokenTeacher(48).forward_tokens([[5, 9]])
    assert full.shape == (4, 48)
    torch.testing.assert_close(full[:2], prefix)                     # row j sees tokens 0..j only
    (changed,) = t.forward_tokens([[5, 9, 14, 2]])
    torch.testing.assert_close(changed[:2], full[:2])
    assert not torch.allclose(changed[2:], full[2:])
