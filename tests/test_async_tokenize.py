"""AsyncLLM tokenizes a text prompt in a worker thread before queueing it: never on the event loop,
never under the engine's lock, and an obviously over-long text is refused without being tokenized.
The request behaves as one submitted as ids: same tokens, its text kept in the output, abortable and
cancellable while it is being tokenized."""

import asyncio
import threading

import pytest

from minillm.async_engine import AsyncLLM
from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.sampling import SamplingParams
from tests.hf_reference import ByteTokenizer

GREEDY = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)


class WatchedTokenizer(ByteTokenizer):
    """ByteTokenizer that notes, for each encode, its thread and whether it held the engine's lock."""

    def __init__(self):
        self.calls: list[tuple[threading.Thread, bool]] = []
        self.engine: LLMEngine | None = None
        self.gate = threading.Event()
        self.gate.set()

    def encode(self, text: str) -> list[int]:
        self.gate.wait(timeout=10)
        self.calls.append((threading.current_thread(), self.engine.lock._is_owned()))
        return super().encode(text)


@pytest.fixture
def watched(model):
    tokenizer = WatchedTokenizer()
    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=2, max_model_len=64))
    tokenizer.engine = engine
    return AsyncLLM(engine=engine), tokenizer


def test_a_text_prompt_is_tokenized_off_the_loop_and_outside_the_lock(watched):
    llm, tokenizer = watched

    async def scenario():
        loop_thread = threading.current_thread()
        text = await llm.submit("ROMEO:", GREEDY)
        ids = await llm.submit(list(b"ROMEO:"), GREEDY)
        streamed = "".join([d async for d in llm.stream("ROMEO:", GREEDY)])
        return loop_thread, text, ids, streamed

    loop_thread, text, ids, streamed = asyncio.run(scenario())
    assert text.token_ids == ids.token_ids and streamed == text.text
    assert text.prompt == "ROMEO:" and text.prompt_token_ids == list(b"ROMEO:")
    assert tokenizer.calls and all(thread is not loop_thread and not locked for thread, locked in tokenizer.calls)


def test_an_over_long_text_is_refused_without_being_tokenized(watched):
    llm, tokenizer = watched

    async def scenario():
        with pytest.raises(ValueError, match="1000000 characters: more than the context of 64 tokens"):
            await llm.submit("x" * 1_000_000, GREEDY)
        with pytest.raises(ValueError, match="prompt is not valid Unicode"):
            await llm.submit("ab\ud800", GREEDY)
        return await llm.submit([5, 6], GREEDY)

    assert asyncio.run(scenario()).finish_reason == "length"
    assert tokenizer.calls == []  # neither reached the tokenizer


def test_a_text_request_aborted_or_cancelled_while_tokenized_never_runs(watched):
    llm, tokenizer = watched

    async def scenario():
        tokenizer.gate.clear()  # the tokenizer is slow: both requests are still being tokenized
        aborted = llm.submit("ROMEO:", GREEDY, request_id="a")
        cancelled = llm.submit("JULIET:", GREEDY, request_id="c")
        ids = llm.submit([5, 6], GREEDY)  # queued at once, served first
        await asyncio.sleep(0.05)
        llm.abort("a")
        cancelled.cancel()
        tokenizer.gate.set()
        return await aborted, await ids, cancelled

    out, ids, cancelled = asyncio.run(scenario())
    assert out.finish_reason == "abort" and out.token_ids == [] and cancelled.cancelled()
    assert ids.finish_reason == "length"
    assert not any(slot is not None and slot.request_id in ("a", "c") for step in llm.engine.trace.steps
                   for slot in step.slots)
