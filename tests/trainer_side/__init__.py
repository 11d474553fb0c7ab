"""The trainer's side of the engine check: what `gguf-trainer infer --prompt`'s path, the packs' own reference
preprocessing and their teachers give for the prompts bench/engine_check.py hands the engine.

tests/test_engine_rows.py holds it against the engine's recorded rows (tests/data/engine_rows.json);
bench/engine/ against the live engine. Both import it from here, so the tests never import bench/:

    ours.py        Ours (one export's infer path), the row fingerprints the fixture keeps, the tolerances
    references.py  the reference-image side: a tower the engine can run, each reference family's prediction
    teacher.py     the teacher side: a tiny teacher at the engine's real layer count, the pack's own on it

What differs between packs is read from their declarations (`TrainerPack.engine`: EngineFacts), never from
a pack id.
"""
