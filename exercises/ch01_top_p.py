"""Chapter 1 exercise `ch01.top_p`: nucleus (top-p) filtering."""

import torch


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most-likely tokens whose probability reaches `top_p`.

    logits: (vocab,) or (batch, vocab). Return a tensor of the same shape where every dropped
    token's logit is -inf and kept logits are unchanged. Rules (Hugging Face's):
      * sort probabilities ascending; drop a token when it and all less likely tokens together
        hold at most 1 - top_p of the probability;
      * so the token that crosses the boundary is kept, and the most likely token always is;
      * top_p = 1.0 keeps everything.
    """
    raise NotImplementedError("ch01.top_p: implement nucleus filtering")
