"""The engine under load without the model (chapter 9): a step-time model fitted from real traces,
and a discrete-event simulator that runs the real scheduler with it.

    step_time.py   StepTimeModel: a step's seconds from what it runs, by least squares on traces
    simulator.py   simulate(workload, config, step_time, ...): arrivals, the scheduler, the clock
    lab.py         the diagnosis lab: servers that miss their SLO, each for one reason, read from a dashboard
"""

from minillm.sim.simulator import SimRequest, SimResult, SimSpeculation, simulate
from minillm.sim.step_time import StepTimeModel

__all__ = ["SimRequest", "SimResult", "SimSpeculation", "StepTimeModel", "simulate"]
