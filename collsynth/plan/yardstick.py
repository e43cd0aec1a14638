"""One yardstick for a plan: the runtime's ring (and allreduce tree) and synthesized programs
after tuned lowering, simulated by the program model with the same constants.

The details: ``docs/plan.md``, section "Pricing".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from collsynth.errors import CollsynthError
from collsynth.export.pipeline import AUTO_CHANNELS
from collsynth.plan.choose import NCCL, PROGRAM_MODEL, Candidate, Sample, algorithm_detail
from collsynth.timing.runtime_baselines import (RING_COLLECTIVES, TREE_COLLECTIVES, baseline_rows,
                                               runtime_rings, runtime_tree)
from collsynth.timing.runtime_model import prepare_program, simulate_program
from collsynth.timing.tune import TunedExport, tune_export, tune_sizes

if TYPE_CHECKING:  # pragma: no cover - for annotations only
    from collsynth.algorithm.model import Algorithm
    from collsynth.runtimes import RuntimeConstants
    from collsynth.topology.model import Topology

__all__ = ["PLAN_SAMPLE_SIZES", "PLAN_BOUNDARY_STEPS", "PLAN_TUNE_LAYOUTS", "PLAN_TUNE_INSTANCES",
           "PLAN_TUNE_MAX_SENDS",
           "program_model_reason", "sample_sizes", "plan_layouts", "runtime_candidate",
           "tree_candidate", "tuned_candidate", "Pricer"]

#: Sizes every program-model plan samples besides the traced ones (every traced size is
#: sampled): 1 KiB .. 1 GiB in x16 steps; the boundaries between them are bisected.
PLAN_SAMPLE_SIZES = tune_sizes(1024, 1 << 30, 16)
#: Bisection steps that place a boundary between two sampled sizes: a x16 gap to within 5%.
PLAN_BOUNDARY_STEPS = 6
#: Layouts (channels, policy) a plan tunes per algorithm: the fewest channels that fit and the
#: next ones of ``AUTO_CHANNELS``. ``collsynth export --tune`` searches them all; a plan tunes
#: every synthesized algorithm of every planned collective, so it keeps the search short.
PLAN_TUNE_LAYOUTS = 3
#: Above this many sends an algorithm is tuned on one layout (the fewest channels that fit),
#: protocols only: lowering, checking and preparing a layout of a large program takes seconds.
PLAN_TUNE_MAX_SENDS = 4096
#: Instance counts a plan tunes: one. Instances multiply ``nchunksperloop``, so they would change
#: which traced calls the runtime gives the program.
PLAN_TUNE_INSTANCES = (1,)


def program_model_reason(topology: "Topology", collective: str) -> str | None:
    """``None`` when the program model can price ``collective`` on ``topology`` against the
    runtime's own ring; otherwise why not (the plan then uses the closed form)."""
    if collective not in RING_COLLECTIVES:
        return (f"{collective}: the runtime's own algorithm is not written as a program "
                f"(rings of {', '.join(RING_COLLECTIVES)} only)")
    if topology.unit_gbps is None:
        return f"topology {topology.name!r} has no physical figures (unit_gbps)"
    try:
        runtime_rings(topology)
    except CollsynthError as exc:
        return str(exc)
    return None


def sample_sizes(traced: Iterable[int]) -> tuple[int, ...]:
    """:data:`PLAN_SAMPLE_SIZES` and every traced size of at least one byte, ascending.

    >>> sample_sizes([3000, 0, 1024])[:3]
    (1024, 3000, 16384)
    """
    return tuple(sorted(set(PLAN_SAMPLE_SIZES) | {int(s) for s in traced if s >= 1}))


def plan_layouts(channels: int, channel_by: str, sends: int = 0
                 ) -> tuple[tuple[int, str], ...]:
    """The layouts a plan tunes for a program of ``sends`` sends: ``(channels, channel_by)``
    (the fewest that fit) and the next ones of ``AUTO_CHANNELS``, :data:`PLAN_TUNE_LAYOUTS` in
    all; that one alone above :data:`PLAN_TUNE_MAX_SENDS` sends.

    >>> plan_layouts(1, "chunk"), plan_layouts(2, "peer", sends=10**5)
    (((1, 'chunk'), (2, 'chunk'), (2, 'peer')), ((2, 'peer'),))
    """
    key = (channels, channel_by)
    if key not in AUTO_CHANNELS:
        return (key,)
    start = AUTO_CHANNELS.index(key)
    count = 1 if sends > PLAN_TUNE_MAX_SENDS else PLAN_TUNE_LAYOUTS
    return AUTO_CHANNELS[start:start + count]


