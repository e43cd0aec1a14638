"""Import a real machine's GPU topology from what its tools print or write.

The details: ``docs/topologies.md``, section "Importing a machine's topology".
"""

from __future__ import annotations

import os
from pathlib import Path

from collsynth._files import read_bytes_bounded
from collsynth._parse import decode_text, name_from_file
from collsynth.errors import FileFormatError
from collsynth.topology.importers._common import (
    MAX_IMPORTED_GPUS,
    MAX_INPUT_BYTES,
)
from collsynth.topology.importers.nccl_xml import import_nccl_xml
from collsynth.topology.importers.nvidia_smi import import_nvidia_smi, looks_like_nvidia_smi
from collsynth.topology.importers.rocm_smi import import_rocm_smi, looks_like_rocm_smi
from collsynth.topology.model import Topology

__all__ = [
    "MAX_IMPORTED_GPUS",
    "MAX_INPUT_BYTES",
    "detect_format",
    "import_nvidia_smi",
    "import_rocm_smi",
    "import_nccl_xml",
    "import_topology_file",
]


def detect_format(data: bytes) -> str | None:
    """``"nccl-xml"``, ``"rocm-smi"``, ``"nvidia-smi"`` or ``None`` for unrecognised content.

    XML (the first non-blank character is ``<``) is NCCL's; text with a rocm-smi ``... between two
    GPUs`` banner is rocm-smi's; text with a ``GPU0`` header row is nvidia-smi's.

    >>> detect_format(b"<system version='1'/>"), detect_format(b"hello")
    ('nccl-xml', None)
    """
    head = data.lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"<"):
        return "nccl-xml"
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    if looks_like_rocm_smi(text):
        return "rocm-smi"
    if looks_like_nvidia_smi(text):
        return "nvidia-smi"
    return None


def _read(path: Path, max_bytes: int) -> bytes:
    return read_bytes_bounded(path, max_bytes, what="a topology importer reads")


def import_topology_file(path: str | os.PathLike[str], *, name: str | None = None,
                         assume_pcie: bool = False) -> Topology:
    """Read a machine-topology file and import it with the importer its content calls for.

    Parameters
    ----------
    path:
        An NCCL/RCCL topology XML dump (root ``<system>``), ``nvidia-smi topo -m`` output or
        ``rocm-smi --showtopo`` output. Files above 16 MiB are refused before reading.
    name:
        The topology name (default: the file name without its extension).
    assume_pcie:
        Passed to :func:`import_nccl_xml` and :func:`import_nvidia_smi`: import an input that shows
        no GPU link and cannot say whether links exist (an NCCL dump without links, ``nvidia-smi
        topo -mp`` output) as a PCIe-only machine instead of refusing it.

    Raises
    ------
    FileFormatError
        A missing or unreadable file, content of none of the three formats (collsynth's own JSON
        topologies are read by :func:`collsynth.topology.load_topology`), or any refusal of the
        importer.
    InputTooLargeError
        A file above 16 MiB.
    """
    p = Path(path)
    data = _read(p, MAX_INPUT_BYTES)
    kind = detect_format(data)
    topo_name = name or name_from_file(p)
    if kind == "nccl-xml":
        return import_nccl_xml(data, name=topo_name, source=str(p), assume_pcie=assume_pcie)
    if kind is None:
        if not data.strip():
            raise FileFormatError(p, "the file is empty")
        decode_text(data, str(p))  # UTF-16 (how to convert it) or not UTF-8 (where): said first
        raise FileFormatError(
            p, "not a recognised topology file: expected an NCCL/RCCL topology XML dump (root "
               "<system>), nvidia-smi topo -m output (a header row starting with GPU0) or rocm-smi "
               "--showtopo output (a 'Link Type between two GPUs' table), or a collsynth "
               "topology file (.json, docs/file-formats.md)")
    text = data.decode("utf-8-sig")
    if kind == "rocm-smi":
        return import_rocm_smi(text, name=topo_name, source=str(p))
    return import_nvidia_smi(text, name=topo_name, source=str(p), assume_pcie=assume_pcie)
