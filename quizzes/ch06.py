"""Chapter 6's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("Eight requests are decoding when a 1,500-token prompt arrives. Without chunked prefill, what do the "
             "eight see?",
             ("Nothing: the engine runs the prefill in a separate step, between two of their decode steps",
              "One long gap: their decodes share the step that runs the whole prompt",
              "They are preempted until the prompt is done"),
             1, "Continuous batching puts the newcomer's whole prefill into the next step beside the decodes, so "
                "that one step takes as long as the prefill — a spike in every decoding request's inter-token "
                "latency (ITL).",
             why_not=("A step of its own is still a step every decoding request waits for: between two of their "
                      "tokens lies the whole prefill, so the gap is the same. SGLang runs prefills this way by "
                      "default, and bounds the gap by chunking them (--chunked-prefill-size).",
                      None, "Preemption is for KV memory, not for time: nobody loses their blocks here.")),
    Question("Why does the chunked scheduler give the budget to decodes before prefills?",
             ("Decodes are cheaper to compute, so serving them first fits more requests into every step",
              "A late decode is a stall someone is watching; a late chunk only delays a first token",
              "Prefills cannot share a step with decodes, so they must wait for the next one"),
             1, "Stall-free scheduling (Sarathi-Serve): as long as the decodes alone fit in the budget, a decoding "
                "request never misses a step, and prompts take what is left.",
             why_not=("Cheapness is not the point: a decode is one token, whoever goes first.", None,
                      "They share steps all the time: that is what a chunk is for.")),
    Question("You halve max_tokens_per_prefill_chunk. What happens?",
             ("Lower worst-case ITL for the decoders, later first token for the long prompt",
              "Lower ITL and an earlier first token for the long prompt too: smaller chunks are better everywhere",
              "Nothing changes: the total work is the same"),
             0, "Smaller chunks make every step lighter (smoother decodes), but the prompt needs twice as many "
                "steps, each paying the fixed cost p0 again and running the decodes again — its TTFT grows. The "
                "chunk size is the knob between the two.",
             why_not=(None, "The long prompt pays: more steps to finish its prefill.",
                      "The prompt's tokens and attention pairs are the same, but every extra step pays p0 and the "
                      "decodes again — and how the work is spread over steps is exactly what ITL sees.")),
    Question("A 1,500-token prompt is prefilled in chunks of 128. Which of its steps is the heaviest?",
             ("The first: it fills an empty cache",
              "All the same: every step computes 128 prompt tokens and the same decodes",
              "The last full chunk: its tokens attend to every prompt token before them too"),
             2, "A chunk of n tokens starting at position s has n·s + n(n+1)/2 attention pairs: the 128 tokens at "
                "position 1,280 see 1,280 earlier tokens each. The ITL bound is set by the late chunks of the "
                "longest prompt, not by the first.",
             why_not=("Writing K/V costs the same per token wherever it goes; it is reading the earlier ones that "
                      "grows.", "The same tokens, but not the same attention: later chunks see more keys.", None)),
    Question("A 100-token prompt is prefilled in chunks of 32. Which chunks sample a token?",
             ("Every chunk: each one ends with logits, and logits are there to be sampled",
              "The first one, so that the user sees a token early",
              "Only the last (tokens 96–99)"),
             2, "Only the chunk that reaches the prompt's last token produces the first output token; the others "
                "just fill the KV cache. They draw nothing, so a seeded request samples exactly as unchunked.",
             why_not=("Their last logits predict a token the prompt already has.",
                      "A token sampled mid-prompt would be a token the user did not write.", None)),
]
