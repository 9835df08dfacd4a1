"""Chapter 3's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("What does minillm's continuous scheduler look at instead of a prefill/decode flag?",
             ("The request's position in the queue",
              "num_computed_tokens: each request is granted the tokens not yet in its KV cache",
              "The length of the prompt"),
             1, "A request needs num_tokens − num_computed_tokens tokens run: its whole prompt at first, then one "
                "per step. Chunked prefill and prefix caching will change only how much is granted and where the "
                "count starts.",
             why_not=("The queue order decides who is admitted first, not how many tokens a request runs.", None,
                      "The prompt length only matters for the first step; after it a request needs one token per "
                      "step, whatever its prompt was.")),
    Question("Why can a newcomer's prefill share a forward pass with other requests' decodes?",
             ("Prefill and decode use different weights, so they do not interfere",
              "It cannot: the engine alternates prefill steps and decode steps",
              "The model runs a flat batch of tokens with their positions, and only attention needs to know which "
              "tokens belong to which request"),
             2, "Everything but attention works token by token; the attention backend knows which tokens belong to "
                "whom.",
             why_not=("Every token goes through the same weights — that is why batching them saves weight reads.",
                      "Step 1 of the hand-driven run in section 3 shows A decoding and B prefilling in one pass.",
                      None)),
    Question("64 requests with identical prompt and output lengths, 16 slots: continuous batching is no faster "
             "than static. Why?",
             ("Continuous scheduling costs a lot of time in every step",
              "Every request of a batch finishes on the same step, so no slot frees early and there is nothing to "
              "refill",
              "Continuous batching recomputes the prompts of running requests"),
             1, "The replay in section 6 shows both schedulers deciding the very same steps: with every request "
                "there from the start, continuous batching gains only from differences in length.",
             why_not=("The two schedulers decided identical steps, and the scheduler's own work is a few list "
                      "operations per request in both — small next to a forward pass.", None,
                      "Only a preempted request is recomputed (chapter 4, when a paged cache runs out of blocks); "
                      "nothing is preempted here.")),
    Question("Why does minillm keep each request's future on the Request itself?",
             ("When the request ends, the loop resolves request.future from the request alone: it needs no table "
              "from request ids to waiting futures",
              "An asyncio future can only be created inside a dataclass",
              "So that the scheduler can await it before admitting the next request"),
             0, "The request carries everything about itself — prompt, progress, stopwatch and its way back to the "
                "caller — so the loop only reacts to what each step produced.",
             why_not=(None, "A future is made by the event loop (loop.create_future()) and can be kept anywhere.",
                      "The scheduler never awaits anything: it is plain synchronous code run between steps; only "
                      "the caller awaits the future.")),
]
