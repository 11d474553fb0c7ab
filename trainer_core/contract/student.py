"""The student side of the engine contract: pig_clip, a plain Qwen3 model.

The student is read from a pig_clip GGUF (HF tensor names under `model.`, ne = torch shape
reversed, any type the gguf package can dequantize) plus a snapshot folder holding its
config.json and tokenizer.json. It tokenizes as the engine does (engine_bpe: the pack's chunks
each encoded on its own with the engine's pre-tokenizer, no BOS/EOS, added markers as their single
ids, nothing -> <|endoftext|>) and its output is the final RMSNorm's hidden states (HF
`last_hidden_state`).

Nothing here touches the clock or events; unusable files raise ModelFileError.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import Qwen3Config, Qwen3Model

from trainer_core.contract.batching import greedy_batches, pad_batch
from trainer_core.contract.engine_bpe import EMPTY_TOKEN_ID, EngineBPE
from trainer_core.base.errors import ModelFileError
from trainer_core.contract.gguf_io import STUDENT_MARKER, dequantize, open_gguf

__all__ = [
    "EMPTY_TOKEN_ID", "GGUF_PREFIX", "STUDENT_MARKER_TENSOR", "Student", "load_student",
    "read_student_gguf", "read_student_config", "load_tokenizer", "tokenize",
]

GGUF_PREFIX = "model."           # pig_clip GGUF tensor names are the HF names under this prefix
STUDENT_MARKER_TENSOR = STUDENT_MARKER  # ggk's front end tells a student GGUF by this tensor
_IGNORED_TENSORS = {"lm_head.weight"}   # a tied head some exporters keep; the student has none

_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


# ---------------------------------------------------------------- files

def read_student_config(snapshot_dir: str | os.PathLike) -> Qwen3Config:
    """The Qwen3Config in `<snapshot_dir>/config.json`."""
    path = Path(snapshot_dir) / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFileError(f"The student snapshot folder {Path(snapshot_dir)} has no config.json; "
                             "point it at a folder like callgg/pig-clip-tokenizer.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path} cannot be read as JSON ({e}); download the student "
                             "snapshot again.") from None
    if not isinstance(raw, dict) or raw.get("model_type") != "qwen3":
        found = raw.get("model_type") if isinstance(raw, dict) else None
        raise ModelFileError(f"{path} describes a {found or 'model without a model_type'}, not a "
                             "Qwen3 model; pig_clip needs its own snapshot's config.json.")
    try:
        return Qwen3Config.from_dict(raw)
    except Exception as e:  # TypeError, ValueError or huggingface_hub's validation errors
        raise ModelFileError(f"{path} is not a valid Qwen3 config ({_one_line(e)}); download "
                             "the student snapshot again.") from None


_TOKENIZERS: dict[bytes, tuple[Tokenizer, EngineBPE]] = {}     # tokenizer.json's digest → both, newest last
_TOKENIZERS_KEPT = 2                 # ~120 MB a pair for pig_clip


def load_tokenizer(snapshot_dir: str | os.PathLike) -> Tokenizer:
    """The tokenizer in `<snapshot_dir>/tokenizer.json`."""
    return _tokenizers(snapshot_dir)[0]


def _tokenizers(snapshot_dir: str | os.PathLike) -> tuple[Tokenizer, EngineBPE]:
    """The folder's Hugging Face tokenizer and the engine's (EngineBPE), built once per process for each content of
    tokenizer.json: pig_clip's 151k-entry vocabulary takes ~0.5 CPU-s to build, and a stage chain, the GUI or a
    test worker loads the same one again and again (a copied project included). Neither is changed once built."""
    path = Path(snapshot_dir) / "tokenizer.json"
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise ModelFileError(f"The student snapshot folder {Path(snapshot_dir)} has no "
                             "tokenizer.json; point it at a folder like callgg/pig-clip-tokenizer.") from None
    except OSError as e:
        raise ModelFileError(f"{path} cannot be read ({e.strerror or e}); check the file's permissions or "
                             "download the student snapshot again.") from None
    key = hashlib.blake2b(data, digest_size=16).digest()
    if key not in _TOKENIZERS:
        try:
            text = data.decode("utf-8")
            tokenizer = Tokenizer.from_str(text)
        except Exception as e:  # the tokenizers library raises plain Exception subclasses
            raise ModelFileError(f"{path} cannot be loaded as a tokenizer ({e}); download the "
                                 "student snapshot again.") from None
        _TOKENIZERS[key] = (tokenizer, EngineBPE.from_text(text, path))
        while len(_TOKENIZERS) > _TOKENIZERS_KEPT:
            del _TOKENIZERS[next(iter(_TOKENIZERS))]
    return _TOKENIZERS[key]


def tokenize(tokenizer: Tokenizer, text: str) -> list[int]:
    """The engine's rule: BPE over the formatted string, no special tokens added, added
    markers such as <|im_start|> as their single ids; an empty result is [EMPTY_TOKEN_ID]."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return ids or [EMPTY_TOKEN_ID]


