"""OR-Tools CP-SAT backend for the time-expanded encoding (:mod:`collsynth.encoding.problem`).

Every constraint family of the problem maps to linear 0-1 constraints; ``rounds[t]`` are small
integer variables. The search runs a fixed portfolio (``num_workers``) so results do not depend
on the machine's core count, with the feasibility-jump local search switched on explicitly: on
these models it finds satisfying schedules far sooner than tree search, and it is what made the
difference between 1 s and no answer in 120 s in our measurements (see ``benchmarks/``).
"""

from __future__ import annotations

import time

from collsynth.encoding.backend import Outcome, Status, run_interruptibly
from collsynth.encoding.problem import SchedulingProblem
from collsynth.errors import SolverError

__all__ = ["CpSatBackend"]


class CpSatBackend:
    """CP-SAT with a fixed portfolio of ``num_workers`` search workers."""

    name = "cpsat"

    def __init__(self, *, num_workers: int = 4, seed: int = 0) -> None:
        self.num_workers = num_workers
        self.seed = seed

    def available(self) -> bool:
        try:
            import ortools.sat.python.cp_model  # noqa: F401
        except ImportError:
            return False
        return True

    def solve(self, problem: SchedulingProblem, *, time_limit: float,
              minimize_rounds: bool = False) -> Outcome:
        """Solve ``problem``; with ``minimize_rounds`` the instance's rounds are an upper bound
        and the fewest total rounds are sought (``stats["optimal"]`` says if proven)."""
        try:
            from ortools.sat.python import cp_model
        except ImportError as exc:
            raise SolverError("the cpsat backend needs OR-Tools: pip install ortools") from exc
        started = time.perf_counter()
        if problem.trivially_infeasible:
            return Outcome(Status.UNSAT, seconds=time.perf_counter() - started,
                           detail=problem.trivially_infeasible)
        model = cp_model.CpModel()
        x = [model.NewBoolVar(f"send_{s.chunk}_from_{s.src}_to_{s.dst}_at_{s.step}")
             for s in problem.sends]
        S = problem.num_steps
        if problem.max_rounds_per_step == 1:
            rounds = [1] * S
        else:
            rounds = [model.NewIntVar(1, problem.max_rounds_per_step, f"rounds_{t}")
                      for t in range(1, S + 1)]
            # 5. The steps' rounds add up to the instance's rounds (at most, when minimising).
            if minimize_rounds:
                model.Add(sum(rounds) <= problem.total_rounds)
                model.Minimize(sum(rounds))
            else:
                model.Add(sum(rounds) == problem.total_rounds)
        # 1. A rank sends a chunk only after it has received it: holds[h][t] counts the arrivals
        #    of one (chunk, rank) up to step t (0 or 1, since it receives at most once).
        holds: dict[tuple[int, int], object] = {}

        def held(h: int, t: int):
            if (h, t) not in holds:
                arrived = sum(x[j] for j in problem.arrivals[h][t - 1])
                var = model.NewBoolVar(f"holds_{h}_{t}")
                model.Add(var == (held(h, t - 1) if t > 1 else 0) + arrived)
                holds[(h, t)] = var
            return holds[(h, t)]

        for i, h, t in problem.hold_before_send:
            model.Add(x[i] == 0) if h < 0 else model.Add(x[i] <= held(h, t))
        # 2. Every rank that needs a chunk receives it exactly once; others at most once.
        for group in problem.receive_exactly_once:
            model.AddExactlyOne(x[i] for i in group)
        for group in problem.receive_at_most_once:
            model.AddAtMostOne(x[i] for i in group)
        # 3. Per link and step, at most bandwidth x rounds chunks.
        for bandwidth, group in problem.link_capacity:
            step = problem.sends[group[0]].step
            model.Add(sum(x[i] for i in group) <= bandwidth * rounds[step - 1])
        # 4. Per bandwidth group and step, at most limit x rounds chunks.
        for limit, step, group in problem.group_capacity:
            model.Add(sum(x[i] for i in group) <= limit * rounds[step - 1])
        # 6. Scratch memory per rank.
        for _step, _rank, group, limit in problem.memory:
            model.Add(sum(x[i] for i in group) <= limit)
        # 7. Cut: far chunks arrive late, within the capacity of the remaining rounds.
        if problem.max_rounds_per_step > 1:
            for count, first, capacity in problem.arrival_cuts:
                model.Add(capacity * sum(rounds[first - 1:]) >= count)
        # 8. Symmetry: interchangeable chunks arrive in order at their first needing rank.
        for first, second in problem.symmetric_pairs:
            if first and second:
                model.Add(sum(problem.sends[i].step * x[i] for i in first)
                          <= sum(problem.sends[j].step * x[j] for j in second))

        # 9. Cut: each chunk is sent at least as often as it has needing ranks (and hops).
        for count, group in problem.min_sends:
            model.Add(sum(x[i] for i in group) >= count)
        # Symmetric search only: sends in one orbit of the automorphism are chosen together.
        for i, j in problem.orbit_ties:
            model.Add(x[i] == x[j])
        for i in problem.orbit_zero:
            model.Add(x[i] == 0)

        solver = cp_model.CpSolver()
        params = solver.parameters
        # The limit covers building the model too.
        params.max_time_in_seconds = max(0.01, float(time_limit)
                                         - (time.perf_counter() - started))
        params.num_workers = self.num_workers
        params.random_seed = self.seed
        params.use_feasibility_jump = True
        params.log_search_progress = False
        # Ctrl-C is ours (run_interruptibly calls StopSearch). CP-SAT's own handler would reset
        # SIGINT to "kill the process" after every solve and abort on a signal that reaches
        # another thread: Ctrl-C then lost every result found so far.
        params.catch_sigint_signal = False

        def work() -> Outcome:
            code = solver.Solve(model)
            seconds = time.perf_counter() - started
            if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                chosen = tuple(i for i, var in enumerate(x) if solver.BooleanValue(var))
                values = tuple(r if isinstance(r, int) else int(solver.Value(r)) for r in rounds)
                return Outcome(Status.SAT, chosen, values, seconds,
                               stats={"optimal": code == cp_model.OPTIMAL})
            if code == cp_model.INFEASIBLE:
                return Outcome(Status.UNSAT, seconds=seconds)
            if code == cp_model.MODEL_INVALID:
                raise SolverError(f"CP-SAT rejected the model: {model.Validate()}")
            status = Status.TIMEOUT if seconds >= time_limit * 0.95 else Status.UNKNOWN
            return Outcome(status, seconds=seconds)

        return run_interruptibly(work, solver.StopSearch)
