"""The project's docs, code and tests speak to users about the project, not about its
history: no "session 6", "issue 17" or "DESIGN section 4" (a team document users do not
have). History belongs in commit messages."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DIARY = re.compile(r"\b(?:session|issue)s?[ -]\d+\b|DESIGN section|\bother sessions\b", re.IGNORECASE)
#: Files exempt from the rule (none: each entry would be a debt, not a rule).
NOT_YET: set[str] = set()


def _files():
    for base in ("README.md", "docs", "platform/hardpos", "benchmarks", "tests", "infra", "jobs", "serve"):
        root = REPO / base
        paths = [root] if root.is_file() else root.rglob("*")
        for p in paths:
            if p.is_file() and p.suffix in (".md", ".py", ".yaml", ".yml", ".txt", ".toml", ".sh") \
                    and "__pycache__" not in p.parts and p.name != Path(__file__).name:
                yield p


def test_no_diary_words():
    hits = []
    for path in _files():
        rel = path.relative_to(REPO).as_posix()
        if rel in NOT_YET:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if DIARY.search(line):
                hits.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not hits, "diary words in user-facing files (say what is, not when it happened):\n" + "\n".join(hits)


def test_the_pattern_catches_what_it_must():
    assert DIARY.search("Measured in session 6") and DIARY.search("(issue 17)") and DIARY.search("DESIGN section 5")
    assert DIARY.search("the session-6 run")
    assert not DIARY.search("one session of training") and not DIARY.search("an issue with the path")
