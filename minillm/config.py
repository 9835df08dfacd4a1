"""EngineConfig: which mechanisms the engine uses, and its limits.

Each chapter switches one mechanism on; an earlier chapter's engine is the same engine with it off,
so a notebook can run two chapters' engines side by side on the same requests.
"""

from __future__ import annotations

from dataclasses import dataclass

BATCHING = ("static", "continuous")
KV_LAYOUTS = ("contiguous",)


@dataclass(frozen=True)
class EngineConfig:
    """Frozen and validated: a bad value raises ValueError naming the field and its allowed range."""

    batching: str = "continuous"  # "static" (chapter 2) | "continuous" (chapter 3)
    max_num_seqs: int = 16  # batch slots: requests running at once
    max_model_len: int | None = None  # prompt + output tokens per request; None = the model's context
    max_tokens_per_step: int = 8192  # token budget of one forward pass
    kv: str = "contiguous"  # where K/V live: one max_model_len slot per running request
    device: str | None = None  # None: cuda when available, else cpu
    dtype: str | None = None  # None: float32 on cpu, the checkpoint's dtype on cuda

    def __post_init__(self) -> None:
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}, got {self.batching!r}")
        if self.kv not in KV_LAYOUTS:
            raise ValueError(f"kv must be one of {KV_LAYOUTS}, got {self.kv!r}")
        if not isinstance(self.max_num_seqs, int) or not 1 <= self.max_num_seqs <= 4096:
            raise ValueError(f"max_num_seqs must be an integer in [1, 4096], got {self.max_num_seqs!r}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise ValueError(f"max_model_len must be an integer >= 2 or None, got {self.max_model_len!r}")
        if not isinstance(self.max_tokens_per_step, int) or self.max_tokens_per_step < 1:
            raise ValueError(f"max_tokens_per_step must be an integer >= 1, got {self.max_tokens_per_step!r}")
        if self.device not in (None, "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be None, 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.dtype not in (None, "float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be None, 'float32', 'float16' or 'bfloat16', got {self.dtype!r}")
