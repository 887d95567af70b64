#!/usr/bin/env python3
"""Fails when a relative link of the README or of docs/ leads nowhere: a file that does not
exist, or an #anchor that no heading of the target makes (GitHub's heading slugs). The
code-review checklist links only to documents, never to headers.

Usage: check_links.py <source tree>
"""
import pathlib
import re
import sys

LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def slug(heading):
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    found, inside = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            inside = not inside
        elif not inside and line.startswith("#"):
            name = slug(line.lstrip("#"))
            candidate, n = name, 1
            while candidate in found:
                candidate, n = f"{name}-{n}", n + 1
            found.add(candidate)
    return found


def links(path):
    inside = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            for target in LINK.findall(line):
                yield number, target


def main(root):
    root = pathlib.Path(root)
    documents = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    problems, checked = [], 0
    for document in documents:
        for number, target in links(document):
            if re.match(r"^[a-z]+:", target):
                continue
            checked += 1
            where = f"{document.relative_to(root)}:{number}: {target}"
            file_part, _, anchor = target.partition("#")
            linked = (document.parent / file_part).resolve() if file_part else document
            if not linked.exists():
                problems.append(f"{where}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                problems.append(f"{where}: no heading makes #{anchor}")
            if document.name == "checklist.md" and "include/" in file_part:
                problems.append(f"{where}: the checklist links to documents, not headers")
    if checked == 0:
        problems.append("no relative link found: the check reads nothing")
    for problem in problems:
        print(problem)
    print(f"{checked} relative links checked, {len(problems)} broken")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
