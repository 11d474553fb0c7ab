"""What several packs share and no pack owns: the mock teachers and tokenizer (mock_teachers.py), the RoPE
guard the teachers load under (rope_guard.py), the frozen seed table of the slot kinds (seed_table.py)
and the Qwen3-VL parts of the image packs (qwen3vl/: the engine's vision contract, the teacher,
vision_proj and the VisionPack base). Nothing here is a pack: the registry skips this folder."""
