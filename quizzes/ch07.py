"""Chapter 7's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("On a GPU at batch 1, why can the target check k guessed tokens in about the time of one decode step?",
             ("Because it skips the layers for the tokens that the draft model is already sure about",
              "A pass reads each weight once, however many tokens it carries",
              "Because the guesses' K/V is taken over from the draft model's own cache instead of computed"),
             1, "At batch 1 a GPU's decode step is bound by reading the weights (chapter 1). Verifying k + 1 "
                "positions reads them once too and adds only arithmetic, which the hardware had to spare. (On our "
                "CPU the pass costs more than one step, as the chapter's first table shows — its arithmetic is "
                "slow — but still far less than k + 1 steps, for the same reason.)",
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
    Question("On an A100 (312 TFLOP/s of 16-bit arithmetic, about 2 TB/s of memory), speculation with k = 4 "
             "gave a 16-bit model 1.8x at batch 1. At batch 32, what decides whether it still pays?",
             ("Nothing: every request still gets the same tokens per target pass, so the gain stays at 1.8x "
              "whatever the batch",
              "Whether a verification pass, now 32 x 5 = 160 tokens, stays under the ridge point of about 156: at "
              "k = 4 it just crosses it, and the gain shrinks",
              "Nothing to weigh: at batch 32 a decode step is already compute-bound, so every extra token is paid "
              "in full and speculation cannot pay"),
             1, "A pass over t tokens does about 2 FLOPs per weight per token and reads each 2-byte weight once: "
                "about t FLOPs per byte (chapter 1, section 6). Below the ridge point, 312 T / 2 T = 156 FLOPs per "
                "byte, the pass waits on memory and extra tokens ride along almost free; above it each token "
                "costs its arithmetic. So batch x (k + 1) decides: 160 at k = 4 is at the ridge (fewer guesses, "
                "k = 2 and 96 tokens, stay under it), and every sequence's KV cache adds bytes, which keeps the "
                "pass memory-bound a little longer. A laptop "
                "CPU's arithmetic is far slower, so there the gain fades at much smaller batches (section 4).",
             why_not=("Tokens per pass stay the same, but the cost of a pass does not once it leaves the "
                      "memory-bound regime.", None,
                      "A decode step at batch 32 carries 32 tokens, a fifth of the ridge point: still memory-bound. "
                      "It is the guesses that multiply the tokens in a pass.")),
]
