"""Chapter 7's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("Why can the target check k guessed tokens in about the time of one decode step?",
             ("Because it skips the layers for the tokens that the draft model is already sure about",
              "A pass reads each weight once, however many tokens it carries",
              "Because the guesses' K/V is taken over from the draft model's own cache instead of computed"),
             1, "At batch 1 a decode step is bound by reading the weights (chapter 1). Verifying k + 1 positions "
                "reads them once too and adds only arithmetic, which the hardware had to spare.",
             why_not=("Every guess goes through every layer: the target must compute its own distribution there.",
                      None, "The draft's K/V belongs to the draft model; the target computes its own.")),
    Question("Greedy decoding with speculation: the draft guessed 4 tokens, the target agrees with the first 2. "
             "What does the request get from this pass?",
             ("3 tokens: the 2 kept guesses and the target's own token at the third place",
              "2 tokens: only the guesses it agreed with",
              "4 tokens: the 2 kept guesses and the target's argmax for places 3 and 4"),
             0, "At the first disagreement the target's argmax for that place is already computed, and it is "
                "exactly what plain greedy decoding would produce there; everything after it depended on a wrong "
                "guess and is dropped.",
             why_not=(None, "The target's token at the refused place is free: its logits are already there.",
                      "Place 4's logits were computed after the wrong guess 3: they predict a continuation of a "
                      "token the request does not have.")),
    Question("With sampling, the target gives the guess d probability p(d) = 0.2 and the draft drew it with q(d) "
             "= 0.5. What happens?",
             ("It is always refused, since the target likes it less than the draft did and only tokens with "
              "p >= q can be kept",
              "Kept with probability 0.4; if refused, a token is drawn from the residual",
              "It is kept with probability 0.2, just like any other token the target would sample there"),
             1, "min(1, p/q) = 0.4. Keeping it 40% of the time and otherwise drawing from the residual gives every "
                "token exactly its probability under p.",
             why_not=("Refusing every guess with p < q would never emit d, whose true probability is 0.2.", None,
                      "0.2 ignores how often the draft proposes d: combined with q = 0.5 it would emit d too "
                      "rarely (0.5 x 0.2 = 0.1).")),
    Question("Speculation gave 1.8x at batch 1. At batch 32, what do you expect, and why?",
             ("About 1.8x again, since every request still gets the same number of tokens per target pass",
              "More than 1.8x, because the draft model's passes are shared across the whole batch",
              "Little or no gain: the batch already keeps the arithmetic busy"),
             2, "Speculation trades spare compute for fewer passes. A step with 32 requests has none left: "
                "verifying 5 tokens per request costs about 5 times the arithmetic, and the draft's passes grow "
                "with the batch too.",
             why_not=("Tokens per pass stay the same, but the cost of a pass does not.",
                      "The draft runs for every request in the batch: its cost grows with it.", None)),
]
