"""widgets/prefix_tree.py: the replay rebuilds exactly the engine's cache, and the pictures say it."""

import pytest

from minillm.config import EngineConfig
from minillm.engine import LLMEngine
from minillm.sampling import SamplingParams
from minillm.trace import StepRecord, Trace
from tests.hf_reference import ByteTokenizer
from tests.test_engine import paged_budget
from widgets.prefix_tree import CacheFrame, PrefixTreeWidget, TreeNode, layout, render_frame, replay


def decode(ids: list[int]) -> str:
    return "".join(chr(i) if 32 <= i < 127 else "?" for i in ids)


def run_shared(model, num_blocks: int = 12) -> LLMEngine:
    config = EngineConfig(kv="paged", block_size=4, max_num_seqs=3, max_model_len=64, prefix_cache=True,
                          kv_cache_bytes=paged_budget(model, 4, num_blocks))
    engine = LLMEngine(model, ByteTokenizer(), config)
    shared = [ord(c) for c in "The system says:"]  # 16 tokens: 4 full blocks
    for question in ("hi?", "who are you?", "bye", "a longer question here"):
        engine.add_request(shared + [ord(c) for c in question],
                           SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True))
        engine.step()
    while engine.has_unfinished():
        engine.step()
    return engine


def test_replay_ends_with_the_engines_own_cache(model):
    for num_blocks in (40, 12):  # roomy, then tight enough to evict
        engine = run_shared(model, num_blocks)
        final = replay(engine.trace)[-1]
        cache = engine.pool.cache
        assert {n.block for n in final.nodes} == set(cache.by_block)
        for node in final.nodes:
            entry = cache.by_block[node.block]
            assert node.token_ids == entry.token_ids
            assert node.parent == (entry.parent.block_id if entry.parent else -1)
            assert node.ref_count == 0  # nothing runs any more
        ranks = sorted((n.lru_rank, n.block) for n in final.nodes)
        assert [b for _, b in ranks] == list(engine.pool.evictable)  # the eviction queue, in order
    assert any(f.evicted for f in replay(engine.trace)), "the tight pool was meant to evict"


def test_a_hit_lights_up_its_path_and_is_counted(model):
    frames = replay(run_shared(model).trace)
    second = next(f for f in frames if "1" in f.admitted)
    assert second.cache_hits == {"1": 16} and len(second.hit_blocks) == 4
    page = render_frame(second, decode, last_step=frames[-1].step)
    assert "request 1 admitted, 16 tokens found cached" in page
    assert page.count("stroke=\"#e67e22\"") == 4  # the four shared blocks drawn with the hit colour
    assert "held by 2" in page
    assert f"data-step='{second.step}'" in page  # the browser test finds each frame's picture by its step


def test_layout_gives_each_branch_a_row():
    nodes = [TreeNode(0, -1, (1,), 1, None), TreeNode(1, 0, (2,), 1, None), TreeNode(2, 1, (3,), 0, 0),
             TreeNode(3, 0, (4,), 0, 1), TreeNode(4, -1, (5,), 0, 2)]
    assert layout(nodes) == {0: (0, 0), 1: (1, 0), 2: (2, 0), 3: (1, 1), 4: (0, 2)}


def test_an_empty_cache_and_a_long_one_render_with_a_note():
    empty = CacheFrame(0, (), (), {}, (), (), ())
    assert "nothing cached yet" in render_frame(empty, decode)
    many = tuple(TreeNode(b, -1, (65,), 0, b) for b in range(20))
    assert "and 6 more branches" in render_frame(CacheFrame(1, many, (), {}, (), (), ()), decode)


def test_the_widget_animates_the_steps_where_the_cache_changed(model):
    engine = run_shared(model)
    widget = PrefixTreeWidget(engine.trace, decode)
    assert len(widget.stacks[0].children) == len(widget.slider.options) > 3
    pictures = {child.value for child in widget.stacks[0].children}
    assert len(pictures) == len(widget.stacks[0].children)  # every frame shows something new
    assert widget.slider.options[0].startswith("step 0 /")
    last = engine.trace.steps[-1].step
    assert widget.slider.options[-1] == f"step {last} / {last}", "the slider must end where the trace ends"
    assert "viewBox=" in widget.still_html() and "max-width:100%" in widget.still_html()  # fits a narrow page
    assert "The system says" not in widget.still_html()  # blocks are cut at 4 tokens: "The ", "syst", ...
    assert "syst" in widget.still_html()


