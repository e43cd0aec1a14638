"""Graph algorithms shared by the bounds and the synthesis engines.

:mod:`~collsynth.graph.fabric` (a topology as a sparse fabric with switch-port vertices),
:mod:`~collsynth.graph.arborescence` (minimum spanning arborescences, Chu-Liu/Edmonds) and
:mod:`~collsynth.graph.symmetry` (rank permutations that preserve a topology, node shifts).
"""
