"""A tiny stand-in for LLaDA2-MoE's remote code, copied into test and demo snapshots.

The two modules are written the way 4.x-era `trust_remote_code` models are: a config class and
a model loaded through `auto_map`, its rotary module taking `ROPE_INIT_FUNCTIONS["default"]` and
keeping `inv_freq` as a non-persistent buffer (so transformers 5 leaves it uninitialised). The
outer model exposes `.model(inputs_embeds=…, attention_mask=<additive 4-D>, position_ids=…)` and
`get_input_embeddings()`, which is all the LLaDA teacher uses. `trainer_core.packs.common.tiny_models.write_tiny_llada`
copies them beside the config; nothing imports them from here.
"""
