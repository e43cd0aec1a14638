"""The SMT *path* encoding (SCCL's) with z3: arrival times instead of a time-expanded network.

Variables, one named constructor per family:

* ``time[c][r]`` (integer): the step at the end of which rank ``r`` first holds chunk ``c``;
  ``0`` for ranks in the precondition, ``S + 1`` meaning "never".
* ``send[c][s][d]`` (Boolean): chunk ``c`` is sent over link ``s -> d`` (in step ``time[c][d]``).
* ``rounds[t]`` (integer): rounds of step ``t``.

It is built from the same pruned :class:`~collsynth.encoding.problem.SchedulingProblem` as the
other backends (the links a chunk may use, and the steps in which it may arrive), so the two z3
backends differ only in the encoding. In our measurements it is slower than the time-expanded
Boolean encoding (``z3``) and much slower than CP-SAT; it is kept as the reference formulation
of the literature and as a cross-check.
"""

from __future__ import annotations

import time
from collections import defaultdict

from collsynth.encoding.backend import Outcome, Status
from collsynth.encoding.problem import SchedulingProblem
from collsynth.encoding.z3 import check_within, import_z3, z3_available

__all__ = ["Z3PathBackend"]


class Z3PathBackend:
    """z3 over linear integer arithmetic, SCCL's path encoding."""

    name = "z3-path"

    def available(self) -> bool:
        return z3_available()

    def solve(self, problem: SchedulingProblem, *, time_limit: float) -> Outcome:
        z3 = import_z3(self.name)
        started = time.perf_counter()
        if problem.trivially_infeasible:
            return Outcome(Status.UNSAT, seconds=time.perf_counter() - started,
                           detail=problem.trivially_infeasible)
        if problem.orbit_ties or problem.orbit_zero:
            return Outcome(Status.UNKNOWN, detail="z3-path does not do symmetric search")
        ctx = z3.Context()
        solver = z3.SolverFor("QF_LIA", ctx=ctx)
        S, collective = problem.num_steps, problem.collective
        never = S + 1
        # Candidate links and arrival steps per (chunk, receiver), from the pruned problem.
        steps_of: dict[tuple[int, int, int], set[int]] = defaultdict(set)
        for x in problem.sends:
            steps_of[(x.chunk, x.src, x.dst)].add(x.step)
        arrival_steps: dict[tuple[int, int], set[int]] = defaultdict(set)
        for (c, _s, d), steps in steps_of.items():
            arrival_steps[(c, d)] |= steps

        times: dict[tuple[int, int], object] = {}

        def arrival(c: int, r: int):
            if r in collective.precondition[c]:
                return z3.IntVal(0, ctx)
            if (c, r) not in times:
                var = z3.Int(f"time_{c}_{r}", ctx)
                # time is "never" or one of the steps in which the chunk can arrive.
                options = sorted(arrival_steps.get((c, r), ()))
                solver.add(z3.Or([var == t for t in options] + [var == never], ctx))
                times[(c, r)] = var
            return times[(c, r)]

        send = {key: z3.Bool(f"send_{key[0]}_from_{key[1]}_to_{key[2]}", ctx) for key in steps_of}
        into: dict[tuple[int, int], list[tuple[int, object]]] = defaultdict(list)
        for (c, s, d), var in send.items():
            into[(c, d)].append((s, var))
        top = problem.max_rounds_per_step
        rounds = [z3.Int(f"rounds_{t}", ctx) for t in range(1, S + 1)]
        for r in rounds:
            solver.add(r >= 1, r <= top)
        # The steps' rounds add up to the instance's rounds.
        solver.add(z3.Sum(rounds) == problem.total_rounds)
        for c in range(collective.num_chunks):
            for r in range(collective.num_ranks):
                if r in collective.precondition[c]:
                    continue
                senders = into.get((c, r), [])
                t_r = arrival(c, r)
                # Ranks in the postcondition hold the chunk by the last step.
                if r in collective.postcondition[c]:
                    if not senders:
                        return Outcome(Status.UNSAT, seconds=time.perf_counter() - started,
                                       detail=f"no link can bring chunk {c} to rank {r}")
                    solver.add(t_r <= S)
                # A rank that holds the chunk received it from exactly one sender ...
                solver.add(z3.Implies(t_r <= S, z3.PbEq([(v, 1) for _, v in senders], 1)
                                      if senders else z3.BoolVal(False, ctx)))
                solver.add(z3.Implies(t_r > S, z3.And([z3.Not(v) for _, v in senders], ctx)))
                for s, var in senders:
                    # ... which held it in an earlier step.
                    solver.add(z3.Implies(var, arrival(c, s) < t_r))
        # Bandwidth: per link and per group, the chunks arriving in step t fit in its rounds.
        per_link: dict[tuple[int, int], list[tuple[int, object]]] = defaultdict(list)
        for (c, s, d), var in send.items():
            per_link[(s, d)].append((c, var))
        topology = problem.topology

        def arriving(members, t: int):
            return z3.Sum([z3.If(z3.And(var, arrival(c, d) == t), 1, 0)
                           for (c, d), var in members] or [z3.IntVal(0, ctx)])

        for (s, d), members in per_link.items():
            for t in range(1, S + 1):
                solver.add(arriving([((c, d), v) for c, v in members], t)
                           <= topology.links[s][d] * rounds[t - 1])
        for group, covered in topology.effective_groups:
            members = [((c, d), v) for (s, d) in covered for c, v in per_link.get((s, d), ())]
            for t in range(1, S + 1):
                solver.add(arriving(members, t) <= group.limit * rounds[t - 1])

        def chosen_sends(model) -> Outcome:
            index = {(x.chunk, x.src, x.dst, x.step): i for i, x in enumerate(problem.sends)}
            chosen = []
            for (c, s, d), var in send.items():
                if z3.is_true(model.eval(var, model_completion=True)):
                    t = model.eval(arrival(c, d), model_completion=True).as_long()
                    chosen.append(index[(c, s, d, t)])
            values = tuple(model.eval(r, model_completion=True).as_long() for r in rounds)
            return Outcome(Status.SAT, tuple(chosen), values)

        return check_within(z3, solver, chosen_sends, started, time_limit, ctx.interrupt)
