"""Chapter 11's experiments: the hand-built automaton's masks are the library's on the real vocabulary; the
replay re-walks a real run exactly; where-the-JSON-stands reads the text right; the mask's cost holds or
warns under load and its words follow each outcome; jump-forward's counts come from real runs; the saved
benchmark's words follow whatever it holds."""

from __future__ import annotations

import json

import pytest

import minillm
from experiments import ch11
from minillm import EngineConfig
from minillm.engine import LLMEngine
from minillm.sampling import SamplingParams
from minillm.structured import StructuredOutput
from minillm.structured.grammars import GrammarCompiler
from minillm.timing import CpuUse, Trials
from tests.cpu_hog import cpu_hog

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def shipped():
    return minillm.load_model(), minillm.load_tokenizer()


def test_the_hand_built_automaton_masks_what_the_library_masks(shipped):
    _, tokenizer = shipped
    vocab = ch11.vocabulary(tokenizer, len(tokenizer))
    compiler = GrammarCompiler(tokenizer, len(vocab), [0])
    grammar = compiler.compile(StructuredOutput(regex=ch11.REGEX))
    prefixes = ["", "R", "JUL", "ROMEO", "JULIET:", "ROMEO: ", "ROMEO: the king", "JULIET: o. ".rstrip(". ") + ".",
                "ROMEO: the king."]
    rows = ch11.compare_masks(ch11.speaker_automaton(), tokenizer, grammar, vocab, prefixes, 0)
    assert all(r.agree for r in rows), [(r.prefix, sorted(r.by_hand ^ r.library)[:5]) for r in rows]
    counts = {r.prefix: len(r.by_hand) for r in rows}
    assert counts["ROMEO: the king."] == 1 and rows[-1].by_hand == {0}  # complete: the end token alone
    assert counts[""] == len({"R", "RO", "ROM", "ROMEO", "J", "JUL", "JULIET"} & set(vocab))
    assert counts["ROMEO: "] > 1000  # inside the loop: every token of lower-case letters and spaces
    compiler.close()


def test_the_automaton_walks_and_falls_off():
    a = ch11.speaker_automaton()
    assert a.walk(a.start, "ROMEO: ab c.") in a.accepting
    assert a.walk(a.start, "ROMIO") is None and a.walk(a.start, "ROMEO:\n") is None
    assert a.walk(a.walk(a.start, "JULIET"), "") == a.walk(a.start, "ROMEO")  # both names lead to one state
    assert sorted(a.labels) == list(range(len(a.transitions))) and a.labels[a.start] == "start"


@pytest.mark.parametrize(("text", "where"), [
    ("", ("$", "", "before the first character: a value must start")),
    ('{"tool"', ("$.tool", "{", 'the colon after "tool" next')),
    ('{"tool": "sum', ("$.tool", "{", "inside a string value")),
    ('{"tool": "summon", "arguments": {"char', ("$.arguments.char…", "{ {", "inside a key")),
    ('{"a": {"b": 12', ("$.a.b", "{ {", "inside a number or a literal (more of it, or what follows it)")),
    ('{"a": [[1, 2], [3', ("$.a[1][0]", "{ [ [", "inside a number or a literal (more of it, or what follows it)")),
    ('{"a": [1, 2], ', ("$", "{", "a key (or the closing brace) next")),
    ('{"a": "x\\"}"', ("$.a", "{", "a comma or the closing brace next")),
    ('{"a": [{"b": true}]}', ("$", "", "the JSON value is complete")),
])
def test_where_the_json_stands(text, where):
    assert ch11.json_position(text) == where


