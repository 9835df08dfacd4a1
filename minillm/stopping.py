"""When does a request stop? One rule, shared by chapter 1's loops and the engine.

Stop strings need text, so the detokenizer finds those (`minillm/detokenizer.py`) and says so here.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from minillm.sampling import SamplingParams


def stop_reason(output_ids: Sequence[int], num_prompt_tokens: int, params: SamplingParams,
                eos_token_ids: Collection[int], max_model_len: int, stop_string_found: bool = False) -> str | None:
    """"stop", "length" or None, judged after the newest token `output_ids[-1]` was appended.

    stop:   a stop string completed, the token is one of `params.stop_token_ids`, or it is an EOS id
            (unless `ignore_eos`)
    length: `max_new_tokens` reached, or the sequence filled the model's context

    When both hold for the same token, "stop" wins: the request ended because it said what it had
    to say, and would have ended there with any larger limit. No stop ends it within its first
    `min_tokens` tokens (the sampler never draws EOS or a stop token there either).
    """
    if stop_string_found or ends_on_stop_token(output_ids, params, eos_token_ids):
        return "stop"
    if len(output_ids) >= params.max_new_tokens or num_prompt_tokens + len(output_ids) >= max_model_len:
        return "length"
    return None


def ends_on_stop_token(output_ids: Sequence[int], params: SamplingParams, eos_token_ids: Collection[int]) -> bool:
    """Whether the newest token is a stop token — one of `params.stop_token_ids`, or EOS unless
    `ignore_eos` — past the first `min_tokens`. Its text is not part of the output unless
    `include_stop_str_in_output` (as vLLM does), so the loops judge this before detokenizing it."""
    last = output_ids[-1]
    stop_token = last in params.stop_token_ids or (not params.ignore_eos and last in eos_token_ids)
    return stop_token and len(output_ids) > params.min_tokens
