"""Chapter 10's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("A request arrives at a server whose engine core runs in a process of its own. What does the front "
             "end send to the core?",
             ("The prompt's text and the sampling parameters: the core tokenizes, since it owns the model",
              "The prompt's token ids and the sampling parameters, in a small message",
              "The prompt's KV cache, computed by the front end so that the core only decodes"),
             1, "Tokenizing is the front end's work; the core sees only token ids, and sends back only token ids. "
                "Messages stay small, and the core's loop never spends time on text (`AddRequest` in "
                "`minillm/engine_core/messages.py`).",
             why_not=("Then the core would tokenize between steps, and the model would wait for it: the very work "
                      "the split moves away.", None,
                      "The front end holds no model and no KV cache; the prefill is the core's, like every forward "
                      "pass.")),
    Question("The stop string is \"END\". The front end finds it in the text of step 40's tokens, but the core, "
             "which does not look at text, has already run step 41. What becomes of step 41's token?",
             ("It is added to the answer: the core generated it before it heard of the stop, and a token the "
              "core has made is always delivered",
              "The core rolls its KV cache back by one token and generates step 41 again, this time stopped",
              "It is dropped, and the front end tells the core to stop the request"),
             2, "A stop string is found where the text is, a step or two after the core made the tokens. The front "
                "end cuts the text, drops what came after, and sends the abort (`RequestState.add` in "
                "`minillm/engine_core/output_processor.py`). The core's extra step costs a little compute, never "
                "a wrong answer.",
             why_not=("Then the answer would not match the same request served in one process, which stops at "
                      "\"END\" exactly.",
                      "Nothing needs rolling back: the request is over, and its blocks are freed whole.", None)),
    Question("A request's stop string is \"ROMEO\" and the text so far ends in \"... to RO\". Why does the front "
             "end hold back \"RO\" instead of streaming it?",
             ("Because \"RO\" is not a whole token yet, and the front end streams tokens whole, never parts of them",
              "Because text once sent cannot be taken back, and \"MEO\" may follow",
              "To batch the network writes: the front end sends text in chunks of at least five characters"),
             1, "A client already holds whatever it received. Text that could still become a stop string waits "
                "until it either completes one (it is never sent) or cannot any more (it goes out with the next "
                "delta).",
             why_not=("\"RO\" may well be one token, or two; what matters is that it could begin \"ROMEO\".", None,
                      "The hold-back depends on the stop strings only: with none, every complete character goes out "
                      "at once.")),
    Question("A teammate proposes to run the front end in a second thread of the engine's process instead of a "
             "second process: \"threads are cheaper\". In CPython, what happens to the step while that thread "
             "is busy?",
             ("Nothing: torch runs its operators in C++, so the two threads run fully in parallel",
              "It speeds up: the second thread shares the model's weights in the same memory, so nothing is copied",
              "It slows down: only one thread at a time runs Python (the GIL)"),
             2, "torch releases the GIL inside an operator, but the step is hundreds of operators with Python "
                "between them, and every return from an operator must take the GIL again. The chapter measures "
                "it: the same steps beside a busy thread, and beside a busy process.",
             why_not=("Inside an operator, yes; but the Python around each operator, the scheduler and the sampler "
                      "all need the interpreter.",
                      "Sharing memory saves nothing per step; the process split shares nothing but small messages, "
                      "and the weights live in the core alone.", None)),
    Question("This course's machine is a 2-core CPU, and the model's forward pass keeps both cores busy. What can "
             "moving the front end into a process of its own buy there?",
             ("Only what sharing one process cost (the waits for the interpreter, the threads contending); the "
              "front end's work still runs on the forward's cores",
              "Twice the throughput, since two processes can spread over both cores where one process was held to "
              "one of them",
              "A faster forward pass, since the core's process no longer holds the tokenizer, the HTTP server and "
              "their memory"),
             0, "Overlap needs a free resource. With a GPU, the host launches the forward and is idle until the "
                "tokens come back: the front end, the scheduling of the next step, and the sampler's host work "
                "can all hide there. On a CPU that computes the forward itself there is no idle core to hide the "
                "front end's work on; what the split removes is the cost of sharing one process, which the saved "
                "benchmark measures on this machine.",
             why_not=(None, "The forward already used both cores; a second process adds work to them, not cores.",
                      "The forward is the same computation in either process; only what waits around it changes.")),
    Question("SGLang's overlap scheduler builds step N+1 on the CPU while the GPU still computes step N. What must "
             "it do that a plain loop (schedule, run, wait for the tokens, repeat) does not?",
             ("Run two copies of the model, one for each step in flight, so the two steps never wait for each other",
              "Nothing: a GPU runs steps in any order it likes, so the two steps simply run at the same time",
              "Build step N+1's inputs before step N's tokens reach the host, with placeholders the GPU fills in"),
             2, "Step N+1's input tokens are step N's outputs, not yet known on the host. The scheduler leaves "
                "their slots to be filled on the device, and judges stops when step N's tokens arrive, a step "
                "later: a finished request may run one step too many, whose token is thrown away.",
             why_not=("One model serves both: the steps follow each other on the GPU; only the CPU's preparation "
                      "runs ahead.",
                      "Step N+1 needs step N's tokens and KV: the GPU runs them in order. What overlaps is the "
                      "CPU's work for N+1 with the GPU's work for N.", None)),
]
