#!/usr/bin/env python3
"""test/test_doc_links.py - every relative link of the user documentation resolves.

README.md and docs/*.md link to each other, to files of the tree and to headings (`page.md#anchor`,
`#anchor`). For each page, every Markdown link and image outside code - `[text](target)`,
`![alt](target)` - that is not a URL must name a file or folder inside the repository, and its
`#anchor`, if any, must be a heading of the Markdown page it names (GitHub's anchors: the heading's
text lower-cased, code marks and punctuation other than `-` and `_` dropped, spaces made `-`, a
repeated heading numbered `-1`, `-2`, ...). One TAP test per page, the broken links listed.
"""
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def pages():
    found = [os.path.join(REPO, "README.md")]
    docs = os.path.join(REPO, "docs")
    found += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    return found


def prose(text):
    """The text with fenced code blocks and inline code spans blanked (lines and offsets kept), so
    that a link found in it is a link of the rendered page, even one whose text wraps."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r"(`+)[\s\S]*?(?<!`)\1(?!`)", blank, "\n".join(lines))


def slug(heading):
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        seen, out = {}, set()
        with open(path, encoding="utf-8") as f:
            text = f.read()
        fenced = False
        for line in text.split("\n"):
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = None if fenced else HEADING.match(line)
            if m:
                s = slug(m.group(2))
                k = seen.get(s, 0)
                seen[s] = k + 1
                out.add(s if k == 0 else "%s-%d" % (s, k))
        cache[path] = out
    return cache[path]


def broken_links(page):
    """The links of one page that do not resolve, each as 'line N: target: why'."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    problems, count = [], 0
    body = prose(text)
    for m in LINK.finditer(body):
        target, n = m.group(1), body.count("\n", 0, m.start(1)) + 1
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
            continue
        count += 1
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if os.path.relpath(dest, REPO).startswith(".."):
            problems.append("line %d: %s: outside the repository" % (n, target))
            continue
        if not os.path.exists(dest):
            problems.append("line %d: %s: no such file" % (n, target))
            continue
        if anchor:
            if not dest.endswith(".md") or os.path.isdir(dest):
                problems.append("line %d: %s: an anchor into a file that is not a Markdown page" % (n, target))
            elif anchor not in anchors(dest):
                problems.append("line %d: %s: %s has no heading with that anchor"
                                % (n, target, os.path.relpath(dest, REPO)))
    return count, problems


def main():
    found = pages()
    print("1..%d" % (len(found) + 1))
    failed = 0
    names = [os.path.relpath(p, REPO) for p in found]
    if "README.md" in names and "docs/configuration.md" in names and len(names) >= 10:
        print("ok 1 - README.md and %d pages of docs/ found" % (len(names) - 1))
    else:
        print("not ok 1 - README.md and the docs/ pages found (got %s)" % ", ".join(names))
        failed += 1
    for i, page in enumerate(found, 2):
        count, problems = broken_links(page)
        name = os.path.relpath(page, REPO)
        if problems:
            failed += 1
            print("not ok %d - %s: every relative link resolves (%d of %d do not)" % (i, name, len(problems), count))
            for p in problems:
                print("# %s: %s" % (name, p))
        else:
            print("ok %d - %s: all %d relative links resolve" % (i, name, count))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
