"""Chapter 0's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("You saved your edit to exercises/ch01_top_p.py. How do you grade it?",
             ("Restart the kernel, then run the check cell", "Run the notebook's check(\"ch01.top_p\") cell again",
              "Copy the function into the notebook first"),
             1, "check re-reads your file every time it runs, so saving is enough. make grade in a terminal "
                "gives your score for every chapter.",
             why_not=("Harmless, but not needed: check re-reads the file on every call.", None,
                      "Not needed: check grades the file in exercises/ as it is saved.")),
    Question("Which stage decides which requests take part in the next forward pass, and with how many tokens?",
             ("The tokenizer (minillm/prompts.py)", "The scheduler (minillm/scheduler/)",
              "The sampler (minillm/sampling.py)"),
             1, "The scheduler holds the waiting queue and the running requests; every step it picks who runs "
                "and how many tokens each one computes.",
             why_not=("It turns text into token ids, once per request, before the request is queued.", None,
                      "It picks one token from the logits after the forward pass has run.")),
    Question("Our target has 4 query heads but only 2 key/value heads. What does that do to its KV cache?",
             ("It is half the size it would be with 4 K/V heads", "It is twice the size",
              "Nothing: the cache stores the query heads"),
             0, "The cache holds K and V per K/V head — 2 × layers × kv_heads × head_dim × bytes per token — "
                "so sharing K/V heads between query heads (grouped-query attention) shrinks it in proportion.",
             why_not=(None, "Fewer K/V heads means fewer vectors stored, not more.",
                      "Queries are used once and never cached; only keys and values are.")),
    Question("Why does minillm apply the LM head to the last prompt position only?",
             ("Only that position's logits decide the next token", "The other positions' logits would be wrong",
              "The tokenizer drops the other positions"),
             0, "The earlier positions' logits predict tokens we already have; computing them costs a "
                "hidden × vocabulary matrix multiply each, for nothing.",
             why_not=(None, "They would be correct predictions — of tokens already in the prompt.",
                      "Every prompt token goes through the model: their K and V are needed for attention.")),
]
