"""The batched sampler: one step's logits in, each row's next token out — every request's own
settings applied to the whole batch at once, in one fixed order, with one copy to the host:

    raw logits (rows, vocab) ──► logprobs reported from here (minillm/logprobs.py)
      ─► bias, penalties, min_tokens                       (minillm/logits_processors.py)
      ─► structured outputs: the grammars' bitmask          (minillm/structured/step_masks.py)
      ─► greedy rows: one argmax over every row
      ─► sampling rows: / temperature ─► top-k ─► top-p ─► min-p, each row with its own values
                        ─► softmax ─► one draw per row from the row's own seeded generator

The per-row values become (rows, 1) columns, so one kernel serves rows that differ; the result is
exactly what `minillm/sampling.py::filtered_logits` gives each row alone (and so what Hugging Face's
warpers give). Draws stay one per row — each request owns its generator, so a seeded request
draws the same tokens whoever shares its batch — but they are collected as tensors and copied to
the host once. Chapter 1's naive loop runs this same code with one row.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from minillm.logits_processors import RowHistory, process_logits
from minillm.sampling import SamplingParams
from minillm.structured.step_masks import StepMasks


@dataclass(frozen=True)
class SamplingRow(RowHistory):
    """One row to sample: its history (for the processors) and its request's generator."""

    generator: torch.Generator | None = None


def warp(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p, row i with params[i]'s values. logits: (rows, vocab)."""
    device, dtype = logits.device, logits.dtype
    temperatures = torch.tensor([p.temperature for p in params], dtype=dtype, device=device).unsqueeze(1)
    logits = logits / temperatures  # (rows, vocab)
    rows = [i for i, p in enumerate(params) if p.top_k is not None]
    if rows:  # the k-th largest value of each row; ties with it stay (HF's rule)
        ks = torch.tensor([min(params[i].top_k, logits.shape[-1]) - 1 for i in rows], device=device).unsqueeze(1)
        sub = logits[rows]
        kth = sub.topk(int(ks.max()) + 1, dim=-1).values.gather(1, ks)  # (len(rows), 1)
        logits[rows] = sub.masked_fill(sub < kth, float("-inf"))
    rows = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if rows:  # drop the least likely tokens whose total stays within 1 - p; the crossing one stays
        sub = logits[rows]
        sorted_logits, order = torch.sort(sub, dim=-1, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # 1 - p in double precision, then float32: the same threshold as the scalar rule's
        drop_sorted = cumulative <= torch.tensor([1 - params[i].top_p for i in rows], device=device).to(
            cumulative.dtype).unsqueeze(1)
        drop_sorted[..., -1:] = False  # always keep the most likely token
        logits[rows] = sub.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    rows = [i for i, p in enumerate(params) if p.min_p > 0.0]
    if rows:
        sub = logits[rows]
        probs = sub.softmax(dim=-1)
        min_p = torch.tensor([params[i].min_p for i in rows], dtype=probs.dtype, device=device).unsqueeze(1)
        logits[rows] = sub.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    return logits


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token id from one row of probabilities (vocab,), as a (1,) tensor left on the device."""
    return torch.multinomial(probs, 1, generator=generator)


class StepSampler:
    """A step's rows, processed once: the argmax of every row, and the distributions of the rows
    that sample. The runner reads tokens from it, or (speculative decoding) the rows' distributions."""

    def __init__(self, logits: torch.Tensor, rows: Sequence[SamplingRow], eos_token_ids: Collection[int],
                 masks: StepMasks | None = None):
        self.rows = rows
        processed = process_logits(logits.float(), rows, eos_token_ids)  # (rows, vocab)
        if masks is not None:  # after the penalties, before temperature and the filters
            if processed is logits:
                processed = processed.clone()  # the raw logits stay as they were: logprobs read them
            masks.apply(processed)
        self.failed_rows: dict[int, Exception] = {  # nothing to choose from: the row's request fails, alone
            row: ValueError("the structured output's grammar allows no token here: the vocabulary cannot continue "
                            "it") for row in (masks.dead_rows() if masks is not None else ())}
        self.argmax: list[int] = processed.argmax(dim=-1).tolist()
        sampling = [i for i, r in enumerate(rows) if not r.params.greedy]
        self._position = {row: j for j, row in enumerate(sampling)}
        self._probs = warp(processed[sampling], [rows[i].params for i in sampling]).softmax(dim=-1) if sampling \
            else None  # (len(sampling), vocab)

    def probs(self, first: int, count: int) -> torch.Tensor:
        """The distributions of rows first .. first + count - 1, all sampling rows: (count, vocab)."""
        start = self._position[first]
        return self._probs[start : start + count]

    def tokens(self, rows: Sequence[int]) -> tuple[dict[int, int], dict[int, Exception]]:
        """One token for each of `rows`: the argmax, or a draw with the row's generator. A draw that
        raises fails its row alone (the others' generators advance exactly as without it)."""
        draws, failed = {}, {row: self.failed_rows[row] for row in rows if row in self.failed_rows}
        for row in rows:
            if self.rows[row].params.greedy or row in failed:
                continue
            try:
                draws[row] = draw(self.probs(row, 1)[0], self.rows[row].generator)
            except Exception as err:
                failed[row] = err
        drawn = dict(zip(draws, torch.cat(list(draws.values())).tolist())) if draws else {}
        tokens = {row: drawn[row] if row in drawn else self.argmax[row] for row in rows if row not in failed}
        return tokens, failed


def sample_row(logits: torch.Tensor, row: SamplingRow, eos_token_ids: Collection[int]) -> int:
    """One row alone (vocab,): chapter 1's loops sample this way, with the engine's code."""
    tokens, failed = StepSampler(logits.unsqueeze(0), [row], eos_token_ids).tokens([0])
    if failed:
        raise failed[0]
    return tokens[0]