def runtime_candidate(collective: str, topology: "Topology", sizes: Sequence[int],
                      constants: "RuntimeConstants", *, cache: dict | None = None) -> Candidate:
    """The runtime's ring (:func:`~collsynth.timing.runtime_baselines.baseline_rows`, ``cache``
    as there) at ``sizes``, as NCCL's one candidate."""
    rows = baseline_rows(collective, topology, sizes, constants, cache=cache)
    channels = len(runtime_rings(topology, constants.channels))
    return Candidate(rows[0].name, NCCL, None,
                     detail=f"the runtime's ring, {channels} channel(s), its protocol by size",
                     samples=tuple(Sample(r.size_bytes, r.time_us, r.protocol) for r in rows),
                     yardstick=PROGRAM_MODEL)


def tree_candidate(collective: str, topology: "Topology", sizes: Sequence[int],
                   constants: "RuntimeConstants", *, cache: dict | None = None
                   ) -> Candidate | None:
    """The runtime's allreduce tree (:func:`~collsynth.timing.runtime_baselines.baseline_rows`
    with ``algorithm="tree"``, ``cache`` as there) at ``sizes``, as NCCL's second candidate;
    ``None`` when ``collective`` has no tree or ``topology`` lacks a link the tree needs."""
    if collective not in TREE_COLLECTIVES:
        return None
    try:
        nodes, _ = runtime_tree(topology, constants.channels)
    except CollsynthError:
        return None
    rows = baseline_rows(collective, topology, sizes, constants, cache=cache, algorithm="tree")
    shape = ("a chain in the node" if nodes == 1
             else f"chains and a double binary tree of {nodes} nodes")
    return Candidate(rows[0].name, NCCL, None,
                     detail=f"the runtime's tree ({shape}), its protocol by size",
                     samples=tuple(Sample(r.size_bytes, r.time_us, r.protocol) for r in rows),
                     yardstick=PROGRAM_MODEL)


def tuned_candidate(algorithm: "Algorithm", runtime: str, topology: "Topology",
                    sizes: Sequence[int], constants: "RuntimeConstants", *,
                    layouts: Sequence[tuple[int, str]], inplace: bool, outofplace: bool
                    ) -> tuple[Candidate, TunedExport]:
    """``algorithm`` lowered and tuned for ``runtime`` (:func:`~collsynth.timing.tune.tune_export`
    over ``layouts``, one instance, every protocol) and priced at ``sizes``: each sample is the
    time of the layout its tuned range runs.

    Raises
    ------
    CollsynthError
        What :func:`~collsynth.timing.tune.tune_export` raises (no layout fits, a program the
        model refuses).
    """
    tuned = tune_export(algorithm, runtime, topology, sizes, constants=constants,
                        layouts=layouts, instances=PLAN_TUNE_INSTANCES, inplace=inplace,
                        outofplace=outofplace, name=algorithm.name, render=False)
    samples = tuple(Sample(r.size_bytes, r.time_us, r.variant.protocol, r.variant.label)
                    for r in tuned.rows)
    return (Candidate(algorithm.name, "collsynth", None, algorithm, algorithm_detail(algorithm),
                      samples=samples, yardstick=PROGRAM_MODEL), tuned)


class Pricer:
    """``pricer(name, size_bytes)``: the program-model time of a candidate at any size (the
    boundaries between ranges); :data:`NCCL` is the faster of the runtime's ring and, once
    :attr:`tree` is set, its tree (NCCL picks between them per size); another name the tuned
    export registered with :meth:`add`, run by the layout of the tuned range holding the size."""

    def __init__(self, collective: str, topology: "Topology",
                 constants: "RuntimeConstants") -> None:
        self._collective = collective
        self._topology = topology
        self._constants = constants
        self._tuned: dict[str, TunedExport] = {}
        #: baseline_rows' prepared ring and tree programs (pass it as ``cache=``).
        self.rings: dict = {}
        #: Whether NCCL's tree is one of its candidates (set it when it is).
        self.tree = False

    def add(self, name: str, tuned: TunedExport) -> None:
        self._tuned[name] = tuned

    def __call__(self, name: str, size_bytes: int) -> float:
        if name == NCCL:
            (row,) = baseline_rows(self._collective, self._topology, [size_bytes],
                                   self._constants, cache=self.rings)
            if not self.tree:
                return row.time_us
            (tree,) = baseline_rows(self._collective, self._topology, [size_bytes],
                                    self._constants, cache=self.rings, algorithm="tree")
            return min(row.time_us, tree.time_us)
        tuned = self._tuned[name]
        try:
            r = tuned.range_of(size_bytes)
        except CollsynthError:  # above an msccl export's last maxBytes: it cannot run there
            return float("inf")
        prepared = r.prepared if r.prepared is not None else prepare_program(r.program,
                                                                              self._topology)
        return simulate_program(prepared, None, size_bytes, self._constants,
                                protocol=r.variant.protocol).time_us
