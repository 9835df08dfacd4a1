"""Chapter 1's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("Where does a request's first generated token come from?",
             ("An extra decode step run right after the prefill",
              "The logits at the last prompt position, computed by the prefill pass itself",
              "The logits at the first prompt position of the prefill pass"),
             1, "Prefill computes logits for every prompt position; the last one looks past the prompt, and sampling "
                "from it gives the first token. Decode steps start with the second token.",
             why_not=("The prefill already produced the logits the first token needs; TTFT contains no decode step.",
                      None,
                      "Position 0's logits predict the prompt's second token, which we already know; only the last "
                      "position predicts something new.")),
    Question("Why is a decode step of one request memory-bound?",
             ("Each weight is read from memory to be used in a single multiply-add, for one token",
              "Attention is quadratic in the sequence length",
              "The vocabulary is large"),
             0, "A [1 × hidden] @ [hidden × n] product does 2·n·hidden FLOPs while reading n·hidden weights: about "
                "1 FLOP per byte in bf16, far below any GPU's ridge point.",
             why_not=(None,
                      "Quadratic attention is a prefill cost (L queries × L keys); a decode step has one query, and "
                      "its attention grows only linearly with the context.",
                      "The LM head is one matrix among many; every layer has the same problem: one row times every "
                      "weight.")),
    Question("A request's first token appears 200 ms after it arrived; its 101st and last token at 1,200 ms. "
             "What is its TPOT?",
             ("10 ms", "12 ms", "11.9 ms"),
             0, "TPOT = (last − first) / (tokens − 1) = (1,200 − 200) ms / 100 = 10 ms.",
             why_not=(None,
                      "1,200 ms / 100 puts the TTFT into the pace; TPOT starts at the first token.",
                      "1,200 ms / 101 mixes the TTFT in and divides by tokens, not gaps: 101 tokens have 100 gaps.")),
    Question("A 0.5B model on an A100 serves 1,024-token prompts. Its answers grow from 32 to 512 tokens. "
             "What happens, by the latency model?",
             ("TTFT grows about 16×",
              "TTFT stays the same; the total latency grows more than 10×",
              "TPOT grows about 16×, because the context is longer",
              "Little changes: the prefill dominates the cost"),
             1, "TTFT is queue + prefill and does not see the output length. The decode part grows from 31 to 511 "
                "steps of ≈ 0.5 ms: the total goes from ≈ 19 ms to ≈ 259 ms, about 14×.",
             why_not=("The output length is not part of TTFT: the first token exists as soon as the prefill ends.",
                      None,
                      "The KV cache grows from about 1K to 1.5K tokens, some 6 MB more to read next to 1 GB of "
                      "weights: TPOT barely moves.",
                      "A 1,024-token prefill costs about 3.3 ms, roughly 7 decode steps; 511 decode steps dwarf it.")),
]
