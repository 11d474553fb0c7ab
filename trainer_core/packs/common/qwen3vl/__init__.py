"""The Qwen3-VL machinery the MageFlow and Qwen-Image 2.1 packs share: the engine's vision
contract, the teacher, vision_proj and the VisionPack."""
