"""Hostile input, round 20: what this round's hunt found.

Each case failed on the code before its fix.
"""

from __future__ import annotations

import pytest

from collsynth import cli
from collsynth._parse import NumberTextError, size_from_text
from tests.test_inputs_round17 import one_usage_line  # one usage-error line, nothing on stdout




# -- --gpus-per-thread: nccl-tests runs processes x threads x G GPUs, so G divides a node --------


@pytest.mark.parametrize("gpus", ["3", "5", "6", "7"])
def test_time_refuses_threads_that_cannot_share_a_node(capsys, gpus):
    # 8 GPUs cannot be driven by threads of 3 (the first fix accepted any G up to 8)
    code = cli.main(["time", "--collective", "allreduce", "--topology", "DGX-H100",
                     "--gpus-per-thread", gpus, "--sizes", "1MB", "-q"])
    line = one_usage_line(capsys, code, "collsynth time")
    assert f"--gpus-per-thread {gpus}" in line and "a divisor of 8" in line


@pytest.mark.parametrize("gpus", ["1", "2", "4", "8"])
def test_time_takes_every_divisor_of_the_node(capsys, gpus):
    code = cli.main(["time", "--collective", "allreduce", "--topology", "DGX-H100",
                     "--gpus-per-thread", gpus, "--sizes", "1MB", "-q"])
    assert code == cli.EXIT_OK, capsys.readouterr().err


def test_divisor_is_of_a_node_not_of_the_machine(capsys):
    # two 8-GPU nodes: 16 ranks, but a thread drives GPUs of one node, so G = 16 is refused
    # and G = 8 taken (a divisor of the machine's 16 is not enough)
    code = cli.main(["time", "--collective", "allreduce", "--topology", "DGX-H100",
                     "--nodes", "2", "--gpus-per-thread", "16", "--sizes", "1MB", "-q"])
    assert "one node" in one_usage_line(capsys, code, "collsynth time")
    code = cli.main(["time", "--collective", "allreduce", "--topology", "DGX-H100",
                     "--nodes", "2", "--gpus-per-thread", "8", "--sizes", "1MB", "-q"])
    assert code == cli.EXIT_OK, capsys.readouterr().err


# -- time --sizes: a list, not tune-runtime's range; no exponents ----------------------------------


def test_time_sizes_names_a_range_as_a_range(capsys):
    # tune-runtime's --sizes is FROM:TO; time's is a list: say so, not "expected a number"
    code = cli.main(["time", "--collective", "allreduce", "--topology", "DGX-H100",
                     "--sizes", "1KB,1:1e30"])
    line = one_usage_line(capsys, code, "collsynth time")
    assert "'1:1e30'" in line and "not a FROM:TO range" in line and "1KB,1MB,1GB" in line


@pytest.mark.parametrize("text", ["1e30", "2.5E+9", "1e-3", ".5e6"])
def test_an_exponent_is_named(text):
    with pytest.raises(NumberTextError, match="an exponent is not a size"):
        size_from_text(text)


@pytest.mark.parametrize("text", ["1e", "1eB", "1 e"])
def test_a_letter_e_alone_is_an_unknown_unit_not_an_exponent(text):
    with pytest.raises(NumberTextError) as info:
        size_from_text(text)
    assert "exponent" not in str(info.value)


def test_time_sizes_exponent_is_a_usage_error(capsys):
    code = cli.main(["time", "--collective", "allreduce", "--topology", "DGX-H100",
                     "--sizes", "1e9"])
    assert "an exponent is not a size" in one_usage_line(capsys, code, "collsynth time")
