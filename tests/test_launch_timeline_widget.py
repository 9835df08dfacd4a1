"""minillm/graphs/step_profile.py and widgets/launch_timeline.py: a real profiled step keeps the
operators the host dispatched (a compiled region replaced by the calls it still makes), survives a
JSON round trip, and the widget draws exactly the operators launched by its cursor's time."""

import pytest

from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.graphs.step_profile import Span, StepProfile, load_profiles, profile_step, save_profiles
from minillm.sampling import SamplingParams
from tests.hf_reference import ByteTokenizer
from widgets.launch_timeline import KINDS, LaunchTimeline, kind_of, render_frame


def test_a_real_eager_step_is_hundreds_of_top_level_operators(model, tmp_path):
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(kv="paged", max_num_seqs=2, max_model_len=64))
    engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True))
    engine.step()  # the prefill
    profile = profile_step(engine.step, "eager")
    while engine.has_unfinished():
        engine.step()
    names = [s.name for s in profile.host]
    assert profile.num_host_ops > 50 and not profile.compiled and not profile.device  # a CPU, no compile
    # qkv, o, gate_up, down; the LM head (on CPU oneDNN's packed matmul, minillm/model/linear.py; else aten::linear)
    assert sum(n in ("aten::linear", "mkldnn::_linear_pointwise") for n in names) == 4 * model.config.num_layers + 1
    assert "aten::addmm" not in names  # called inside aten::linear: not a top-level bar of its own
    starts = [s.start_us for s in profile.host]
    assert starts == sorted(starts) and starts[0] >= 0 and profile.host[-1].start_us <= profile.wall_us
    save_profiles([profile], tmp_path / "trace.json")
    assert load_profiles(tmp_path / "trace.json") == [profile]


def test_a_compiled_region_is_replaced_by_the_calls_it_makes(model):
    engine = LLMEngine(model, ByteTokenizer(), EngineConfig(kv="paged", max_num_seqs=2, max_model_len=64, compile=True,
                                                            graph_batch_sizes=(1,)))
    engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True))
    for _ in range(3):  # the prefill, then a decode that compiles bucket 1
        engine.step()
    profile = profile_step(engine.step, "compiled")
    while engine.has_unfinished():
        engine.step()
    assert engine.trace.steps[-1].recorded_batch == 1
    assert len(profile.compiled) == 1 and profile.compiled[0].name.startswith("Torch-Compiled Region")
    names = [s.name for s in profile.host]
    assert not any(n.startswith(("Torch-Compiled Region", "## Call CompiledFxGraph")) for n in names)
    assert sum("linear" in n for n in names) == 4 * model.config.num_layers + 1  # the pre-packed matmuls remain
    assert "aten::rms_norm" not in names and "aten::roll" not in names  # fused into generated loops
    region = profile.compiled[0]
    inside = [s for s in profile.host if region.start_us <= s.start_us <= region.start_us + region.duration_us]
    assert len(inside) >= 4 * model.config.num_layers


def _profile(label: str, spans: list[tuple[str, float, float]], wall: float, device=()) -> StepProfile:
    return StepProfile(label, wall, [Span(*s) for s in spans], [Span(*s) for s in device])


def test_frames_draw_the_operators_launched_by_the_cursor():
    eager = _profile("eager", [("aten::linear", 0, 40), ("aten::mul", 50, 5), ("aten::copy_", 60, 5),
                               ("aten::index_select", 70, 10)], 100)
    fast = _profile("graph", [("cudaGraphLaunch", 0, 8)], 30, device=[("ampere_sgemm", 10, 5), ("kernel_x", 16, 2)])
    early = render_frame([eager, fast], 55, 100)
    assert 'data-step="55"' in early and "2 of 4 operators launched" in early and "1 of 1 operators launched" in early
    assert early.count("<rect") - render_frame([eager, fast], -1, 100).count("<rect") == 2 + 1 + 2  # bars by t=55
    late = render_frame([eager, fast], 100, 100)
    assert "4 of 4 operators launched, step 0.10 ms — done" in late and "GPU kernels" in late
    for kind, (colour, _) in KINDS.items():
        assert colour in late and f">{kind}<" in late  # the legend
    assert kind_of("aten::linear") == kind_of("mkl::_mkl_linear") == "matmul"
    assert kind_of("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert kind_of("aten::rms_norm") == "element-wise" and kind_of("aten::view") == "book-keeping"


def test_the_widget_opens_on_the_whole_step_and_refuses_empty_profiles():
    eager = _profile("eager", [("aten::linear", 0, 40), ("aten::mul", 50, 5)], 100)
    widget = LaunchTimeline([eager, _profile("compiled", [("mkl::_mkl_linear", 0, 20)], 40)], frames=6)
    assert len(widget.slider.options) == 6 and widget.play.value == 5
    assert widget.slider.options[-1] == "t = 0.10 ms"
    short = LaunchTimeline([_profile("tiny", [("aten::mul", 0, 2)], 10)], frames=6)
    assert short.slider.options[1] == "t = 2 µs"  # in ms, the frames' labels would repeat
    assert len(LaunchTimeline([_profile("tiny", [("aten::mul", 0, 2)], 10)], frames=2000).slider.options) == 11
    assert "2 of 2 operators launched" in widget.stacks[0].children[-1].value
    with pytest.raises(ValueError, match="at least one recorded operator"):
        LaunchTimeline([_profile("empty", [], 10)])
