"""The shell tasks' checker, run by the verifier inside the sandbox (Python stdlib only).

    python3 /tests/check_tree.py /tests/expected.json

Compares the working directory with the expected tree: every path, its type (directory,
file; a symlink or anything else never matches), a file's text (trailing newlines aside)
and its executable bit. Writes 1 or 0 to /logs/verifier/reward.txt and prints why.
This file is copied into the sandbox at grading time, after the agent's processes are gone.
"""

import json
import os
import stat
import sys


def actual_tree(root):
    """{relative path: entry} of everything under root, symlinks not followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                out[rel] = {"type": "dir"}
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    text = f.read().decode("utf-8", "replace")
                out[rel] = {"type": "file", "text": text, "exec": bool(st.st_mode & 0o100)}
            else:
                out[rel] = {"type": "other"}
    return out


def differences(expected, actual):
    """Lines naming what differs (empty when the trees match)."""
    diffs = []
    for path in sorted(set(expected) | set(actual)):
        want, got = expected.get(path), actual.get(path)
        if want is None:
            diffs.append(f"unexpected {got['type']}: {path}")
        elif got is None:
            diffs.append(f"missing {want['type']}: {path}")
        elif want["type"] != got["type"]:
            diffs.append(f"{path}: expected a {want['type']}, found a {got['type']}")
        elif want["type"] == "file":
            if want["text"].rstrip("\n") != got["text"].rstrip("\n"):
                diffs.append(f"{path}: content differs: expected {want['text'][:80]!r}, found {got['text'][:80]!r}")
            if want["exec"] != got["exec"]:
                diffs.append(f"{path}: expected {'' if want['exec'] else 'not '}executable")
    return diffs


def main():
    """Compare, write the reward, print the differences."""
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    diffs = differences(spec["tree"], actual_tree(spec["root"]))
    os.makedirs("/logs/verifier", exist_ok=True)
    with open("/logs/verifier/reward.txt", "w") as f:
        f.write("0\n" if diffs else "1\n")
    print("\n".join(diffs[:20]) if diffs else "the working directory matches the expected state")


if __name__ == "__main__":
    main()