def read_student_gguf(path: str | os.PathLike, config: Qwen3Config, dtype: torch.dtype = torch.float32
                      ) -> dict[str, torch.Tensor]:
    """The weights of a pig_clip GGUF as `dtype` tensors (float32 by default) keyed by HF Qwen3Model
    names; each tensor is dequantized to float32 and cast on its own, so at most one float32 copy of
    a tensor exists at a time (the whole model in float32 would double the peak memory of a bf16
    student).

    Checks, in order, that the file is a complete GGUF, that it is a student, that its
    tensors are exactly those `config` asks for with the shapes it asks for, and that
    each type can be dequantized; the first problem raises ModelFileError.
    """
    path = Path(path)
    reader = open_gguf(path)
    tensors = {t.name: t for t in reader.tensors}
    if STUDENT_MARKER_TENSOR not in tensors:
        sample = ", ".join(sorted(tensors)[:3]) or "no tensors at all"
        raise ModelFileError(f"{path} is not a pig_clip student GGUF (no {STUDENT_MARKER_TENSOR}; "
                             f"it holds {sample}); choose the student model file, not an adapter "
                             "or another model.")
    linear = next((n for n in tensors if "linear_attn" in n), None)
    if linear is not None:
        raise ModelFileError(f"{path} has linear-attention tensors ({linear}), so it is not a "
                             "pig_clip (plain Qwen3) student GGUF.")

    expected = _expected_shapes(config)
    for name in tensors:
        if name in _IGNORED_TENSORS:
            continue
        if not name.startswith(GGUF_PREFIX) or name[len(GGUF_PREFIX):] not in expected:
            raise ModelFileError(f"{path} has an unexpected tensor {name} that a Qwen3 model with "
                                 f"{_config_summary(config)} does not have; check that config.json "
                                 "belongs to this GGUF.")
    for key, shape in expected.items():
        name = GGUF_PREFIX + key
        if name not in tensors:
            raise ModelFileError(f"{path} is missing the tensor {name} that a Qwen3 model with "
                                 f"{_config_summary(config)} needs; check that config.json "
                                 "belongs to this GGUF.")
        found = [int(n) for n in reversed(tensors[name].shape.tolist())]
        if found != shape:
            raise ModelFileError(f"In {path} the tensor {name} has shape {found} but the config "
                                 f"asks for {shape}; check that config.json belongs to this GGUF.")

    out = {}
    for key in expected:
        t = tensors[GGUF_PREFIX + key]
        if t.tensor_type.name == "F16" and dtype != torch.float32:     # f16 → bf16/f16 directly (exact via f32)
            shape = tuple(int(x) for x in reversed(t.shape.tolist()))
            with warnings.catch_warnings():      # the map is read-only; the cast only reads it, into a new tensor
                warnings.simplefilter("ignore", UserWarning)
                mapped = torch.from_numpy(np.asarray(t.data, dtype=np.float16).reshape(shape))
            out[key] = mapped.to(dtype) if dtype != torch.float16 else mapped.clone()
            continue
        wide = torch.from_numpy(dequantize(path, t.name, t.tensor_type.name, t.data, tuple(int(x) for x in t.shape)))
        out[key] = wide if dtype == torch.float32 else wide.to(dtype)
        del wide
    return out


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def _expected_shapes(config: Qwen3Config) -> dict[str, list[int]]:
    """name -> torch shape of every persistent Qwen3Model tensor for `config` (built on the
    meta device: no memory, no init)."""
    with torch.device("meta"):
        model = Qwen3Model(config)
    return {key: list(value.shape) for key, value in model.state_dict().items()}


def _config_summary(config: Qwen3Config) -> str:
    return (f"hidden {config.hidden_size}, {config.num_hidden_layers} layers and FFN "
            f"{config.intermediate_size}")


# ---------------------------------------------------------------- model

