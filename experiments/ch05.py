"""Chapter 5's live experiment: requests that share a system prompt, served by chapter 4's engine
(no prefix cache) and by chapter 5's (prefix cache on), interleaved round by round, with their
median TTFT compared within each round. And the runs of its section on n samples of one prompt
(`run_alone`): what each engine computed, held and copied."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from experiments import Finding, same_tokens
from minillm import LLM, EngineConfig, SamplingParams
from minillm.engine import LLMEngine, RequestOutput
from minillm.metrics import percentile
from minillm.timing import interleaved

CHAPTER_4 = EngineConfig(kv="paged", block_size=16, max_num_seqs=16, max_model_len=1024)
CHAPTER_5 = EngineConfig(kv="paged", block_size=16, max_num_seqs=16, max_model_len=1024, prefix_cache=True)


@dataclass
class Served:
    """One run: the engine (its trace) and the requests' outputs, in arrival order."""

    engine: LLMEngine
    outputs: list[RequestOutput]

    @property
    def ttft_p50(self) -> float:
        return percentile([o.metrics.ttft for o in self.outputs], 50)


def serve(config: EngineConfig, prompts: list[list[int]], new_tokens: int = 16) -> Served:
    """A request arrives every second engine step, as a server's would; each generates exactly
    `new_tokens` greedy tokens."""
    params = SamplingParams(temperature=0, max_new_tokens=new_tokens, ignore_eos=True)
    engine = LLM(config=config).engine
    ids = []
    for prompt in prompts:
        ids.append(engine.add_request(prompt, params).request_id)
        engine.step()
        engine.step()
    while engine.has_unfinished():
        engine.step()
    return Served(engine, [engine.output(i) for i in ids])


def prefix_cache_ttft(prompts: list[list[int]], rounds: int = 3) -> Finding:
    """Chapter 4's and chapter 5's engines on the same `prompts`, `rounds` times each, alternating.
    numbers: the median TTFT of each engine's least disturbed round, the per-round speedups, and
    each engine's last run ("chapter 4", "chapter 5": a `Served`)."""
    trials = interleaved({"chapter 4": lambda: serve(CHAPTER_4, prompts),
                          "chapter 5": lambda: serve(CHAPTER_5, prompts)}, rounds, rerun="this cell")
    same_tokens(trials, "the prefix cache")
    ttft = lambda served: served.ttft_p50  # noqa: E731
    speedup = trials.ratio("chapter 4", "chapter 5", ttft)
    without, with_cache = trials.best("chapter 4", ttft), trials.best("chapter 5", ttft)
    holds = speedup.value > 1 and speedup.agrees
    rounds_text = speedup.rounds("{:.1f}x")
    if holds:
        text = (f"Median TTFT {without * 1e3:.0f} ms without the cache, {with_cache * 1e3:.0f} ms with it (each the "
                f"least disturbed of {rounds} runs). Round by round, where the two ran back to back, the cache "
                f"brought the first token {speedup:.1f}x sooner (the median of {rounds_text}).")
    else:
        text = (f"Here the cache did not bring the first token sooner in every round: median TTFT "
                f"{without * 1e3:.0f} ms without it, {with_cache * 1e3:.0f} ms with it, ratios {rounds_text}. It "
                f"computed {_computed(trials.results['chapter 5'][-1])} prompt tokens instead of "
                f"{_computed(trials.results['chapter 4'][-1])}: it did less work, so something else took the "
                f"time. If no warning follows, rerun the cell.")
    numbers = {"ttft_without_s": without, "ttft_with_s": with_cache, "speedup": speedup.value,
               "chapter 4": trials.results["chapter 4"][-1], "chapter 5": trials.results["chapter 5"][-1]}
    return Finding(text, holds, numbers, trials)


def _computed(served: Served) -> int:
    """Prompt tokens the engine ran through the model (a cache hit's tokens are not among them)."""
    return sum(len(o.prompt_token_ids) - o.num_cached_tokens for o in served.outputs)


# ----------------------------------------------------------------------------- n samples of one prompt


@dataclass
class RunAlone:
    """Requests served together on an engine of their own: the engine (its trace), their outputs, and
    every copy its KV cache made — a paged cache's (source block, copy) pairs, a contiguous cache's
    (source slot, slot, tokens)."""

    engine: LLMEngine
    outputs: list[RequestOutput]
    copies: list[tuple[int, ...]]

    @property
    def texts(self) -> list[str]:
        """Every sample's text, request after request."""
        return [sample.text for output in self.outputs for sample in output.outputs]

    @property
    def prompt_tokens_computed(self) -> int:
        """Prompt tokens the engine ran through the model, from its trace."""
        return sum(n for s in self.engine.trace.steps for n in s.prefill_tokens.values())

    @property
    def peak_blocks(self) -> int:
        """The most distinct KV blocks held at once after a step (0 on a contiguous cache)."""
        return max((len({b for table in s.blocks.values() for b in table}) for s in self.engine.trace.steps), default=0)

    @property
    def bytes_copied(self) -> int:
        """K/V bytes the copies moved: a whole block per block copy, the tokens named per slot copy."""
        cache = self.engine.cache
        if hasattr(cache, "block_size"):  # paged
            return len(self.copies) * cache.block_size * cache.bytes_per_token
        return sum(tokens for *_, tokens in self.copies) * cache.nbytes // (cache.num_slots * cache.max_len)


def record_copies(cache: Any, into: list[tuple[int, ...]]) -> None:
    """From now on, write down in `into` every copy `cache` makes (`copy_blocks` of a paged cache,
    `copy_slots` of a contiguous one) before making it."""
    for name in ("copy_blocks", "copy_slots"):
        method = getattr(cache, name, None)
        if method is not None:
            def recorded(copies: list, method: Callable = method) -> None:
                into.extend(tuple(c) for c in copies)
                method(copies)

            setattr(cache, name, recorded)


def run_alone(config: EngineConfig, requests: list[tuple[Any, SamplingParams]], like: LLMEngine | None = None,
              request_ids: list[str] | None = None) -> RunAlone:
    """Serve `requests` (prompt, params) on a new engine with `config` (sharing the model of `like`,
    when given, instead of loading it again), all added before the first step, until they finish."""
    engine = LLMEngine(like.model, like.tokenizer, config) if like is not None else LLM(config=config).engine
    copies: list[tuple[int, ...]] = []
    record_copies(engine.cache, copies)
    ids = [engine.add_request(prompt, params, request_id=rid).request_id
           for (prompt, params), rid in zip(requests, request_ids or [None] * len(requests))]
    while engine.has_unfinished():
        engine.step()
    return RunAlone(engine, [engine.output(i) for i in ids], copies)
