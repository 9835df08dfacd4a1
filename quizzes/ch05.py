"""Chapter 5's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("Request B has the same 16 tokens as request A's second block, but a different first block. Can B "
             "reuse A's second block?",
             ("Yes: the block holds the same 16 tokens",
              "No: a token's K/V depend on every token before it, and B's earlier tokens differ",
              "Only if the two blocks have the same physical id"),
             1, "K/V are computed from the whole prefix up to each token (causal attention). That is why a block's "
                "key chains its parent's key: the same tokens after a different beginning get a different key.",
             why_not=("The same tokens after a different history have different keys and values in every layer.",
                      None, "Physical ids say where a block lives, not what it holds.")),
    Question("A prompt of 64 tokens, block size 16, is entirely in the cache. How many of its tokens does minillm "
             "compute when it is admitted again?",
             ("None: everything is cached", "1: the last token, written into the cached block",
              "16: the last block is recomputed into a fresh block"),
             2, "The first output token needs the logits of the last prompt token, and the cache holds K/V, not "
                "logits. minillm gives back the last block of the hit and recomputes it into a fresh block, so it "
                "never writes into a block other requests may be reading.",
             why_not=("Then there would be no logits to sample the first token from.",
                      "That would write into a block other requests may be reading. vLLM makes the same choice as "
                      "minillm: a hit stops short of the last token and covers whole blocks only.", None)),
    Question("Two different prefixes happen to get the same 64-bit key. What does minillm's lookup do?",
             ("Returns the cached block: keys are unique in practice",
              "Compares the stored token ids and parent entry, sees the mismatch and treats it as a miss",
              "Raises an error"),
             1, "The key only finds a candidate; the stored tokens and the parent entry confirm it. A collision "
                "costs a hit, never correctness — the forced-collision cell of section 2 shows it.",
             why_not=("Rare is not never: returning another prefix's K/V would silently change the answer.", None,
                      "Nothing is wrong with the request: it simply computes its own block.")),
    Question("The free queue is empty and a request needs a block. Evictable blocks: X (released 5 s ago), Y (1 s "
             "ago). Block Z is held by a running request. Which block does it get?",
             ("X: the least recently used evictable block", "Y: the most recently released", "Z: it is cached too"),
             0, "LRU: the block released longest ago goes first; its key is forgotten, and so are its descendants'.",
             why_not=(None, "The most recently used is the most likely to be asked for again.",
                      "A block with holders is never evicted: someone is reading it.")),
]
