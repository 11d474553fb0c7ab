"""The reference-image half of bench/engine_check.py: a vision tower the engine can run, and the trainer's
prediction for a prompt with a reference image, for MageFlow, Qwen-Image 2.1, the Qwen3.5 bridge (MOSS and
FLUX.3) and Ming.

The engine fixes its towers' heads at 16 (llm.hpp:79, ming_image_te.hpp:121; each head_dim = hidden / 16, and
the 2-D rope needs head_dim a multiple of 4, rope.hpp:204-206), while the demo teachers' towers have 2 heads
of 16: the engine cannot run the demos' towers. The check therefore builds its own (16 heads of 4, random
weights, the adapter's vis_dim as its output width) and runs both sides on it; the adapter does not care
which tower made its vision rows, only their width. The Qwen-VL towers go to the engine as a llama.cpp
mmproj (the names a stock mmproj has), Ming's through the pack's own export_vision_gguf. Our side is the
trainer's own code: each pack's preprocessing and template (vision_data / qwenimage_data: preprocess,
build_sample; the bridge's load_reference and prompt_inputs; Ming's preprocess_image and prompt_inputs), the
adapter's frozen vision_proj and the student with the projected rows at the slots (MageFlow, Qwen-Image), the
kind's infer. The tower runs in transformers (Qwen3-VL's, Qwen3.5's, the pack's MingVision) in float32 with
the weights as the engine's file holds them and the patch embedding's input rounded to float16, as the
engine's Conv3d computes it (ggml_extend.hpp:3836, gk_ops.c:1523-1524).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

TOWER = {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 16, "patch_size": 16,
         "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3, "num_position_embeddings": 2304,
         "deepstack_visual_indexes": []}
SEED = 20261205


def build_tower(vis_dim: int, qwen35: bool = False) -> Any:
    """A seeded random vision tower (float32) the engine can run, `vis_dim` wide at the merger's end: the class
    the pack's teacher runs (Qwen3-VL's, or Qwen3.5's for the bridge). Every weight is drawn (norm scales
    around 1), so a swapped or misnamed tensor shows in the rows."""
    import torch
    if qwen35:
        from transformers import Qwen3_5Config
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel as Tower
        shape = {k: v for k, v in TOWER.items() if k != "deepstack_visual_indexes"}
        config = Qwen3_5Config(vision_config={**shape, "out_hidden_size": vis_dim}).vision_config
    else:
        from transformers import Qwen3VLConfig
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel as Tower
        config = Qwen3VLConfig(vision_config={**TOWER, "out_hidden_size": vis_dim}).vision_config
    gen = torch.Generator().manual_seed(SEED)
    model = Tower(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif p.ndim >= 2:
                p.copy_(noise / float(np.sqrt(np.prod(p.shape[1:]))))
            else:
                p.copy_(0.1 * noise)
    return model


def mmproj_tensors(tower: Any) -> dict[str, np.ndarray]:
    """The tower's tensors under llama.cpp's mmproj names (the engine converts them back,
    name_conversion.cpp:186-224): the Conv3d patch embedding split over its two temporal taps."""
    state = {k: v.detach().float().numpy() for k, v in tower.state_dict().items()}
    out = {"v.patch_embd.weight": state.pop("patch_embed.proj.weight")}
    out["v.patch_embd.weight.1"] = out["v.patch_embd.weight"][:, :, 1]
    out["v.patch_embd.weight"] = out["v.patch_embd.weight"][:, :, 0]
    renames = (("patch_embed.proj.bias", "v.patch_embd.bias"), ("pos_embed.weight", "v.position_embd.weight"),
               ("merger.norm.", "v.post_ln."), ("merger.linear_fc1.", "mm.0."), ("merger.linear_fc2.", "mm.2."),
               ("blocks.", "v.blk."), (".attn.qkv.", ".attn_qkv."), (".attn.proj.", ".attn_out."),
               (".mlp.linear_fc1.", ".ffn_up."), (".mlp.linear_fc2.", ".ffn_down."), (".norm1.", ".ln1."),
               (".norm2.", ".ln2."))
    for name, value in state.items():
        for old, new in renames:
            name = name.replace(old, new)
        out[name] = np.ascontiguousarray(value)
    return out


def write_mmproj(path: Path, tower: Any) -> Path:
    import gguf
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("clip.projector_type", "qwen3vl_merger")
    writer.add_bool("clip.has_vision_encoder", True)
    for name, value in mmproj_tensors(tower).items():
        writer.add_tensor(name, value.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tower_rows(tower: Any, image: np.ndarray) -> np.ndarray:
    """The merger's rows [n, vis_dim] float32 of one preprocessed [h, w, 3] image, the patch embedding in
    float16 operands (pixels and weights) as the engine computes it."""
    import torch
    from trainer_core.packs.common.qwen3vl.vision_data import patchify
    rows, grid = patchify(image)
    pixels = torch.from_numpy(rows).half().float()
    proj = tower.patch_embed.proj
    kept = proj.weight.detach().clone()
    try:
        with torch.no_grad():
            proj.weight.copy_(kept.half().float())
            out = tower(hidden_states=pixels, grid_thw=torch.tensor([grid]))
    finally:
        with torch.no_grad():
            proj.weight.copy_(kept)
    return out.pooler_output.float().numpy()


def raw_pixels(path: Path, out: Path, channels: int) -> dict:
    """A reference as the pipeline hands it to the conditioner: 8-bit, `channels` of them (get_image_channels():
    4 for Qwen-Image 2.1, else 3 with the alpha sliced off, gk-diffuser.cpp:3731-3733, 5892-5893); the
    driver's "images" entry."""
    from PIL import Image
    with Image.open(path) as img:
        pixels = np.asarray(img.convert("RGBA" if channels == 4 else "RGB"), dtype=np.uint8)
    out.write_bytes(np.ascontiguousarray(pixels).tobytes())
    return {"path": str(out), "width": int(pixels.shape[1]), "height": int(pixels.shape[0]), "channels": channels}


