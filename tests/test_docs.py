"""The documentation as a product: a front page with the sections a reader looks for, reference
pages whose links resolve, and no lab-diary words ("the twelfth session", "this session") in
the docs, the code or its docstrings. Pure text checks: no GPU, no import of tk_cute."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

_UNITS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth"]
_ORDINAL_WORDS = [*_UNITS, "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth",
                  "fifteenth", "sixteenth", "seventeenth", "eighteenth", "nineteenth",
                  "twentieth", "thirtieth", "fortieth"]
_ORDINAL = (r"(?:(?:twenty|thirty|forty)[- ](?:" + "|".join(_UNITS) + r")|"
            + "|".join(_ORDINAL_WORDS) + r"|\d+(?:st|nd|rd|th))")
DIARY = [
    # "the twelfth session", "twelfth and fifteenth sessions", "twelfth to twenty-first
    # sessions", "twelfth-session measurements"
    re.compile(rf"\b{_ORDINAL}(?:\s*(?:,|and|to|-)\s*{_ORDINAL})*[\s-]+sessions?\b",
               re.IGNORECASE),
    re.compile(r"\b(?:this|that|last|next|previous|earlier|later)\s+(?:H200\s+|GPU\s+)?"
               r"sessions?\b", re.IGNORECASE),
    re.compile(r"\(session", re.IGNORECASE),
    re.compile(r"\bsessions so far\b", re.IGNORECASE),
    re.compile(r"\bsession\s+\d+\b", re.IGNORECASE),
]
# Where the diary words may appear in code text (not docs): these files only.
CODE_DIRS = ("tk_cute", "kernels", "layouts", "examples", "tests")
CODE_SUFFIXES = (".py", ".ipynb", ".md", ".c")
SELF = Path(__file__).resolve()


def _rel(p: Path) -> str:
    return p.resolve().relative_to(ROOT).as_posix()


def _doc_pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _code_files() -> list[Path]:
    files = []
    for d in CODE_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if (p.suffix in CODE_SUFFIXES and p.is_file() and p.resolve() != SELF
                    and ".ipynb_checkpoints" not in p.parts and "__pycache__" not in p.parts):
                files.append(p)
    return files


def _diary_hits(text: str) -> list[tuple[int, str]]:
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        for rx in DIARY:
            m = rx.search(line)
            if m:
                hits.append((n, m.group(0)))
    # a diary phrase split across two lines ("the twelfth\n# session")
    joined = re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)
    if not hits:
        for rx in DIARY:
            m = rx.search(joined)
            if m:
                hits.append((0, m.group(0)))
    return hits


@pytest.mark.parametrize("page", _doc_pages(), ids=_rel)
def test_docs_have_no_diary_words(page):
    """Reference pages, not a lab diary: no "Nth session", "this session", "(session ...".
    Dates belong beside a measurement, not in a heading."""
    text = page.read_text()
    hits = _diary_hits(text)
    assert not hits, f"{_rel(page)}: diary words {hits}"
    dated = [h for h in re.findall(r"^#{1,6} .*$", text, re.MULTILINE)
             if re.search(r"\b\d{4}-\d{2}-\d{2}\b|session", h, re.IGNORECASE)]
    assert not dated, f"{_rel(page)}: dated or diary headings {dated}"


def test_code_has_no_diary_words():
    """Comments and docstrings state contracts and cite docs/facts.md, docs/history.md or a
    commit, never a session."""
    found = []
    for p in _code_files():
        for n, words in _diary_hits(p.read_text(errors="replace")):
            found.append(f"{_rel(p)}:{n}: {words!r}")
    assert not found, "diary words in code:\n" + "\n".join(found)


# --- README: a front page -----------------------------------------------------------------

def _sections(text: str) -> dict[str, str]:
    """"## " headings (lower case) -> their body."""
    parts = re.split(r"^## +(.+)$", text, flags=re.MULTILINE)
    return {parts[i].strip().lower(): parts[i + 1] for i in range(1, len(parts), 2)}


def _section(sections: dict[str, str], pattern: str) -> str:
    hits = [body for head, body in sections.items() if re.search(pattern, head)]
    assert hits, f"README has no section whose heading matches {pattern!r}: {list(sections)}"
    return hits[0]


def test_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 120, "README is a front page: ~100 lines"
    s = _sections(text)
    _section(s, r"what it is")
    req = _section(s, r"requirements|supported hardware")
    for word in ("Linux", "Python", "nvidia-cutlass-dsl", "torch", "sm_90a", "sm_100a", "sm_103a",
                 "sm_107a", "macOS"):
        assert word in req, f"requirements name {word}"
    assert re.search(r"raise", req), "requirements say what other GPUs do"
    assert "pip install" in _section(s, r"^install")
    assert "python -m tk_cute" in _section(s, r"main job")
    tests = _section(s, r"^tests?\b")
    assert "python -m pytest" in tests
    assert re.search(r"\d+\s+minutes", tests), "the tests section says how long they take"
    quick = _section(s, r"quick start")
    block = re.search(r"```python\n(.*?)```", quick, re.DOTALL)
    assert block, "the quick start is a python block"
    assert len(block.group(1).strip().splitlines()) <= 12, "a ten-line quick start"
    perf = _section(s, r"performance|plot|results")
    image = re.search(r"!\[[^\]]*\]\(([^)]+\.(?:png|svg))\)", perf)
    assert image and (ROOT / image.group(1)).is_file(), "the plot, drawn from a file in the repo"
    assert re.search(r"takeaway", perf, re.IGNORECASE), "the plot comes with its takeaway"
    links = _section(s, r"documentation|links")
    assert len(re.findall(r"\]\(docs/[\w./-]+\.md", links)) >= 5, "links to the docs"


# --- links ----------------------------------------------------------------------------------

def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: tags dropped, lower case, punctuation but '-' and '_'
    dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = page.read_text()
    ids = set(re.findall(r"""<a\s+(?:id|name)=["']([^"']+)["']""", text))
    ids |= {_slug(h) for h in re.findall(r"^#{1,6} +(.+)$", _strip_fences(text), re.MULTILINE)}
    return ids


def _strip_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def _strip_code(text: str) -> str:
    return re.sub(r"`[^`\n]*`", "", _strip_fences(text))


def _check_target(source: Path, target: str) -> str | None:
    """None if `target` (a relative path, maybe with #anchor) exists from `source`'s folder."""
    path, _, anchor = target.partition("#")
    dest = (source.parent / path).resolve() if path else source.resolve()
    if not dest.exists():
        return f"{target}: no such file"
    if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
        return f"{target}: no anchor #{anchor} in {_rel(dest)}"
    return None


@pytest.mark.parametrize("page", _doc_pages(), ids=_rel)
def test_relative_links_resolve(page):
    """Every relative link (and image) of the README and docs/ points to a file that exists,
    and to an anchor in it where one is given."""
    text = _strip_code(page.read_text())
    bad = []
    for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        err = _check_target(page, target)
        if err:
            bad.append(err)
    assert not bad, f"{_rel(page)}: " + "; ".join(bad)


def _dead_docs_refs(p: Path) -> list[str]:
    bad = []
    for ref, anchor in re.findall(r"\bdocs/([\w./-]*\w\.md)(?:#([\w-]+))?",
                                  p.read_text(errors="replace")):
        err = _check_target(ROOT / "README.md", f"docs/{ref}" + (f"#{anchor}" if anchor else ""))
        if err:
            bad.append(err)
    return bad


def test_code_references_to_docs_resolve():
    """Every "docs/<page>.md" (and "#anchor") that a comment or docstring cites exists."""
    bad = []
    for p in _code_files():
        bad += [f"{_rel(p)}: {e}" for e in _dead_docs_refs(p)]
    assert not bad, "dead docs references in code:\n" + "\n".join(bad)
