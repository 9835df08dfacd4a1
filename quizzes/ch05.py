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
    Question("Three samples (`n=3`) of a 30-token prompt, blocks of 8 tokens. Each has just sampled its first "
             "token, whose K/V go to position 30. How many blocks are copied before that step's forward pass?",
             ("None: the prompt's K/V never change",
              "2: block 3, the partly filled one, for each sample but the last",
              "3: one copy of block 3 for each sample",
              "8: the prompt's four blocks for each of the two forked samples"),
             1, "Position 30 is in block 3 (30 // 8), which holds tokens 24-29 and has three holders. The first "
                "sample to write gets a copy, then the second; the third is then the block's only holder and "
                "writes in place. Blocks 0-2 are full, never written again, and stay shared.",
             why_not=("The K/V already there stay the same, but each sample adds its own, different token to the "
                      "same block: three tokens cannot share one slot.", None,
                      "After two copies the third sample holds block 3 alone: copying it would only waste a block.",
                      "That is what a contiguous cache must do, copying the whole prompt. Full blocks are only "
                      "read, so sharing them is safe.")),
    Question("A prefix-cache hit shares blocks between requests and never copies one, yet `n` samples need "
             "copy-on-write. Why the difference?",
             ("A hit shares only full blocks, which nobody writes again; samples also share the prompt's partly "
              "filled last block, into which each writes its own first token",
              "A hit copies blocks too, only later, when the request finishes",
              "The samples' prompt K/V differ, because each sample has its own seed"),
             0, "Only a block that is written needs a copy. A hit covers full blocks (and always leaves the last "
                "prompt token to compute, in a fresh block); a fork shares every block of the prompt, the partial "
                "one included, and the samples' next writes land there.",
             why_not=(None, "A finished request lets go of its blocks; nothing is copied at any point.",
                      "The seed only changes which tokens are sampled; the prompt's K/V depend on its tokens alone "
                      "and are the same for every sample.")),
]
