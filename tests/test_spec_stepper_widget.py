"""widgets/spec_stepper.py: verdicts and expectations are exact, and the stepper replays a real trace."""

import pytest

from minillm.trace import SlotState, StepRecord, Trace
from widgets.spec_stepper import (
    BONUS,
    CORRECTION,
    REJECTED,
    UNCHECKED,
    AcceptanceExplorer,
    SpecStepper,
    break_even,
    break_even_words,
    expected_speedup,
    expected_tokens_per_pass,
    fastest_k,
    render_expectations,
    speedups_by_k,
    verdicts,
    verifications,
)


@pytest.mark.parametrize("guesses, kept, marks, last", [
    ((5, 6, 7), (5, 6, 7, 8), ["accepted"] * 3, BONUS),
    ((5, 6, 7), (5, 9), ["accepted", REJECTED, UNCHECKED], CORRECTION),
    ((5, 6, 7), (4,), [REJECTED, UNCHECKED, UNCHECKED], CORRECTION),
    ((5,), (5, 5), ["accepted"], BONUS),
    ((5, 6), (5, 5), ["accepted", REJECTED], CORRECTION),  # the correction may equal an earlier guess
])
def test_verdicts(guesses, kept, marks, last):
    assert verdicts(guesses, kept) == (marks, last)


def test_expected_tokens_per_pass_is_the_geometric_sum():
    assert expected_tokens_per_pass(0.0, 4) == 1.0  # nothing accepted: the target's own token only
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_speedup(0.5, 2, 0.25) == pytest.approx(1.75 / 1.5)
    with pytest.raises(ValueError):
        expected_tokens_per_pass(1.2, 3)


def record(step, speculation=None, *slots):
    return StepRecord(step, 0.1 * step, 0.1, tuple(slots), (), (), speculation=speculation or {})


def test_verifications_know_the_text_before_each_step():
    # A: prefill gives token 1; step 1 verifies (2, 3) keeping 2, 9; step 2 decodes without guesses (4);
    # step 3 verifies (5,) keeping 5, 6
    trace = Trace(1, [record(0, None, SlotState("A", 3, "prefill")),
                      record(1, {"A": ((2, 3), (2, 9))}, SlotState("A", 3, "decode")),
                      record(2, None, SlotState("A", 1, "decode")),
                      record(3, {"A": ((5,), (5, 6))}, SlotState("A", 2, "decode"))])
    output = [1, 2, 9, 4, 5, 6]
    found = verifications(trace, "A", output)
    assert [(v.step, v.context, v.guesses, v.kept) for v in found] == [(1, (1,), (2, 3), (2, 9)),
                                                                       (3, (1, 2, 9, 4), (5,), (5, 6))]


def test_the_stepper_replays_a_real_engine(model, tmp_path):
    from minillm.config import EngineConfig, SpeculativeConfig
    from minillm.engine import LLMEngine
    from minillm.sampling import SamplingParams
    from tests.hf_reference import ByteTokenizer

    ngram = SpeculativeConfig(method="ngram", num_speculative_tokens=3)
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(max_num_seqs=2, max_model_len=96, speculative=ngram))
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]
    rid = engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True)).request_id
    while engine.has_unfinished():
        engine.step()
    out = engine.output(rid)
    widget = SpecStepper(engine.trace, rid, out.token_ids, lambda ids: "".join(chr(65 + i % 26) for i in ids))
    found = widget.verifications
    assert found and sum(len(v.kept) for v in found) <= len(out.token_ids)
    for v in found:  # each verification's context, then what it kept, is the request's real output
        assert list(v.context + v.kept) == out.token_ids[: len(v.context) + len(v.kept)]
    frame = widget.stacks[0].children[0].value
    assert 'data-step="0"' in frame and f"verification 1 / {len(found)}" in frame
    with pytest.raises(ValueError, match="no verified guesses"):
        SpecStepper(engine.trace, "nobody", [], str)


def test_the_explorer_draws_every_rate_and_the_measured_points():
    measured = [{"label": "draft k=4", "alpha": 0.6, "tokens_per_pass": 2.3, "speedup": 1.4, "k": 4}]
    widget = AcceptanceExplorer(k=4, draft_cost=0.2, measured=measured)
    assert len(widget.stack.children) == len(widget.slider.options) == 21
    assert widget.slider.value == "α = 0.70"
    frame = render_expectations(0.5, 4, 0.2, measured)
    assert f"{expected_tokens_per_pass(0.5, 4):.2f} tokens per pass" in frame
    assert f"{expected_speedup(0.5, 4, 0.2):.2f}x" in frame and "draft k=4" in frame
    assert "draft k=4" not in render_expectations(0.5, 3, 0.2, measured)  # a point is drawn at its own k only
    with pytest.raises(ValueError):
        AcceptanceExplorer(k=0, draft_cost=0.2)
    with pytest.raises(ValueError, match="verify_cost"):
        AcceptanceExplorer(k=2, draft_cost=0.2, verify_cost=[1.0, 1.1])


