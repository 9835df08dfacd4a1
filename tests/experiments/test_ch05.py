"""Chapter 5's live experiment holds or warns under load, and its words follow its numbers."""

from __future__ import annotations

import minillm
from experiments.ch05 import prefix_cache_ttft
from tests.cpu_hog import cpu_hog


def _prompts(count: int = 6) -> list[list[int]]:
    text = minillm.load_tokenizer().encode((minillm.ASSETS_DIR / "heldout_sample.txt").read_text())
    return [text[:160] + text[160 + 20 * i : 180 + 20 * i] for i in range(count)]


def test_under_a_cpu_hog_the_finding_holds_or_the_guard_fires():
    with cpu_hog():
        finding = prefix_cache_ttft(_prompts(), rounds=2)
    assert finding.warning or finding.holds, finding.text


def test_the_words_are_the_numbers():
    finding = prefix_cache_ttft(_prompts(), rounds=2)
    n = finding.numbers
    assert f"{n['ttft_without_s'] * 1e3:.0f} ms" in finding.text and f"{n['ttft_with_s'] * 1e3:.0f} ms" in finding.text
    assert (f"{n['speedup']:.1f}x sooner" in finding.text) == finding.holds
