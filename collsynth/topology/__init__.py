"""Topologies: the link-bandwidth value, built-ins, file format, composition and importers.

Convention: ``links[src][dst]`` is the bandwidth from ``src`` to ``dst`` in chunks per round.
"""

from collsynth.topology.builtins import builtin_names, get_topology, list_topologies, with_figures
from collsynth.topology.compose import compose_nodes
from collsynth.topology.families import (
    fully_connected,
    hub,
    hypercube,
    line,
    mesh,
    ring,
    star,
    torus,
)
from collsynth.topology.fileformat import load_topology, save_topology, topology_from_json, topology_to_json
from collsynth.topology.machine import MachineFacts, machine_facts, with_machine
from collsynth.topology.model import MAX_DENSE_RANKS, MAX_RANKS, BandwidthGroup, Topology

__all__ = [
    "Topology",
    "BandwidthGroup",
    "MAX_RANKS",
    "MAX_DENSE_RANKS",
    "get_topology",
    "list_topologies",
    "builtin_names",
    "load_topology",
    "save_topology",
    "topology_from_json",
    "topology_to_json",
    "ring",
    "line",
    "star",
    "fully_connected",
    "hub",
    "torus",
    "mesh",
    "hypercube",
    "with_figures",
    "compose_nodes",
    "MachineFacts",
    "machine_facts",
    "with_machine",
]
