"""``python -m collsynth``: the command line (see :mod:`collsynth.cli`)."""

from collsynth.cli import run

if __name__ == "__main__":
    run()
