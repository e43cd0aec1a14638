"""z3 backend for the time-expanded encoding (:mod:`collsynth.encoding.problem`).

A pure Boolean model (z3's finite-domain logic, ``QF_FD``): sends are Booleans, each step's rounds
a one-hot choice, and every linear constraint a pseudo-Boolean one. z3 is always installed, so
this backend is the fallback when OR-Tools is not. Pseudo-Boolean constraints are compiled with
``sat.pb.solver=binary_merge``; the ``sorting`` compilation once returned an assignment that broke
22 of 48 bandwidth constraints in our measurements, which is one reason every answer is replayed.
"""

from __future__ import annotations

import dataclasses
import time

from collsynth.encoding.backend import Outcome, Status, run_interruptibly
from collsynth.encoding.problem import SchedulingProblem
from collsynth.errors import SolverError

__all__ = ["Z3Backend", "z3_available", "import_z3", "check_within"]


def z3_available() -> bool:
    """True when z3-solver can be imported."""
    try:
        import z3  # noqa: F401
    except ImportError:
        return False
    return True


def import_z3(backend: str):
    """The z3 module, or a :class:`SolverError` saying which backend needs it."""
    try:
        import z3
    except ImportError as exc:
        raise SolverError(f"the {backend} backend needs z3-solver: pip install z3-solver") from exc
    return z3


