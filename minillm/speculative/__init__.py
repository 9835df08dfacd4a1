"""Speculative decoding (chapter 7): a cheap proposer guesses the next tokens, the target model
checks them all in one forward pass, and the acceptance rule keeps exactly the target's tokens
(greedy) or its distribution (sampling).

    acceptance.py   the rule: accept a guess with probability min(1, p/q), else resample
    ngram.py        prompt lookup: propose what followed the last n tokens earlier in the request
    proposers.py    who guesses: the n-gram proposer, or a small draft model, its KV cache beside the target's
"""

from minillm.speculative.acceptance import accept_greedy, accept_sampled
from minillm.speculative.ngram import propose_ngram

__all__ = ["accept_greedy", "accept_sampled", "propose_ngram"]
