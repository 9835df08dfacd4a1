"""minillm's own decoder for the Llama, Qwen2 and Qwen3 families, and its checkpoint loader."""

from minillm.model.config import ModelConfig
from minillm.model.decoder import CausalLM
from minillm.model.loader import load, load_model, load_tokenizer

__all__ = ["CausalLM", "ModelConfig", "load", "load_model", "load_tokenizer"]
