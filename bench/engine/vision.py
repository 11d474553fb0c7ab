"""The reference-image path: for a pack whose conditioner reads references (`EngineFacts.references`), every
trainer_side.references.PROMPTS entry with one reference (the demo's scenes or the given files, in turn), through
the engine with the tower trainer_side builds, against the trainer's side on the same tower.

The engine gets the tower's file (--vision) and each reference's raw 8-bit RGBA pixels; the driver hands its
conditioner the channels the pipeline keeps for the model version (get_image_channels). Compared besides the
rows of the text path: vis_max_rel (the tower's rows, vis_embeds.bin), the ids and slots (vis_pos.txt, or the
slots the conditioner logs), and where the conditioner dumps the pixels its tower reads (ref0_rgb.bin,
Qwen-Image 2.1) pixels_max_abs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from trainer_side.ours import PIXEL_TOLERANCE, TOLERANCE, fingerprint
from trainer_side.references import PROMPTS, jsonable, references_for

from .driver import int_lines, logged_slots, rows, run_engine

__all__ = ["raw_pixels", "check_images"]


def raw_pixels(path: Path, out: Path) -> dict:
    """A reference as the pipeline hands it to the conditioner, before the version's channel rule: 8-bit RGBA
    (an image without alpha opaque); the driver's "images" entry."""
    from PIL import Image
    with Image.open(path) as img:
        pixels = np.asarray(img.convert("RGBA"), dtype=np.uint8)
    out.write_bytes(np.ascontiguousarray(pixels).tobytes())
    return {"path": str(out), "width": int(pixels.shape[1]), "height": int(pixels.shape[0]), "channels": 4}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) if a.shape == b.shape else float("inf")


def check_images(driver: Path, ours: Any, version: str, images: list[Path], work: Path,
                 fixture: list | None = None) -> dict:
    """{"images", "max_rel", "student_max_rel", "vis_max_rel", "ids_equal", "pixels_max_abs", "problems"}; with
    `fixture` (a list), also the engine's ids, slots and row fingerprints of each prompt."""
    c = ours.adapter.config
    refs = references_for(ours, version, images, work)
    if isinstance(refs, str):
        return {"images": 0, "max_rel": 0.0, "student_max_rel": 0.0, "vis_max_rel": 0.0, "ids_equal": False,
                "pixels_max_abs": None, "problems": [refs]}
    extra = [{"images": [raw_pixels(ref, work / f"ref{i}.raw")], **refs.request(ref)} for i, ref in enumerate(refs.refs)]
    answers = run_engine(driver, ours, version, list(PROMPTS), work / "dumps", vision=refs.tower_file(), extra=extra)
    out = {"images": len(set(refs.refs)), "max_rel": 0.0, "student_max_rel": 0.0, "vis_max_rel": 0.0,
           "ids_equal": True, "pixels_max_abs": None, "problems": []}
    for text, ref, answer in zip(PROMPTS, refs.refs, answers):
        dump = answer["dump"]
        if "engine_abort" in answer or not (dump / "adapter_out.bin").exists():
            out["problems"].append(f"{version} {text[:40]!r} + {ref.name}: the engine gave no rows "
                                   f"({answer.get('engine_abort') or answer.get('error')})")
            out["ids_equal"] = False
            continue
        mine = refs.predict(text, ref)
        if (dump / "ref0_rgb.bin").exists():           # a conditioner that dumps the pixels its tower reads
            seen = np.fromfile(dump / "ref0_rgb.bin", "<f4").reshape(3, *mine["pixels"][0].shape[:2])
            gap = float(np.abs(seen.transpose(1, 2, 0) - mine["pixels"][0]).max())
            out["pixels_max_abs"] = max(out["pixels_max_abs"] or 0.0, gap)
            if gap > PIXEL_TOLERANCE:
                out["problems"].append(f"{version} {ref.name}: the tower's pixels differ by {gap:.3g}")
        got = {"rows": rows(dump / "adapter_out.bin", mine["rows"].shape[1]),
               "student": rows(dump / "qwen_hidden.bin", c.in_dim), "vis": rows(dump / "vis_embeds.bin", c.vis_dim)}
        figures = {"max_rel": _rel(got["rows"], mine["rows"]), "student_max_rel": _rel(got["student"], mine["hidden"]),
                   "vis_max_rel": _rel(got["vis"], mine["vis"])}
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
        if max(figures.values()) > TOLERANCE:
            out["problems"].append(f"{version} {text[:40]!r} + {ref.name}: " + ", ".join(
                f"{k} {v:.3g}" for k, v in figures.items()))
        if fixture is not None:
            fixture.append({"prompt": text, "ref": ref.name, "ids": jsonable(engine_ids or []), "slots": slots,
                            **{k: fingerprint(v) for k, v in got.items()}})
    return out
