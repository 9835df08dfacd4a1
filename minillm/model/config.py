"""ModelConfig: the handful of numbers that define a Llama / Qwen2 / Qwen3 decoder.

Built from a Hugging Face `config.json` dict (older `rope_theta`/`rope_scaling` keys or the newer
`rope_parameters`), or directly in code for tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
ROPE_KEYS = {"default": (), "linear": ("factor",),  # the numbers each kind of RoPE scaling needs
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
             "yarn": ("factor", "original_max_position_embeddings")}


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and options of one decoder-only model."""

    family: str  # "llama" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] = field(default_factory=dict)  # {"rope_type": "llama3", "factor": 8.0, ...}
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 always; Llama/Qwen3 when `attention_bias`
    o_bias: bool = False  # Llama/Qwen3 when `attention_bias`
    mlp_bias: bool = False  # Llama's `mlp_bias`
    qk_norm: bool = False  # Qwen3 normalises each head of q and k before RoPE
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "float32"  # the checkpoint's dtype

    def __post_init__(self) -> None:
        if self.family not in SUPPORTED_FAMILIES:
            raise ValueError(f"family must be one of {SUPPORTED_FAMILIES}, got {self.family!r}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in self.eos_token_ids):
            raise ValueError(f"eos_token_ids must be token ids (integers >= 0), got {self.eos_token_ids!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                             f"({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        rope_type = self.rope_scaling.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope_scaling.rope_type must be one of {SUPPORTED_ROPE_TYPES}, got {rope_type!r}")
        for key in ROPE_KEYS[rope_type]:
            value = self.rope_scaling.get(key)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < float("inf"):
                raise ValueError(f"{rope_type} RoPE scaling needs a positive number {key!r}, got {value!r}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token occupies across all layers, in the checkpoint dtype."""
        itemsize = {"float32": 4, "float16": 2, "bfloat16": 2}.get(self.dtype, 4)
        return 2 * self.num_layers * self.kv_size * itemsize

    @classmethod
    def from_hf(cls, hf: dict[str, Any], eos_token_ids: tuple[int, ...] = ()) -> ModelConfig:
        """Read a Hugging Face `config.json` dict (Llama, Qwen2 or Qwen3)."""
        family = hf.get("model_type", "")
        if family not in SUPPORTED_FAMILIES:
            raise ValueError(f"model_type {family!r} is not supported; minillm runs {SUPPORTED_FAMILIES}")
        heads = hf["num_attention_heads"]
        attention_bias = bool(hf.get("attention_bias", False))
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", None) or hf.get("rope_theta", 10000.0)
        if "type" in rope and "rope_type" not in rope:  # the oldest spelling
            rope["rope_type"] = rope.pop("type")
        if rope.get("rope_type", "default") != "default":
            rope.setdefault("original_max_position_embeddings",
                            hf.get("original_max_position_embeddings", hf["max_position_embeddings"]))
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos_token_ids) or ((eos,) if isinstance(eos, int) else tuple(eos or ()))
        return cls(
            family=family,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            max_position_embeddings=hf["max_position_embeddings"],
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=rope if rope.get("rope_type", "default") != "default" else {},
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or attention_bias,
            o_bias=family != "qwen2" and attention_bias,
            mlp_bias=bool(hf.get("mlp_bias", False)),
            qk_norm=family == "qwen3",
            eos_token_ids=eos_ids,
            dtype=str(hf.get("dtype") or hf.get("torch_dtype") or "float32"),
        )
