"""Direct encoding of combining collectives with several destinations per chunk (allreduce).

The details: ``docs/encoding.md``, section "Combining collectives".
"""

from __future__ import annotations

import time
from collections import defaultdict

from collsynth.algorithm.model import Algorithm, Instance, Send, Step
from collsynth.collective.model import Collective
from collsynth.encoding.backend import Outcome, Status, run_interruptibly
from collsynth.encoding.problem import all_pairs_hops
from collsynth.errors import InputTooLargeError, SolverError
from collsynth.topology.model import Topology

__all__ = ["solve_combining_cpsat", "MAX_COMBINING_TERMS"]

#: Refuse direct combining encodings larger than this many auxiliary variables.
MAX_COMBINING_TERMS = 400_000


def solve_combining_cpsat(topology: Topology, collective: Collective, instance: Instance, *,
                          time_limit: float, num_workers: int = 4, seed: int = 0,
                          minimize_rounds: bool = False) -> tuple[Outcome, Algorithm | None]:
    """Solve the direct combining encoding with CP-SAT; return the outcome and the (unverified)
    algorithm when satisfiable."""
    try:
        from ortools.sat.python import cp_model
    except ImportError as exc:
        raise SolverError("the direct combining encoding needs OR-Tools (cpsat)") from exc
    started = time.perf_counter()
    n, S, A = topology.num_ranks, instance.steps, collective.num_chunks
    edges = [(s, d) for s, d, _ in topology.edges]
    size = A * len(edges) * n * S
    if size > MAX_COMBINING_TERMS:
        raise InputTooLargeError(
            f"the direct combining encoding of {collective.describe()} on {topology.name} with "
            f"{S} steps needs {size} variables; more than {MAX_COMBINING_TERMS}")
    hops = all_pairs_hops(topology)
    model = cp_model.CpModel()
    top = instance.total_rounds - S + 1
    rounds = [1] * S if top == 1 else [model.NewIntVar(1, top, f"rounds_{t}") for t in range(1, S + 1)]
    if top > 1 and minimize_rounds:
        model.Add(sum(rounds) <= instance.total_rounds)
        model.Minimize(sum(rounds))
    elif top > 1:
        model.Add(sum(rounds) == instance.total_rounds)

    # Literals are CP-SAT Booleans or the Python constants True/False (folded away here).
    # 1. has[a][r][u][t]: initial values, and False while u's contribution cannot have reached r.
    has: dict[tuple[int, int, int, int], object] = {}
    for a in range(A):
        contributors = collective.precondition[a]
        for r in range(n):
            for u in range(n):
                has[(a, r, u, 0)] = r == u and u in contributors
                for t in range(1, S + 1):
                    has[(a, r, u, t)] = (False if u not in contributors or hops[u][r] > t
                                         else model.NewBoolVar(f"has_{a}_{r}_{u}_{t}"))
    complete: dict[tuple[int, int, int], object] = {}

    def is_complete(a: int, r: int, t: int):
        if (a, r, t) not in complete:
            parts = [has[(a, r, u, t)] for u in collective.precondition[a]]
            if any(p is False for p in parts):
                complete[(a, r, t)] = False
            else:
                literals = [p for p in parts if p is not True]
                if not literals:
                    complete[(a, r, t)] = True
                else:
                    var = model.NewBoolVar(f"complete_{a}_{r}_{t}")
                    model.AddBoolAnd(literals).OnlyEnforceIf(var)
                    model.AddBoolOr([var] + [p.Not() for p in literals])
                    complete[(a, r, t)] = var
        return complete[(a, r, t)]

    red, cpy = {}, {}
    per_link_step: dict[tuple[int, int, int], list] = defaultdict(list)
    into: dict[tuple[int, int, int], list] = defaultdict(list)
    for a in range(A):
        contributors = collective.precondition[a]
        for t in range(1, S + 1):
            for s, d in edges:
                # 2. A sender must hold something: some contribution it may have by step t - 1.
                holding = [has[(a, s, u, t - 1)] for u in contributors]
                if not any(h is not False for h in holding):
                    continue
                r_var = model.NewBoolVar(f"reduce_{a}_from_{s}_to_{d}_at_{t}")
                red[(a, s, d, t)] = r_var
                if not any(h is True for h in holding):
                    model.AddBoolOr([h for h in holding if h is not False] + [r_var.Not()])
                per_link_step[(s, d, t)].append(r_var)
                into[(a, d, t)].append(("red", s, r_var))
                done = is_complete(a, s, t - 1) if t > 1 else False
                if done is not False:  # 2. a copy's sender is complete
                    c_var = model.NewBoolVar(f"copy_{a}_from_{s}_to_{d}_at_{t}")
                    cpy[(a, s, d, t)] = c_var
                    if done is not True:
                        model.AddImplication(c_var, done)
                    per_link_step[(s, d, t)].append(c_var)
                    into[(a, d, t)].append(("cpy", s, c_var))

    # 3. Disjoint reduces, exclusive copies, and the state update.
    for a in range(A):
        contributors = collective.precondition[a]
        for d in range(n):
            for t in range(1, S + 1):
                sends = into.get((a, d, t), [])
                copies = [v for kind, _, v in sends if kind == "cpy"]
                reduces = [(s, v) for kind, s, v in sends if kind == "red"]
                if copies:  # a copy is the only send into (a, d) in its step
                    model.Add(len(sends) * sum(copies) + sum(v for _, v in reduces) <= len(sends))
                for u in contributors:
                    new, old = has[(a, d, u, t)], has[(a, d, u, t - 1)]
                    carried = []
                    for s, v in reduces:
                        source = has[(a, s, u, t - 1)]
                        if source is False:
                            continue
                        if source is True:
                            carried.append(v)
                            continue
                        z = model.NewBoolVar(f"adds_{a}_{s}_{d}_{t}_{u}")
                        model.AddBoolAnd([v, source]).OnlyEnforceIf(z)
                        model.AddBoolOr([v.Not(), source.Not(), z])
                        carried.append(z)
                    # No contribution counted twice: at most one of old and the reduces carries u.
                    if old is True:
                        for z in carried:
                            model.Add(z == 0)
                    elif carried:
                        model.Add(sum(carried) + (old if old is not False else 0) <= 1)
                    inflow = carried + copies + ([old] if old is not False else [])
                    if new is False:
                        for var in inflow:
                            if var is True:
                                raise SolverError("internal: a contribution reached an impossible state")
                            model.Add(var == 0)
                        continue
                    if old is True:
                        model.Add(new == 1)
                        continue
                    model.AddBoolOr([new.Not()] + inflow)
                    for var in inflow:
                        model.AddImplication(var, new)

    # 4. Bandwidth per link and per group.
    for (s, d, t), group in per_link_step.items():
        bw = topology.links[s][d]
        if len(group) > bw:
            model.Add(sum(group) <= bw * rounds[t - 1])
    for group, covered in topology.effective_groups:
        for t in range(1, S + 1):
            members = [v for link in covered for v in per_link_step.get((*link, t), ())]
            if len(members) > group.limit:
                model.Add(sum(members) <= group.limit * rounds[t - 1])
    # 5. Every destination ends complete.
    for a in range(A):
        for r in collective.postcondition[a]:
            done = is_complete(a, r, S)
            if done is False:
                return Outcome(Status.UNSAT, seconds=time.perf_counter() - started,
                               detail=f"rank {r} cannot gather every contribution in {S} steps"), None
            if done is not True:
                model.Add(done == 1)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, float(time_limit))
    solver.parameters.num_workers = num_workers
    solver.parameters.random_seed = seed
    solver.parameters.use_feasibility_jump = True
    solver.parameters.catch_sigint_signal = False  # Ctrl-C is ours: see encoding/cpsat.py

    def work() -> tuple[Outcome, Algorithm | None]:
        code = solver.Solve(model)
        seconds = time.perf_counter() - started
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            outcome = Outcome(Status.SAT, seconds=seconds,
                              stats={"optimal": code == cp_model.OPTIMAL})
            return outcome, decoded()
        if code == cp_model.INFEASIBLE:
            return Outcome(Status.UNSAT, seconds=seconds,
                           detail="no algorithm whose copies carry complete values"), None
        if code == cp_model.MODEL_INVALID:
            raise SolverError(f"CP-SAT rejected the combining model: {model.Validate()}")
        return Outcome(Status.TIMEOUT if seconds >= time_limit * 0.95 else Status.UNKNOWN,
                       seconds=seconds), None

    def decoded() -> Algorithm:
        per_step: list[list[Send]] = [[] for _ in range(S)]
        for (a, s, d, t), v in red.items():
            if solver.BooleanValue(v):
                per_step[t - 1].append(Send(a, s, d, reduce=True))
        for (a, s, d, t), v in cpy.items():
            if solver.BooleanValue(v):
                per_step[t - 1].append(Send(a, s, d, reduce=False))
        values = [r if isinstance(r, int) else int(solver.Value(r)) for r in rounds]
        return Algorithm(
            name=f"{collective.name}-{topology.name}-s{S}-r{sum(values)}-c{instance.chunks}",
            topology=topology, collective=collective,
            steps=tuple(Step(v, tuple(sorted(x))) for v, x in zip(values, per_step)),
            provenance={"backend": "cpsat", "search": "direct combining",
                        "instance": instance.label()})

    # Decoded on the solver's thread, so that a schedule held when Ctrl-C stopped the search
    # reaches the caller in SolveInterrupted.partial.
    return run_interruptibly(work, solver.StopSearch)
