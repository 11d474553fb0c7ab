"""The Qwen3 (text) teachers: a Qwen3Model read at the family's taps, its mock and the demo's tiny one."""
