"""The engine: the step loop that serves many requests at once, and its offline API `LLM`.

    add_request ─► scheduler.schedule() ─► runner.execute() ─► scheduler.update() ─► detokenize, judge stops
    (checks: a bad   (who runs, how many     (one forward pass)  (append tokens)      (stream, stop strings;
     request is       tokens)                                                          the finished retire)
     refused here)

Data flows one way; every step is recorded in `engine.trace`.

A failing request fails alone. Everything a request brings is checked at the door, so a bad one is
refused before it is queued. If a step raises anyway (a kernel failure, a defect not yet found),
the step's requests are run again one at a time to find whose it is: that request ends with
finish_reason "error" and the exception's text, its slot and KV blocks are freed, and every other
request carries on with exactly the tokens it would have had.

Ctrl-C is held until the running step ends. Other signal handlers that raise (a SIGALRM timeout
around `generate`) can still land inside the books and are not supported: give a request a
deadline with `abort()`, or `asyncio.wait_for` on `AsyncLLM`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from minillm.attention import ContiguousKVCache
from minillm.attention.cache_spec import CacheSpec
from minillm.attention.paged import PagedKVCache, kv_bytes_per_token
from minillm.config import EngineConfig
from minillm.detokenizer import IncrementalDetokenizer
from minillm.graphs import batch_size_buckets
from minillm.graphs.recorded_decode import RecordedDecode
from minillm.kv.block_pool import BlockPool
from minillm.logprobs import TokenLogprob
from minillm.memory import available_bytes, format_bytes, keep_freed_memory
from minillm.metrics import RequestMetrics
from minillm.model.decoder import CausalLM
from minillm.model.loader import load, load_model
from minillm.prompts import encode_prompt
from minillm.quantization.model import quantization_of, quantize_model
from minillm.request import Request
from minillm.runner import ModelRunner, StepResult
from minillm.sampling import SamplingParams
from minillm.scheduler import ContinuousScheduler, SchedulerOutput, StaticScheduler
from minillm.scheduler.admission import refusal
from minillm.speculative.proposers import DraftModelProposer, NgramProposer, Proposal
from minillm.stopping import stop_reason
from minillm.structured.manager import StructuredOutputManager
from minillm.trace import SlotState, StepRecord, Trace

logger = logging.getLogger("minillm")


class EngineStopped(RuntimeError):
    """The engine can serve nothing more (a tensor-parallel worker was lost): the reason is in the text."""


@dataclass
class CompletionOutput:
    """One sample of a request (`SamplingParams.n` of them; one by default)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"
    logprobs: list[TokenLogprob] | None = None  # one per token, when the request asked for them