class Student:
    """A loaded pig_clip student: its config, tokenizer and Qwen3Model (in eval mode)."""

    def __init__(self, model: Qwen3Model, config: Qwen3Config, tokenizer: Tokenizer, engine: EngineBPE):
        self.model = model
        self.config = config
        self.tokenizer = tokenizer       # the Hugging Face tokenizer of the folder (checks, teachers)
        self.engine = engine             # the engine's tokenization, which every id fed to the model comes from
        self.hidden_size: int = config.hidden_size

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def tokenize(self, text: str) -> list[int]:
        """`text` as the engine encodes one chunk (no attention parse); never empty."""
        return self.engine.encode_chunks([text])

    def ids(self, chunks: list[str]) -> list[int]:
        """A prompt's ids as the engine assembles them from its chunks (pack.student_chunks)."""
        return self.engine.encode_chunks(chunks)

    def batch(self, token_lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [B, L] long, mask [B, L] bool): right-padded with EMPTY_TOKEN_ID, L = longest."""
        if not token_lists or any(len(ids) == 0 for ids in token_lists):
            raise ValueError("batch() needs at least one token list and no empty ones; "
                             "tokenize() never returns an empty list")
        return pad_batch(token_lists, EMPTY_TOKEN_ID)

    def hidden(self, ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor | None = None
               ) -> torch.Tensor:
        """Final-norm hidden states [B, L, hidden_size] as float32 on the model's device.

        Computed in the model's dtype. Pad positions hold values too; only mask True rows
        are meaningful (a causal model's real rows never see the right padding). `position_ids`
        [B, L] replace the default 0..L-1 (FLUX.3 puts its pads at position 1)."""
        with torch.no_grad():
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device, torch.long),
                             position_ids=None if position_ids is None else position_ids.to(self.device),
                             use_cache=False)
        return out.last_hidden_state.float()  # [B, L, H]

    def rows(self, token_lists: list[list[int]], max_len: int, max_batch: int, tok_budget: int
             ) -> tuple[list[list[int]], list[torch.Tensor], int]:
        """(token ids, final-norm rows [len_i, H] bf16 on the CPU, number truncated) per prompt, in
        input order; the ids are cut to `max_len` tokens and run in length-sorted greedy batches of
        at most `max_batch` samples and `tok_budget` padded tokens."""
        tokens = list(token_lists)
        truncated = sum(len(t) > max_len for t in tokens)
        tokens = [t[:max_len] for t in tokens]
        order = sorted(range(len(tokens)), key=lambda i: len(tokens[i]))
        out: list[torch.Tensor | None] = [None] * len(tokens)
        for batch in greedy_batches([len(tokens[i]) for i in order], max_batch, tok_budget):
            members = [order[j] for j in batch]
            ids, mask = self.batch([tokens[i] for i in members])
            states = self.hidden(ids, mask).to("cpu", torch.bfloat16)          # [b, L, H]
            for row, i in enumerate(members):
                out[i] = states[row, :len(tokens[i])].clone()
        return tokens, out, truncated  # type: ignore[return-value]

    def vision_rows(self, token_lists: list[list[int]], vision: list[list[tuple[int, torch.Tensor]]],
                    max_batch: int, tok_budget: int) -> list[torch.Tensor]:
        """Final-norm rows [len_i, H] bf16 on the CPU per sample, in input order, with rows spliced into
        the input embeddings at the image slots (`vision[i]`: (first slot, rows [n, H]) per image, the
        mmproj embeds already mapped by vision_proj), in length-sorted greedy batches; as the engine."""
        order = sorted(range(len(token_lists)), key=lambda i: len(token_lists[i]))
        out: list[torch.Tensor | None] = [None] * len(token_lists)
        embed = self.model.embed_tokens
        for batch in greedy_batches([len(token_lists[i]) for i in order], max_batch, tok_budget):
            members = [order[j] for j in batch]
            ids, mask = self.batch([token_lists[i] for i in members])
            with torch.no_grad():
                x = embed(ids.to(self.device))                                          # [b, L, H]
                for row, i in enumerate(members):
                    for start, rows in vision[i]:
                        x[row, start:start + rows.shape[0]] = rows.to(self.device, x.dtype)
                states = self.model(inputs_embeds=x, attention_mask=mask.to(self.device, torch.long),
                                    use_cache=False).last_hidden_state.to("cpu", torch.bfloat16)
            for row, i in enumerate(members):
                out[i] = states[row, :len(token_lists[i])].clone()
        return out  # type: ignore[return-value]

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(states [B, L, H] float32, mask [B, L] bool on the model's device) for `texts`."""
        ids, mask = self.batch([self.tokenize(t) for t in texts])
        return self.hidden(ids, mask), mask.to(self.device)


def load_student(gguf_path: str | os.PathLike, snapshot_dir: str | os.PathLike,
                 device: str | torch.device = "cpu",
                 dtype: torch.dtype | str = torch.float32) -> Student:
    """The student from its GGUF and snapshot folder (config.json, tokenizer.json).

    `dtype` is a torch dtype or one of "f32", "f16", "bf16".
    """
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, not {dtype!r}")
        dtype = _DTYPES[dtype]
    config = read_student_config(snapshot_dir)
    tokenizer, engine = _tokenizers(snapshot_dir)
    state = read_student_gguf(gguf_path, config, dtype)
    model = _empty_model(config)
    model.load_state_dict(state, strict=True, assign=True)
    del state
    model.to(device=device, dtype=dtype).eval()
    return Student(model, config, tokenizer, engine)


def _empty_model(config: Qwen3Config) -> Qwen3Model:
    """A Qwen3Model whose weights are left uninitialised (they are loaded next); the
    rotary buffers are still computed."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers: pay for the random init
        return Qwen3Model(config)
    with no_init_weights():
        return Qwen3Model(config)