def predict_bridge(ours: Any, tower: Any, text: str, images: list[Path], version: str) -> dict:
    """The Qwen3.5 bridge's side: the references as its precompute reads them (template.load_reference), the
    student on the raw prompt, the MOSS template's seed ids and the references' slot runs (prompt_inputs), the
    kind's infer with the raw rows (the slot rows on MOSS, the Klein bank on FLUX.3)."""
    from trainer_core.infer import run_adapter
    from trainer_core.packs.qwen35_bridge.template import load_reference
    pixels = [load_reference(p) for p in images]
    vis = np.concatenate([tower_rows(tower, im) for im in pixels])
    hidden = ours.pack.student_states(ours.student, text)
    derived = ours.pack.prompt_inputs(ours.adapter_path, text, vis)
    out = run_adapter(ours.adapter, hidden, vis=vis, seed_ids=derived["--seed-ids"], vis_pos=derived["--vis-pos"],
                      bank=(version in ours.pack.engine.bank_versions), empty_prompt=text == "")
    return {"hidden": hidden, "rows": out, "ids": list(derived["--seed-ids"]), "ids_file": "seed_ids.txt",
            "vis": vis, "slots": [list(r) for r in derived["--vis-pos"]], "pixels": pixels}


def ming_tower(work: Path, vis_dim: int, export: bool = True) -> tuple[Any, Path]:
    """(the trainer's MingVision, the pack's own vision GGUF of it) for a tiny Ming snapshot whose tower has the
    engine's 16 heads (ming_image_te.hpp:119-122; window 112 and full attention only in blocks 7, 15, 23, 31,
    so none at depth 2): written by the pack's write_tiny_ming and exported by its export_vision_gguf. The
    weights are rounded as the GGUF stores them (F16 matrices, the BF16 patch embedding) and the patch
    embedding's input to float16, as the engine computes it."""
    import torch
    from trainer_core.packs.ming_image.export import export_vision_gguf
    from trainer_core.packs.ming_image.tiny import write_tiny_ming
    from trainer_core.packs.ming_image.vision import MingVision
    root = write_tiny_ming(work / "ming-tower", hidden=vis_dim, seed=SEED % 1000, vision={
        "hidden_size": 64, "intermediate_size": 128, "num_heads": 16, "fullatt_block_indexes": []})
    path = work / "pig_ming_vision-f16.gguf"
    if export:
        export_vision_gguf(root, path, force=True)
    tower = MingVision.load(root)
    with torch.no_grad():
        for p in tower.parameters():
            if p.ndim >= 2:
                p.copy_(p.half().float())
    return tower, path


