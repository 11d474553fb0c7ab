"""Fixtures the packs' own tests share: a pig_clip-layout student (the real Qwen BPE, a tiny Qwen3) and its
tokenizers, built once per session."""
from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer

from trainer_core.contract.engine_bpe import EngineBPE


@pytest.fixture(scope="session")
def student_dir(tmp_path_factory):
    """A pig_clip snapshot folder (real Qwen BPE + a tiny Qwen3 config) and its f32 student GGUF."""
    from transformers import Qwen3Model

    from trainer_core.packs.common.tiny_models import (tiny_qwen3_config, write_qwen_tokenizer, write_student_config,
                                                       write_student_gguf)
    folder = tmp_path_factory.mktemp("student")
    config = tiny_qwen3_config(hidden_size=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128)
    write_qwen_tokenizer(folder)
    write_student_config(folder, config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        write_student_gguf(Qwen3Model(config), folder / "student.gguf", dtype="f32")
    return folder


@pytest.fixture(scope="session")
def hf_tokenizer(student_dir):
    return Tokenizer.from_file(str(student_dir / "tokenizer.json"))


@pytest.fixture(scope="session")
def engine(student_dir):
    return EngineBPE.from_folder(student_dir)


@pytest.fixture(scope="session")
def student(student_dir):
    from trainer_core.contract.student import load_student
    return load_student(student_dir / "student.gguf", student_dir, dtype=torch.float32)
