"""Chapter 13's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("Under tensor parallelism, an MLP's gate_up_proj is split column-parallel and its down_proj "
             "row-parallel. Why does that pair need only one all-reduce, after down_proj, and none between the "
             "two layers?",
             ("Between the layers the values are small, so their all-reduce is cheap enough to leave out",
              "The communication library fuses the two all-reduces of the pair into one call",
              "A column-parallel layer gives each rank whole, final values for its own share of the outputs, "
              "which is exactly the share of the inputs a row-parallel layer needs; silu_mul works on them "
              "locally, and only down_proj's partial sums must be added up",
              "Every matmul is linear, so the two layers can be summed at the end whatever the split"),
             2, "Splitting the first layer by its outputs leaves rank r with columns r*P..(r+1)*P-1 of the "
                "intermediate activations, computed in full from the whole input. Splitting the second layer by its "
                "inputs makes rank r read exactly those columns. Each rank's product is one term of the sum over the "
                "intermediate dimension, so a single all-reduce at the end completes it (the "
                "`ch13.column_shard` and `ch13.row_shard` exercises check this end to end).",
             why_not=("Leaving it out is not an approximation that happens to be cheap: no values are exchanged "
                      "between the layers because none are needed.",
                      "There is only one all-reduce to begin with; nothing is fused.", None,
                      "silu between the layers is not linear: summing partial gate_up outputs before it would be "
                      "wrong. The split works because each rank's intermediate values are whole, not partial.")),
    Question("A model has 64 query heads and 8 KV heads (grouped-query attention, 8 query heads per KV head). "
             "What happens at tensor_parallel_size=16?",
             ("Each rank holds half of a KV head: the head dimension is split in two",
              "Each rank holds 4 query heads and the one KV head they read: every KV head is replicated on 2 "
              "ranks, so each rank's KV cache holds 1/8 of the model's K/V, not 1/16",
              "The engine refuses: the number of KV heads must be a multiple of the number of ranks",
              "Ranks 8 to 15 hold no KV heads and read K/V from ranks 0 to 7 at every step"),
             1, "The query heads split evenly, 64 / 16 = 4 per rank, and the 4 query heads of a rank all read the "
                "same KV head (a group is 8 query heads, 2 ranks' worth). So each KV head lives on the 2 ranks "
                "whose query heads read it (`TensorShard.kv_heads` in minillm/distributed/sharding.py). Its "
                "weights and its cache are duplicated: more memory than an even split, but no communication "
                "inside attention.",
             why_not=("Splitting the head dimension would make every q·k dot product a partial sum, an all-reduce "
                      "inside attention at every layer; engines replicate instead.", None,
                      "Fewer KV heads than ranks is allowed when the ranks divide evenly among them: the heads are "
                      "replicated. (minillm refuses only when neither number divides the other.)",
                      "That would be a transfer of K/V per layer and step; the replicated head is simply computed "
                      "and cached on both ranks.")),
    Question("On a laptop CPU, the chapter's engine at tensor_parallel_size=2 is slower than one process, yet "
             "every large deployment on GPUs uses tensor parallelism. Why?",
             ("Tensor parallelism cuts the FLOPs per token in half, which only pays on a GPU",
              "On a CPU the all-reduce runs in Python, on a GPU in hardware",
              "GPUs share one memory, so their ranks need no communication",
              "On the laptop both ranks share the same cores and memory bandwidth, so nothing is gained, and each "
              "all-reduce (two per layer) goes through gloo over loopback; on GPUs each device holds half the "
              "weights (a model too large for one fits, and each reads half the bytes per step with its own "
              "memory bandwidth), and NVLink all-reduces at about 900 GB/s, far faster than PCIe"),
             3, "Decode is bound by reading the weights. Two GPUs read their halves at the same time, each with "
                "its own HBM bandwidth, so a step reads half as many bytes per device; the all-reduces add a little "
                "over NVLink (~900 GB/s on H100/H200) and much more over PCIe (~64 GB/s), which is why tensor "
                "parallelism stays inside a node. Two processes on one laptop read from the same DRAM with the same "
                "cores: the split gains nothing, and gloo's copies through the loopback add time to every "
                "all-reduce, 2 per layer per step.",
             why_not=("The FLOPs are split, not removed, and on a laptop the ranks share the cores that do them; "
                      "what pays on a GPU is memory per device and bandwidth per device.",
                      "gloo's all-reduce is C++; the cost is the copies through the loopback and the shared cores, "
                      "not Python.",
                      "Each GPU has its own memory; the ranks exchange their partial sums over NVLink or PCIe.",
                      None)),
    Question("Prefill/decode disaggregation runs prompts on a prefill engine and token generation on a separate "
             "decode engine. What does it remove, and what does it cost?",
             ("It removes the stalls a long prefill causes in the decoding requests' inter-token latency; it costs "
              "the transfer of the prompt's K/V, which adds to TTFT, and two pools of memory sized separately",
              "It removes the KV cache from the decode engine, which reads K/V from the prefill engine instead",
              "It removes TTFT: the prompt is computed elsewhere, so the first token arrives immediately",
              "It halves the total compute, because prefill and decode then run at the same time"),
             0, "A decode engine that never runs a long prompt keeps its steps short and even, so ITL no longer "
                "jumps when a prompt arrives (chunked prefill only spreads that stall thin). The request's first "
                "token now waits for the prefill, then the transfer of its K/V blocks, then the decode engine's "
                "step: TTFT grows by the transfer. And memory is split in two pools, one of which can be full while "
                "the other idles; the ratio of prefill to decode machines must be tuned to the workload.",
             why_not=(None,
                      "The K/V travel once, to the decode engine's own cache, which holds them for every later step.",
                      "The prompt is still computed before the first token; the transfer even adds to TTFT.",
                      "The work is the same; it is placed on different machines so that one kind does not stall the "
                      "other.")),
    Question("The decode engine receives the prompt's K/V from the prefill engine, yet it still computes the "
             "prompt's last token itself. Why?",
             ("The transfer is lossy, so the last token is recomputed to check it",
              "The first output token is sampled from the logits at the last prompt position, and K/V alone do not "
              "give logits; like every prefix-cache hit, the cached part never covers the whole prompt",
              "The prefill engine cannot compute the last token, because that needs the sampler",
              "It does not: the decode engine starts from the prefill engine's first token"),
             1, "K and V are what later tokens read; the next token's distribution comes from the last position's "
                "hidden state through the LM head. The decode engine adopts the transferred blocks as prefix-cache "
                "entries, and a prefix hit always leaves at least the last prompt token to compute, which gives "
                "the logits of the first output token (in minillm only whole blocks travel, so the decoder computes "
                "the rest of the last partial block too). All output tokens thus come from one engine and its "
                "sampler.",
             why_not=("The blocks arrive byte for byte; nothing is checked or recomputed for accuracy.", None,
                      "The prefill engine runs the whole model and even samples one token; the design simply "
                      "does not use it, so the decode engine keeps the request's whole sampling state.",
                      "In minillm the prefill engine's one sampled token is not used; the decode engine computes "
                      "the last prompt token itself.")),
    Question("How does pipeline parallelism (each device holds a contiguous range of layers) compare with "
             "tensor parallelism (each device holds a slice of every layer)?",
             ("Pipeline parallelism communicates more: it sends the whole KV cache from stage to stage",
              "They differ only in name: both split the same weights the same way",
              "Tensor parallelism all-reduces twice in every layer, so it needs a fast link inside a node; "
              "pipeline parallelism sends activations only at the boundaries between stages, cheap enough across "
              "nodes, but a request passes the stages one after another and stages idle (bubbles) unless many "
              "micro-batches keep them busy",
              "Pipeline parallelism has no idle time, because each stage always has its own layers to run"),
             2, "Per token, tensor parallelism moves 2 x num_layers all-reduces of the hidden state (the "
                "`ch13.allreduce_bytes` exercise) and shortens each layer's time; pipeline parallelism moves one "
                "hidden state per stage boundary and does not shorten anything for a single request: its layers run "
                "in sequence on different devices. Engines combine them: tensor parallelism within a node over "
                "NVLink, pipeline parallelism across nodes.",
             why_not=("Each stage keeps the KV cache of its own layers; only activations cross a boundary.",
                      "Tensor parallelism splits inside every matrix; pipeline parallelism keeps matrices whole and "
                      "splits the stack of layers.", None,
                      "A stage waits for the previous stage's output: with one batch in flight only one stage works "
                      "at a time.")),
]