def predict_ming(ours: Any, tower: Any, text: str, images: list[Path]) -> dict:
    """Ming's side: the first reference as its precompute reads it (template.preprocess_image, patchify), the
    tower's unit rows, the student on the raw prompt, the Ling template's ids and the image run (prompt_inputs),
    the kind's infer."""
    import torch
    from trainer_core.infer import run_adapter
    from trainer_core.packs.ming_image.template import patchify, preprocess_image
    pixels = [preprocess_image(images[0])]
    patches, grid = patchify(pixels[0])
    vis = tower.encode(torch.from_numpy(patches).half().float(), [grid]).numpy()
    hidden = ours.pack.student_states(ours.student, text)
    derived = ours.pack.prompt_inputs(ours.adapter_path, text, vis)
    out = run_adapter(ours.adapter, hidden, vis=vis, seed_ids=derived["--seed-ids"], vis_pos=derived["--vis-pos"],
                      empty_prompt=text == "")
    ids = list(derived["--seed-ids"])
    (start, n), = derived["--vis-pos"]
    assert len(set(ids[start:start + n])) == 1, "the image run holds one patch id"
    return {"hidden": hidden, "rows": out, "ids": [*ids[:start], ("patch", n), *ids[start + n:]],
            "ids_log": "ming_image adapter slots", "vis": vis, "slots": None, "pixels": pixels}


def logged_slots(log: list[str], what: str) -> list | None:
    """The ids Ming's conditioner logs ("ming_image adapter slots (N): [a, b, <imagePatch> x 576, …]"), the image
    run as ("patch", count)."""
    import re
    for line in log:
        m = re.search(re.escape(what) + r" \((\d+)\): \[([^\]]*)\]", line)
        if m:
            out: list = []
            for item in (x.strip() for x in m.group(2).split(",") if x.strip()):
                run = re.fullmatch(r"<imagePatch> x (\d+)", item)
                out.append(("patch", int(run.group(1))) if run else int(item))
            return out
    return None


def predict(ours: Any, tower: Any, text: str, images: list[Path], area: int | None) -> dict:
    """The trainer's side of one prompt with references (`area`: Qwen-Image 2.1's render area): the student's
    rows, the adapter's rows, the raw tower rows, the ids, the image slots and the pixels the tower reads."""
    import torch
    from trainer_core.infer import run_adapter
    data = ours.pack._data()                     # the contract's template and preprocessing, as precompute's
    pixels = [data.preprocess(p) if area is None else data.preprocess(p, area) for p in images]
    raw = [tower_rows(tower, im) for im in pixels]
    sample = data.build_sample(ours.student.tokenizer, text, [r.shape[0] for r in raw])
    weight = ours.adapter.model.vision_proj.weight.detach().float()              # [in_dim, vis_dim]
    model = ours.student.model
    with torch.no_grad():
        x = model.embed_tokens(torch.tensor([sample.ids]))
        for (start, n), rows in zip(sample.slots, raw):
            x[0, start:start + n] = torch.from_numpy(rows) @ weight.T
        hidden = model(inputs_embeds=x, use_cache=False).last_hidden_state[0].float().numpy()
    dense = np.zeros((len(sample.ids), raw[0].shape[1]), np.float32)
    for (start, n), rows in zip(sample.slots, raw):
        dense[start:start + n] = rows
    out = run_adapter(ours.adapter, hidden, vis=dense)
    return {"hidden": hidden, "rows": out, "ids": sample.ids, "ids_file": "tokens.txt", "vis": np.concatenate(raw),
            "slots": [list(s) for s in sample.slots], "pixels": pixels}