@dataclass
class RequestOutput:
    """A request's result: its samples in `outputs`; `text`, `token_ids`, `finish_reason` and
    `logprobs` are the first sample's (the only one unless n > 1)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    metrics: RequestMetrics
    error: str | None = None  # why the request was rejected, when finish_reason == "error"
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache instead of computed
    prompt_logprobs: list[TokenLogprob | None] | None = None  # per prompt token (the first None), when asked

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        return self.outputs[0].logprobs


@dataclass(frozen=True)
class StepUpdate:
    """What one step produced for one sample of a request: new text, and whether it is done."""

    request_id: str  # the request's id (for every sample)
    delta: str
    finished: bool  # the whole request is done (every sample): said once, on its last update
    index: int = 0  # which sample
    sample_finished: bool = False  # this sample is done
    token_ids: tuple[int, ...] = ()  # the tokens this step delivered to the sample
    logprobs: tuple[TokenLogprob, ...] = ()  # theirs, when the request asked for logprobs


def _quantized(model: CausalLM, config: EngineConfig) -> CausalLM:
    """The model the engine runs: `model` itself, or with `config.quantization` its linear layers quantized
    (a new model sharing the rest: minillm/quantization/model.py). A model quantized already must be quantized
    as asked."""
    if config.quantization is None:
        return model
    asked = config.quantization if config.quantization == "int8" else \
        f"int4 (group {config.quantization_group_size})"
    has = quantization_of(model)
    if has is None:
        return quantize_model(model, config.quantization, config.quantization_group_size)
    if has != asked:
        raise ValueError(f"quantization: the model is quantized as {has}, the config asks for {asked}")
    return model


class LLMEngine:
    """Owns the scheduler, the KV cache and the runner; `step()` advances every request once.

    Its methods are not thread-safe on their own: whoever drives it holds `engine.lock` (`LLM` for
    a whole `generate` call, `AsyncLLM` around each step and between steps)."""

    def __init__(self, model: CausalLM, tokenizer, config: EngineConfig | None = None, detokenize: bool = True):
        """`detokenize=False`: the engine core of chapter 10, which leaves text to its front end — it judges
        only the stops that need no text (EOS, stop tokens, lengths); its outputs' text stays empty."""
        self.detokenize = detokenize
        self.config = config = config or EngineConfig()
        if not isinstance(config, EngineConfig):
            raise ValueError(f"config must be an EngineConfig, got {type(config).__name__}")
        self.workers = None  # tensor parallelism (chapter 13): the other ranks, and this process is rank 0
        self.dead: str | None = None  # why the engine has stopped (a tensor-parallel worker was lost)
        if config.tensor_parallel_size > 1:
            from minillm.distributed.executor import TensorParallelWorkers

            self.workers = TensorParallelWorkers(model, config.tensor_parallel_size, config.quantization,
                                                 config.quantization_group_size)
            model = self.workers.model  # rank 0's shard
        try:
            self._build(model, tokenizer, config)
        except BaseException:
            if self.workers is not None:
                self.workers.close()
            raise

    def _build(self, model: CausalLM, tokenizer, config: EngineConfig) -> None:
        model = _quantized(model, config)  # chapter 12: weight-only int8/int4, when asked (each rank its shard)
        self.model, self.tokenizer = model, tokenizer
        context = model.config.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > context:
            raise ValueError(f"max_model_len must be at most the model's context ({context}), "
                             f"got {config.max_model_len}")
        self.max_model_len = config.max_model_len or context
        if model.device.type == "cpu":  # each step's activations reused, not faulted in again (memory.py)
            keep_freed_memory()
        self.draft = self._load_draft()  # first: its weights come out of the memory the KV cache may take
        (self.cache, draft_cache), self.pool = self._make_kv_cache()
        self.proposer = self._make_proposer(draft_cache)
        scheduler_cls = StaticScheduler if config.batching == "static" else ContinuousScheduler
        chunk = config.max_tokens_per_prefill_chunk if config.chunked_prefill else None
        self.scheduler = scheduler_cls(config.max_num_seqs, self.max_model_len, config.max_tokens_per_step, self.pool,
                                       chunk)
        self.runner = ModelRunner(model, self.cache, self._make_recorded_decode(), self.workers)
        self.structured = StructuredOutputManager(tokenizer, model.config.vocab_size, model.config.eos_token_ids)
        self.speculation_counts = {"passes": 0, "drafted": 0, "examined": 0, "accepted": 0, "emitted": 0}
        self.jump_forward_tokens = 0  # structured outputs' forced tokens appended unsampled (chapter 11)
        self.num_preemptions = 0  # since the engine started (the trace keeps only recent steps)
        self.requests: dict[str, Request] = {}
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        self.trace = Trace(config.max_num_seqs, max_model_len=self.max_model_len, max_steps=config.trace_max_steps,
                           max_bytes=config.trace_max_bytes)
        if self.pool is not None:  # the fragmentation visualizer replays block tables
            self.trace.block_size, self.trace.num_blocks = self.pool.block_size, self.pool.num_blocks
        self._ids = itertools.count()
        self._t0 = time.perf_counter()
        self.lock = threading.RLock()
        self._in_step = False  # aborts inside a step are recorded by the step itself

    def _make_kv_cache(self) -> tuple[tuple[ContiguousKVCache | PagedKVCache, ...], BlockPool | None]:
        """The target's cache and, with a draft model, the draft's — addressed alike (the same slots,
        or the same block ids: a block holds both models' K/V for its tokens). Contiguous: a
        max_model_len slot per batch slot. Paged: blocks from one byte budget for both — `kv_cache_bytes`,
        else free GPU memory x `gpu_memory_utilization` on CUDA, else what the contiguous cache would
        reserve (rounded up to whole blocks). Refuses, with the numbers, a cache the device cannot hold."""
        config, model = self.config, self.model
        models = [model] if self.draft is None else [model, self.draft]
        kv_dtype = config.kv_cache_dtype  # "int8" / "fp8": codes in the paged cache (chapter 12)
        # per rank under tensor parallelism: a rank holds its KV heads only (the draft model is rank 0's alone)
        per_token = sum(kv_bytes_per_token(m.config.num_layers, m.shard_config.num_kv_heads, m.config.head_dim,
                                           m.dtype, kv_dtype) for m in models)
        whose = " (the target's and the draft model's cache)" if self.draft is not None else ""
        if config.kv == "contiguous":
            self._check_memory(config.max_num_seqs * self.max_model_len * per_token,
                               f"max_num_seqs={config.max_num_seqs} x max_model_len={self.max_model_len} tokens x "
                               f"{format_bytes(per_token)} per token{whose}")
            spec = CacheSpec("contiguous", num_slots=config.max_num_seqs, max_len=self.max_model_len)
            caches = self._build_caches(spec, models)
            logger.info(caches[0].describe())
            return caches + (None,) * (2 - len(caches)), None
        budget = config.kv_cache_bytes
        if budget is None and model.device.type == "cuda":
            budget = int(torch.cuda.mem_get_info(model.device)[0] * config.gpu_memory_utilization)
        elif budget is None:  # whole blocks: every slot can hold a max_model_len request
            budget = config.max_num_seqs * -(-self.max_model_len // config.block_size) * config.block_size * per_token
        num_blocks = budget // (per_token * config.block_size)
        if num_blocks < 1:
            raise ValueError(f"a KV budget of {budget} bytes holds no block of {config.block_size} tokens "
                             f"({per_token * config.block_size} bytes{whose})")
        self._check_memory(num_blocks * config.block_size * per_token,
                           f"{num_blocks} blocks x {config.block_size} tokens x {format_bytes(per_token)} per token"
                           f"{whose}")
        use_triton = config.use_triton
        if use_triton is None and model.device.type == "cuda":  # when they can run and were not asked for by name
            from minillm.attention.triton_paged import unavailable_reason

            power_of_two = config.block_size & (config.block_size - 1) == 0
            use_triton = power_of_two and unavailable_reason(model.device) is None
        use_cpu_kernel = config.use_cpu_kernel
        if use_cpu_kernel is None and model.device.type == "cpu" and not use_triton and kv_dtype == "auto":
            from minillm.attention.cpu_paged import unavailable_reason

            reason = unavailable_reason(model.device, model.dtype)
            use_cpu_kernel = reason is None
            if reason is not None and model.dtype == torch.float32:
                logger.info("the C paged-attention kernel is not used: %s", reason)
        spec = CacheSpec("paged", num_blocks=num_blocks, block_size=config.block_size, use_triton=bool(use_triton),
                         use_cpu_kernel=bool(use_cpu_kernel), kv_cache_dtype=kv_dtype,
                         pad_block=config.compile or config.cuda_graphs)
        caches = self._build_caches(spec, models)
        logger.info("%s (%s)%s", caches[0].describe(), "Triton kernels" if use_triton else
                    "C decode kernel" if use_cpu_kernel else "torch reference", whose and ", the draft's beside it")
        return caches + (None,) * (2 - len(caches)), BlockPool(num_blocks, config.block_size,
                                                               prefix_cache=config.prefix_cache)

    def _build_caches(self, spec: CacheSpec, models: list[CausalLM]) -> tuple[ContiguousKVCache | PagedKVCache, ...]:
        """The caches `spec` describes, one per model (the target's shard on every rank, under tensor parallelism)."""
        caches = tuple(spec.build(m.shard_config, m.dtype, m.device) for m in models)
        if self.workers is not None:
            self.workers.build_caches(spec)
        return caches

    def _load_draft(self) -> CausalLM | None:
        """Speculative decoding's draft model (chapter 7), loaded on the target's device and dtype,
        refused unless it shares the target's vocabulary and context. None without one."""
        spec = self.config.speculative
        if spec is None or spec.method != "draft":
            return None
        draft = load_model(spec.draft_model or "draft", dtype=self.model.dtype, device=self.model.device)
        if draft.config.vocab_size != self.model.config.vocab_size:
            raise ValueError(f"the draft model has a vocabulary of {draft.config.vocab_size} tokens and the target "
                             f"{self.model.config.vocab_size}: a draft must use the target's tokenizer")
        if draft.config.max_position_embeddings < self.max_model_len:
            raise ValueError(f"the draft model's context ({draft.config.max_position_embeddings}) is shorter than "
                             f"max_model_len ({self.max_model_len})")
        return draft

    def _make_proposer(self, draft_cache: ContiguousKVCache | PagedKVCache | None
                       ) -> NgramProposer | DraftModelProposer | None:
        """Speculative decoding's proposer (chapter 7): n-gram lookup, or the draft model on its cache."""
        spec = self.config.speculative
        if spec is None:
            return None
        if spec.method == "ngram":
            return NgramProposer(spec)
        return DraftModelProposer(self.draft, draft_cache)

    def _make_recorded_decode(self) -> RecordedDecode | None:
        """Chapter 8: pure-decode steps through a step recorded per batch-size bucket — CUDA Graphs
        captured now (`cuda_graphs`), or torch.compile'd on first use (`compile`)."""
        config = self.config
        if not (config.compile or config.cuda_graphs):
            return None
        if config.cuda_graphs and self.model.device.type != "cuda":
            raise ValueError(f"cuda_graphs=True needs a CUDA device, and this engine runs on {self.model.device}: on "
                             "a CPU, compile=True records the same fixed-shape decode step with torch.compile")
        buckets = list(config.graph_batch_sizes or batch_size_buckets(config.max_num_seqs))
        recorded = RecordedDecode(self.model, self.cache, buckets, "cuda_graphs" if config.cuda_graphs else "compile",
                                  max_blocks_per_seq=self.pool.blocks_for(self.max_model_len))
        if config.cuda_graphs:
            recorded.capture()
        return recorded

    def _check_memory(self, needed: int, how: str) -> None:
        available = available_bytes(self.model.device)
        if available is not None and needed > available:
            raise ValueError(f"the KV cache would take {format_bytes(needed)} ({how}), but {self.model.device} has "
                             f"{format_bytes(available)} available: lower max_num_seqs, max_model_len or "
                             "kv_cache_bytes")

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> Request:
        """Check and queue a request. Anything that could fail it later inside a step is refused
        here: a ValueError naming the problem, and nothing is queued."""
        if self.dead is not None:
            raise EngineStopped(f"the engine has stopped: {self.dead}")
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if request_id is None:
            request_id = self.new_request_id(params.n)
        elif not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str or None, got {request_id!r}")
        elif request_id in self.requests and (not self.requests[request_id].status.is_done
                                              or self.requests[request_id].parent is not None):
            raise ValueError(f"request_id {request_id!r} is already in use")
        if arrival_time is not None and (isinstance(arrival_time, bool) or not isinstance(arrival_time, int | float)
                                         or not math.isfinite(arrival_time)):
            raise ValueError(f"arrival_time must be a time.perf_counter() value or None, got {arrival_time!r}")
        params.check_vocab(self.model.config.vocab_size, self.model.config.eos_token_ids)
        if params.n > 1 and self.config.batching == "static":
            raise ValueError(f"n={params.n} samples need continuous batching: a static batch cannot fork a request")
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"n={params.n} samples run at once, one slot each, and max_num_seqs is "
                             f"{self.config.max_num_seqs}")
        sample_ids = [f"{request_id}#{i}" for i in range(1, params.n)]
        if any(i in self.requests for i in sample_ids):
            raise ValueError(f"request_id {request_id!r}: the ids of its samples ({request_id!r}#i) are in use")
        ids = encode_prompt(self.tokenizer, prompt, self.max_model_len, self.model.config.vocab_size)
        reason = refusal(len(ids), params.max_new_tokens, self.config, self.max_model_len, self.pool)
        if reason is not None:
            raise ValueError(reason)
        arrival = arrival_time if arrival_time is not None else time.perf_counter()
        text = prompt if isinstance(prompt, str) else None
        request = Request(request_id, ids, params, arrival, prompt=text)
        request.children = [Request(sample_id, ids, params.for_sample(i), arrival, prompt=text, parent=request,
                                    sample_index=i) for i, sample_id in enumerate(sample_ids, start=1)]
        if params.prompt_logprobs is not None:
            request.prompt_logprobs = [None]  # the first token has no context to be predicted from
        if params.structured is not None:  # compiles off the step loop; the request waits until it is ready
            try:
                self.structured.submit(request)
            except ValueError:
                raise
            except Exception as err:  # the grammar library cannot work with this tokenizer, say
                raise ValueError(f"structured outputs are unavailable: {type(err).__name__}: {err}") from err
        for sample in request.samples:
            if self.detokenize:
                self.detokenizers[sample.request_id] = IncrementalDetokenizer.for_request(self.tokenizer, ids, params)
            self.requests[sample.request_id] = sample
        self.scheduler.add(request)
        return request

    def new_request_id(self, n: int = 1) -> str:
        """A request id that no request held here uses, nor the ids of its `n` samples."""
        while not self.ids_free(request_id := str(next(self._ids)), n):
            pass
        return request_id

    def ids_free(self, request_id: str, n: int = 1) -> bool:
        """Whether a request with this id and n samples would collide with no request held here."""
        return request_id not in self.requests and not any(f"{request_id}#{i}" in self.requests for i in range(1, n))

    def abort(self, request_id: str) -> bool:
        """Stop a request (every sample of it) wherever it is, freeing its slots and KV blocks; False if
        it is unknown or already done."""
        request = self.requests.get(request_id) if isinstance(request_id, str) else None
        return request is not None and request.parent is None and self._finish(request, "abort")

    def fail(self, request_id: str, error: BaseException | str) -> bool:
        """End a request with finish_reason "error" and `error`'s text, freeing what it holds. A sample's
        failure fails its whole request (every sample)."""
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        request = self.requests.get(request_id) if isinstance(request_id, str) else None
        return request is not None and self._finish(request.parent or request, "error", text)

    def finish_sample(self, sample_id: str, reason: str) -> bool:
        """End one sample of a request (`reason`: "stop" when the front end found a stop string in its text),
        freeing its slot and blocks; the request's other samples go on. False if unknown or already done."""
        sample = self.requests.get(sample_id) if isinstance(sample_id, str) else None
        if sample is None or sample.status.is_done:
            return False
        self.scheduler.finish(sample, reason)
        sample.metrics.finish_time = time.perf_counter()
        if not self._in_step:
            self._record_between_steps()
        return True

    def _finish(self, request: Request, reason: str, error: str | None = None) -> bool:
        live = [s for s in request.samples if not s.status.is_done]
        if not live:
            return False
        now = time.perf_counter()
        for sample in reversed(live):  # the forked samples first: the parent's blocks are freed last
            self.scheduler.finish(sample, reason)
            sample.error = error
            sample.metrics.finish_time = now
        if request.grammar is not None:  # ended while its grammar compiles: the compilation may be dropped
            self.structured.forget(request)
        if not self._in_step:
            self._record_between_steps()
        return True

    def is_done(self, request_id: str) -> bool:
        """Whether the request (every sample of it) has ended."""
        return all(s.status.is_done for s in self.requests[request_id].samples)

    def _record_between_steps(self) -> None:
        """An abort between two steps changes the block pool too (its blocks are released): fold that
        into the last step's record, which then shows the state after that step and the aborts that
        followed it — so that a replay of the trace always ends where the engine is."""
        if self.pool is None or not self.trace.steps:
            return
        running = self.scheduler.running
        self.trace.steps[-1] = dataclasses.replace(
            self.trace.steps[-1], kv_events=self.trace.steps[-1].kv_events + tuple(self.pool.drain_events()),
            kv_tokens={r.request_id: r.num_computed_tokens for r in running},
            blocks={r.request_id: tuple(self.pool.block_table(r.request_id)) for r in running})

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Share of the tokens looked up at admissions that were served from the prefix cache (None
        without one)."""
        cache = self.pool.cache if self.pool is not None else None
        return cache.hit_rate if cache is not None else None

    def gauges(self) -> dict[str, float]:
        """The engine's state now, by name (the server's /metrics): requests running and waiting, preemptions,
        KV blocks, prefix-cache and speculative counters where those are on."""
        gauges = {"requests_running": len(self.scheduler.running), "requests_waiting": len(self.scheduler.waiting),
                  "preemptions": self.num_preemptions}
        if self.pool is not None:
            gauges |= {"kv_blocks_total": self.pool.num_blocks,
                       "kv_blocks_used": self.pool.num_blocks - self.pool.num_free_blocks,
                       "kv_blocks_cached": len(self.pool.evictable)}
        if self.prefix_cache_hit_rate is not None:  # first admissions only: a preempted request finding its
            cache = self.pool.cache  #                  own blocks again is counted apart (it shared nothing)
            gauges |= {"prefix_cache_hit_rate": self.prefix_cache_hit_rate,
                       "prefix_cache_queried_tokens": cache.queried_tokens, "prefix_cache_hit_tokens": cache.hit_tokens,
                       "prefix_cache_readmitted_queried_tokens": cache.readmitted_queried_tokens,
                       "prefix_cache_readmitted_hit_tokens": cache.readmitted_hit_tokens}
        if (speculative := self.speculative_metrics) is not None:
            gauges["speculative_acceptance_rate"] = speculative["acceptance_rate"]
            gauges["speculative_tokens_per_pass"] = speculative["tokens_per_pass"]
        return gauges

    def unfinished_ids(self) -> list[str]:
        """Requests (not their forked samples) with a sample still running or waiting."""
        return [rid for rid, r in self.requests.items() if r.parent is None and not self.is_done(rid)]

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[StepUpdate]:
        """Advance every running request by one forward pass. A Ctrl-C (SIGINT) arriving meanwhile is
        held until the step has ended — a step cut in the middle could leave the scheduler's and the
        block pool's books half-updated — and then raised as KeyboardInterrupt, the step complete."""
        with _interrupts_between_steps() as interrupted:
            self._in_step = True
            try:
                updates = self._step()
            finally:
                self._in_step = False
        if interrupted():
            raise KeyboardInterrupt
        return updates

    def _step(self) -> list[StepUpdate]:
        if self.dead is not None:
            raise EngineStopped(f"the engine has stopped: {self.dead}")
        start = time.perf_counter()
        if not self._ready_grammars():
            return []
        self._offer_guesses()
        output = self.scheduler.schedule()
        self.num_preemptions += len(output.preempted_ids)
        output, proposals = self._propose(output)
        result = self._execute(output, proposals)
        updates = [StepUpdate(self._top(rid).request_id, "", True, sample_finished=True)
                   for rid, err in result.failed.items() if self.fail(rid, err)]
        advanced = self.scheduler.update(output, result.sampled)
        for request_id, entries in result.prompt_logprobs.items():
            self.requests[request_id].prompt_logprobs.extend(entries)
        now = time.perf_counter()
        delivered = {}  # request id -> tokens it really got (a stop inside a run of kept guesses cuts it)
        for request, count in advanced:
            before = request.num_output_tokens - count
            request.output_logprobs.extend(result.logprobs.get(request.request_id, ()))
            delta = self._emit(request, now, count)
            try:
                forced = self._jump_forward(request) if not request.status.is_done else 0
            except Exception as err:  # the grammar library failed on this request's walk: it alone fails
                forced = 0
                self.fail(request.request_id, err)
            if forced:  # the grammar's forced text: the matcher has it already; it runs in the next pass
                delta += self._emit(request, now, forced, advance=False)
            updates.append(StepUpdate(self._top(request.request_id).request_id, delta, False, request.sample_index,
                                      request.status.is_done, tuple(request.output_token_ids[before:]),
                                      tuple(request.output_logprobs[before:])))
            delivered[request.request_id] = request.num_output_tokens - before
        updates = self._mark_finished(updates)
        speculation = self._count_speculation(output, result, delivered)
        if output.is_empty and not self.scheduler.running:
            stuck = next((r for r in self.scheduler.waiting if r.is_ready), None)
            if stuck is not None:
                self._refuse_stuck(stuck)
        self._forget_drafts()
        self._record(output, start, now, speculation, result.bucket)
        return updates

    def _top(self, request_id: str) -> Request:
        """The request a sample belongs to (itself, unless it was forked)."""
        request = self.requests[request_id]
        return request.parent or request

    def _mark_finished(self, updates: list[StepUpdate]) -> list[StepUpdate]:
        """`finished` on the last update of each request that is now done (every sample), and only there."""
        last = {u.request_id: i for i, u in enumerate(updates)}
        return [dataclasses.replace(u, finished=last[u.request_id] == i and self.is_done(u.request_id))
                for i, u in enumerate(updates)]

    def _ready_grammars(self) -> bool:
        """Structured outputs, before scheduling: requests whose grammar has compiled may now be admitted,
        and one whose grammar failed ends with the reason. When nothing could run but grammars still compile,
        wait for one a moment; False if there is still nothing to do (the step then does nothing at all)."""
        if not self.structured.pending:  # the usual step: no grammar awaited, nothing to look at
            return True
        for _ in range(2):
            for request, error in self.structured.ready():
                self.fail(request.request_id, error)
            compiling = self.waiting_for_grammars()
            if not compiling:
                return True
            self.structured.wait(compiling)
        return False

    def close(self) -> None:
        """Let go of what outlives a step: the grammar compiler's threads and process, the tensor-parallel workers
        (also let go of when the engine is garbage-collected)."""
        self.structured.close()
        if self.workers is not None:
            self.workers.close()
            self.dead = self.dead or "the engine was closed"  # not "worker 1 exited": it was told to

    def _stop(self, reason: str) -> RuntimeError:
        """The engine cannot step any more (a tensor-parallel worker is gone): its unfinished requests end with
        `reason` (its driver fails them: `LLM.generate`, `AsyncLLM`), the other workers are stopped, and later
        requests are refused. Returns the error to raise."""
        self.dead = reason
        if self.workers is not None:
            self.workers.close()
        return EngineStopped(f"the engine has stopped: {reason}")

    def waiting_for_grammars(self) -> list:
        """The compilations (futures) the engine waits for when nothing else can run: an asynchronous driver
        awaits these instead of stepping (an empty list while there is anything to step)."""
        if not self.structured.pending or self.scheduler.running or any(r.is_ready for r in self.scheduler.waiting):
            return []
        return self.structured.compiling()

    def _offer_guesses(self) -> None:
        """Speculative decoding, before scheduling: how many guesses each decoding request could verify
        (never past max_new_tokens or the context); the scheduler reserves room for as many as the
        step's budget and the free blocks allow."""
        if self.proposer is None:
            return
        # never more than the step budget could carry beside the token itself
        k = min(self.config.speculative.num_speculative_tokens, self.config.max_tokens_per_step - 1)
        for request in self.scheduler.running:
            decoding = request.num_uncomputed_tokens == 1 and not request.pending_forks  # samples fork from a plain row
            request.max_guesses = request.room_for_guesses(k, self.max_model_len) if decoding else 0

    def _propose(self, output: SchedulerOutput) -> tuple[SchedulerOutput, dict[str, Proposal]]:
        """Speculative decoding, after scheduling: the proposer fills the room the scheduler reserved —
        only the requests verifying this step guess. A proposer that fails costs only the guesses."""
        if self.proposer is None or output.is_empty:
            return output, {}
        try:
            proposals = self.proposer.propose(output, self.requests, self.runner.sampling)
        except Exception:
            logger.exception("the speculative proposer failed; this step verifies no guesses")
            return output, {}
        chunks = tuple(c.with_guesses(proposals[c.request_id].token_ids[: c.num_lookahead])
                       if c.request_id in proposals else c for c in output.chunks)
        return dataclasses.replace(output, chunks=chunks), proposals

    def _count_speculation(self, output: SchedulerOutput, result: StepResult,
                           delivered: dict[str, int]) -> dict[str, tuple]:
        """Add this step's verdicts to `speculation_counts`; returns them per request for the trace:
        (guesses, tokens the rule kept — a stop may have delivered fewer)."""
        if self.proposer is None:
            return {}
        verdicts, counts = {}, self.speculation_counts
        for chunk in output.chunks:
            new = result.sampled.get(chunk.request_id)
            if new is None or chunk.request_id not in delivered:  # no token: a prefill chunk, failed, aborted
                continue
            if chunk.is_prefill and not chunk.num_drafts:  # a prompt's first token: no decode pass
                continue
            counts["passes"] += 1
            counts["emitted"] += delivered[chunk.request_id]
            if chunk.num_drafts:
                accepted = len(new) - 1
                counts["drafted"] += chunk.num_drafts
                counts["accepted"] += accepted
                counts["examined"] += accepted + (accepted < chunk.num_drafts)  # guesses after a refusal: never
                verdicts[chunk.request_id] = (chunk.draft_token_ids, tuple(new))
        return verdicts

    @property
    def speculative_metrics(self) -> dict[str, float] | None:
        """Speculative decoding so far (None without it): `acceptance_rate`, the share of guesses the
        target kept (accepted / drafted, what vLLM reports); `alpha`, the share of the guesses it
        *examined* that it kept — the chance a guess is kept when every guess before it was, the α of
        (1 - α^(k+1)) / (1 - α); and `tokens_per_pass`, tokens per target pass per decoding request."""
        if self.proposer is None:
            return None
        c = self.speculation_counts
        return {"acceptance_rate": c["accepted"] / c["drafted"] if c["drafted"] else 0.0,
                "alpha": c["accepted"] / c["examined"] if c["examined"] else 0.0,
                "tokens_per_pass": c["emitted"] / c["passes"] if c["passes"] else 0.0,
                "drafted": c["drafted"], "accepted": c["accepted"], "passes": c["passes"]}

    def _forget_drafts(self) -> None:
        """The proposer forgets requests no longer running (finished, aborted, preempted: a preempted
        request's slot, and so its draft cache, may go to someone else)."""
        if self.proposer is not None:
            self.proposer.keep_only({r.request_id for r in self.scheduler.running})

    def _refuse_stuck(self, request: Request) -> None:
        """Nothing ran, nothing is running, yet the queue's head was not admitted: it never will be
        (the checks at the door should have refused it — a defect, or memory lost to one). Fail it
        rather than loop forever on empty steps."""
        free = f"; {self.pool.num_free_blocks} KV blocks free" if self.pool is not None else ""
        self.fail(request.request_id, f"request could not be admitted into an idle engine ({request.num_tokens} "
                                      f"tokens{free})")

    def _execute(self, output: SchedulerOutput, proposals: dict[str, Proposal] | None = None) -> StepResult:
        """Run the step. If the forward pass raises, run each request alone to find whose fault it
        is: no token was sampled and no generator advanced yet, and K/V written for positions not
        yet counted as computed are simply written again."""
        if self.workers is not None:  # a failed pass may have left ranks inside a collective: no retry is safe
            try:
                return self.runner.execute(output, proposals)
            except Exception as err:
                raise self._stop(self.workers.failure(err)) from err
        try:
            return self.runner.execute(output, proposals)
        except Exception as err:
            if len(output.chunks) == 1:  # alone already: it is this request's
                return StepResult(failed={c.request_id: err for c in output.chunks if not c.is_padding})
        result = StepResult()
        for chunk in (c for c in output.chunks if not c.is_padding):  # a padding row needs no result
            new = tuple(r for r in output.new_requests if r.request_id == chunk.request_id)
            try:
                alone = self.runner.execute(SchedulerOutput((chunk,), new, ()), proposals)
            except Exception as err:
                result.failed[chunk.request_id] = err
                continue
            result.sampled.update(alone.sampled)
            result.failed.update(alone.failed)
        return result

    def _emit(self, request: Request, now: float, count: int = 1, advance: bool = True) -> str:
        """Record the `count` newest tokens of `request` one by one, retire the request at the first
        that ends it (stop strings need the text, so the stop rules are judged here) — tokens after
        it are dropped, never emitted — and return their new text. `advance`: a structured output's
        matcher follows them (False: it already has, jump-forward's tokens)."""
        detok = self.detokenizers.get(request.request_id)  # none when the front end detokenizes
        first = request.num_output_tokens - count
        text = ""
        for index in range(first, first + count):
            request.metrics.record_token(now)
            # the output up to this token: the list itself for the newest (no copy per token: O(1), not O(n))
            so_far = request.output_token_ids if index == request.num_output_tokens - 1 else \
                request.output_token_ids[: index + 1]
            try:
                if detok is not None:
                    text += detok.push_output(so_far, request.params, self.model.config.eos_token_ids)
            except Exception as err:  # a tokenizer that cannot decode its token: this request alone fails
                del request.output_token_ids[index + 1 :]
                del request.output_logprobs[index + 1 :]
                self.fail(request.request_id, err)
                return text
            if request.matcher is not None and advance:  # structured outputs: the grammar follows; complete, it stops
                try:
                    self.structured.advance(request, so_far[-1])
                except Exception as err:  # refused, or the grammar library failed: this request alone fails
                    del request.output_token_ids[index:]
                    del request.output_logprobs[index:]
                    self.fail(request.request_id, err)
                    return text
            reason = stop_reason(so_far, request.num_prompt_tokens, request.params,
                                 self.model.config.eos_token_ids, self.max_model_len,
                                 stop_string_found=detok is not None and detok.stopped_by is not None)
            if request.matcher is not None and request.matcher.is_finished:
                reason = "stop"
            if reason is not None:  # an error while retiring it is the engine's, not the request's: it propagates
                del request.output_token_ids[index + 1 :]  # guesses kept past the stop are not the request's
                del request.output_logprobs[index + 1 :]
                self.scheduler.finish(request, reason)
                request.metrics.finish_time = now
                try:
                    text += detok.flush() if detok is not None else ""
                except Exception as err:  # the text's last piece is lost; its tokens are complete
                    request.error = f"{type(err).__name__}: {err}"
                break
        return text

    def _jump_forward(self, request: Request) -> int:
        """Jump-forward decoding (SGLang's; `EngineConfig.jump_forward`): when the grammar allows exactly one
        continuation for a while (`{"name": "` after `{`), its text is appended now as tokens, unsampled, and
        the next pass computes them together with the next token, as one extend chunk. Returns how many.

        The forced text is tokenized on its own, so where it meets the sampled text the tokens may split
        differently than the tokenizer would split the whole: the text is what the grammar wants, token
        for token it can differ from what sampling would have chosen. A request asking for logprobs does
        not jump (forced tokens have no sampled distribution to report)."""
        if not self.config.jump_forward or request.matcher is None or request.params.logprobs is not None:
            return 0
        text = request.matcher.jump_forward()
        if not text:
            return 0
        room = min(request.params.max_new_tokens - request.num_output_tokens, self.max_model_len - request.num_tokens)
        forced = []
        for token in self.tokenizer.encode(text, add_special_tokens=False)[:room]:
            if not request.matcher.accept(token):  # a split the grammar refuses: the rest is sampled
                break
            forced.append(token)
        request.output_token_ids.extend(forced)
        self.jump_forward_tokens += len(forced)
        return len(forced)

    def _record(self, output: SchedulerOutput, start: float, end: float, speculation: dict | None = None,
                recorded_batch: int | None = None) -> None:
        ran = {c.slot: c for c in output.chunks}
        slots: list[SlotState | None] = [None] * self.config.max_num_seqs
        for slot, request_id in self.scheduler.slot_owners().items():
            chunk = ran.get(slot)
            idle = chunk is None or chunk.is_padding  # padding is computed, but is no useful work
            phase = "idle" if idle else ("prefill" if chunk.is_prefill else "decode")
            slots[slot] = SlotState(request_id, 0 if idle else chunk.num_tokens, phase, not idle and chunk.samples)
        for chunk in output.chunks:  # requests that finished this step no longer own their slot
            if slots[chunk.slot] is None:
                phase = "idle" if chunk.is_padding else ("prefill" if chunk.is_prefill else "decode")
                slots[chunk.slot] = SlotState(chunk.request_id, 0 if chunk.is_padding else chunk.num_tokens, phase,
                                              not chunk.is_padding and chunk.samples)
        useful = [c for c in output.chunks if not c.is_padding]
        finished = tuple(c.request_id for c in useful if self.requests[c.request_id].status.is_done)
        running = self.scheduler.running
        blocks = {r.request_id: tuple(self.pool.block_table(r.request_id)) for r in running} if self.pool else {}
        events = tuple(self.pool.drain_events()) if self.pool else ()
        admitted = {r.request_id for r in output.new_requests}
        hits = {c.request_id: c.start for c in output.chunks if c.request_id in admitted and c.start > 0}
        self.trace.record(StepRecord(self.trace.next_step, start - self._t0, end - start, tuple(slots),
                                     tuple(r.request_id for r in output.new_requests), finished,
                                     output.preempted_ids, {r.request_id: r.num_computed_tokens for r in running},
                                     blocks, hits, events, speculation or {}, recorded_batch))

    def output(self, request_id: str) -> RequestOutput:
        r = self.requests[request_id]
        logprobs = r.params.logprobs is not None
        texts = {s.request_id: d.text for s in r.samples if (d := self.detokenizers.get(s.request_id)) is not None}
        outputs = [CompletionOutput(s.sample_index, texts.get(s.request_id, ""), list(s.output_token_ids),
                                    s.finish_reason, list(s.output_logprobs) if logprobs else None)
                   for s in r.samples]
        prompt_logprobs = list(r.prompt_logprobs) if r.params.prompt_logprobs is not None else None
        return RequestOutput(r.request_id, r.prompt, r.prompt_token_ids, outputs, r.metrics, r.error,
                             r.num_cached_tokens, prompt_logprobs)

    def release(self, request_id: str) -> None:
        """Forget a finished request and its samples (its output has been delivered)."""
        if self.is_done(request_id):
            for sample in self.requests[request_id].samples:
                if self.requests.get(sample.request_id) is sample:
                    del self.requests[sample.request_id]
                    self.detokenizers.pop(sample.request_id, None)


