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
             why_not=("minillm (like vLLM) mixes them in one forward pass; the decodes wait for the step to end.",
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
             0, "Smaller chunks make every step lighter (smoother decodes), but the prompt needs more steps, each "
                "also running the decodes and re-reading its growing KV — its TTFT grows. The chunk size is the "
                "knob between the two.",
             why_not=(None, "The long prompt pays: more steps to finish its prefill.",
                      "The total tokens are the same, but how they are spread over steps is exactly what ITL sees.")),
    Question("A 100-token prompt is prefilled in chunks of 32. Which chunks sample a token?",
             ("Every chunk: each one ends with logits, and logits are there to be sampled",
              "The first one, so that the user sees a token early",
              "Only the last (tokens 96–99)"),
             2, "Only the chunk that reaches the prompt's last token produces the first output token; the others "
                "just fill the KV cache. They draw nothing, so a seeded request samples exactly as unchunked.",
             why_not=("Their last logits predict a token the prompt already has.",
                      "A token sampled mid-prompt would be a token the user did not write.", None)),
]
