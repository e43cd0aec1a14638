"""The docs and the code that cites them stay in step.

Every ``§N`` the package cites names a section of docs/msccl-xml.md, every checker problem kind
has its row in the document's table of kinds (and the table names no other), the document's own
links and section references resolve, and nothing in the package or the docs refers to files
outside the repository. Every other document the repository names exists, every section named by
its title exists, links resolve, the docs are Markdown, and module docstrings stay short.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from collsynth.export.check import PROBLEM_KINDS
from collsynth.plan.environment import EXECUTOR_SOURCE, SPEC, runtime_environment
from collsynth.runtimes import get_runtime

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "msccl-xml.md"
DOC_NAME = "docs/msccl-xml.md"

# A citation: "§7", "§7.3"; a trailing period ends the sentence, not the number.
_CITATION = re.compile(r"§(\d+(?:\.\d+)*)")
_HEADING = re.compile(r"^(#{2,3}) (\d+(?:\.\d+)*)\.? (.+)$", re.M)
# Names the project may not mention, assembled so that this file does not mention them either.
_OUTSIDE = ("..", "/shared")
_FORBIDDEN = ("".join(_OUTSIDE), "shared" + "/data", "MSCCL_XML" + "_SPEC", "/work" + "/shared",
              "BASELINES" + ".md")


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _sections(text: str) -> dict[str, str]:
    """Section number -> heading text, for ``## N. Title`` and ``### N.M Title`` headings."""
    found: dict[str, str] = {}
    for match in _HEADING.finditer(text):
        level, number, title = match.groups()
        assert level == ("##" if "." not in number else "###"), match.group(0)
        assert number not in found, f"section {number} appears twice"
        found[number] = title
    return found


def _package_files() -> list[Path]:
    return sorted(p for p in (ROOT / "collsynth").rglob("*.py"))


def test_the_document_has_numbered_sections():
    sections = _sections(_doc())
    # Top-level sections are numbered 1, 2, ... without gaps, and every subsection has a parent.
    top = sorted(int(n) for n in sections if "." not in n)
    assert top == list(range(1, len(top) + 1)) and len(top) >= 15
    for number in sections:
        assert number.split(".")[0] in sections, number


def test_every_citation_in_the_package_names_a_section():
    sections = _sections(_doc())
    cited = 0
    for path in _package_files():
        text = path.read_text(encoding="utf-8")
        numbers = _CITATION.findall(text)
        if not numbers:
            continue
        # A bare "§N" is only unambiguous in a file that says which document it cites.
        assert DOC_NAME in text, f"{path.relative_to(ROOT)} cites § without naming {DOC_NAME}"
        for number in numbers:
            cited += 1
            assert number in sections, (f"{path.relative_to(ROOT)} cites {DOC_NAME} §{number}, "
                                        "which does not exist")
    assert cited >= 50  # the export, plan and runtime modules cite it throughout


def test_the_document_references_and_links_resolve():
    text = _doc()
    sections = _sections(text)
    for number in _CITATION.findall(text):
        assert number in sections, f"the document refers to §{number}, which does not exist"
    # GitHub's anchors: lower case, punctuation dropped, spaces to hyphens.
    anchors = {re.sub(r"[^\w\- ]", "", f"{n} {t}".lower()).replace(" ", "-")
               for n, t in sections.items()}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links, "the contents list links the sections"
    for link in links:
        assert link in anchors, f"link #{link} has no heading"


def test_every_problem_kind_has_its_row_in_the_document():
    text = _doc()
    sections = _sections(text)
    assert sections["16.2"] == "Problem kinds"
    start = text.index("### 16.2 ")
    table = text[start:text.index("\n### ", start + 1)]
    rows = re.findall(r"^\| `([a-z-]+)` \| (.+) \| (.+) \|$", table, re.M)
    assert {kind for kind, _, _ in rows} == set(PROBLEM_KINDS)
    assert len(rows) == len(PROBLEM_KINDS)
    for kind, _, rules in rows:
        cited = _CITATION.findall(rules)
        assert cited, f"the row of {kind!r} names no section"
        assert all(number in sections for number in cited), kind


@pytest.mark.parametrize("runtime", ["msccl", "rccl", "msccl-executor"])
def test_environment_sources_cite_the_document(runtime):
    sections = _sections(_doc())
    assert SPEC == DOC_NAME
    env, notes = runtime_environment(get_runtime(runtime), xml_dir="/p/xml", xml_paths=["/p/xml/a.xml"],
                                     collectives=["allreduce", "allgather"])
    assert env
    for var in env:
        if var.source == EXECUTOR_SOURCE:
            assert runtime == "msccl-executor"
            continue
        match = re.fullmatch(rf"{re.escape(DOC_NAME)} §(\d+(?:\.\d+)*)", var.source)
        assert match and match.group(1) in sections, var
    for note in notes:
        for number in _CITATION.findall(note):
            assert number in sections, note


