"""The pack registry. Packs are listed here explicitly, in the order the GUI shows them."""
from __future__ import annotations

from trainer_core.base.errors import UnknownPackError
from trainer_core.packs import (llada_image, ming_image, qwen35_bridge, qwen3vl_flux3, qwen3vl_mageflow,
                                qwen3vl_qwenimage, t5xxl_pixart)
from trainer_core.packs.base import TrainerPack

__all__ = ["PACKS", "DEFAULT_PACK", "DEMO_PACKS", "get_pack", "TrainerPack"]

PACKS: dict[str, TrainerPack] = {
    p.id: p
    for p in (llada_image.PACK, qwen3vl_mageflow.PACK, qwen3vl_qwenimage.PACK, qwen3vl_flux3.PACK, qwen35_bridge.PACK,
              ming_image.PACK, t5xxl_pixart.PACK)
}
DEFAULT_PACK = llada_image.PACK.id   # the reference project.json's pack
# the packs with a demo, in the order the GUI offers them; the first (a tiny real T5 teacher, the
# fastest run) is the demo `python app.py --demo` and `gguf-trainer demo` build by default
DEMO_PACKS: tuple[str, ...] = (t5xxl_pixart.PACK.id, llada_image.PACK.id, qwen3vl_mageflow.PACK.id,
                               qwen3vl_qwenimage.PACK.id, qwen3vl_flux3.PACK.id, qwen35_bridge.PACK.id,
                               ming_image.PACK.id)


def get_pack(pack_id: str) -> TrainerPack:
    try:
        return PACKS[pack_id]
    except (KeyError, TypeError):
        known = ", ".join(PACKS)
        raise UnknownPackError(
            f'There is no trainer pack "{pack_id}"; choose one of: {known}.'
        ) from None
