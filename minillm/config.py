"""EngineConfig: which mechanisms the engine uses, and its limits.

Each chapter switches one mechanism on; an earlier chapter's engine is the same engine with it off,
so a notebook can run two chapters' engines side by side on the same requests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from minillm.sampling import is_bool, is_int

BATCHING = ("static", "continuous")
KV_LAYOUTS = ("contiguous", "paged")
INTEGER_RANGES = {"max_num_seqs": (1, 4096), "max_model_len": (2, None), "max_tokens_per_step": (1, None),
                  "max_tokens_per_prefill_chunk": (1, None), "block_size": (1, 1024), "kv_cache_bytes": (1, None),
                  "trace_max_steps": (1, None), "trace_max_bytes": (1, None),
                  "tensor_parallel_size": (1, 64)}
OPTIONAL = {"max_model_len", "kv_cache_bytes", "trace_max_steps", "trace_max_bytes"}  # None is allowed


SPECULATIVE_METHODS = ("draft", "ngram")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (chapter 7): a proposer guesses `num_speculative_tokens` tokens per
    decoding request and step; the target checks them in the same forward pass.

    method "draft": a small model with the target's tokenizer proposes (`draft_model`: a shipped name,
    a local folder or a hub id; default the shipped "draft"). method "ngram": prompt lookup, the
    tokens that followed the request's last `ngram_max`..`ngram_min` tokens earlier in the request.

    Greedy tokens are exactly those without speculation. Sampled tokens follow exactly the target's
    distribution, and a seeded request repeats itself run to run on the same requests — but which
    tokens it draws can depend on how many guesses each step verified, which the step budget and the
    free blocks, and so the other requests, decide (without speculation they cannot)."""

    method: str = "draft"
    num_speculative_tokens: int = 4
    draft_model: str | None = None
    ngram_max: int = 3
    ngram_min: int = 1

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative method must be one of {SPECULATIVE_METHODS}, got {self.method!r}")
        for name, low, high in (("num_speculative_tokens", 1, 16), ("ngram_max", 1, 64), ("ngram_min", 1, 64)):
            value = getattr(self, name)
            if not is_int(value) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max})")
        if isinstance(self.draft_model, os.PathLike):
            object.__setattr__(self, "draft_model", os.fspath(self.draft_model))
        if self.draft_model is not None and (not isinstance(self.draft_model, str) or not self.draft_model):
            raise ValueError(f"draft_model must be a model name or folder (str) or None, got {self.draft_model!r}")
        if self.method == "ngram" and self.draft_model is not None:
            raise ValueError("draft_model is for method='draft'; the n-gram proposer needs no model")


