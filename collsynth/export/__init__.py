"""Export to and check MSCCL XML: the program IR, runtime rules, writer, reader, checker."""

from collsynth.export.program import GpuProgram, Program, ThreadBlock, XmlStep
from collsynth.export.runtimes import RUNTIMES, Runtime, get_runtime

__all__ = ["Program", "GpuProgram", "ThreadBlock", "XmlStep", "Runtime", "RUNTIMES", "get_runtime"]
