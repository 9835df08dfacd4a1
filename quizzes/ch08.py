"""Chapter 8's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("A CUDA Graph of the decode step was captured with the input ids in tensor A. Before the next step, "
             "the runner builds a new tensor B with this step's ids and passes B. What does the replay compute?",
             ("This step's tokens, because replay takes the step's new inputs as its arguments just like a call",
              "The step it recorded, on whatever tensor A holds now: B is never read",
              "Nothing: the replay notices that its input changed and raises an error"),
             1, "A graph stores the kernels with their arguments, and those are addresses. Replay reruns them on "
                "the same addresses: new inputs must be copied into A (static buffers), never passed as a new "
                "tensor.",
             why_not=("Replay takes no arguments at all: `graph.replay()`.", None,
                      "Nothing checks: it silently computes on stale data, which is why the buffers are filled in "
                      "place.")),
    Question("Buckets are 1, 2, 4, 8, 16. Five requests are decoding. What runs?",
             ("The bucket-8 step, with 3 padding rows that write only into the pad block",
              "The bucket-4 step twice, once for four requests and once for the fifth",
              "An eager step, since five matches no bucket exactly and a recorded step needs its exact shape"),
             0, "A batch pads up to the smallest bucket that holds it; padding rows cost compute, not correctness: "
                "they write into a block no request owns, and their logits are dropped.",
             why_not=(None, "Two replays cost two launches and two passes over the weights; padding to 8 costs one.",
                      "Only a batch above the largest bucket runs eagerly.")),
    Question("Which line inside the recorded decode step would break a CUDA Graph capture (or a fullgraph compile)?",
             ("`mask = positions[None, :] < context_lens[:, None]`, a comparison of two device tensors",
              "`out = torch.empty_like(q)`, because capture forbids allocating any tensor inside the step",
              "`n = int(context_lens.max())`, used to size the gather"),
             2, "`int(...)` copies a value to the host and waits for the device: a sync, and a shape that depends "
                "on data. The recorded step masks over a fixed width instead.",
             why_not=("A comparison of tensors is just one more kernel on the device.",
                      "Allocations during capture come from the graph's private memory pool and are replayed at the "
                      "same addresses; it is a copy to the host that cannot be recorded.", None)),
    Question("On this course's CPU, compiling the float32 step gains about 1.3x at batch 1 but only a few percent "
             "from batch 8 up. Why?",
             ("At larger batches the step is dominated by the matrix multiplies, which compiling does not make faster",
              "torch.compile only compiles the batch-1 bucket; larger batches run eagerly",
              "Larger batches recompile at every step, which eats the gain"),
             0, "Compiling removes per-operator overhead, a fixed cost per step. The matmuls grow with the batch "
                "(and stream the weights at every batch size); once they dominate, the fixed cost is a small "
                "share.",
             why_not=(None, "The benchmark compiles a bucket for every batch size it measures.",
                      "One graph per bucket is compiled once; the trace of a long run shows no recompilation.")),
    Question("A decode step of 9 requests pads up to bucket 16: 7 of its 16 rows are padding. On a memory-bound "
             "step, about how much of the padded step's time do those 7 rows cost?",
             ("About 44%: the step's time is shared among its rows, and 7 of 16 are padding",
              "Much less than 44%: the step streams every weight once whatever its rows, so a padding row adds "
              "only its own arithmetic and its one-token attention",
              "Nothing at all: padding rows write into the pad block, so the device skips them"),
             1, "Padding wastes rows, not their share of the time. A memory-bound step's time is mostly the weights' "
                "trip from memory and the host's fixed cost, both paid once per step; the rows add little. The "
                "chapter measures it: the step of 16 against the step of 9.",
             why_not=("That would hold for a compute-bound step, whose time grows with its rows; a decode step of a "
                      "few rows is far from that.", None,
                      "The padding rows are computed like any other (a recorded step cannot skip them); they are "
                      "cheap, not free.")),
]
