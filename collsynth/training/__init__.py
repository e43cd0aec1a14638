"""Simulate parallel training: a model's training step on a topology, with planned collectives.

* :mod:`~collsynth.training.model`: layers as GEMMs and tensor-parallel collectives
  (:class:`Linear`, :class:`TransformerBlock`, :func:`mlp`);
* :mod:`~collsynth.training.strategy`: data / tensor / pipeline degrees, microbatches,
  placement (:class:`ParallelStrategy`);
* :mod:`~collsynth.training.comm`: what communication costs (:class:`NcclComm`, the NCCL
  baseline; :class:`PlannedComm`, the best of NCCL and collsynth algorithms);
* :mod:`~collsynth.training.simulate`: the GPipe simulator (:func:`simulate`,
  :func:`grid_search`);
* :mod:`~collsynth.training.chrome_trace`: timelines as Chrome traces.

The models are described in docs/training.md.
"""

from collsynth.training.chrome_trace import chrome_trace, write_chrome_trace
from collsynth.training.comm import (
    CommChoice,
    CommModel,
    NcclComm,
    PlannedComm,
    induced_topology,
    p2p_time_us,
    topology_signature,
)
from collsynth.training.model import (
    Gemm,
    Layer,
    Linear,
    TensorComm,
    TransformerBlock,
    mlp,
    transformer,
)
from collsynth.training.simulate import (
    Event,
    SimulationResult,
    candidate_strategies,
    grid_search,
    simulate,
    single_device_time_us,
)
from collsynth.training.strategy import ParallelStrategy, partition_stages, tensor_roles

__all__ = [
    "Gemm",
    "TensorComm",
    "Layer",
    "Linear",
    "TransformerBlock",
    "mlp",
    "transformer",
    "ParallelStrategy",
    "partition_stages",
    "tensor_roles",
    "CommModel",
    "CommChoice",
    "NcclComm",
    "PlannedComm",
    "induced_topology",
    "p2p_time_us",
    "topology_signature",
    "Event",
    "SimulationResult",
    "simulate",
    "single_device_time_us",
    "candidate_strategies",
    "grid_search",
    "chrome_trace",
    "write_chrome_trace",
]