class LLM:
    """Offline batch inference: give it all the prompts, get all the outputs.

        llm = LLM()                                   # the shipped target, continuous batching
        outs = llm.generate(["ROMEO:", "What is 1+1? Answer:"], SamplingParams(temperature=0))

    Calls from several threads take turns (the engine's lock): one call at a time.
    """

    def __init__(self, model: str | None = None, config: EngineConfig | None = None):
        config = config if config is not None else EngineConfig()
        if not isinstance(config, EngineConfig):
            raise ValueError(f"config must be an EngineConfig, got {type(config).__name__}")
        net, tokenizer = load(model, dtype=config.dtype, device=config.device)
        self.engine = LLMEngine(net, tokenizer, config)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | Sequence[str | Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """One output per prompt, in order. A request refused at the door, or whose step failed, gets
        finish_reason "error" and its reason in `.error`; the others are served normally.

        The call owns its requests: if it is interrupted (KeyboardInterrupt, the notebook's stop
        button) or anything raises, every request it added is aborted before the exception goes on.
        """
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, Sequence) or isinstance(prompts, bytes | bytearray):
            raise ValueError(f"prompts must be a str or a list of prompts, got {type(prompts).__name__}")
        if params is None or isinstance(params, SamplingParams):
            params = [params if params is not None else SamplingParams()] * len(prompts)
        if not isinstance(params, Sequence) or len(params) != len(prompts):
            raise ValueError(f"params must be one SamplingParams or one per prompt ({len(prompts)})")
        with self.engine.lock:
            if self.engine.has_unfinished():
                raise RuntimeError("the engine is serving requests this call did not add (an AsyncLLM on the same "
                                   "engine?): drive one engine through one API")
            return self._generate(prompts, params, use_tqdm)

    def _generate(self, prompts, params, use_tqdm: bool) -> list[RequestOutput]:
        engine = self.engine
        arrival = time.perf_counter()
        ids: list[str] = []
        refused: dict[str, RequestOutput] = {}
        try:
            for prompt, p in zip(prompts, params):
                request_id = engine.new_request_id(p.n if isinstance(p, SamplingParams) else 1)
                ids.append(request_id)
                try:
                    engine.add_request(prompt, p, request_id=request_id, arrival_time=arrival)
                except Exception as err:  # of any type: it is this request's error, not the call's
                    refused[request_id] = RequestOutput(request_id, prompt if isinstance(prompt, str) else None, [],
                                                        [CompletionOutput(0, "", [], "error")], RequestMetrics(arrival),
                                                        error=str(err))
            with tqdm(total=len(ids) - len(refused), desc="generate", unit="req", disable=not use_tqdm) as bar:
                while engine.has_unfinished():
                    bar.update(sum(u.finished for u in engine.step()))
            return [refused[i] if i in refused else engine.output(i) for i in ids]
        finally:  # delivered, or abandoned by an exception: either way the call's requests leave the engine
            for request_id in ids:
                if request_id in engine.requests:
                    engine.abort(request_id)
                    engine.release(request_id)


@contextlib.contextmanager
def _interrupts_between_steps() -> Iterator[Callable[[], bool]]:
    """Hold Ctrl-C (a notebook's stop button) while the block runs: in the main thread SIGINT is only
    noted, and the caller asks `interrupted()` afterwards. In other threads (signals never reach them)
    nothing changes."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) in (
            signal.SIG_IGN, None):
        yield lambda: False
        return
    noted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    try:
        yield lambda: bool(noted)
    finally:
        signal.signal(signal.SIGINT, previous)
