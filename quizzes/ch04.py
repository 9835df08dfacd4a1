"""Chapter 4's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("With block_size 16, what is the most KV memory a request can waste to internal fragmentation?",
             ("15 tokens: only its last block can be partly empty", "Half of its tokens",
              "max_model_len minus its length"),
             0, "Every block but the last is full, and the last holds at least one token.",
             why_not=(None, "Every block but the last is full, so the waste does not grow with the request's length.",
                      "That is what reserving max_model_len wastes; a paged cache never reserves ahead.")),
    Question("On our model (8 KiB of KV per token), three running requests hold 100, 300 and 600 tokens. "
             "How much KV memory do they need?",
             ("About 23 MiB: 3 x (100 + 300 + 600) x 8 KiB", "About 14 MiB: 3 x 600 x 8 KiB",
              "About 7.8 MiB: (100 + 300 + 600) tokens x 8 KiB"),
             2, "Formula ③: bytes per token times the total tokens of the active requests, 1000 x 8 KiB.",
             why_not=("The sum already covers the whole batch: multiplying by B again counts it twice.",
                      "That is what giving everyone the longest request's length would reserve (formula ② with "
                      "L = 600); the requests hold only their sum.", None)),
    Question("Free KV memory totals 1 GB, in holes of 400, 300 and 300 MB. A new request D needs 500 MB. "
             "Which is true?",
             ("Both a contiguous allocator and a paged cache can place D: 1 GB is free",
              "A contiguous allocator cannot place D; a paged cache can",
              "Neither can place D"),
             1, "Contiguous allocation needs one 500 MB run, and the largest hole is 400 MB: external fragmentation. "
                "Blocks need not be adjacent, so a paged cache serves D from any free blocks.",
             why_not=("Contiguous allocation needs a single hole of 500 MB; the largest is 400 MB.", None,
                      "A paged cache only needs enough free blocks in total, wherever they lie.")),
    Question("A running request needs a new block and none is free. What does minillm do?",
             ("Drops the request", "Preempts the newest running request: frees its blocks, recomputes it later",
              "Truncates the request's output"),
             1, "Preemption by recompute: no request is lost or truncated, and its tokens do not change.",
             why_not=("Nothing is lost: the preempted request goes back to the front of the queue.", None,
                      "Every request still produces all its tokens, identical to an unpreempted run.")),
]
