"""Chapter 1: generation one request at a time — the correctness oracle of every later chapter.

Two loops, identical in what they produce, different in what they cost:

    generate_without_cache   every step runs the model over prompt + everything generated so far
    generate_with_cache      prefill the prompt once (storing K/V), then each step runs one token

In both, the first token comes from the prefill's last logits: there is no extra decode step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from minillm.attention import ContiguousKVCache, DenseAttention
from minillm.detokenizer import IncrementalDetokenizer
from minillm.logprobs import TokenLogprob, token_logprobs
from minillm.metrics import RequestMetrics
from minillm.model.decoder import CausalLM
from minillm.prompts import encode_prompt
from minillm.sampler import SamplingRow, sample_row
from minillm.sampling import SamplingParams
from minillm.stopping import ends_on_stop_token, stop_reason


@dataclass
class GenerationOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens, including a final EOS / stop token if one ended it
    text: str  # generated text, without special tokens, cut before a stop string
    finish_reason: str  # "stop" (EOS, stop token or stop string) or "length"
    metrics: RequestMetrics
    logprobs: list[TokenLogprob] | None = None  # per generated token, with params.logprobs
    prompt_logprobs: list[TokenLogprob | None] | None = None  # per prompt token (the first None), if asked


class _Progress:
    """What both loops share: validate the prompt, seed the sampler, then record each new token,
    detokenise it and decide whether to stop."""

    def __init__(self, model: CausalLM, tokenizer, prompt: str | Sequence[int], params: SamplingParams | None,
                 on_text: Callable[[str], None] | None):
        arrival = time.perf_counter()
        self.params = params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.n != 1:
            raise ValueError(f"n={params.n}: these loops generate one sample; run them once per "
                             "params.for_sample(i), as the engine's n samples are")
        params.check_vocab(model.config.vocab_size, model.config.eos_token_ids)
        self.on_text = on_text
        self.prompt_ids = prompt_ids = encode_prompt(tokenizer, prompt, model.config.max_position_embeddings,
                                                     model.config.vocab_size)
        self.token_ids: list[int] = []
        self.generator = params.make_generator(model.device)
        self.eos_ids = model.config.eos_token_ids
        self.max_len = model.config.max_position_embeddings
        self.detok = IncrementalDetokenizer.for_request(tokenizer, prompt_ids, params)
        self.metrics = RequestMetrics(arrival_time=arrival)
        self.finish_reason: str | None = None
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[TokenLogprob | None] | None = None

    def record_prompt_logprobs(self, logits: torch.Tensor) -> None:
        """From the logits of every prompt position but the last (len - 1, vocab): each prompt token's
        logprob given the tokens before it; the first token has none."""
        if self.params.prompt_logprobs is not None:
            tops = [self.params.prompt_logprobs] * (len(self.prompt_ids) - 1)
            self.prompt_logprobs = [None, *token_logprobs(logits, self.prompt_ids[1:], tops)]

    def next_token(self, logits: torch.Tensor) -> int:
        """The next token from the last position's raw logits (vocab,): the engine's sampler, one row."""
        row = SamplingRow(self.params, self.prompt_ids, self.token_ids, self.generator)
        token = sample_row(logits, row, self.eos_ids)
        if self.logprobs is not None:
            self.logprobs += token_logprobs(logits.unsqueeze(0), [token], [self.params.logprobs])
        return token

    def add(self, token: int) -> bool:
        """Record one generated token; True when generation is finished."""
        self.metrics.record_token(time.perf_counter())
        self.token_ids.append(token)
        if self.params.include_stop_str_in_output or not ends_on_stop_token(self.token_ids, self.params, self.eos_ids):
            self._emit(self.detok.push(token))  # a stop token's own text is left out
        self.finish_reason = stop_reason(self.token_ids, len(self.prompt_ids), self.params, self.eos_ids,
                                         self.max_len, stop_string_found=self.detok.stopped_by is not None)
        return self.finish_reason is not None

    def _emit(self, delta: str) -> None:
        if delta and self.on_text is not None:
            self.on_text(delta)

    def output(self) -> GenerationOutput:
        self._emit(self.detok.flush())
        self.metrics.finish_time = time.perf_counter()
        return GenerationOutput(self.prompt_ids, self.token_ids, self.detok.text, self.finish_reason, self.metrics,
                                self.logprobs, self.prompt_logprobs)


@torch.inference_mode()
def generate_without_cache(model: CausalLM, tokenizer, prompt: str | Sequence[int],
                           params: SamplingParams | None = None,
                           on_text: Callable[[str], None] | None = None) -> GenerationOutput:
    """The naive loop: each step recomputes attention over the whole sequence. O(n²) work."""
    progress = _Progress(model, tokenizer, prompt, params, on_text)
    ids = progress.prompt_ids
    while True:
        seq = torch.tensor(ids + progress.token_ids, device=model.device)  # (seq_len,)
        positions = torch.arange(len(seq), device=model.device)
        hidden = model(seq, positions, DenseAttention([len(seq)]))  # (seq_len, hidden)
        if not progress.token_ids:
            progress.record_prompt_logprobs(model.logits(hidden[: len(ids) - 1]))
        logits = model.logits(hidden[-1:])[0]  # only the last position predicts the next token
        if progress.add(progress.next_token(logits)):
            return progress.output()


@torch.inference_mode()
def generate_with_cache(model: CausalLM, tokenizer, prompt: str | Sequence[int],
                        params: SamplingParams | None = None,
                        on_text: Callable[[str], None] | None = None) -> GenerationOutput:
    """Prefill once, then decode one token per step against the stored K/V. O(n) work per step."""
    progress = _Progress(model, tokenizer, prompt, params, on_text)
    ids, params = progress.prompt_ids, progress.params
    max_len = min(len(ids) + params.max_new_tokens, model.config.max_position_embeddings)
    cache = ContiguousKVCache.for_model(model.config, num_slots=1, max_len=max_len,
                                        dtype=model.dtype, device=model.device)
    # Prefill: all prompt tokens in one pass; its last logits give the first token.
    tokens, start = ids, 0
    while True:
        n = len(tokens)
        hidden = model(torch.tensor(tokens, device=model.device),
                       torch.arange(start, start + n, device=model.device),
                       cache.batch(slots=[0], starts=[start], query_lens=[n]))
        if start == 0:
            progress.record_prompt_logprobs(model.logits(hidden[:-1]))
        token = progress.next_token(model.logits(hidden[-1:])[0])
        if progress.add(token):
            return progress.output()
        # Decode: the next pass feeds only the token just sampled.
        tokens, start = [token], start + n


def generate(model: CausalLM, tokenizer, prompt: str | Sequence[int], params: SamplingParams | None = None,
             kv_cache: bool = True, on_text: Callable[[str], None] | None = None) -> GenerationOutput:
    """Generate for one prompt with either loop (`kv_cache=True`: the cached one)."""
    loop = generate_with_cache if kv_cache else generate_without_cache
    return loop(model, tokenizer, prompt, params, on_text)
