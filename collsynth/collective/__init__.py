"""Collectives: pre/postconditions over (rank, chunk), the standard ones, and their duals."""

from collsynth.collective.duality import has_non_combining_dual, non_combining_dual
from collsynth.collective.fileformat import (collective_from_json, collective_to_json,
                                             load_collective, save_collective)
from collsynth.collective.model import Collective, from_conditions
from collsynth.collective.standard import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    gather,
    multiroot_broadcast,
    multiroot_gather,
    multiroot_scatter,
    reduce,
    reduce_scatter,
    scatter,
    standard_collective,
    standard_names,
)

__all__ = [
    "Collective",
    "from_conditions",
    "allgather",
    "allreduce",
    "alltoall",
    "broadcast",
    "gather",
    "multiroot_broadcast",
    "multiroot_gather",
    "multiroot_scatter",
    "reduce",
    "reduce_scatter",
    "scatter",
    "standard_collective",
    "standard_names",
    "non_combining_dual",
    "has_non_combining_dual",
    "load_collective",
    "save_collective",
    "collective_from_json",
    "collective_to_json",
]
