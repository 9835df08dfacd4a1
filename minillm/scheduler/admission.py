"""Requests the engine refuses at the door: those it could never serve, whatever else is running.

    empty prompt · prompt that fills the context · prompt longer than a step's token budget
    (without chunked prefill) · a request whose longest growth needs more KV blocks than the pool
    has, or could not be recomputed in one step after a preemption

`LLMEngine.add_request` raises with the reason; the simulator (chapter 9) counts the request as
refused — the same rule in both, so that the simulator serves exactly the engine's requests.
"""

from __future__ import annotations

from minillm.config import EngineConfig
from minillm.kv.block_pool import BlockPool


def refusal(num_prompt_tokens: int, max_new_tokens: int, config: EngineConfig, max_model_len: int,
            pool: BlockPool | None) -> str | None:
    """Why a request of this size could never be served (the reason, in words), or None."""
    if num_prompt_tokens < 1:
        return "prompt is empty: give at least one token"
    if num_prompt_tokens >= max_model_len:
        return (f"prompt has {num_prompt_tokens} tokens; the context holds {max_model_len}, which must also leave "
                "room for at least one new token")
    if num_prompt_tokens > config.max_tokens_per_step and not config.chunked_prefill:
        return (f"prompt has {num_prompt_tokens} tokens, more than max_tokens_per_step={config.max_tokens_per_step}: "
                "it could never be scheduled in one step (chunked_prefill=True would serve it in chunks)")
    if pool is None:
        return None
    longest = min(num_prompt_tokens + max_new_tokens, max_model_len)
    if pool.blocks_for(longest) > pool.num_blocks:
        return (f"request may grow to {longest} tokens = {pool.blocks_for(longest)} blocks, but the KV cache has "
                f"only {pool.num_blocks} blocks: it could never fit")
    if longest > config.max_tokens_per_step and not config.chunked_prefill:
        return (f"request may grow to {longest} tokens, more than max_tokens_per_step={config.max_tokens_per_step}: "
                "after a preemption it could not be recomputed")
    return None
