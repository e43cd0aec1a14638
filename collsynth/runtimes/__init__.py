"""The runtimes collsynth targets: one registry, their XML dialects, protocols and constants.

* :mod:`~collsynth.runtimes.registry`: :class:`Runtime` values by name (:func:`get_runtime`,
  :func:`runtime_names`), what each loads and how PyTorch reaches it;
* :mod:`~collsynth.runtimes.dialect`: the MSCCL XML rules of each runtime that loads XML;
* :mod:`~collsynth.runtimes.protocols`: the protocol names and buffer geometry;
* :mod:`~collsynth.runtimes.constants`: the constants the program model prices with, and the
  runtimes' documented ones.

Plain data below export, executor and timing: it imports nothing above the collective layer.
"""

from collsynth.runtimes.constants import RuntimeConstants, check_channels
from collsynth.runtimes.dialect import XmlDialect
from collsynth.runtimes.protocols import PROTOCOLS, check_protocol
from collsynth.runtimes.registry import (
    MSCCL_XML,
    MSCCLPP_PLAN,
    RUNTIMES,
    TUNER_CONFIG,
    Artifact,
    Environment,
    EnvVar,
    Runtime,
    get_runtime,
    parse_given_version,
    parse_version,
    runtime_family,
    runtime_names,
    xml_dialect,
)

__all__ = ["Runtime", "RUNTIMES", "get_runtime", "parse_given_version", "parse_version",
           "runtime_family", "runtime_names", "xml_dialect", "Artifact", "Environment", "EnvVar",
           "MSCCL_XML", "MSCCLPP_PLAN", "TUNER_CONFIG", "XmlDialect", "PROTOCOLS", "check_protocol",
           "RuntimeConstants", "check_channels"]