def test_no_reference_to_files_outside_the_repository():
    folders = ("collsynth", "docs", "tests", "notebooks", "benchmarks", "topologies", "examples",
               ".ci")
    paths = [p for folder in folders for p in (ROOT / folder).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    paths += [ROOT / "README.md", ROOT / "pyproject.toml", *(ROOT / "data").rglob("README.md")]
    assert DOC in paths
    for path in paths:
        text = path.read_bytes().decode("utf-8", "replace")
        for name in _FORBIDDEN:
            assert name not in text, f"{path.relative_to(ROOT)} mentions {name}"


# -- module docstrings stay short ---------------------------------------------------------------

#: Most lines of a module docstring; longer explanations belong in docs/*.md.
MODULE_DOCSTRING_MAX_LINES = 15


def _docstring_lines() -> dict[str, int]:
    import ast

    found = {}
    for path in _package_files():
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        found[path.relative_to(ROOT).as_posix()] = \
            len(docstring.strip("\n").splitlines()) if docstring else 0
    return found


def test_module_docstrings_are_short():
    long = {name: lines for name, lines in _docstring_lines().items()
            if lines > MODULE_DOCSTRING_MAX_LINES}
    assert not long, f"module docstrings over {MODULE_DOCSTRING_MAX_LINES} lines: {long}"


# -- the other documents: references that resolve, Markdown only --------------------------------

_DOCS = sorted((ROOT / "docs").glob("*.md"))
# A named section of a document: 'docs/<name>.md, "Title"' or 'docs/<name>.md``, section "Title"'.
_SECTION_REFERENCE = re.compile(r"docs/([\w.-]+\.md)`*,\s+(?:section\s+)?\"([^\"]+)\"")
_FENCE = re.compile(r"^\s*```.*?^\s*```[^\n]*$", re.M | re.S)


def _headings(text: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^#{1,4} (.+)$", _FENCE.sub("", text), re.M)]


def _titles(text: str) -> set[str]:
    """What a reference may call a section: its heading, or the heading's words without the
    module named in parentheses after them ("Tuning" for "Tuning (`collsynth/timing/tune.py`)")."""
    headings = _headings(text)
    return set(headings) | {re.sub(r" \([^()]*\)$", "", h) for h in headings}


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _mentioning_files() -> list[Path]:
    folders = ("collsynth", "docs", "tests", "benchmarks", "notebooks")
    return [p for folder in folders for p in (ROOT / folder).rglob("*")
            if p.suffix in (".py", ".md", ".ipynb") and "__pycache__" not in p.parts] \
        + [ROOT / "README.md"]


def test_every_named_document_exists():
    for path in _mentioning_files():
        for name in re.findall(r"\bdocs/([\w.-]+?\.md)\b", path.read_text(encoding="utf-8")):
            assert (ROOT / "docs" / name).is_file(), \
                f"{path.relative_to(ROOT)} names docs/{name}, which does not exist"


def test_every_named_section_exists():
    found = 0
    for path in _mentioning_files():
        for name, title in _SECTION_REFERENCE.findall(path.read_text(encoding="utf-8")):
            title = " ".join(title.split())  # a title may wrap in a docstring
            doc = ROOT / "docs" / name
            found += 1
            assert title in _titles(doc.read_text(encoding="utf-8")), \
                f"{path.relative_to(ROOT)} refers to section {title!r} of docs/{name}, which has none"
    assert found >= 10  # the module docstrings point into the docs this way


@pytest.mark.parametrize("doc", [*_DOCS, ROOT / "README.md"], ids=lambda p: p.name)
def test_markdown_links_resolve(doc):
    text = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # an address on the web
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        assert linked.exists(), f"{doc.name} links {target}, which does not exist"
        if anchor and linked.suffix == ".md":
            anchors = {_anchor(h) for h in _headings(linked.read_text(encoding="utf-8"))}
            assert anchor in anchors, f"{doc.name} links {target}: no such heading"


@pytest.mark.parametrize("doc", _DOCS, ids=lambda p: p.name)
def test_docs_are_markdown_not_restructuredtext(doc):
    text = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    lines = text.splitlines()
    roles = re.findall(r":(?:func|meth|class|mod|data|attr|exc|obj):`", text)
    assert not roles, f"{doc.name}: reStructuredText roles {roles[:3]}"
    assert "``" not in text, f"{doc.name}: double backquotes (Markdown code is `x`)"
    literal = [line for line in lines if line.rstrip().endswith("::")]
    assert not literal, f"{doc.name}: '::' literal markers (use a fenced block): {literal[:2]}"
    rules = [line for line in lines if re.fullmatch(r"={3,}(\s+={3,})*", line.strip())]
    assert not rules, f"{doc.name}: a reStructuredText table or title"
    module_titles = [h for h in _headings(text) if re.fullmatch(r"`?collsynth[\w.]*`?", h)]
    assert not module_titles, f"{doc.name}: headings that are module names: {module_titles}"
