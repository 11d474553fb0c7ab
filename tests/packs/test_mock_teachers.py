"""Mock teachers: right shapes, deterministic per prompt, dependent on the prompt, light."""
from __future__ import annotations

import zlib

import torch

from trainer_core.packs.common.mock_teachers import MockQueryTeacher, MockTokenTeacher, word_ids


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


def test_ming_mock_teacher_rows_are_deterministic_and_follow_the_prompt_and_image():
    import numpy as np
    import pytest

    from trainer_core.packs.ming_image.teacher import MockMingTeacher
    from trainer_core.packs.ming_image.template import FACTOR, build_prompt_ids
    a, b = MockMingTeacher(48, 40, 24), MockMingTeacher(48, 40, 24)
    image = np.random.default_rng(1).random((2 * FACTOR, 3 * FACTOR, 3)).astype(np.float32)
    (rows,) = a.encode_images([image])
    assert rows.shape == (6, 24) and rows.dtype == torch.bfloat16
    torch.testing.assert_close(rows.float().norm(dim=-1), torch.ones(6), rtol=1e-2, atol=0)
    plain, _ = build_prompt_ids(a.encode, "a sheep in sunglasses")
    edit, start = build_prompt_ids(a.encode, "make it night", 6)
    cap, direct = a.targets([(plain, -1, None, None), (edit, start, rows, (2, 3))])
    assert cap.shape == (2, 256, 40) and [d.shape for d in direct] == [(len(plain), 48), (len(edit), 48)]
    cap2, direct2 = b.targets([(edit, start, rows, (2, 3))])
    assert torch.equal(cap2[0], cap[1]) and torch.equal(direct2[0], direct[1])      # per prompt, not per batch
    bare, _ = b.targets([(edit, start, None, None)])
    assert not torch.allclose(bare[0], cap[1])                                      # the image moves the caption rows
    assert not torch.allclose(cap[0], cap[1]) and not torch.allclose(cap[0, 0], cap[0, 1])
    with pytest.raises(ValueError, match="imagePatch"):
        a.targets([(edit, start + 1, rows, (2, 3))])                                # rows off their run
