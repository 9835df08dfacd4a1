"""Chapter 1 exercise `ch01.kv_decode`: the KV-cached greedy decode loop."""

from minillm.model import CausalLM


def greedy_decode_with_cache(model: CausalLM, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Return `max_new_tokens` greedy tokens (never stop early), using a KV cache.

    Use `minillm.attention.ContiguousKVCache.for_model(model.config, num_slots=1, max_len=...,
    dtype=model.dtype, device=model.device)` and `cache.batch(slots, starts, query_lens)` as the
    attention backend of each pass:
      * one prefill pass over all prompt tokens; the first new token is the argmax of its last
        position's logits (`model.logits(hidden[-1:])`);
      * then one pass per further token, feeding only the token just chosen.
    Call the model as `model(input_ids, positions, backend)` with 1-D tensors.
    """
    raise NotImplementedError("ch01.kv_decode: implement the cached decode loop")
