#!/usr/bin/python3
"""Writes `Regenerate: `COMMAND`` as the paragraph under each report's title, replacing an
earlier one: the one command that rewrites the file. For the reports of centroidkv-quality
and centroidkv-retrieval, which several scripts run and which cannot tell which one did;
the Python report writers put the line there themselves. Standard library only.

Usage: stamp_regenerate.py "COMMAND" FILE...
"""
import sys


def stamp(text, command):
    lines = text.split("\n")
    start = 1 if lines and lines[0].startswith("# ") else 0
    while start < len(lines) and lines[start] == "":
        start += 1
    if start < len(lines) and lines[start].startswith("Regenerate: "):
        end = start + 1
        if end < len(lines) and lines[end] == "":
            end += 1
        del lines[start:end]
    return "\n".join(lines[:start] + [f"Regenerate: `{command}`", ""] + lines[start:])


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    command = sys.argv[1]
    for path in sys.argv[2:]:
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(stamp(text, command))


if __name__ == "__main__":
    main()
