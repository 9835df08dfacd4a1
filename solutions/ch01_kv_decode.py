"""Solution of `ch01.kv_decode`."""

import torch

from minillm.attention import ContiguousKVCache
from minillm.model import CausalLM


@torch.inference_mode()
def greedy_decode_with_cache(model: CausalLM, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    cache = ContiguousKVCache.for_model(model.config, num_slots=1, max_len=len(prompt_ids) + max_new_tokens,
                                        dtype=model.dtype, device=model.device)
    out: list[int] = []
    feed, start = list(prompt_ids), 0
    while len(out) < max_new_tokens:
        hidden = model(torch.tensor(feed, device=model.device),
                       torch.arange(start, start + len(feed), device=model.device),
                       cache.batch([0], [start], [len(feed)]))
        out.append(int(model.logits(hidden[-1:])[0].argmax()))
        start += len(feed)
        feed = [out[-1]]
    return out
