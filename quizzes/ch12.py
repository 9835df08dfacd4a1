"""Chapter 12's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("A server decodes one request at a time with an 8B-parameter model on a GPU. Its weights go from "
             "bf16 to int4 in groups of 128. Why does each decode step get about 3.5x faster, and when does "
             "that gain shrink or vanish?",
             ("Int4 arithmetic is 4x faster than bf16 arithmetic, at any batch size",
              "A step reads every weight once for one token each, so it is bound by bytes moved; the gain fades "
              "when large batches or prefill make the step bound by arithmetic instead",
              "Smaller weights fit in the GPU's caches, so the gain grows with the batch size",
              "The model has fewer weights after quantization, so there is less to compute"),
             1, "At batch 1 each weight is fetched to do two FLOPs, far below what the GPU can compute per byte: "
                "the step lasts as long as the reading, and 0.53 instead of 2 bytes per weight cuts it. A batch of "
                "hundreds (or a prefill of hundreds of tokens) reuses each weight for that many tokens, the step "
                "becomes bound by arithmetic, and weight-only codes, which are turned back into bf16 before the "
                "multiply, save nothing there — the unpacking even adds work (the `ch12.fastest_scheme` exercise).",
             why_not=("Weight-only int4 kernels multiply in bf16 after unpacking the codes; the arithmetic is the "
                      "same, plus the unpacking.", None,
                      "An 8B model's weights are gigabytes whatever the format; no cache holds them, and the "
                      "gain shrinks, not grows, with the batch.",
                      "Quantization keeps every weight: each one is stored in fewer bits, and the multiply count "
                      "is unchanged.")),
    Question("One weight of a 4096 x 4096 layer is 60 times larger than all the others. How do per-tensor, "
             "per-channel and per-group int8 scales cope?",
             ("All three are equally hurt: a scale is always set by the largest weight in the tensor",
              "Per-tensor is best: one scale stored for the whole tensor leaves more bits for the codes",
              "Per-tensor stretches every weight's step 60-fold, most of them round to a few codes; per-channel "
              "hurts only the outlier's row, per-group only its group",
              "Per-group is hurt most, because a group is small and one weight dominates it"),
             2, "A scale is max|w| / 127 over the weights that share it. With one scale for the tensor, the outlier "
                "sets a step 60x too coarse for 16.7 million weights, and nearly all of them land on the five "
                "codes -2..2. With a scale per row, only that row's 4096 weights pay; with groups of 128, only 128 "
                "do. The chapter measures this on the shipped model's own weights.",
             why_not=("The scale is the largest weight among those that share it: a row, or a group, not the "
                      "whole tensor.",
                      "The codes have 8 bits whatever the granularity; the scales are extra bytes, a few per row or "
                      "group, and one shared scale makes almost all codes useless.", None,
                      "Only the outlier's own group is hurt, and it is the smallest share of the weights that "
                      "could be.")),
    Question("All weights in one group of 128 lie between 0.02 and 0.10. Why do the course's int4 groups use "
             "asymmetric codes (a scale and a minimum) rather than symmetric ones?",
             ("Symmetric codes cover [-0.10, 0.10], so the negative half of the codes is never used and the "
              "step is 2.5 times as coarse; asymmetric codes spend all 16 on [0.02, 0.10]",
              "Symmetric codes cannot represent zero exactly",
              "Asymmetric codes need no scale at all, only the minimum",
              "Kernels cannot multiply signed 4-bit numbers"),
             0, "A symmetric range is centred on zero and must reach max|w|, so a one-sided group wastes the codes "
                "on the side it never reaches. Asymmetric codes map [min, max] onto 0..15: here a step of "
                "0.08 / 15 instead of 0.20 / 15. The price is a second number per group (the minimum). With 256 "
                "codes int8 can afford the waste, so the engine keeps int8 symmetric.",
             why_not=(None,
                      "Symmetric codes represent zero exactly (code 0); it is asymmetric codes that usually do not.",
                      "The scale is still needed to turn codes into steps: w = code x scale + minimum.",
                      "Kernels unpack 4-bit codes into wider integers or floats before multiplying; the sign is "
                      "no obstacle (GPTQ checkpoints are often quantized symmetrically).")),
    Question("Which of these values can float8 e4m3 (4 exponent bits, 3 mantissa bits, as in "
             "`torch.float8_e4m3fn`) store exactly?",
             ("500, because an 8-bit float reaches far beyond int8's 127",
              "0.1, because fp8 has finer steps than int8 everywhere",
              "17, because every integer up to 448 is representable",
              "448, its largest finite value, but not 17: between 16 and 32 the steps are 2 apart"),
             3, "With 3 mantissa bits there are 8 values per power of two: 16, 18, 20, ... 30 between 16 and 32, so "
                "17 rounds to 16 or 18. The largest finite e4m3fn value is 448 (1.75 x 2^8); larger values must be "
                "clamped, which is why the engine's fp8 KV cache clamps at ±448. int8 with a scale has uniform "
                "steps; fp8 rounds to within about 6% of the value at any magnitude.",
             why_not=("e4m3's largest finite value is 448; 500 is out of range (e5m2 reaches 57344 with fewer "
                      "mantissa bits).",
                      "0.1 is not a binary fraction: no float format stores it exactly, and e4m3's steps near 0.1 "
                      "are about 0.008.",
                      "Above 16 the steps are 2 wide, above 32 they are 4 wide, and so on: 17 is not representable.",
                      None)),
    Question("The engine's int8 KV cache stores one scale per token and KV head, not one per block of 16 "
             "tokens. Why does that matter for chunked prefill and the prefix cache?",
             ("A per-block scale would take more memory than a per-token one",
              "Each token's codes then depend on that token alone, so a prompt cached in one piece, in chunks, or "
              "shared from the prefix cache holds exactly the same codes and gives the same tokens",
              "Per-token scales make the attention kernel faster because it can skip the scale for most tokens",
              "It does not matter: a block's scale could be chosen when the block is first written and never "
              "change"),
             1, "With a scale per block, the codes of the block's first tokens would depend on which tokens were "
                "in the block when it was quantized: a prompt prefilled in chunks, or a block filled over several "
                "decode steps, would be quantized differently from one long prefill, and the outputs of the same "
                "request would depend on scheduling (`minillm/attention/kv_codes.py`).",
             why_not=("Per block is fewer scales, not more: one scale per 16 tokens instead of 16.", None,
                      "Every token's scale is applied on every read; the kernel skips nothing.",
                      "Fixing the scale at the first write means a later, larger token is clamped, and whether it "
                      "shares a block with that first token depends on chunk boundaries: results would still "
                      "depend on scheduling.")),
    Question("Weight-only int8 barely speeds up a prefill of 2000 tokens. What do W8A8 schemes such as "
             "SmoothQuant or fp8 (weights and activations in 8 bits) change?",
             ("They make the matmul itself run in 8-bit arithmetic, which tensor cores do about twice as fast "
              "as bf16, so compute-bound steps (prefill, large batches) gain too",
              "They store the activations in 8 bits, so the KV cache becomes smaller",
              "Nothing for speed: they only improve accuracy over weight-only int8",
              "They remove the scales, so no dequantization is needed anywhere"),
             0, "Weight-only codes are unpacked to bf16 and multiplied in bf16, so they only help where bytes "
                "bound the step. Quantizing the activations as well lets the matmul run in int8 or fp8. The "
                "difficulty is the activations' outlier channels; SmoothQuant moves that range into the weights "
                "with a per-channel factor, fp8 copes with its wider dynamic range and per-tensor or "
                "per-token scales.",
             why_not=(None, "The KV cache is quantized separately (the chapter's int8/fp8 cache); W8A8 concerns the "
                            "inputs of the linear layers.",
                      "Activation quantization costs some accuracy; what it buys is speed where arithmetic is the "
                      "bottleneck.",
                      "W8A8 still has scales, per tensor, channel or token; they are applied once to each output "
                      "rather than per weight.")),
]
