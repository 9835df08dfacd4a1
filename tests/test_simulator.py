"""minillm/sim/: the simulator runs the engine's own scheduler, so for the same requests it takes the
engine's steps exactly (the same composition, step by step, with preemption, chunks and prefix
hits); its clock follows the step-time model; the model fitted on a trace explains that trace."""

import numpy as np
import pytest

from minillm.config import EngineConfig, SpeculativeConfig
from minillm.engine import LLMEngine
from minillm.sampling import SamplingParams
from minillm.sim import SimRequest, SimSpeculation, StepTimeModel, simulate
from minillm.sim.step_time import features_of
from tests.hf_reference import ByteTokenizer, make_checkpoint
from tests.test_engine import paged_budget

CONSTANT = StepTimeModel(base=1.0, per_sequence=0.0, per_prompt_token=0.0, per_context_token=0.0)


def engine_steps(model, config: EngineConfig, workload: list[SimRequest]) -> tuple[list, LLMEngine]:
    engine = LLMEngine(model, ByteTokenizer(), config)
    for i, spec in enumerate(workload):
        prompt = [7] * spec.shared_prefix_len + [1000 + (i * 7919 + j) % 100_000 for j in
                                                 range(spec.prompt_len - spec.shared_prefix_len)]
        engine.add_request([t % 256 for t in prompt],
                           SamplingParams(temperature=0, max_new_tokens=spec.output_len, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    return [(s.decode_tokens, sum(s.prefill_tokens.values())) for s in engine.trace.steps], engine


@pytest.mark.parametrize("overrides", [{}, {"chunked_prefill": True, "max_tokens_per_prefill_chunk": 8},
                                       {"prefix_cache": True}])
def test_the_simulator_takes_the_engines_steps(model, overrides):
    workload = [SimRequest(0.0, 10 + 3 * i, 6 + 5 * (i % 3), shared_prefix_len=8 if i % 2 else 0) for i in range(6)]
    config = EngineConfig(max_num_seqs=3, max_model_len=64, kv="paged", block_size=4,
                          kv_cache_bytes=paged_budget(model, 4, 14), **overrides)  # small: preemptions
    real, engine = engine_steps(model, config, workload)
    sim = simulate(workload, config, CONSTANT, max_model_len=64, num_blocks=engine.pool.num_blocks)
    assert [(d, p) for _, _, d, p in sim.steps] == real
    assert sim.preemptions == engine.num_preemptions > 0  # the pool is small enough to preempt
    assert len(sim.metrics) == len(workload)


def test_speculation_always_right_takes_the_engines_steps(model, tmp_path):
    """With the target as its own draft every greedy guess is kept: acceptance 1 in the simulator
    must then fit the same guesses into the same steps as the engine (budget, blocks, output ends)."""
    make_checkpoint("qwen3", tmp_path, seed=3)
    workload = [SimRequest(0.0, 10 + 3 * i, 5 + 4 * (i % 3)) for i in range(5)]
    config = EngineConfig(max_num_seqs=3, max_model_len=64, kv="paged", block_size=4, max_tokens_per_step=40,
                          kv_cache_bytes=paged_budget(model, 4, 40),
                          speculative=SpeculativeConfig("draft", 3, str(tmp_path)))
    _, engine = engine_steps(model, config, workload)
    real = [(sum(1 for x in s.slots if x is not None and x.phase == "decode"),
             sum(x.num_tokens for x in s.slots if x is not None and (x.phase == "prefill" or x.num_tokens > 1)))
            for s in engine.trace.steps]
    assert engine.speculative_metrics["acceptance_rate"] == 1.0
    sim = simulate(workload, config, CONSTANT, max_model_len=64, num_blocks=engine.pool.num_blocks,
                   speculation=SimSpeculation(k=3, acceptance=1.0, draft_cost=0.0))
    assert [(d, p) for _, _, d, p in sim.steps] == real
    assert [m.num_tokens for m in sim.metrics] == [w.output_len for w in workload]


def test_speculation_yields_the_expected_tokens_per_pass():
    """Each guess kept with probability a until the first refusal: (1 - a^(k+1)) / (1 - a) tokens a pass."""
    workload = [SimRequest(0.0, 8, 400) for _ in range(8)]
    config = EngineConfig(max_num_seqs=8, max_model_len=512)
    plain = simulate(workload, config, CONSTANT, max_model_len=512)
    for acceptance in (0.0, 0.5, 0.8, 1.0):
        k = 4
        run = simulate(workload, config, CONSTANT, max_model_len=512,
                       speculation=SimSpeculation(k=k, acceptance=acceptance, draft_cost=0.0, seed=1))
        passes = sum(d for _, _, d, _ in run.steps)
        expected = k + 1 if acceptance == 1.0 else (1 - acceptance ** (k + 1)) / (1 - acceptance)
        assert sum(m.num_tokens for m in run.metrics) == 8 * 400  # never a token past the output length
        assert sum(m.num_tokens for m in run.metrics) / passes == pytest.approx(expected, rel=0.05)
        assert (run.wall < plain.wall) == (acceptance > 0)
    slow = simulate(workload, config, CONSTANT, max_model_len=512, speculation=SimSpeculation(k=4, acceptance=0.5))
    fast = simulate(workload, config, CONSTANT, max_model_len=512,
                    speculation=SimSpeculation(k=4, acceptance=0.5, draft_cost=0.0))
    assert len(slow.steps) == len(fast.steps) and slow.wall == pytest.approx(fast.wall * 1.8, rel=0.05)  # 1 + 4 x 0.2
    for bad in ({"k": 0}, {"acceptance": 1.5}, {"acceptance": float("nan")}, {"draft_cost": -1.0}):
        with pytest.raises(ValueError):
            SimSpeculation(**bad)


def test_the_clock_follows_the_step_time_model():
    config = EngineConfig(max_num_seqs=2, max_model_len=64)
    one = simulate([SimRequest(0.5, 10, 4)], config, CONSTANT, max_model_len=64)
    m = one.metrics[0]
    assert m.ttft == pytest.approx(1.0) and m.tpot == pytest.approx(1.0) and m.latency == pytest.approx(4.0)
    model = StepTimeModel(0.01, 0.002, 0.0001, 0.0)
    two = simulate([SimRequest(0.0, 20, 3), SimRequest(100.0, 20, 3)], config, model, max_model_len=64)
    assert two.metrics[1].ttft == pytest.approx(0.01 + 0.002 + 20 * 0.0001)  # the server was idle when it came
    assert two.queue[-1] == (two.wall, 0, 0)


def test_a_fitted_model_explains_its_own_trace(model):
    config = EngineConfig(max_num_seqs=4, max_model_len=64, kv="paged", block_size=8,
                          kv_cache_bytes=paged_budget(model, 8, 40))
    _, engine = engine_steps(model, config, [SimRequest(0.0, 5 + 7 * i, 10 + i) for i in range(8)])
    fitted, residuals = StepTimeModel.fit([engine.trace])
    durations = np.array([s.duration for s in engine.trace.steps if s.num_tokens])
    assert len(residuals) == len(durations)
    predicted = durations - residuals
    x = np.array([features_of(s) for s in engine.trace.steps if s.num_tokens])
    np.testing.assert_allclose(predicted, x @ [fitted.base, fitted.per_sequence, fitted.per_prompt_token,
                                               fitted.per_context_token], rtol=1e-6, atol=1e-9)
    assert abs(residuals.mean()) < 1e-6  # least squares with an intercept: residuals average to zero
    with pytest.raises(ValueError, match="at least 4"):
        StepTimeModel.fit([])


def _lab_servers() -> dict:
    from exercises.grading.ch09 import CAUSE_OF, UNSEEN
    from minillm.sim import lab

    return {name: (lab.SERVERS[name], cause) for name, cause in CAUSE_OF.items()} | UNSEEN


def test_every_lab_server_was_healthy_until_one_setting_went_wrong_and_only_its_fix_works():
    """Each server met its SLO with its healthy settings, misses it with the one wrong, and of the four
    causes' fixes only its own cause's meets it again: the symptoms have one answer."""
    from minillm.sim import lab

    fixes = {lab.CAUSES[0]: {"max_num_seqs": 512}, lab.CAUSES[1]: {"num_blocks": 32_768},
             lab.CAUSES[2]: {"chunked_prefill": True, "max_tokens_per_prefill_chunk": 128},
             lab.CAUSES[3]: {"prefix_cache": True}}
    wrong_of = dict(zip(lab.CAUSES, ("max_num_seqs", "num_blocks", "chunked_prefill", "prefix_cache")))
    for name, (server, cause) in _lab_servers().items():
        assert not lab.meets_slo(server), f"{name} meets its SLO as it is: nothing to diagnose"
        seed = next(seed for seed in range(1, 50) if lab.build_server(wrong_of[cause], seed, server.slo) == server)
        healthy = dict(lab._draw(wrong_of[cause], seed)[1])
        settings = dict(server.settings)
        assert sum(settings[key] != healthy[key] for key in ("max_num_seqs", "num_blocks", "chunked_prefill",
                                                             "prefix_cache")) == 1, name
        assert lab.meets_slo(server, healthy), f"{name} missed its SLO even before its setting went wrong"
        for other, fix in fixes.items():
            if other != cause and any(settings[key] != value for key, value in fix.items()):
                assert not lab.meets_slo(server, fix), f"{name} ({cause}) is also fixed by {fix}"


def test_each_cause_has_several_servers_unlike_each_other_and_the_dashboards_show_no_setting():
    from minillm.sim import lab

    servers = _lab_servers()
    for cause in lab.CAUSES:
        mine = [server for server, of in servers.values() if of == cause]
        assert len(mine) >= 3 and len({server.workload for server in mine}) == len(mine)
        assert len({server.rate for server in mine}) == len(mine)
    assert not set(lab.DASHBOARD) & set(lab.SETTINGS)
    board = lab.dashboard("server_c")
    assert list(board) == list(lab.DASHBOARD)
    for setting in lab.SETTINGS:
        with pytest.raises(KeyError, match="a dashboard shows symptoms, not settings"):
            board[setting]
        with pytest.raises(KeyError, match="not settings"):
            board.copy().get(setting, 16)
    for cause in lab.CAUSES:  # what the notebook prints of a server never names its cause nor shows its settings
        assert all(cause not in repr(server) and "max_num_seqs" not in repr(server) for server in lab.SERVERS.values())
    board["ttft_p99_s"] = 0.0  # the learner's copy: the lab's own numbers stay
    assert lab.dashboard("server_c")["ttft_p99_s"] > 0


def test_the_lab_checks_every_fix_and_an_empty_answer_fails():
    from exercises.grading import run
    from minillm.sim import lab

    for bad, error, message in (({"num_blocks": "512"}, TypeError, "an integer"),
                                ({"num_blocks": 512.0}, TypeError, "an integer"),
                                ({"max_num_seqs": True}, TypeError, "an integer"),
                                ({"prefix_cache": 1}, TypeError, "True or False"),
                                ({"num_blocks": 10**9}, ValueError, r"\[16, 65536\]"),
                                ({"max_tokens_per_prefill_chunk": 1}, ValueError, r"\[16, 8192\]"),
                                ({"max_num_seqs": 0}, ValueError, r"\[1, 1024\]"),
                                ({"temperature": 0}, ValueError, "settings you can change"),
                                ("max_num_seqs=4", TypeError, "a dict")):
        with pytest.raises(error, match=message):
            lab.run("server_c", bad)
    with pytest.raises(ValueError, match="the lab's servers"):
        lab.run("Server_C")
    assert lab.check_fix({"num_blocks": np.int64(512)}) == {"num_blocks": 512}
    results = run("ch09.diagnose", lambda dashboard: {})
    assert results and not any(r.passed for r in results)


def test_the_grader_judges_the_cause_before_the_fix():
    from exercises.grading import run
    from exercises.grading.ch09 import CAUSE_OF, UNSEEN

    def causes_only(dashboard):
        return {"cause": _cause_of(dashboard, CAUSE_OF, UNSEEN), "fix": None}

    results = run("ch09.diagnose", causes_only)
    assert len(results) == len(CAUSE_OF) + len(UNSEEN)
    assert all(not r.passed and "(the cause is right): expected a dict {setting: value}" in r.message for r in results)


def test_a_wrong_cause_is_answered_with_the_symptom_that_rules_it_out_not_with_the_answer():
    from exercises.grading import run
    from exercises.grading.ch09 import CAUSE_OF, SLOTS
    from minillm.sim import lab

    results = run("ch09.diagnose", lambda dashboard: {"cause": SLOTS, "fix": {"max_num_seqs": 32}})
    server_a = next(r.message for r in results if "'server_a'" in r.message)
    assert "preemptions and KV use up to 100% while at most" in server_a
    assert "the slots were not what ran out" in server_a
    wrong = [r.message for r in results if not r.passed and "['cause']" in r.message]
    assert len(wrong) == sum(cause != SLOTS for cause in CAUSE_OF.values()) + 4  # the unseen ones too
    assert all("which the dashboard rules out: " in m and not any(c in m.split("got")[-1] for c in lab.CAUSES[1:])
               for m in wrong)


def _cause_of(dashboard, cause_of: dict, unseen: dict) -> str:
    """The grader's answer for the server whose dashboard this is (a test's shortcut, not a diagnosis)."""
    from minillm.sim import lab

    for name, cause in cause_of.items():
        if lab.dashboard(name) == dashboard:
            return cause
    return next(cause for server, cause in unseen.values() if lab.dashboard(server) == dashboard)


def test_the_simulator_refuses_what_the_engine_refuses(model):
    """The door's rules (scheduler/admission.py) are one function for both: a request that can never
    fit is refused at once, never queued ahead of the others, and one longer than the context stops
    where the context is full."""
    config = EngineConfig(max_num_seqs=2, max_model_len=64, kv="paged", block_size=4,
                          kv_cache_bytes=paged_budget(model, 4, 6))  # 24 tokens of KV
    engine = LLMEngine(model, ByteTokenizer(), config)
    workload = [SimRequest(0.0, 30, 4), SimRequest(0.0, 8, 4), SimRequest(0.1, 10, 60), SimRequest(0.2, 70, 2)]
    for spec in workload:
        refused_by_engine = False
        try:
            request = engine.add_request([5] * spec.prompt_len,
                                         SamplingParams(temperature=0, max_new_tokens=spec.output_len))
            engine.abort(request.request_id)  # only its admission is compared
        except ValueError:
            refused_by_engine = True
        alone = simulate([spec], config, CONSTANT, max_model_len=64, num_blocks=engine.pool.num_blocks)
        assert (alone.refused == 1) == refused_by_engine and len(alone.metrics) == 1 - alone.refused
    together = simulate(workload, config, CONSTANT, max_model_len=64, num_blocks=engine.pool.num_blocks)
    assert together.refused == 3 and together.metrics[0].ttft == pytest.approx(1.0)  # nobody blocked the queue
    wide = EngineConfig(max_num_seqs=2, max_model_len=64)
    capped = simulate([SimRequest(0.0, 60, 50)], wide, CONSTANT, max_model_len=64)
    assert capped.metrics[0].num_tokens == 4  # 60 + 4 = the context: the engine's stop rule
    for bad in (dict(arrival=float("nan")), dict(arrival=-1.0), dict(output_len=0), dict(prompt_len=2.5),
                dict(shared_prefix_len=20)):
        with pytest.raises(ValueError):
            SimRequest(**({"arrival": 0.0, "prompt_len": 10, "output_len": 5} | bad))


def test_a_fit_refuses_steps_that_cannot_tell_the_coefficients_apart():
    from minillm.trace import SlotState, StepRecord, Trace

    def trace(durations, batch) -> Trace:
        steps = [StepRecord(i, 0.02 * i, d, tuple(SlotState(f"r{j}", 1, "decode") for j in range(batch(i))), (), (),
                            kv_tokens={f"r{j}": 10 + i for j in range(batch(i))}) for i, d in enumerate(durations)]
        return Trace(num_slots=4, steps=steps)

    with pytest.raises(ValueError, match="cannot tell the 4 coefficients apart"):
        StepTimeModel.fit([trace([0.01] * 20, lambda i: 2)])  # one batch size, no prompt: a guess
    with pytest.raises(ValueError, match="not finite"):
        StepTimeModel.fit([trace([0.01] * 3 + [float("nan")] + [0.01] * 16, lambda i: 1 + i % 3)])