def test_the_speedup_counts_the_verification_pass_and_crosses_one_once():
    assert expected_speedup(0.5, 2, 0.25, verify=1.5) == pytest.approx(1.75 / 2.0)
    where = break_even(4, 0.2, 1.3)  # a round costs 2.1 steps
    assert 0 < where < 1 and expected_tokens_per_pass(where, 4) == pytest.approx(2.1)
    assert expected_speedup(where - 0.01, 4, 0.2, 1.3) < 1 < expected_speedup(where + 0.01, 4, 0.2, 1.3)
    assert break_even(4, 1.0) is None  # 5 steps a round: not even 5 kept tokens repay it
    assert break_even(3, 0.0) == 0.0  # free guesses and a free verification: never slower


def test_the_fastest_k_weighs_tokens_against_costs():
    flat = [1.0] * 7
    assert speedups_by_k(0.8, 0.1, flat)[0] == 1.0  # k = 0 is plain decoding
    assert fastest_k(1.0, 0.1, flat) == 6  # every guess kept: the more the better
    assert fastest_k(0.1, 0.3, flat) == 0  # guesses rarely kept and dear: no speculation
    assert fastest_k(0.0, 0.0, flat) == 0  # a tie with plain decoding is not a gain
    s = speedups_by_k(0.8, 0.2, flat)
    assert fastest_k(0.8, 0.2, flat) == s.index(max(s)) and 0 < s.index(max(s)) < 6


@pytest.mark.parametrize("k, cost, verify, words", [
    (4, 0.2, 1.3, f"break-even at α = {break_even(4, 0.2, 1.3):.2f}"),
    (4, 1.0, 1.0, "no α pays"),
    (2, 0.0, 1.0, "never slower"),
])
def test_the_explorer_says_where_its_curve_crosses_the_dashed_line(k, cost, verify, words):
    verify_cost = [1.0] * 7
    verify_cost[k] = verify
    frame = render_expectations(0.5, k, cost, [], verify_cost=verify_cost)
    assert words in frame and break_even_words(k, cost, verify) in frame
    assert "below the dashed line: slower" not in frame  # the old fixed label
    assert ("break-even " in frame.split("</text>", 1)[1]) == words.startswith("break-even")


def test_the_explorer_sliders_redraw_every_frame():
    verify = [1.0, 1.2, 1.3, 1.4, 1.45, 1.5, 1.6]
    widget = AcceptanceExplorer(k=4, draft_cost=0.2, verify_cost=verify, start_alpha=0.5)
    assert "expected speedup, k = 4" in widget.stack.children[10].value
    assert "a pass over 5 tokens: 1.45 steps" in widget.stack.children[10].value
    widget.k_slider.value = 2
    assert all("expected speedup, k = 2" in view.value for view in widget.stack.children)
    assert "expected speedup, k = 2" in widget.still_html()
    widget.cost_slider.value = 0.5
    assert f"{expected_speedup(0.5, 2, 0.5, 1.3):.2f}x" in widget.stack.children[10].value
    widget.verify_choice.value = AcceptanceExplorer.GPU
    assert f"{expected_speedup(0.5, 2, 0.5, 1.0):.2f}x" in widget.stack.children[10].value
    best = fastest_k(0.5, 0.5, [1.0] * 7)
    assert ("fastest here: k = 0" if best == 0 else f"fastest here: k = {best}") in widget.stack.children[10].value


def test_the_explorer_says_what_its_plots_are_drawn_for_and_what_needs_the_kernel():
    """A learner walk moved k on the saved page and the plots stayed at k = 5 without a word."""
    widget = AcceptanceExplorer(k=4, draft_cost=0.23, verify_cost=[1.0, 1.2, 1.3, 1.4, 1.45, 1.5, 1.6])
    assert "k = 4</b>, <b>c = 0.23</b>, a pass over k+1 tokens as measured on this machine" in widget.drawn.value
    assert "without one they move, but the plots stay" in widget.drawn.value and widget.drawn in widget.children
    widget.k_slider.value, widget.verify_choice.value = 6, AcceptanceExplorer.GPU
    assert "k = 6</b>" in widget.drawn.value and AcceptanceExplorer.GPU in widget.drawn.value
    assert widget.still_html().startswith(widget.drawn.value)
    assert widget.verify_choice.style.button_width == "auto"  # labels are not cut short
