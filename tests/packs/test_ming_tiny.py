"""The tiny Ming-Image snapshot: its Ling tokenizer keeps the specials atomic at their ids and
tokenizes the template the same whole and by segments; the files are the real layout and the
same seed writes the same bytes."""
from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from trainer_core.packs.ming_image.template import (SYSTEM_PREFIX, build_prompt_ids, check_template, encoder,
                                                    prompt_string)
from trainer_core.packs.ming_image.tiny import SPECIAL_IDS, VOCAB_SIZE, write_tiny_ming

SHARD = "model-00001-of-00001.safetensors"
FOUR = (("a sheep in sunglasses", 0), ("make it night", 4), ("", 0), ("Add snow, heavy\nLayer 1: x", 6))


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    return write_tiny_ming(tmp_path_factory.mktemp("ming") / "a", seed=7)


@pytest.fixture(scope="module")
def tokenizer(snapshot):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(snapshot / "mllm" / "tokenizer.json"))


def test_the_specials_are_atomic_at_their_ids(tokenizer):
    encode = encoder(tokenizer)
    assert tokenizer.get_vocab_size() == VOCAB_SIZE
    for name, i in SPECIAL_IDS.items():
        assert encode(name) == [i], name
        around = encode(f"a cat{name}on a mat")
        assert around.count(i) == 1 and encode("a cat") + [i] + encode("on a mat") == around, name
    prefix = encode(SYSTEM_PREFIX)
    specials = [i for i in prefix if i in SPECIAL_IDS.values()]
    role, end_role, role_end = SPECIAL_IDS["<role>"], SPECIAL_IDS["</role>"], SPECIAL_IDS["<|role_end|>"]
    assert specials == [role, end_role, role_end, role, end_role]
    assert prefix[0] == role and prefix[-1] == end_role
    assert tokenizer.decode(prefix, skip_special_tokens=False) == SYSTEM_PREFIX


def test_segment_wise_ids_equal_whole_string_ids(snapshot, tokenizer):
    from transformers import PreTrainedTokenizerFast
    fast = PreTrainedTokenizerFast(tokenizer_file=str(snapshot / "mllm" / "tokenizer.json"),
                                   eos_token="<|role_end|>", pad_token="<|role_end|>", bos_token="<|startoftext|>")
    for encode in (encoder(tokenizer), encoder(fast)):
        check_template(encode)
        for text, n in FOUR:
            ids, start = build_prompt_ids(encode, text, n)
            assert ids == encode(prompt_string(text, n)), (text, n)
            if n:
                assert ids[start - 1:start + n + 1] == [SPECIAL_IDS["<image>"], *[SPECIAL_IDS["<imagePatch>"]] * n,
                                                        SPECIAL_IDS["</image>"]]
    assert fast.pad_token_id == SPECIAL_IDS["<|role_end|>"]


def test_the_snapshot_has_the_real_layout(snapshot):
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    config = json.loads((snapshot / "mllm" / "config.json").read_text())
    assert set(config) >= {"llm_config", "vision_config"}
    index = json.loads((snapshot / "mllm" / "model.safetensors.index.json").read_text())
    with safe_open(str(snapshot / "mllm" / SHARD), framework="pt") as f:
        keys = set(f.keys())
        assert set(index["weight_map"]) == keys
        assert f.get_slice("model.model.word_embeddings.weight").get_shape() == [VOCAB_SIZE, 64]
        assert f.get_slice("linear_proj.0.weight").get_shape() == [64, config["vision_config"]["out_hidden_size"]]
    tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(Qwen2_5_VLVisionConfig(**config["vision_config"]))
    assert {"vision." + k for k in tower.state_dict()} == {k for k in keys if k.startswith("vision.")}
    assert {k for k in keys if not k.startswith(("vision.", "model.model."))} == {
        "linear_proj.0.weight", "linear_proj.0.bias", "linear_proj.2.weight", "linear_proj.2.bias"}
    with safe_open(str(snapshot / "connector" / SHARD), framework="pt") as f:
        assert "model.embed_tokens.weight" in f.keys()
    with safe_open(str(snapshot / "mlp" / "model.safetensors"), framework="pt") as f:
        assert f.get_slice("query_tokens_dict.16x16").get_shape() == [256, 64]
    for name in ("tokenizer_config.json", "special_tokens_map.json", "preprocessor_config.json"):
        assert json.loads((snapshot / "mllm" / name).read_text())


def test_the_same_seed_writes_the_same_bytes(snapshot, tmp_path):
    again = write_tiny_ming(tmp_path / "b", seed=7)
    files = sorted(p.relative_to(snapshot) for p in snapshot.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for rel in files:
        assert (snapshot / rel).read_bytes() == (again / rel).read_bytes(), rel
    other = write_tiny_ming(tmp_path / "c", seed=8)
    assert (other / "mllm" / SHARD).read_bytes() != (snapshot / "mllm" / SHARD).read_bytes()
