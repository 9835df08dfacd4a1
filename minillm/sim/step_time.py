"""A step's time as a function of what it runs, fitted from the engine's own trace (chapter 9).

    t(step) ≈ base + per_sequence · sequences + per_prompt_token · prompt tokens + per_context_token · context

`sequences`: requests that ran in the step (each decode is one token, and costs a row of every
matmul); `prompt tokens`: prefill (or chunk, or recomputation) tokens; `context`: the tokens the
step's requests attend to (their cached K/V, read by attention). Least squares over the recorded
steps gives the four coefficients; the residuals say how much of a step's time they leave out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minillm.trace import StepRecord, Trace

FEATURES = ("base", "per_sequence", "per_prompt_token", "per_context_token")


def step_features(sequences: int, prompt_tokens: int, context_tokens: int) -> list[float]:
    return [1.0, float(sequences), float(prompt_tokens), float(context_tokens)]


def features_of(record: StepRecord) -> list[float]:
    """The features of a recorded step: who ran, how many prompt tokens, how much context they read."""
    ran = [s for s in record.slots if s is not None and s.num_tokens > 0]
    context = sum(record.kv_tokens.get(s.request_id, 0) for s in ran)
    return step_features(len(ran), sum(record.prefill_tokens.values()), context)


@dataclass(frozen=True)
class StepTimeModel:
    base: float  # seconds per step, whatever it runs
    per_sequence: float
    per_prompt_token: float
    per_context_token: float

    def predict(self, sequences: int, prompt_tokens: int, context_tokens: int) -> float:
        # plain arithmetic: the simulator asks once per simulated step, a hundred thousand times a run
        seconds = (self.base + self.per_sequence * sequences + self.per_prompt_token * prompt_tokens
                   + self.per_context_token * context_tokens)
        return max(0.0, seconds)

    @classmethod
    def fit(cls, traces: list[Trace], busy_gap: float | None = None) -> tuple[StepTimeModel, np.ndarray]:
        """Least squares over every recorded step of the traces; returns the model and the residuals
        (measured - predicted, seconds, one per step).

        A step's time is its own duration — or, with `busy_gap`, the time until the next step began
        when that came within `busy_gap` seconds: then the work done between steps (a server
        streaming tokens, taking requests) counts too, which is what a simulated clock must advance."""
        records, times = [], []
        for trace in traces:
            steps = list(trace.steps)
            for record, after in zip(steps, steps[1:] + [None]):
                if record.num_tokens == 0:
                    continue
                gap = after.start_time - record.start_time if after is not None else None
                records.append(record)
                times.append(gap if busy_gap is not None and gap is not None and gap - record.duration <= busy_gap
                             else record.duration)
        if len(records) < len(FEATURES):
            raise ValueError(f"need at least {len(FEATURES)} recorded steps to fit {len(FEATURES)} coefficients, "
                             f"got {len(records)}")
        x = np.array([features_of(r) for r in records])  # (steps, 4)
        y = np.array(times)  # (steps,)
        if not np.isfinite(y).all():
            raise ValueError(f"{int((~np.isfinite(y)).sum())} recorded step times are not finite numbers")
        coefficients, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
        if rank < len(FEATURES):  # e.g. every step the same batch, or no prompt ever: a coefficient is a guess
            raise ValueError(f"the steps cannot tell the {len(FEATURES)} coefficients apart (rank {rank}): record "
                             "steps that vary in batch size, prompt tokens and context")
        model = cls(*(float(c) for c in coefficients))
        return model, y - x @ coefficients
