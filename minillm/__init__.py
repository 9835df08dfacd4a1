"""minillm: a small, readable LLM inference engine, built chapter by chapter in the course."""

from pathlib import Path

from minillm.async_engine import AsyncLLM
from minillm.config import EngineConfig, SpeculativeConfig
from minillm.engine import LLM, LLMEngine, RequestOutput
from minillm.generate import GenerationOutput, generate, generate_with_cache, generate_without_cache
from minillm.model import CausalLM, ModelConfig, load, load_model, load_tokenizer
from minillm.sampling import SamplingParams

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
"""The course's own models (`target`, `draft`), trained by `scripts/train_tiny_models.py`."""

__all__ = [
    "ASSETS_DIR",
    "AsyncLLM",
    "EngineConfig",
    "LLM",
    "LLMEngine",
    "RequestOutput",
    "CausalLM",
    "GenerationOutput",
    "ModelConfig",
    "SamplingParams",
    "SpeculativeConfig",
    "generate",
    "generate_with_cache",
    "generate_without_cache",
    "load",
    "load_model",
    "load_tokenizer",
]
