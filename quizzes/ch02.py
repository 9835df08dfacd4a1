"""Chapter 2's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("Why does batching raise decode throughput so much?",
             ("Each sequence's attention gets faster",
              "The weights are read once per step for all the sequences in it",
              "The model skips layers for short sequences"),
             1, "A decode step is bound by reading the weights; sharing one read among B sequences multiplies "
                "the useful work per byte by B until other bytes (the KV cache) or compute become the limit.",
             why_not=("Attention does the same work per sequence as before — and each sequence still reads its "
                      "own KV cache.", None, "Every token runs every layer; nothing is skipped.")),
    Question("A static batch of 4 holds requests that generate 20, 20, 20 and 200 tokens. Slot utilisation?",
             ("100%", "about 32%", "about 55%"),
             1, "(20+20+20+200) / (4 × 200) = 260 / 800 = 32.5%.",
             why_not=("That needs every slot busy for all 200 steps; three requests finish at step 20 and their "
                      "slots sit idle for 180 steps.", None,
                      "Count slot-steps: the batch runs 200 steps on 4 slots (800), of which 260 are busy.")),
    Question("A request arrives one step after a static batch started. When does it start?",
             ("At the next step", "As soon as a slot frees up",
              "When every request of the running batch has finished"),
             2, "That is head-of-line blocking: the batch is formed once and holds its slots until the end.",
             why_not=("Joining at the next step is continuous batching (chapter 3); a static batch never admits "
                      "anyone mid-way.",
                      "A finished request's slot stays with its batch, idle, until the whole batch ends.", None)),
    Question("In theory B decodes in one step give B times the throughput. On a GPU, what bends the real "
             "curve below B first, with the arithmetic units still far from busy?",
             ("Every request reads its own KV cache, so the bytes per step grow with B",
              "The weights must be read once per request",
              "Sampling B tokens takes B times longer"),
             0, "Bytes per step are weights + B × (context × KV bytes per token); as the KV term grows toward "
                "the weights, each extra request adds a real share of the step's bytes, and so of its time, though "
                "the step stays memory-bound.",
             why_not=(None, "The weights are read once per step for the whole batch — that is why batching helps.",
                      "Sampling one token per row is tiny next to the forward pass.")),
]