@dataclass(frozen=True)
class EngineConfig:
    """Frozen and validated: a bad value raises ValueError naming the field and its allowed range."""

    batching: str = "continuous"  # "static" (chapter 2) | "continuous" (chapter 3)
    max_num_seqs: int = 16  # batch slots: requests running at once
    max_model_len: int | None = None  # prompt + output tokens per request; None = the model's context
    max_tokens_per_step: int = 8192  # token budget of one forward pass (decodes and prefill chunks together)
    chunked_prefill: bool = False  # cut prompts into chunks that share each step with the decodes (chapter 6)
    max_tokens_per_prefill_chunk: int = 128  # chunked: the most prompt tokens one request computes in a step.
    #                                          128 shows the effect on a laptop CPU; on a GPU, ~1024 (and a
    #                                          step budget of ~8192) keeps the matrix units busy
    kv: str = "contiguous"  # "contiguous": a max_model_len slot per running request | "paged": blocks (chapter 4)
    block_size: int = 16  # tokens per KV block (paged)
    kv_cache_bytes: int | None = None  # paged KV budget; None: free GPU memory x gpu_memory_utilization on
    #                                    CUDA, on CPU what the contiguous cache would reserve
    gpu_memory_utilization: float = 0.9  # share of the GPU's free memory the paged cache may take
    use_triton: bool | None = None  # paged kernels in Triton; None: on CUDA when triton is installed
    use_cpu_kernel: bool | None = None  # paged decode attention as a C kernel (minillm/attention/cpu_paged.py);
    #                                     None: on CPU in float32 when a C compiler can build it
    device: str | None = None  # None: cuda when available, else cpu
    dtype: str | None = None  # None: float32 on cpu, the checkpoint's dtype on cuda
    trace_max_steps: int | None = 10_000  # the trace keeps this many recent steps (None: all of them)
    trace_max_bytes: int | None = 64 << 20  # ...and no more than about this much memory (None: no bound)
    prefix_cache: bool = False  # reuse cached full KV blocks of earlier requests (chapter 5; paged only)
    speculative: SpeculativeConfig | None = None  # draft tokens and verify them in one pass (chapter 7)
    jump_forward: bool = False  # structured outputs: text the grammar forces is appended unsampled (chapter 11)
    compile: bool = False  # decode steps through torch.compile, one compiled step per batch bucket (chapter 8)
    cuda_graphs: bool = False  # decode steps as CUDA Graphs, one captured per batch bucket (chapter 8; CUDA)
    graph_batch_sizes: tuple[int, ...] | None = None  # the buckets; None: 1, 2, 4, then steps of 8 to max_num_seqs
    quantization: str | None = None  # weight-only "int8" (per channel) | "int4" (groups) | None (chapter 12);
    #                                  the target's layers: a draft model stays in the model's dtype
    quantization_group_size: int = 64  # int4: inputs sharing a scale (32, 64 or 128)
    kv_cache_dtype: str = "auto"  # paged K/V as "int8" (a scale per token and head) | "fp8" (e4m3) | "auto"
    tensor_parallel_size: int = 1  # ranks sharing each layer: worker processes on this machine (chapter 13).
    #                                Each rank quantizes its own shard: int8's scale for a row of o_proj /
    #                                down_proj (split by columns) covers that rank's columns only, as fine as
    #                                TP=1's or finer, so int8 tokens can differ from TP=1's (int4's groups are
    #                                TP=1's: its group size must divide a rank's columns). In float32 the tokens
    #                                are TP=1's; in 16-bit (and the int8/int4 CPU kernels' bfloat16 activations)
    #                                each rank's partial sums are rounded apart, so they can differ too

    def __post_init__(self) -> None:
        if self.batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}, got {self.batching!r}")
        if self.kv not in KV_LAYOUTS:
            raise ValueError(f"kv must be one of {KV_LAYOUTS}, got {self.kv!r}")
        if self.kv == "paged" and self.batching != "continuous":
            raise ValueError("kv='paged' needs batching='continuous' (preemption re-forms the batch every step)")
        for name, (low, high) in INTEGER_RANGES.items():
            value = getattr(self, name)
            if value is None and name in OPTIONAL:
                continue
            if not is_int(value) or value < low or (high is not None and value > high):
                bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
                raise ValueError(f"{name} must be an integer {bound}{' or None' if name in OPTIONAL else ''}, "
                                 f"got {value!r}")
            object.__setattr__(self, name, int(value))  # a numpy integer becomes a plain int
        if (not isinstance(self.gpu_memory_utilization, int | float) or isinstance(self.gpu_memory_utilization, bool)
                or not 0 < self.gpu_memory_utilization <= 1):
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        for name in ("chunked_prefill", "prefix_cache", "compile", "cuda_graphs", "jump_forward") + tuple(
                name for name in ("use_triton", "use_cpu_kernel") if getattr(self, name) is not None):
            if not is_bool(getattr(self, name)):
                allowed = "None, True or False" if name in ("use_triton", "use_cpu_kernel") else "True or False"
                raise ValueError(f"{name} must be {allowed}, got {getattr(self, name)!r}")
            object.__setattr__(self, name, bool(getattr(self, name)))  # a numpy bool becomes a plain bool
        if self.chunked_prefill and self.batching != "continuous":
            raise ValueError("chunked_prefill=True needs batching='continuous' (chunks share steps with running "
                             "decodes)")
        if self.prefix_cache and self.kv != "paged":
            raise ValueError("prefix_cache=True needs kv='paged': cached blocks are shared by reference")
        if self.speculative is not None and not isinstance(self.speculative, SpeculativeConfig):
            raise ValueError(f"speculative must be a SpeculativeConfig or None, got {type(self.speculative).__name__}")
        if self.speculative is not None and self.batching != "continuous":
            raise ValueError("speculative decoding needs batching='continuous' (requests accept different numbers of "
                             "tokens per step)")
        self._check_recording()
        if self.device not in (None, "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be None, 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.dtype not in (None, "float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be None, 'float32', 'float16' or 'bfloat16', got {self.dtype!r}")
        from minillm.attention.kv_codes import check_kv_cache_dtype
        from minillm.quantization.model import check_scheme

        # the group size is checked even without a scheme, and kept as a plain int (a numpy integer would be
        # refused later by the int4 layers); the names are kept as plain str (not numpy's, nor arrays)
        check_scheme(self.quantization, self.quantization_group_size, allow_none=True)
        object.__setattr__(self, "quantization_group_size", int(self.quantization_group_size))
        if self.quantization is not None:
            object.__setattr__(self, "quantization", str(self.quantization))
        check_kv_cache_dtype(self.kv_cache_dtype)
        object.__setattr__(self, "kv_cache_dtype", str(self.kv_cache_dtype))
        if self.kv_cache_dtype != "auto":
            if self.kv != "paged":
                raise ValueError(f"kv_cache_dtype={self.kv_cache_dtype!r} needs kv='paged' (the quantized cache is "
                                 "the paged one)")
            if self.use_cpu_kernel:
                raise ValueError(f"kv_cache_dtype={self.kv_cache_dtype!r} runs on the torch reference or the Triton "
                                 "kernels: use_cpu_kernel=True (the C decode kernel) reads the model's dtype")

        if self.tensor_parallel_size > 1 and (self.compile or self.cuda_graphs):
            raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size} runs eager steps: "
                             f"{'compile' if self.compile else 'cuda_graphs'}=True is not supported with it yet")

    def _check_recording(self) -> None:
        """compile / cuda_graphs (chapter 8): one of them, on the paged cache, with valid buckets."""
        if self.compile and self.cuda_graphs:
            raise ValueError("choose compile=True or cuda_graphs=True, not both")
        if (self.compile or self.cuda_graphs) and self.kv != "paged":
            raise ValueError(f"{'compile' if self.compile else 'cuda_graphs'}=True needs kv='paged' (the recorded "
                             "step reads block tables)")
        sizes = self.graph_batch_sizes
        if sizes is None:
            return
        if (not isinstance(sizes, tuple | list) or not sizes
                or any(not is_int(b) or not 1 <= b <= self.max_num_seqs for b in sizes)):
            raise ValueError(f"graph_batch_sizes must be a non-empty tuple of integers in [1, max_num_seqs="
                             f"{self.max_num_seqs}] or None, got {sizes!r}")
        object.__setattr__(self, "graph_batch_sizes", tuple(sorted({int(b) for b in sizes})))
