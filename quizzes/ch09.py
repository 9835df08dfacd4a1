"""Chapter 9's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("A server finishes 20 requests per second, and each spends 3 s in the system on average (queue and "
             "generation). How many requests are inside it at a typical moment?",
             ("About 7, the 20 requests per second divided by the 3 s each one takes",
              "About 60: requests inside = requests per second x seconds each one stays",
              "It cannot be known without the number of batch slots the server was configured with"),
             1, "Little's law, L = lambda x W, holds for any stable system whatever its scheduling: 20 x 3 = 60. "
                "If the server has 16 slots, the other 44 are waiting in its queue.",
             why_not=("20 / 3 is in requests per second per second: not a number of requests at all.", None,
                      "The slots decide how the 60 split between running and waiting, not how many there are.")),
    Question("Streaming (`stream: true`) makes a chat feel faster. Which metric does it change?",
             ("None of the engine's: it changes when the user sees the first token, not when the engine makes it",
              "TPOT, because streamed tokens are produced one at a time instead of in a batch",
              "Throughput, because the server no longer holds whole answers in memory"),
             0, "The engine produces the same tokens at the same moments; without streaming the client only sees them "
                "at the end. Streaming delivers each as it comes, so the time the user waits for the first word is "
                "the TTFT instead of the whole latency.",
             why_not=(None, "Tokens come out one step at a time either way.",
                      "A few kilobytes of text per request are not what limits throughput.")),
    Question("A server's throughput rises from 600 to 800 tokens/s when the arrival rate doubles, and its goodput "
             "(requests per second meeting TTFT <= 1 s) falls. What happened?",
             ("Nothing to worry about: tokens per second went up, so the server is now doing more useful work",
              "The server passed its capacity: requests queue, so more of them miss the latency target",
              "The load generator is broken, since goodput can never fall while throughput rises"),
             1, "Past capacity, extra requests only lengthen the queue: the tokens still come out a little faster "
                "(fuller batches) while the wait before each first token grows, and fewer requests meet the SLO.",
             why_not=("Tokens that arrive too late to meet the target are not useful work: that is what goodput "
                      "counts.", None, "This is exactly the regime goodput was defined to reveal.")),
    Question("A client closes its connection halfway through a long streamed answer. What should the server do, "
             "and why does it matter under load?",
             ("Nothing: the engine finishes the answer and the server throws the text away, which is harmless",
              "Abort the request in the engine at once, so that its batch slot and KV blocks go to a waiting request",
              "Keep generating and cache the answer, in case the client asks the same question again"),
             1, "A request nobody reads still takes a slot and KV blocks every step until it ends; under load "
                "those are exactly what the queue is waiting for. The server notices the disconnect and aborts, and "
                "the engine frees the request's blocks the same step.",
             why_not=("Not harmless under load: every step it runs is a slot and blocks that a waiting request could "
                      "have had, and its tokens are computed for nobody.", None,
                      "The prefix cache already keeps reusable KV; finishing text nobody asked for only delays "
                      "others.")),
    Question("lm-eval scores the choice ` 7` after `What is 3+4? Answer:` by sending question and choice as one prompt "
             "of token ids, with `echo: true, logprobs: 1, max_tokens: 1`. Which numbers of the answer's "
             "`token_logprobs` does it add up?",
             ("The entries after the question's tokens, all but the last one: the last is the token generated "
              "after the prompt, not part of the choice",
              "Only the last entry: the one token the request generated is the model's answer",
              "Every entry: the question's tokens, the choice's and the generated one, since the whole sequence is "
              "what the model saw"),
             0, "With echo the list holds one entry per prompt token (the first is null) and then one for the token "
                "generated after it. The choice's tokens are the entries between the question's and that last one; "
                "their sum is the log-probability of the choice given the question. The sums of the four choices are "
                "compared: the largest is the model's pick.",
             why_not=(None, "The generated token comes after the choice: it says what the model would write next, "
                            "nothing about the choice. lm-eval drops it.",
                      "The question's tokens are the same for every choice and say nothing about which choice fits; "
                      "the generated token is not part of any choice.")),
    Question("A request at temperature 1.5 with `presence_penalty: 1` asks for `logprobs`. Which distribution do the "
             "numbers it gets back come from?",
             ("The one the token was drawn from: logits penalised, divided by 1.5, then softmaxed",
              "The model's own: the log-softmax of its raw logits, before penalties, bias or temperature",
              "The penalised logits' log-softmax, before the temperature"),
             1, "minillm reports the raw distribution, as vLLM does by default: the numbers then say what the model "
                "thinks, whatever the request's sampling settings, and they equal transformers' log-softmax — which is "
                "what lets an evaluation harness trust them. A token drawn at a high temperature can be one the model "
                "ranked low: its logprob shows it.",
             why_not=("Then the same prompt would get different logprobs at each temperature, and a harness's scores "
                      "would depend on sampling settings it never meant to set.", None,
                      "Penalties and bias are the request's sampling choices too: the reported numbers are taken "
                      "before any of them.")),
    Question("One request asks for `n: 3` samples of a 600-token prompt at temperature 0.8. What does the engine do "
             "with the prompt?",
             ("Computes it three times, once per sample, since each sample has its own random generator",
              "Computes it once; each sample then gets its own copy of all the prompt's KV blocks",
              "Computes it once; the samples share its KV blocks, and only the partly filled last block is copied, "
              "when each sample writes its first token into it"),
             2, "The prompt's K/V are the same for every sample, so one prefill serves all three. The samples fork "
                "the request's block table: full blocks are shared for good, and the first write into the shared "
                "last block gives the writer its own copy (copy-on-write, chapter 5). The usage counts the prompt "
                "once too.",
             why_not=("The generators only change which tokens are drawn after the prompt; the prompt's K/V depend on "
                      "its tokens alone.",
                      "Full blocks are only read, never written again: copying them would waste memory. That is what "
                      "a contiguous cache must do.", None)),
]
