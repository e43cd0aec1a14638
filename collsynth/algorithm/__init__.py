"""Algorithms: the schedule value, its verifier, transforms, rendering and file format."""

from collsynth.algorithm.arrays import SendBlock, as_send_block, sends_as_arrays
from collsynth.algorithm.fileformat import algorithm_from_json, algorithm_to_json, load_algorithm, save_algorithm
from collsynth.algorithm.model import Algorithm, Instance, Send, Step
from collsynth.algorithm.show import format_algorithm
from collsynth.algorithm.transform import invert_dual, refine, sequence
from collsynth.algorithm.verify import find_problems, verify

__all__ = [
    "Algorithm",
    "Instance",
    "Send",
    "Step",
    "SendBlock",
    "as_send_block",
    "sends_as_arrays",
    "find_problems",
    "verify",
    "invert_dual",
    "sequence",
    "refine",
    "format_algorithm",
    "load_algorithm",
    "save_algorithm",
    "algorithm_to_json",
    "algorithm_from_json",
]