def test_the_replay_re_walks_a_real_run_exactly(shipped):
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=2, kv="paged", max_model_len=256))
    params = SamplingParams(temperature=0, max_new_tokens=96, structured={"json": ch11.TOOL_CALL})
    request = engine.add_request(ch11.TOOL_PROMPT, params)
    while engine.has_unfinished():
        engine.step()
    out = engine.output(request.request_id)
    assert out.finish_reason == "stop"
    grammar = engine.structured.compiler.compile(params.structured)
    steps = ch11.replay(model, tokenizer, grammar, request.prompt_token_ids, out.token_ids)
    assert [s.token for s in steps] == out.token_ids and steps[-1].piece == "<end of text>"
    assert steps[-1].text == out.text and json.loads(out.text)["tool"] == "summon"
    for s in steps:
        assert 1 <= s.allowed <= len(tokenizer) and 0 < s.chosen_p <= 1 + 1e-6 and 0 <= s.kept_mass <= 1 + 1e-6
        assert s.top[0][1] >= s.chosen_p - 1e-6  # the first of `top` is the most likely allowed token
    assert steps[0].forced.startswith('{"tool": "summon"') and steps[0].allowed == 1
    for s in steps:  # where the schema leaves one token, the words name it (a JSON reader alone would not)
        assert (s.where[2] == f"only {s.piece!r} next: the schema allows nothing else") == (s.allowed == 1)
    assert any(s.allowed > 1000 for s in steps)  # inside the greeting string
    greedy = [s for s in steps if s.allowed > 1]
    assert sum(s.top[0][0] == s.piece for s in greedy) >= 0.9 * len(greedy)  # greedy: the most likely allowed
    assert ch11.replay(model, tokenizer, grammar, request.prompt_token_ids, out.token_ids)[5].to_dict() == \
        steps[5].to_dict()
    with pytest.raises(ValueError, match="refuses token"):
        ch11.replay(model, tokenizer, grammar, request.prompt_token_ids, [tokenizer.encode("x")[0]])
    engine.release(request.request_id)


def test_the_grammar_timer_times_a_real_run_and_puts_the_methods_back(shipped):
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=4, kv="paged", max_model_len=256))
    ids = tokenizer.encode(ch11.LIST_PROMPT)
    free = ch11.decode_run(engine, ids, 2, 6, None)
    masked = ch11.decode_run(engine, ids, 2, 6, {"json": ch11.LONG_LIST})
    assert free.tokens == masked.tokens == 12 and free.grammar_ms == 0
    assert masked.fill_ms > 0 and masked.apply_ms > 0 and masked.advance_ms > 0
    assert "_masks" not in vars(engine.runner) and "advance" not in vars(engine.structured)
    assert engine.pool.is_idle


def test_under_a_cpu_hog_the_mask_cost_holds_or_the_guard_fires(shipped):
    model, tokenizer = shipped
    engine = LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=4, kv="paged", max_model_len=256))
    with cpu_hog():
        finding = ch11.mask_cost(engine, tokenizer.encode(ch11.LIST_PROMPT), batches=(1, 4), tokens=6, rounds=2)
    assert finding.warning or finding.holds, finding.text
    assert "At batch 1" in finding.text and "At batch 4" in finding.text and "batch" in finding.table()


def _runs(step_free, step_masked, grammar_ms, batch):
    free = [ch11.RunTimes(batch, s, 0, 0, 0, batch * 8) for s in step_free]
    masked = [ch11.RunTimes(batch, s, g * 0.7, g * 0.2, g * 0.1, batch * 8) for s, g in zip(step_masked, grammar_ms)]
    return free, masked


def _trials(busy=False, share=0.02):
    f1, m1 = _runs([4.0, 4.2, 4.1], [4.1, 4.2, 4.2], [4.0 * share] * 3, 1)
    f16, m16 = _runs([6.0, 6.1, 6.2], [6.2, 6.1, 6.3], [6.0 * share * 1.2] * 3, 16)
    cpu = CpuUse(wall_s=1.0, ours_s=2.0, others_s=2.0 if busy else 0.0, cores=2, threads=2)
    return Trials({"free 1": f1, "masked 1": m1, "free 16": f16, "masked 16": m16}, cpu)


def test_the_mask_cost_words_follow_each_outcome():
    small = ch11.describe_mask_cost(_trials(), (1, 16))
    assert small.holds and small.warning is None
    assert "a few percent of a step" in small.text and "2.0% of the free step" in small.text
    assert small.numbers["fill_per_row_ms"] > 0
    large = ch11.describe_mask_cost(_trials(share=0.2), (1, 16))
    assert not large.holds and "did not stay under 10%" in large.text and large.warning is None
    busy = ch11.describe_mask_cost(_trials(busy=True), (1, 16))
    assert busy.warning and "kept 2.0 of this machine's 2 cores" in busy.warning
    assert "the grammar's own work, timed inside the step, is the steadier figure" in busy.text
    assert "slower than the free one" not in busy.text  # a busy run's step difference is not explained away
    # the table's two steps are one round's: their ratio is the ratio shown beside them
    for n in small.numbers["batches"].values():
        assert abs(n["masked_ms"] / n["free_ms"] - n["step_ratio"].value) < 1e-9
    assert "in the median round (1.02x" in small.text  # batch 1's rounds: 1.025, 1.0, 1.024