def test_the_widget_refuses_a_trace_without_cache_events_or_with_dropped_steps(model):
    config = EngineConfig(kv="paged", block_size=4, max_num_seqs=2, max_model_len=64,
                          kv_cache_bytes=paged_budget(model, 4, 20))
    engine = LLMEngine(model, ByteTokenizer(), config)
    engine.add_request([5, 6, 7, 8, 9], SamplingParams(temperature=0, max_new_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    with pytest.raises(ValueError, match="prefix_cache=True"):
        PrefixTreeWidget(engine.trace, decode)
    dropped = Trace(1, [StepRecord(5, 0.0, 0.0, (None,), (), ())], num_dropped=5)
    with pytest.raises(ValueError, match="dropped"):
        replay(dropped)


def test_an_abort_after_the_last_step_is_in_the_replay(model):
    """Found by a probe: blocks released by an abort between steps never reached the trace, so the replay
    ended with them still held."""
    config = EngineConfig(kv="paged", block_size=4, max_num_seqs=2, max_model_len=64, prefix_cache=True,
                          kv_cache_bytes=paged_budget(model, 4, 32))
    engine = LLMEngine(model, ByteTokenizer(), config)
    request = engine.add_request(list(range(40, 53)), SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True))
    for _ in range(3):
        engine.step()
    engine.abort(request.request_id)  # no step follows
    final = replay(engine.trace)[-1]
    assert all(n.ref_count == 0 for n in final.nodes)
    assert [n.block for n in sorted(final.nodes, key=lambda n: n.lru_rank)] == list(engine.pool.evictable)
    assert engine.trace.steps[-1].blocks == {} and not engine.pool.events


# ----------------------------------------------------------------------------- n samples: fork and copy on write


def run_forked(model, prompt_len: int = 10, num_blocks: int = 24) -> LLMEngine:
    """Three samples of one prompt of `prompt_len` tokens, in blocks of 4 (10 tokens: two full blocks and a
    partial one of 2 tokens)."""
    config = EngineConfig(kv="paged", block_size=4, max_num_seqs=4, max_model_len=64, prefix_cache=True,
                          kv_cache_bytes=paged_budget(model, 4, num_blocks))
    engine = LLMEngine(model, ByteTokenizer(), config)
    engine.add_request([ord(c) for c in "Tell me a story"[:prompt_len]],
                       SamplingParams(n=3, temperature=0.8, seed=3, max_new_tokens=6, ignore_eos=True),
                       request_id="q")
    while engine.has_unfinished():
        engine.step()
    return engine


def test_a_fork_shows_each_samples_table_sharing_the_parents_blocks(model):
    frames = replay(run_forked(model).trace)
    (fork,) = [f for f in frames if f.forks]
    assert fork.forks == (("q#1", "q"), ("q#2", "q"))
    tables = dict(fork.tables)
    assert tables["q"] == tables["q#1"] == tables["q#2"] and len(tables["q"]) == 3
    page = render_frame(fork, decode, last_step=frames[-1].step)
    assert "q#1, q#2 forked from q, sharing its 3 blocks" in page
    assert page.count("shared ×3") == 9  # three rows of three shared blocks
    assert "class=\"block-tables\"" in page
    full = [n for n in fork.nodes if n.ref_count == 3]  # the two full prompt blocks, cached and held by three
    assert len(full) == 2 and page.count('fill="#8e44ad"') == 2 + 9  # marked in the tree and in the tables


def test_copy_on_write_shows_the_copy_beside_its_source(model):
    engine = run_forked(model)
    frames = replay(engine.trace)
    (fork,) = [f for f in frames if f.forks]
    (cow,) = [f for f in frames if f.copies]
    source = dict(fork.tables)["q"][2]  # the partly filled last prompt block
    step = next(s for s in engine.trace.steps if s.step == cow.step)
    assert cow.copies == tuple(tuple(e[1:]) for e in step.kv_events if e[0] == "copy")
    (_, first), (_, second) = cow.copies
    assert [s for s, _ in cow.copies] == [source, source]
    tables = dict(cow.tables)
    assert (tables["q"][2], tables["q#1"][2], tables["q#2"][2]) == (first, second, source)  # the last holder keeps it
    assert tables["q"][:2] == tables["q#1"][:2] == tables["q#2"][:2] == dict(fork.tables)["q"][:2]  # still shared
    page = render_frame(cow, decode)
    assert f"copy on write: #{source} → #{first} (q), #{source} → #{second} (q#1)" in page
    assert page.count(f"copy of #{source}") == 2
    assert page.count('stroke="#c0392b" stroke-width="3"') == 2  # the two copies, in the column of their source
    assert page.count('stroke-dasharray="4 2"') == 1  # the source, in q#2's row
    widget = PrefixTreeWidget(engine.trace, decode)
    assert cow.step in [frames[i].step for i in widget.frame_steps]
    assert f"data-step='{cow.step}'" in widget.still_html()  # the still picture is the copy-on-write moment


def test_a_prompt_ending_on_a_block_boundary_forks_without_a_copy(model):
    frames = replay(run_forked(model, prompt_len=8).trace)
    assert any(f.forks for f in frames) and not any(f.copies for f in frames)
    assert "copy on write" not in "".join(render_frame(f, decode) for f in frames)


def test_older_traces_render_as_before(model):
    """A trace without forks: frames carry no tables, and the picture has no grid, no purple, no copy."""
    frames = replay(run_shared(model).trace)
    assert not any(f.shows_tables or f.tables or f.forks or f.copies for f in frames)
    for frame in frames:
        page = render_frame(frame, decode)
        assert "block-tables" not in page and "#8e44ad" not in page and "#c0392b" not in page
        assert "forked" not in page and "copied on write" not in page
    assert any("held by 2" in render_frame(f, decode) for f in frames)  # shared by hits: green, as before


def test_the_end_of_a_fork_says_nobody_shares_any_more(model):
    last = replay(run_forked(model).trace)[-1]
    assert last.shows_tables and not last.tables
    assert "no running sequence shares a block now" in render_frame(last, decode)