# the packs whose references this check runs (the demo's own images are the references)
PACKS = ("qwen3vl_mageflow", "qwen3vl_qwenimage", "qwen35_bridge", "ming_image")
BRIDGE_VERSIONS = ("moss_image", "flux3")     # Qwen35BridgeEmbedder: the slots on MOSS, the Klein bank on FLUX.3
PROMPTS = ("", "make it snowy", "replace the (red:1.3) ball with a blue cube, keep the background")
FOUR_CHANNELS = ("qwen_image_2_1", "ming_image")   # the versions whose pipeline keeps the alpha (get_image_channels)


def with_alpha(path: Path, out: Path) -> Path:
    """The reference with a transparent left third and a half-transparent band: the alpha the Qwen-Image 2.1
    conditioner composites over white (conditioner.hpp:3101-3106), the colours under it kept."""
    from PIL import Image
    with Image.open(path) as img:
        rgba = np.asarray(img.convert("RGBA")).copy()
    w = rgba.shape[1]
    rgba[:, : w // 3, 3] = 0
    rgba[:, w // 3: w // 2, 3] = 128
    Image.fromarray(rgba, "RGBA").save(out)
    return out


@dataclass
class Setup:
    """What one version's image check runs on: the tower (ours) and its file (the engine's), the references in
    prompt order and the driver's entries for them."""
    version: str
    tower: Any
    tower_file: Path
    refs: list[Path]
    extra: list[dict]


def prepare(ours: Any, version: str, images: list[Path], work: Path, engine: bool = True) -> Setup | str:
    """The tower, its file (with `engine`: the trainer's side alone needs none) and the references of `version`'s
    check (a sentence when no reference suits)."""
    work.mkdir(parents=True, exist_ok=True)
    c = ours.adapter.config
    if version == "ming_image":
        tower, tower_file = ming_tower(work, c.vis_dim, engine)
    else:
        tower = build_tower(c.vis_dim, qwen35=version in BRIDGE_VERSIONS)
        tower_file = write_mmproj(work / "tower-mmproj.gguf", tower) if engine else work / "not-written"
    qwen_image = version == "qwen_image_2_1"
    if qwen_image:
        # the pipeline first resizes a reference to the request's area (gk-diffuser.cpp:6016-6071, not linked
        # here): the request is the reference's own size, a multiple of 32 a side, so that resize keeps it
        images = [p for p in images if _size(p)[0] % 32 == 0 and _size(p)[1] % 32 == 0]
        if not images:
            return f"{version}: no reference whose sides are multiples of 32"
        images = [*images[:1], with_alpha(images[0], work / "alpha.png"), *images[1:2]]
    if not images:
        return f"{version}: no reference images"
    images = images[:len(PROMPTS)]
    refs = [images[i % len(images)] for i in range(len(PROMPTS))]
    extra = []
    for i, path in enumerate(refs):
        entry = raw_pixels(path, work / f"ref{i}.raw", 4 if version in FOUR_CHANNELS else 3)
        extra.append({"images": [entry], **({"width": entry["width"], "height": entry["height"]} if qwen_image
                                            else {})})
    return Setup(version, tower, tower_file, refs, extra)


def predict_one(ours: Any, setup: Setup, text: str, ref: Path) -> dict:
    """The trainer's side of `text` with the reference `ref` on `setup`'s version."""
    if setup.version in BRIDGE_VERSIONS:
        return predict_bridge(ours, setup.tower, text, [ref], setup.version)
    if setup.version == "ming_image":
        return predict_ming(ours, setup.tower, text, [ref])
    w, h = _size(ref)
    return predict(ours, setup.tower, text, [ref], w * h if setup.version == "qwen_image_2_1" else None)


def jsonable(ids: list) -> list:
    """Ids as the fixture keeps them (Ming's image run as ["patch", n])."""
    return [list(i) if isinstance(i, tuple) else i for i in ids]


def check_images(driver: Path, ours: Any, version: str, images: list[Path], work: Path,
                 fixture: list | None = None) -> dict:
    """Every PROMPTS entry with one reference (the images in turn), through the engine and the trainer:
    {"images", "max_rel", "student_max_rel", "vis_max_rel", "ids_equal", "pixels_max_abs", "problems"}; with
    `fixture` (a list), also the engine's ids, slots and row fingerprints of each."""
    from engine_check import PIXEL_TOLERANCE, fingerprint, int_lines, rows, run_engine
    c = ours.adapter.config
    setup = prepare(ours, version, images, work)
    if isinstance(setup, str):
        return {"images": 0, "max_rel": 0.0, "student_max_rel": 0.0, "vis_max_rel": 0.0, "ids_equal": False,
                "pixels_max_abs": None, "problems": [setup]}
    answers = run_engine(driver, ours, version, list(PROMPTS), work / "dumps", vision=setup.tower_file,
                         extra=setup.extra)
    out = {"images": len(set(setup.refs)), "max_rel": 0.0, "student_max_rel": 0.0, "vis_max_rel": 0.0,
           "ids_equal": True, "pixels_max_abs": None, "problems": []}

    def rel(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) if a.shape == b.shape else float("inf")

    for text, ref, answer in zip(PROMPTS, setup.refs, answers):
        dump = answer["dump"]
        if "engine_abort" in answer or not (dump / "adapter_out.bin").exists():
            out["problems"].append(f"{version} {text[:40]!r} + {ref.name}: the engine gave no rows "
                                   f"({answer.get('engine_abort') or answer.get('error')})")
            out["ids_equal"] = False
            continue
        mine = predict_one(ours, setup, text, ref)
        if (dump / "ref0_rgb.bin").exists():           # Qwen-Image 2.1 dumps the pixels its tower reads
            seen = np.fromfile(dump / "ref0_rgb.bin", "<f4").reshape(3, *mine["pixels"][0].shape[:2])
            gap = float(np.abs(seen.transpose(1, 2, 0) - mine["pixels"][0]).max())
            out["pixels_max_abs"] = max(out["pixels_max_abs"] or 0.0, gap)
            if gap > PIXEL_TOLERANCE:
                out["problems"].append(f"{version} {ref.name}: the tower's pixels differ by {gap:.3g}")
        got = {"rows": rows(dump / "adapter_out.bin", mine["rows"].shape[1]),
               "student": rows(dump / "qwen_hidden.bin", c.in_dim), "vis": rows(dump / "vis_embeds.bin", c.vis_dim)}
        figures = {"max_rel": rel(got["rows"], mine["rows"]), "student_max_rel": rel(got["student"], mine["hidden"]),
                   "vis_max_rel": rel(got["vis"], mine["vis"])}
        for name, value in figures.items():
            out[name] = max(out[name], value)
        engine_ids = (logged_slots(answer.get("log", []), mine["ids_log"]) if "ids_log" in mine
                      else int_lines(dump / mine["ids_file"]) if (dump / mine["ids_file"]).exists() else None)
        slots = [[int(x) for x in line.split()] for line in (dump / "vis_pos.txt").read_text().splitlines()
                 if line.strip()] if (dump / "vis_pos.txt").exists() else None
        if engine_ids != mine["ids"] or (slots is not None and mine["slots"] is not None and slots != mine["slots"]):
            out["ids_equal"] = False
            out["problems"].append(f"{version} {text[:40]!r} + {ref.name}: ids or slots differ (engine "
                                   f"{(engine_ids or [])[:12]}…, slots {slots}; ours {mine['ids'][:12]}…, "
                                   f"{mine['slots']})")
        if max(figures.values()) > 1e-4:
            out["problems"].append(f"{version} {text[:40]!r} + {ref.name}: " + ", ".join(
                f"{k} {v:.3g}" for k, v in figures.items()))
        if fixture is not None:
            fixture.append({"prompt": text, "ref": ref.name, "ids": jsonable(engine_ids or []), "slots": slots,
                            **{k: fingerprint(v) for k, v in got.items()}})
    return out


def _size(path: Path) -> tuple[int, int]:
    from PIL import Image
    with Image.open(path) as img:
        return img.size