def test_a_masked_step_no_slower_is_not_called_slower():
    trials = _trials()
    trials.results["masked 16"] = [ch11.RunTimes(16, s, 0.1, 0.02, 0.01, 128) for s in (5.0, 5.1, 5.2)]
    finding = ch11.describe_mask_cost(trials, (1, 16))
    assert "more at batch 16" not in finding.text


def test_a_cell_run_before_the_cells_it_needs_says_what_to_run():
    from experiments import NeedsEarlierCells, needs

    needs({"cost": 1}, "cost", made_in="section 5")
    with pytest.raises(NeedsEarlierCells, match="uses `cost`, made in section 5") as raised:
        needs({}, "cost", made_in="section 5")
    assert raised.value._render_traceback_() == [f"⚠ {raised.value}"]  # IPython shows this, not a traceback


def test_jump_forward_counts_come_from_real_runs(shipped):
    model, tokenizer = shipped
    engines = {way: LLMEngine(model, tokenizer, EngineConfig(max_num_seqs=4, kv="paged", max_model_len=256,
                                                             jump_forward=way == "jump-forward"))
               for way in ("sampled", "jump-forward")}
    finding = ch11.jump_forward_runs(engines, prompts=ch11.RECORD_PROMPTS[:2], rounds=1)
    sampled, jumped = finding.numbers["sampled"], finding.numbers["jump"]
    assert sampled.tokens_per_pass == 1.0 and jumped.tokens_per_pass > 2 and jumped.forced > 0
    assert sampled.forced == 0 and all(json.loads(t) for t in sampled.texts + jumped.texts)
    assert "tokens per pass" in finding.text


def test_the_saved_words_follow_whatever_the_benchmark_holds():
    saved = {"machine": "x86_64, 2 cores", "rounds": 3, "tokens": 32,
             "minillm": {"1": {"free_step_ms": 3.7, "masked_step_ms": 3.8, "step_ratio": 1.02,
                               "free_tokens_per_s": 246, "masked_tokens_per_s": 230, "throughput_ratio": 0.94},
                         "16": {"free_step_ms": 5.3, "masked_step_ms": 5.6, "step_ratio": 1.06,
                                "free_tokens_per_s": 2447, "masked_tokens_per_s": 2239, "throughput_ratio": 0.91}}}
    words = ch11.saved_words(saved)
    assert "at batch 1 the masked decode step took 1.02x the free one (+2%)" in words and "vLLM" not in words
    assert len(ch11.saved_rows(saved)) == 2
    saved["vllm"] = {"1": {"free_tokens_per_s": 100, "masked_tokens_per_s": 90, "throughput_ratio": 0.9}}
    saved["vllm_version"] = "0.32.0"
    saved["jump_forward"] = {"sampled": {"tokens_per_pass": 1.0}, "jump": {"tokens_per_pass": 4.89},
                             "time_ratio": 0.31}
    words = ch11.saved_words(saved)
    assert "0.90x at batch 1" in words and "1.00 → 4.89 output tokens per request-pass" in words
    assert ch11.saved_rows(saved)[-1][0] == "vLLM 0.32.0"
    saved["vllm"]["1"]["rounds"] = {"free": [100, 120, 90], "masked": [110, 90, 80]}  # ratios 1.1, 0.75, 0.89
    assert ch11.saved_rows(saved)[-1][3:] == ["90 → 80 tok/s", "0.89x"]  # the median round, its own ratio
    real = ch11.saved_results()
    if real is not None:  # the course's own file, whatever it holds
        assert ch11.saved_words(real) and ch11.saved_rows(real)
        for row in ch11.saved_rows(real):  # each pair shown gives the ratio shown beside it
            free, masked = (float(v.replace(",", "")) for v in row[3].removesuffix(" tok/s").split(" → "))
            assert f"{masked / free:.2f}x" == row[4]
