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
]
