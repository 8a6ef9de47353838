#!/usr/bin/python3
"""Checks that the documentation stays a house a maintainer can walk into:

1. every relative link in the README, ROADMAP.md and the docs resolves;
2. docs/README.md names every file under docs/ (a link, or in backticks: a path under
   docs/, a sibling's name, `.json` for the row's own file with that suffix, or a glob);
3. every results file (docs/results/*.md) says under its title, as "Regenerate: ...", the
   command that rewrites it;
4. no tracked text file points at a tracker that is not in the repository (the word issue or
   session followed by a number, a range of sessions too): such history goes into commit
   messages.

Standard library only; needs a git checkout (exit 77, skipped, without one).
Usage: check_docs.py [REPOSITORY_ROOT]
"""
import fnmatch
import os
import re
import subprocess
import sys

DOCS = ["README.md", "ROADMAP.md", "deploy/README.md", "client/python/README.md",
        "models/longctx/README.md"]
DATA = re.compile(r"\.(npy|bin|png|safetensors|json|jsonl|pdf)$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
TRACKER = re.compile(r"\b(issues?|sessions?) #?[0-9]", re.IGNORECASE)


def tracked(root):
    out = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        print("check_docs: not a git checkout; skipped")
        sys.exit(77)
    return [f for f in out.stdout.split("\n") if f and os.path.isfile(os.path.join(root, f))]


def without_code_blocks(text):
    return re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)


def broken_links(root, files):
    problems = []
    for f in files:
        text = without_code_blocks(open(os.path.join(root, f), encoding="utf-8").read())
        for m in LINK.finditer(text):
            target = m.group(1).split("#")[0]
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            if not os.path.exists(os.path.join(root, os.path.dirname(f), target)):
                line = text[:m.start()].count("\n") + 1
                problems.append(f"{f}:{line}: broken link {m.group(1)}")
    return problems


def unlisted_docs(root, files):
    """Files under docs/ that no row of docs/README.md names."""
    named = []  # patterns relative to docs/
    for row in open(os.path.join(root, "docs/README.md"), encoding="utf-8"):
        links = [t for t in LINK.findall(row) if not re.match(r"^[a-z]+:|#", t)]
        links = [os.path.normpath(t) for t in links]
        named += links
        base = os.path.dirname(links[0]) if links else ""
        for token in re.findall(r"`([^`\s]+)`", row):
            if token.startswith("."):  # `.json`: the row's own files with that suffix
                named += [os.path.splitext(t)[0] + token for t in links]
            elif token.startswith("results/"):
                named.append(token)
            else:  # a sibling of the row's first link, or a glob beside it
                named.append(os.path.join(base, token))
    problems = []
    for f in files:
        if not f.startswith("docs/"):
            continue
        rel = f[len("docs/"):]
        if rel != "README.md" and not any(fnmatch.fnmatch(rel, p) for p in named):
            problems.append(f"docs/README.md does not name {f}")
    return problems


def results_without_command(root, files):
    problems = []
    for f in files:
        if f.startswith("docs/results/") and f.endswith(".md"):
            head = open(os.path.join(root, f), encoding="utf-8").read().split("\n")[:8]
            if not any(line.startswith("Regenerate: ") for line in head):
                problems.append(f"{f}: no 'Regenerate: COMMAND' line under its title")
    return problems


def tracker_references(root, files):
    problems = []
    for f in files:
        if DATA.search(f) or f == "tests/docs/check_docs.py":
            continue
        try:
            text = open(os.path.join(root, f), encoding="utf-8").read()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.split("\n"), 1):
            m = TRACKER.search(line)
            if m:
                problems.append(f"{f}:{number}: tracker reference '{m.group(0)}'")
    return problems


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    files = tracked(root)
    markdown = [f for f in files if f in DOCS or (f.startswith("docs/") and f.endswith(".md"))]
    problems = (broken_links(root, markdown) + unlisted_docs(root, files)
                + results_without_command(root, files) + tracker_references(root, files))
    for p in problems:
        print(p)
    print(f"check_docs: {len(markdown)} docs, {len(files)} files, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
