"""What the front end and the engine core tell each other (pickled over a pipe: small, and no text).

Front end → core: `StartCore` once, then `AddRequest`, `AbortRequest`, `StopSample`, `Shutdown`.
Core → front end: `CoreReady` once, or `CoreFailed`; then one `CoreStep` per engine step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minillm.config import EngineConfig
from minillm.disagg.kv_connector import KVHandle, KVTransfer
from minillm.logprobs import TokenLogprob
from minillm.model.config import ModelConfig
from minillm.sampling import SamplingParams
from minillm.timeline import Span


@dataclass(frozen=True)
class StartCore:
    """The first message: what to serve."""

    model: str | None
    config: EngineConfig
    parent_pid: int  # the front end: the core ends when it is no longer its parent
    threads: int | None = None  # the core's torch threads (None: torch's default)
    timeline: bool = False  # record the core's spans and send them with its steps (minillm/timeline.py)
    kv_transfer: KVTransfer | None = None  # a disaggregated pair's prefill or decode core (chapter 13)


@dataclass(frozen=True)
class AddRequest:
    request_id: str  # the core's id (the front end's own counter: never reused while a message may be in flight)
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float  # time.perf_counter(): one clock for both processes on one machine
    export_kv: bool = False  # a prefill core: send the prompt's K/V to the decode core when it is done
    kv: KVHandle | None = None  # a decode core: receive the prompt's K/V first (its prefill was done elsewhere)


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class StopSample:
    """A stop string ended this sample (found in its text by the front end): the core stops it too."""

    sample_id: str  # the request's id for sample 0, f"{request_id}#{i}" for sample i


@dataclass(frozen=True)
class DiscardKV:
    """A decode core: take this transfer's bytes and drop them (its request was aborted meanwhile)."""

    kv: KVHandle


@dataclass(frozen=True)
class Shutdown:
    pass


@dataclass(frozen=True)
class CoreReady:
    max_model_len: int
    model_config: ModelConfig  # the checkpoint's (vocabulary, EOS ids, context), as the core loaded it


@dataclass(frozen=True)
class CoreFailed:
    error: Exception  # why the core could not start (a refused config, a missing checkpoint), or stopped (a
    #                   tensor-parallel worker lost)


@dataclass(frozen=True)
class SampleTokens:
    """What one step gave one sample: its new tokens, and its finish reason once it has ended."""

    request_id: str
    index: int
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None  # a stop without text (EOS, stop token), or a length limit
    num_cached_tokens: int | None = None  # with sample 0's first tokens: prompt tokens found in the prefix cache
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # with sample 0's first tokens, when asked


@dataclass(frozen=True)
class RequestDone:
    """The core let go of a request: each sample's finish reason, and the error of a failed one."""

    request_id: str
    finish_reasons: tuple[str | None, ...]
    error: str | None = None


@dataclass(frozen=True)
class Refused:
    request_id: str
    error: str  # the engine's ValueError at the door (a KV budget too small for it...)


@dataclass
class CoreStep:
    time: float  # when the step's tokens were produced (time.perf_counter())
    samples: list[SampleTokens] = field(default_factory=list)
    done: list[RequestDone] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)
    gauges: dict[str, float] = field(default_factory=dict)  # LLMEngine.gauges() after the step
    spans: list[Span] = field(default_factory=list)  # with a timeline only: the core's spans since its last step
    kv_sent: list[KVHandle] = field(default_factory=list)  # a prefill core: the transfers posted this step
    lane_spans: list[tuple[str, float, float, str]] = field(default_factory=list)  # a disaggregated core's steps
    #                                                        and transfers, (kind, start, end, label), for a replay
