"""Chapter 11's quiz: the answers are below, so try it in the notebook first."""

from widgets.quiz import Question

QUESTIONS = [
    Question("A request asks for JSON. At this step the model gives a line break 40% of its probability, but the "
             "grammar allows only `\"` and `}`. What does the engine do?",
             ("Samples as usual; if the line break comes out, it draws again until it gets a token the grammar "
              "allows",
              "Sets every refused token's logit to −∞ before temperature and top-p, then samples among the "
              "allowed",
              "Samples as usual and leaves the token out of the answer when the grammar refuses it"),
             1, "The mask is applied to the logits, so the allowed tokens share all the probability and one draw "
                "suffices. It comes after the penalties and before temperature, top-k and top-p "
                "(`minillm/sampler.py::StepSampler`).",
             why_not=("Drawing again could take hundreds of tries when the model wants something else, and it "
                      "would need a sampler pass each time.", None,
                      "Dropping tokens would change the text the model has already seen as its own output: "
                      "its KV cache holds the refused token.")),
    Question("The regex is `(ROMEO|JULIET): [a-z ]+\\.` and the output so far is `ROMEO`. Why is the token "
             "`:\\n` refused while `:` is allowed?",
             ("Because every character of a token must fit, and the line break falls off the automaton",
              "Because the mask only looks at single characters, and `:\\n` is two characters long",
              "Because the tokenizer never produces `:\\n` right after an upper-case word like ROMEO"),
             0, "Both tokens start with `:`, which fits; the walk goes on through `\\n`, and no state after `:` "
                "has a move for it. Multi-character tokens like `ROMEO` or ` king` are allowed when the whole "
                "walk stays on the automaton.",
             why_not=(None, "Multi-character tokens are allowed all the time: after `ROMEO:`, ` king` walks the "
                            "space and then four letters inside the loop.",
                      "The grammar judges the text of each token, not what the tokenizer would have chosen; "
                      "`:\\n` is an ordinary token of the vocabulary.")),
    Question("Why does a JSON grammar need a stack (a pushdown automaton), where a regex's automaton needs none?",
             ("Because JSON strings may contain escaped quotes, which no regular expression can describe",
              "Because keys in a JSON object may come in any order, and only a stack can sort them",
              "Because brackets nest to any depth, and what closes next depends on every open one"),
             2, "After `{\"a\": [[{` the next closers must be `}`, `]`, `]`, `}` in that order. A finite automaton "
                "has a fixed number of states, so it can only remember nesting up to a fixed depth; a stack "
                "remembers any depth.",
             why_not=("Escaped quotes are easy for a regex: `\"([^\"\\\\]|\\\\.)*\"`.",
                      "Key order needs no sorting; a schema's grammar lists the keys in one order (or allows "
                      "several), all within a finite automaton's reach.", None)),
    Question("A request verifies 3 guesses in a step. The grammar accepts the first guess and refuses the "
             "second. After filling the rows' masks, how many tokens must its matcher roll back?",
             ("3: every guess was fed to it, so every guess must be undone",
              "1: only the guess it accepted; the refused one never moved it",
              "None: the acceptance rule stops at the refused guess, so the first one is kept anyway"),
             1, "The matcher moved once, for the accepted guess; it must end where it started, because the "
                "acceptance rule has not yet decided what the request keeps. The engine accepts the kept tokens "
                "afterwards (`minillm/structured/step_masks.py::StepMasks.fill`).",
             why_not=("Rolling back 3 would undo two tokens the request had really kept before this step.", None,
                      "Whether the first guess is kept depends on the target's verdict, which comes after the "
                      "masks; the matcher must not run ahead of it.")),
    Question("With jump-forward on, the same greedy requests under the same schema gave different texts than "
             "without it, though every output is valid. Why?",
             ("Jump-forward samples the forced tokens with temperature 1, so they vary from run to run",
              "The forced text is appended unmasked, and the model may write characters the schema forbids",
              "The forced text is tokenized on its own, not split the way the model would have spelt it"),
             2, "The model would have spelt `\"character_name\"` in its own pieces; jump-forward appends the "
                "tokenizer's pieces. From there the model continues a token sequence it might never have made, "
                "and its next choices can change (`minillm/engine.py::LLMEngine._jump_forward`).",
             why_not=("Forced tokens are not sampled at all: the grammar leaves no choice.",
                      "The matcher accepts every forced token, so the text stays what the grammar wants.", None)),
    Question("A new request brings a large JSON schema that takes 300 ms to compile. Where should that time go?",
             ("Into the step loop, once: every running request waits 300 ms, then the grammar is cached",
              "Onto a worker thread: the request waits in the queue until it is ready, the others keep going",
              "Nowhere: grammars are compiled lazily, one token's worth of states at each step of the request"),
             1, "Compiling off the loop costs the running requests nothing; only the new request waits, as it "
                "would for a slot. Equal constraints share one compilation "
                "(`minillm/structured/grammars.py::GrammarCompiler.submit`; vLLM does the same).",
             why_not=("A 300 ms stall lands on every request's inter-token latency at once.", None,
                      "Libraries like xgrammar precompute per-state masks when compiling; that is what makes each "
                      "step's mask cost microseconds.")),
]
