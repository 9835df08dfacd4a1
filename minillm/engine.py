"""The engine: the step loop that serves many requests at once, and its offline API `LLM`.

    add_request ─► scheduler.schedule() ─► runner.execute() ─► scheduler.update() ─► detokenize
                        (who runs, how many tokens)  (one forward pass)  (append, retire)   (stream, stop strings)

Data flows one way; every step is recorded in `engine.trace`.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tqdm.auto import tqdm

from minillm.attention import ContiguousKVCache
from minillm.config import EngineConfig
from minillm.detokenizer import IncrementalDetokenizer
from minillm.generate import encode_prompt
from minillm.metrics import RequestMetrics
from minillm.model.decoder import CausalLM
from minillm.model.loader import load
from minillm.request import Request
from minillm.runner import ModelRunner
from minillm.sampling import SamplingParams
from minillm.scheduler import ContinuousScheduler, StaticScheduler
from minillm.trace import SlotState, StepRecord, Trace


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
        scheduler_cls = StaticScheduler if config.batching == "static" else ContinuousScheduler
        self.scheduler = scheduler_cls(config.max_num_seqs, self.max_model_len, config.max_tokens_per_step,
                                       model.config.eos_token_ids)
        self.cache = ContiguousKVCache.for_model(model.config, config.max_num_seqs, self.max_model_len,
                                                 model.dtype, model.device)
        self.runner = ModelRunner(model, self.cache)
        self.requests: dict[str, Request] = {}
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        self.trace = Trace(num_slots=config.max_num_seqs)
        self._ids = itertools.count()
        self._t0 = time.perf_counter()

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
        request = Request(request_id, ids, params, arrival_time or time.perf_counter(),
                          prompt=prompt if isinstance(prompt, str) else None)
        self.requests[request_id] = request
        self.detokenizers[request_id] = IncrementalDetokenizer(self.tokenizer, ids, params.stop)
        self.scheduler.add(request)
        return request

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
            phase = "idle" if chunk is None else ("prefill" if chunk.is_prefill else "decode")
            slots[slot] = SlotState(request_id, 0 if chunk is None else chunk.num_tokens, phase)
        for chunk in output.chunks:  # requests that finished this step no longer own their slot
            if slots[chunk.slot] is None:
                slots[chunk.slot] = SlotState(chunk.request_id, chunk.num_tokens,
                                              "prefill" if chunk.is_prefill else "decode")
        finished = tuple(c.request_id for c in output.chunks if self.requests[c.request_id].status.is_done)
        self.trace.record(StepRecord(len(self.trace.steps), start - self._t0, end - start, tuple(slots),
                                     tuple(r.request_id for r in output.new_requests), finished))

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