class Z3Backend:
    """z3 QF_FD with pseudo-Boolean constraints."""

    name = "z3"

    def __init__(self, *, pb_solver: str = "binary_merge") -> None:
        self.pb_solver = pb_solver

    def available(self) -> bool:
        return z3_available()

    def solve(self, problem: SchedulingProblem, *, time_limit: float) -> Outcome:
        z3 = import_z3(self.name)
        started = time.perf_counter()
        if problem.trivially_infeasible:
            return Outcome(Status.UNSAT, seconds=time.perf_counter() - started,
                           detail=problem.trivially_infeasible)
        ctx = z3.Context()
        x = [z3.Bool(f"send_{s.chunk}_from_{s.src}_to_{s.dst}_at_{s.step}", ctx)
             for s in problem.sends]
        solver = z3.SolverFor("QF_FD", ctx=ctx)
        try:
            solver.set("sat.pb.solver", self.pb_solver)
        except z3.Z3Exception:  # older z3: keep its default compilation
            pass
        S, top = problem.num_steps, problem.max_rounds_per_step
        # one_hot[t][k-1]: step t (1-based) lasts k rounds.
        one_hot = [[z3.Bool(f"rounds_{t}_is_{k}", ctx) for k in range(1, top + 1)]
                   for t in range(1, S + 1)]
        for options in one_hot:
            solver.add(z3.PbEq([(v, 1) for v in options], 1))
        # 5. The steps' rounds add up to the instance's rounds.
        if top > 1:
            solver.add(z3.PbEq([(v, k) for options in one_hot for k, v in enumerate(options, 1)],
                               problem.total_rounds))
        # 1. A rank sends a chunk only after it has received it: holds[h][t] is "one of the
        #    arrivals of this (chunk, rank) happened by step t".
        holds: dict[tuple[int, int], object] = {}

        def held(h: int, t: int):
            if (h, t) not in holds:
                var = z3.Bool(f"holds_{h}_{t}", ctx)
                parts = [x[j] for j in problem.arrivals[h][t - 1]]
                if t > 1:
                    parts.append(held(h, t - 1))
                solver.add(var == z3.Or(parts, ctx) if parts else z3.Not(var))
                holds[(h, t)] = var
            return holds[(h, t)]

        for i, h, t in problem.hold_before_send:
            solver.add(z3.Not(x[i]) if h < 0 else z3.Implies(x[i], held(h, t)))
        # 2. Every rank that needs a chunk receives it exactly once; others at most once.
        for group in problem.receive_exactly_once:
            solver.add(z3.PbEq([(x[i], 1) for i in group], 1))
        for group in problem.receive_at_most_once:
            solver.add(z3.AtMost(*[x[i] for i in group], 1))

        def capacity(group: tuple[int, ...], per_round: int, step: int) -> None:
            for k, chosen_k in enumerate(one_hot[step - 1], 1):
                if per_round * k < len(group):
                    solver.add(z3.Implies(chosen_k, z3.AtMost(*[x[i] for i in group], per_round * k)))

        # 3. Per link and step, at most bandwidth x rounds chunks.
        for bandwidth, group in problem.link_capacity:
            capacity(group, bandwidth, problem.sends[group[0]].step)
        # 4. Per bandwidth group and step, at most limit x rounds chunks.
        for limit, step, group in problem.group_capacity:
            capacity(group, limit, step)
        # 6. Scratch memory per rank.
        for _step, _rank, group, limit in problem.memory:
            solver.add(z3.AtMost(*[x[i] for i in group], limit))
        # 7. Cut: far chunks arrive late, within the capacity of the remaining rounds.
        if top > 1:
            for count, first, cap in problem.arrival_cuts:
                terms = [(v, cap * k) for options in one_hot[first - 1:]
                         for k, v in enumerate(options, 1)]
                solver.add(z3.PbGe(terms, count))
        # 8. Symmetry: interchangeable chunks arrive in order at their first needing rank.
        for first, second in problem.symmetric_pairs:
            if first and second:
                terms = [(x[i], problem.sends[i].step) for i in first]
                terms += [(x[j], -problem.sends[j].step) for j in second]
                solver.add(z3.PbLe(terms, 0))

        # 9. Cut: each chunk is sent at least as often as it has needing ranks (and hops).
        for count, group in problem.min_sends:
            solver.add(z3.AtLeast(*[x[i] for i in group], count))
        # Symmetric search only: sends in one orbit of the automorphism are chosen together.
        for i, j in problem.orbit_ties:
            solver.add(x[i] == x[j])
        for i in problem.orbit_zero:
            solver.add(z3.Not(x[i]))

        def chosen_sends(model) -> Outcome:
            chosen = tuple(i for i, var in enumerate(x)
                           if z3.is_true(model.eval(var, model_completion=True)))
            rounds = tuple(
                next((k for k, v in enumerate(options, 1)
                      if z3.is_true(model.eval(v, model_completion=True))), 1)
                for options in one_hot)
            return Outcome(Status.SAT, chosen, rounds)

        return check_within(z3, solver, chosen_sends, started, time_limit, ctx.interrupt)


def check_within(z3, solver, read_model, started: float, time_limit: float, interrupt
                 ) -> Outcome:
    """Run ``solver.check()`` in what is left of ``time_limit`` seconds since ``started``
    (``time.perf_counter``), interruptibly; a sat answer becomes ``read_model(model)``'s
    outcome, timed. The limit covers building the constraints too: z3's own timeout only
    bounds ``check()``, so none left is a timeout before checking."""
    left = time_limit - (time.perf_counter() - started)
    if left <= 0:
        return Outcome(Status.TIMEOUT, seconds=time.perf_counter() - started,
                       detail="time limit reached while encoding")
    solver.set("timeout", max(1, int(left * 1000)))

    def work() -> Outcome:
        answer = solver.check()
        seconds = time.perf_counter() - started
        if answer == z3.sat:
            return dataclasses.replace(read_model(solver.model()), seconds=seconds)
        if answer == z3.unsat:
            return Outcome(Status.UNSAT, seconds=seconds)
        reason = solver.reason_unknown()
        status = Status.TIMEOUT if ("timeout" in reason or "canceled" in reason
                                    or seconds >= time_limit * 0.95) else Status.UNKNOWN
        return Outcome(status, seconds=seconds, detail=reason)

    return run_interruptibly(work, interrupt)
