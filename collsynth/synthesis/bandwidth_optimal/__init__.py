"""Bandwidth-optimal schedules for large systems (16 to 1024+ GPUs): exact throughput from cuts,
tree packing per root, pipelined and verified schedules.

* :mod:`.fabric` -- the topology as a sparse graph with switch-port vertices;
* :mod:`.throughput` -- the optimal rounds per chunk, exactly, from cuts (maximum flows);
* :mod:`.arborescence` -- minimum-cost spanning arborescences (dense Chu-Liu/Edmonds);
* :mod:`.symmetry` -- the node shift of composed topologies;
* :mod:`.packing` -- column generation over trees and integer multiplicities;
* :mod:`.pipeline` -- trees to a pipelined k-synchronous schedule;
* :mod:`.symmetric` -- compact schedules: a template and the node shift;
* :mod:`.engine` -- :func:`solve_bandwidth_optimal`, all of it end to end.
"""

from collsynth.synthesis.bandwidth_optimal.engine import solve_bandwidth_optimal
from collsynth.graph.fabric import Fabric, UnsupportedFabricError, build_fabric
from collsynth.synthesis.bandwidth_optimal.packing import PackingOptions, TreePacking, pack_trees
from collsynth.bounds.throughput import Throughput, optimal_throughput
from collsynth.synthesis.bandwidth_optimal.symmetric import (
    SymmetricSchedule,
    expand,
    solve_symmetric,
    verify_symmetric,
)

__all__ = [
    "solve_bandwidth_optimal",
    "Fabric",
    "UnsupportedFabricError",
    "build_fabric",
    "PackingOptions",
    "TreePacking",
    "pack_trees",
    "Throughput",
    "optimal_throughput",
    "SymmetricSchedule",
    "solve_symmetric",
    "verify_symmetric",
    "expand",
]
