"""The engine: the step loop that serves many requests at once, and its offline API `LLM`.

    add_request ─► scheduler.schedule() ─► runner.execute() ─► scheduler.update() ─► detokenize
                        (who runs, how many tokens)  (one forward pass)  (append, retire)   (stream, stop strings)

Data flows one way; every step is recorded in `engine.trace`.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from minillm.attention import ContiguousKVCache
from minillm.attention.paged import PagedKVCache, kv_bytes_per_token
from minillm.config import EngineConfig
from minillm.detokenizer import IncrementalDetokenizer
from minillm.generate import encode_prompt
from minillm.kv.block_pool import BlockPool
from minillm.metrics import RequestMetrics
from minillm.model.decoder import CausalLM
from minillm.model.loader import load
from minillm.request import Request
from minillm.runner import ModelRunner
from minillm.sampling import SamplingParams
from minillm.scheduler import ContinuousScheduler, StaticScheduler
from minillm.trace import SlotState, StepRecord, Trace

logger = logging.getLogger("minillm")


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"
    metrics: RequestMetrics
    error: str | None = None  # why the request was rejected, when finish_reason == "error"


@dataclass(frozen=True)
class StepUpdate:
    """What one step produced for one request: new text, and whether it is done."""

    request_id: str
    delta: str
    finished: bool


class LLMEngine:
    """Owns the scheduler, the KV cache and the runner; `step()` advances every request once."""

    def __init__(self, model: CausalLM, tokenizer, config: EngineConfig | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.config = config = config or EngineConfig()
        context = model.config.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > context:
            raise ValueError(f"max_model_len must be at most the model's context ({context}), "
                             f"got {config.max_model_len}")
        self.max_model_len = config.max_model_len or context
        self.cache, self.pool = self._make_kv_cache()
        scheduler_cls = StaticScheduler if config.batching == "static" else ContinuousScheduler
        self.scheduler = scheduler_cls(config.max_num_seqs, self.max_model_len, config.max_tokens_per_step,
                                       model.config.eos_token_ids, self.pool)
        self.runner = ModelRunner(model, self.cache)
        self.requests: dict[str, Request] = {}
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        self.trace = Trace(config.max_num_seqs, max_model_len=self.max_model_len)
        if self.pool is not None:  # the fragmentation visualizer replays block tables
            self.trace.block_size, self.trace.num_blocks = self.pool.block_size, self.pool.num_blocks
        self._ids = itertools.count()
        self._t0 = time.perf_counter()

    def _make_kv_cache(self) -> tuple[ContiguousKVCache | PagedKVCache, BlockPool | None]:
        """A contiguous cache (a max_model_len slot per batch slot), or a paged cache sized from a byte
        budget: `kv_cache_bytes`, else free GPU memory x `gpu_memory_utilization` on CUDA, else what
        the contiguous cache would reserve."""
        config, model, spec = self.config, self.model, self.model.config
        if config.kv == "contiguous":
            cache = ContiguousKVCache.for_model(spec, config.max_num_seqs, self.max_model_len, model.dtype,
                                                model.device)
            logger.info(cache.describe())
            return cache, None
        per_token = kv_bytes_per_token(spec.num_layers, spec.num_kv_heads, spec.head_dim, model.dtype)
        budget = config.kv_cache_bytes
        if budget is None and model.device.type == "cuda":
            budget = int(torch.cuda.mem_get_info(model.device)[0] * config.gpu_memory_utilization)
        elif budget is None:
            budget = config.max_num_seqs * self.max_model_len * per_token
        num_blocks = budget // (per_token * config.block_size)
        if num_blocks < 1:
            raise ValueError(f"a KV budget of {budget} bytes holds no block of {config.block_size} tokens "
                             f"({per_token * config.block_size} bytes)")
        use_triton = config.use_triton
        if use_triton is None and model.device.type == "cuda":
            from minillm.attention.triton_paged import TRITON_AVAILABLE

            use_triton = TRITON_AVAILABLE
        cache = PagedKVCache.for_model(spec, num_blocks, config.block_size, model.dtype, model.device, bool(use_triton))
        logger.info("%s (%s)", cache.describe(), "Triton kernels" if use_triton else "torch reference")
        return cache, BlockPool(num_blocks, config.block_size)

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None) -> Request:
        """Validate and queue a request; raises ValueError (and queues nothing) if it is invalid."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        request_id = request_id if request_id is not None else str(next(self._ids))
        if request_id in self.requests and not self.requests[request_id].status.is_done:
            raise ValueError(f"request_id {request_id!r} is already in use")
        ids = encode_prompt(self.tokenizer, prompt, self.max_model_len)
        if len(ids) > self.config.max_tokens_per_step:
            raise ValueError(f"prompt has {len(ids)} tokens, more than max_tokens_per_step="
                             f"{self.config.max_tokens_per_step}: it could never be scheduled")
        if self.pool is not None:
            self._check_fits_paged(len(ids), params)
        request = Request(request_id, ids, params, arrival_time or time.perf_counter(),
                          prompt=prompt if isinstance(prompt, str) else None)
        self.requests[request_id] = request
        self.detokenizers[request_id] = IncrementalDetokenizer(self.tokenizer, ids, params.stop)
        self.scheduler.add(request)
        return request

    def _check_fits_paged(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """A request must fit the pool alone, and its recompute after a preemption must fit one step."""
        longest = min(num_prompt_tokens + params.max_new_tokens, self.max_model_len)
        if self.pool.blocks_for(longest) > self.pool.num_blocks:
            raise ValueError(f"request may grow to {longest} tokens = {self.pool.blocks_for(longest)} blocks, but the "
                             f"KV cache has only {self.pool.num_blocks} blocks: it could never fit")
        if longest > self.config.max_tokens_per_step:
            raise ValueError(f"request may grow to {longest} tokens, more than max_tokens_per_step="
                             f"{self.config.max_tokens_per_step}: after a preemption it could not be recomputed")

    def abort(self, request_id: str) -> bool:
        """Stop a request wherever it is; False if it is unknown or already done."""
        request = self.requests.get(request_id)
        if request is None or request.status.is_done:
            return False
        self.scheduler.finish(request, "abort")
        request.metrics.finish_time = time.perf_counter()
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ------------------------------------------------------------------ the loop
    def step(self) -> list[StepUpdate]:
        start = time.perf_counter()
        output = self.scheduler.schedule()
        sampled = self.runner.execute(output)
        advanced = self.scheduler.update(output, sampled)
        now = time.perf_counter()
        updates = []
        for request in advanced:
            request.metrics.record_token(now)
            detok = self.detokenizers[request.request_id]
            delta = detok.push(request.output_token_ids[-1])
            if detok.stopped_by is not None:
                self.scheduler.finish(request, "stop")
            if request.status.is_done:
                delta += detok.flush()
                request.metrics.finish_time = now
            updates.append(StepUpdate(request.request_id, delta, request.status.is_done))
        self._record(output, start, now)
        return updates

    def _record(self, output, start: float, end: float) -> None:
        ran = {c.slot: c for c in output.chunks}
        slots: list[SlotState | None] = [None] * self.config.max_num_seqs
        for slot, request_id in self.scheduler.slot_owners().items():
            chunk = ran.get(slot)
            idle = chunk is None or chunk.is_padding  # padding is computed, but is no useful work
            phase = "idle" if idle else ("prefill" if chunk.is_prefill else "decode")
            slots[slot] = SlotState(request_id, 0 if idle else chunk.num_tokens, phase)
        useful = [c for c in output.chunks if not c.is_padding]
        for chunk in useful:  # requests that finished this step no longer own their slot
            if slots[chunk.slot] is None:
                slots[chunk.slot] = SlotState(chunk.request_id, chunk.num_tokens,
                                              "prefill" if chunk.is_prefill else "decode")
        finished = tuple(c.request_id for c in useful if self.requests[c.request_id].status.is_done)
        running = self.scheduler.running
        blocks = {r.request_id: tuple(self.pool.block_table(r.request_id)) for r in running} if self.pool else {}
        self.trace.record(StepRecord(len(self.trace.steps), start - self._t0, end - start, tuple(slots),
                                     tuple(r.request_id for r in output.new_requests), finished,
                                     output.preempted_ids, {r.request_id: r.num_computed_tokens for r in running},
                                     blocks))

    def output(self, request_id: str) -> RequestOutput:
        r = self.requests[request_id]
        return RequestOutput(r.request_id, r.prompt, r.prompt_token_ids, self.detokenizers[request_id].text,
                             list(r.output_token_ids), r.finish_reason, r.metrics)

    def release(self, request_id: str) -> None:
        """Forget a finished request (its output has been delivered)."""
        if self.requests[request_id].status.is_done:
            del self.requests[request_id], self.detokenizers[request_id]


class LLM:
    """Offline batch inference: give it all the prompts, get all the outputs.

        llm = LLM()                                   # the shipped target, continuous batching
        outs = llm.generate(["ROMEO:", "What is 1+1? Answer:"], SamplingParams(temperature=0))
    """

    def __init__(self, model: str | None = None, config: EngineConfig | None = None):
        config = config or EngineConfig()
        net, tokenizer = load(model, dtype=config.dtype, device=config.device)
        self.engine = LLMEngine(net, tokenizer, config)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | Sequence[str | Sequence[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """One output per prompt, in order. An invalid request gets finish_reason "error" and its
        reason in `.error`; the others are served normally."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        engine = self.engine
        arrival = time.perf_counter()
        ids: list[str | RequestOutput] = []
        for prompt, p in zip(prompts, params):
            try:
                ids.append(engine.add_request(prompt, p, arrival_time=arrival).request_id)
            except ValueError as err:
                ids.append(RequestOutput("rejected", prompt if isinstance(prompt, str) else None, [], "", [],
                                         "error", RequestMetrics(arrival), error=str(err)))
        live = sum(isinstance(i, str) for i in ids)
        with tqdm(total=live, desc="generate", unit="req", disable=not use_tqdm) as bar:
            while engine.has_unfinished():
                bar.update(sum(u.finished for u in engine.step()))
        outputs = []
        for i in ids:
            if isinstance(i, str):
                outputs.append(engine.output(i))
                engine.release(i)
            else:
                outputs.append(i)
        return outputs
