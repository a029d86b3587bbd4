"""The `shell` task family's templates: simple shell work with random names and contents.

A template is a function `rng -> Instance`: the instruction, the working directory's files
before (`start`) and the whole tree it must hold after (`end`), and a reference solution
(shell commands, one per turn), for the training templates two paraphrases of the instruction,
and, for some, a plausible first command that fails with an
informative error (`mistake`: recovery demonstrations show it, the error, then the fix). The end state is complete — every path, its type, its
content and its executable bit — so a checker comparing trees rewards only the right result:
extra files, a deleted neighbour or a wrong line all score 0.

`TRAIN_TEMPLATES` are what a run trains on; `HELD_OUT_TEMPLATES` are never trained on and
measure generalisation (each is a near relative of a trained one: `tail` of `head`, `mkdir -p`
of `mkdir`, `rm -r` of `rm`, ...).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# Words that are never substrings of one another (grep-based templates count whole lines).
WORDS = (
    "alpha bravo cedar delta ember falcon garnet harbor indigo juniper kestrel lumen maple nectar "
    "onyx pepper quartz raven saffron tundra umber violet willow xenon yarrow zephyr"
).split()
STEMS = (
    "notes data report todo config names list draft summary inventory journal records output "
    "input results items readme backup archive plan"
).split()
EXTS = ("txt", "md", "csv", "log", "cfg", "dat")
DIRS = "docs backups archive logs reports tmp build src assets cache old out drafts media".split()


@dataclass
class Entry:
    """One path of the working directory: a directory, or a file with its text and executable bit."""

    kind: str  # "dir" | "file"
    text: str = ""
    exec: bool = False

    def to_json(self) -> dict:
        """The entry as the checker's expected-tree JSON reads it."""
        return {"type": "dir"} if self.kind == "dir" else {"type": "file", "text": self.text, "exec": self.exec}


Tree = dict[str, Entry]  # path relative to the working directory -> entry


@dataclass
class Instance:
    """One generated task: what the agent is told, the tree before and after, and a reference solution."""

    template: str
    instruction: str
    start: Tree
    end: Tree
    solution: list[str]  # one shell command per turn
    # A plausible first command that fails with an error naming what is wrong; a recovery
    # demonstration runs it, shows the error, then the solution (never part of `solution`).
    mistake: str | None = None
    # Other wordings of `instruction`, the same task in other words; `wording` picks the one the
    # agent is told (0: `instruction`). Neither is part of `key`: a held-out instance stays held
    # out however it is worded.
    paraphrases: tuple[str, ...] = ()
    wording: int = 0

    @property
    def told(self) -> str:
        """The instruction in the words the agent gets."""
        return (self.instruction, *self.paraphrases)[self.wording]

    @property
    def key(self) -> str:
        """A digest of everything that defines the instance (two equal instances share it)."""
        blob = json.dumps(
            [self.template, self.instruction, {p: e.to_json() for p, e in sorted(self.start.items())}], sort_keys=True
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


# -- random pieces ----------------------------------------------------------------------------
def _pick(rng: np.random.Generator, items, k: int | None = None):
    if k is None:
        return items[int(rng.integers(len(items)))]
    return [items[int(i)] for i in rng.choice(len(items), size=k, replace=False)]


def _file_names(rng: np.random.Generator, k: int, ext: str | None = None) -> list[str]:
    stems = _pick(rng, STEMS, k)
    return [f"{s}.{ext or _pick(rng, EXTS)}" for s in stems]


def _line(rng: np.random.Generator) -> str:
    return " ".join(_pick(rng, WORDS, int(rng.integers(1, 4))))


def _lines(rng: np.random.Generator, lo: int = 3, hi: int = 8) -> list[str]:
    return [_line(rng) for _ in range(int(rng.integers(lo, hi + 1)))]


def _text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _distractors(rng: np.random.Generator, taken: set[str], k: int | None = None) -> Tree:
    """0-2 unrelated files the task must leave as they are."""
    k = int(rng.integers(0, 3)) if k is None else k
    out: Tree = {}
    for name in _file_names(rng, 6):
        if len(out) == k:
            break
        if name not in taken and not any(t.startswith(name.split(".")[0] + ".") for t in taken):
            out[name] = Entry("file", _text(_lines(rng, 1, 3)))
    return out


def _q(s: str) -> str:
    return shlex.quote(s)


def _stem(name: str) -> str:
    """A file name without its extension: the wrong name a mistake uses."""
    return name.rsplit(".", 1)[0]


def _dir_of_files(rng: np.random.Generator, d: str) -> tuple[Tree, Tree]:
    """A directory `d` holding 1-3 small files, beside one unrelated file: (its files, the whole tree)."""
    inside = {f"{d}/{n}": Entry("file", _text(_lines(rng, 1, 2))) for n in _file_names(rng, int(rng.integers(1, 4)))}
    return inside, {d: Entry("dir"), **inside, **_distractors(rng, {d}, k=1)}


def _set(tree: Tree, changes: dict[str, Entry | None]) -> Tree:
    out = dict(tree)
    for path, entry in changes.items():
        if entry is None:
            out.pop(path, None)
        else:
            out[path] = entry
    return out


# -- the templates ----------------------------------------------------------------------------
def make_dir(rng) -> Instance:
    """mkdir: create a directory."""
    d = _pick(rng, DIRS)
    start = _distractors(rng, {d})
    return Instance(
        "make_dir",
        f"Create a directory named {d}.",
        start,
        _set(start, {d: Entry("dir")}),
        [f"mkdir {d}"],
        paraphrases=(f"Make a new directory called {d}.", f"Add an empty directory {d} to the working directory."),
    )


def make_file(rng) -> Instance:
    """touch: create an empty file."""
    (f,) = _file_names(rng, 1)
    start = _distractors(rng, {f})
    return Instance(
        "make_file",
        f"Create an empty file named {f}.",
        start,
        _set(start, {f: Entry("file")}),
        [f"touch {f}"],
        paraphrases=(f"Make a new, empty file called {f}.", f"Add an empty file {f} to the working directory."),
    )


def write_line(rng) -> Instance:
    """echo >: a new file holding one line."""
    (f,) = _file_names(rng, 1)
    text = _line(rng)
    start = _distractors(rng, {f})
    return Instance(
        "write_line",
        f"Create a file named {f} containing the line: {text}",
        start,
        _set(start, {f: Entry("file", text + "\n")}),
        [f"echo {_q(text)} > {f}"],
        paraphrases=(f"Make a new file {f} whose only line is: {text}", f"Save this line in a new file {f}: {text}"),
    )


def copy_file(rng) -> Instance:
    """cp: copy a file (the original stays)."""
    a, b = _file_names(rng, 2)
    body = Entry("file", _text(_lines(rng)))
    start = {a: body, **_distractors(rng, {a, b})}
    return Instance(
        "copy_file",
        f"Copy {a} to {b}.",
        start,
        _set(start, {b: body}),
        [f"cp {a} {b}"],
        paraphrases=(f"Make a copy of {a} named {b}.", f"Duplicate {a} as {b}, keeping {a}."),
    )


def rename_file(rng) -> Instance:
    """mv: rename a file."""
    a, b = _file_names(rng, 2)
    body = Entry("file", _text(_lines(rng)))
    start = {a: body, **_distractors(rng, {a, b})}
    return Instance(
        "rename_file",
        f"Rename {a} to {b}.",
        start,
        _set(start, {a: None, b: body}),
        [f"mv {a} {b}"],
        mistake=f"mv {_stem(a)} {b}",
        paraphrases=(f"Change the name of {a} to {b}.", f"Give the file {a} the new name {b}."),
    )


def delete_file(rng) -> Instance:
    """rm: delete one file, leaving its neighbours."""
    (a,) = _file_names(rng, 1)
    start = {a: Entry("file", _text(_lines(rng))), **_distractors(rng, {a}, k=int(rng.integers(1, 3)))}
    return Instance(
        "delete_file",
        f"Delete the file {a}.",
        start,
        _set(start, {a: None}),
        [f"rm {a}"],
        mistake=f"rm {_stem(a)}",
        paraphrases=(f"Remove {a}.", f"Get rid of the file {a}, leaving the other files."),
    )


def append_line(rng) -> Instance:
    """echo >>: append a line to a file."""
    (f,) = _file_names(rng, 1)
    lines, extra = _lines(rng, 2, 5), _line(rng)
    start = {f: Entry("file", _text(lines)), **_distractors(rng, {f})}
    return Instance(
        "append_line",
        f"Append the line {extra} to the end of {f}.",
        start,
        _set(start, {f: Entry("file", _text(lines + [extra]))}),
        [f"echo {_q(extra)} >> {f}"],
        paraphrases=(f"Add the line {extra} at the end of {f}.", f"Add a line to {f} after its existing ones: {extra}"),
    )


def _source_and_out(rng, lo: int = 4, hi: int = 9) -> tuple[str, str, list[str]]:
    f, out = _file_names(rng, 2, ext="txt")
    return f, out, _lines(rng, lo, hi)


def _to_new_file(
    name: str,
    f: str,
    lines: list[str],
    out: str,
    text: str,
    prompt: str,
    command: str,
    paraphrases: tuple[str, ...] = (),
) -> Instance:
    """An instance whose start is one file `f` of `lines` and whose end adds a new file `out` holding `text`."""
    start = {f: Entry("file", _text(lines))}
    return Instance(name, prompt, start, _set(start, {out: Entry("file", text)}), [command], paraphrases=paraphrases)


def count_lines(rng) -> Instance:
    """wc -l: the number of lines of a file, as a number in a new file."""
    f, out, lines = _source_and_out(rng)
    return _to_new_file(
        "count_lines",
        f,
        lines,
        out,
        f"{len(lines)}\n",
        f"Write the number of lines in {f} to a new file {out}.",
        f"wc -l < {f} > {out}",
        paraphrases=(
            f"Count the lines of {f} and save the count in a new file {out}.",
            f"Put how many lines {f} has into a new file {out}.",
        ),
    )


def _word_in(rng, lines: list[str]) -> str:
    return _pick(rng, sorted({w for line in lines for w in line.split()}))


def count_matches(rng) -> Instance:
    """grep -c: the number of lines containing a word."""
    f, out, lines = _source_and_out(rng, 5, 9)
    w = _word_in(rng, lines)
    n = sum(w in line for line in lines)
    return _to_new_file(
        "count_matches",
        f,
        lines,
        out,
        f"{n}\n",
        f"Write the number of lines in {f} that contain {w} to a new file {out}.",
        f"grep -c {w} {f} > {out}",
        paraphrases=(
            f"Count the lines of {f} containing {w}; save the count in a new file {out}.",
            f"Put how many lines of {f} mention {w} into a new file {out}.",
        ),
    )


def grep_lines(rng) -> Instance:
    """grep: the lines containing a word, into a new file."""
    f, out, lines = _source_and_out(rng, 5, 9)
    w = _word_in(rng, lines)
    return _to_new_file(
        "grep_lines",
        f,
        lines,
        out,
        _text([line for line in lines if w in line]),
        f"Write the lines of {f} that contain {w} to a new file {out}.",
        f"grep {w} {f} > {out}",
        paraphrases=(
            f"Save every line of {f} containing {w} in a new file {out}.",
            f"Put the lines of {f} that mention {w} into a new file {out}.",
        ),
    )


def head_lines(rng) -> Instance:
    """head: the first k lines, into a new file."""
    f, out, lines = _source_and_out(rng, 5, 9)
    k = int(rng.integers(1, 4))
    return _to_new_file(
        "head_lines",
        f,
        lines,
        out,
        _text(lines[:k]),
        f"Write the first {k} lines of {f} to a new file {out}.",
        f"head -n {k} {f} > {out}",
        paraphrases=(
            f"Save the top {k} lines of {f} in a new file {out}.",
            f"Put the opening {k} lines of {f} into a new file {out}.",
        ),
    )


def sort_lines(rng) -> Instance:
    """sort: a file's lines sorted, into a new file."""
    f, out, lines = _source_and_out(rng)
    return _to_new_file(
        "sort_lines",
        f,
        lines,
        out,
        _text(sorted(lines)),
        f"Write the lines of {f}, sorted alphabetically, to a new file {out}.",
        f"sort {f} > {out}",
        paraphrases=(
            f"Sort the lines of {f} alphabetically into a new file {out}.",
            f"Save the lines of {f} in alphabetical order in a new file {out}.",
        ),
    )


def make_executable(rng) -> Instance:
    """chmod +x: make a script executable."""
    f = f"{_pick(rng, STEMS)}.sh"
    body = f"#!/bin/sh\necho {_line(rng)}\n"
    start = {f: Entry("file", body), **_distractors(rng, {f})}
    return Instance(
        "make_executable",
        f"Make {f} executable.",
        start,
        _set(start, {f: Entry("file", body, True)}),
        [f"chmod +x {f}"],
        mistake=f"chmod +x {_stem(f)}",
        paraphrases=(f"Give {f} permission to execute.", f"Set the executable bit on {f}."),
    )


def find_ext(rng) -> Instance:
    """ls/find by extension: the names of a directory's files of one extension, sorted."""
    d = _pick(rng, DIRS)
    ext, other = _pick(rng, EXTS, 2)
    out = f"{_pick(rng, ['found', 'matches', 'listing', 'files'])}.txt"
    stems = _pick(rng, STEMS, int(rng.integers(3, 6)))
    n_match = int(rng.integers(1, len(stems)))
    names = [f"{s}.{ext}" for s in stems[:n_match]] + [f"{s}.{other}" for s in stems[n_match:]]
    start = {d: Entry("dir"), **{f"{d}/{n}": Entry("file", _text(_lines(rng, 1, 2))) for n in names}}
    found = sorted(n for n in names if n.endswith("." + ext))
    return Instance(
        "find_ext",
        f"Write the names of the .{ext} files in {d}, one per line, sorted, to a new file {out}.",
        start,
        _set(start, {out: Entry("file", _text(found))}),
        [f"ls {d} | grep '\\.{ext}$' | sort > {out}"],
        paraphrases=(
            f"List the .{ext} files in {d} (names only, sorted, one per line) in a new file {out}.",
            f"Save the sorted names of the .{ext} files in {d}, one per line, in a new file {out}.",
        ),
    )


def replace_word(rng) -> Instance:
    """sed: replace every occurrence of a word in a file."""
    (f,) = _file_names(rng, 1, ext="txt")
    lines = _lines(rng, 3, 6)
    a = _word_in(rng, lines)
    b = _pick(rng, [w for w in WORDS if w not in " ".join(lines).split()])
    start = {f: Entry("file", _text(lines)), **_distractors(rng, {f})}
    return Instance(
        "replace_word",
        f"In {f}, replace every {a} with {b}.",
        start,
        _set(start, {f: Entry("file", _text([line.replace(a, b) for line in lines]))}),
        [f"sed -i 's/{a}/{b}/g' {f}"],
        paraphrases=(f"Change each {a} in {f} to {b}.", f"Edit {f} so that every {a} becomes {b}."),
    )


def move_into_dir(rng) -> Instance:
    """mv into a directory."""
    d = _pick(rng, DIRS)
    (f,) = _file_names(rng, 1)
    body = Entry("file", _text(_lines(rng, 1, 4)))
    start = {d: Entry("dir"), f: body, **_distractors(rng, {f})}
    return Instance(
        "move_into_dir",
        f"Move {f} into the directory {d}.",
        start,
        _set(start, {f: None, f"{d}/{f}": body}),
        [f"mv {f} {d}/"],
        paraphrases=(f"Put {f} inside {d}, leaving no copy behind.", f"Relocate {f} to the directory {d}."),
    )


def make_two_dirs(rng) -> Instance:
    """mkdir with two operands: two directories at once."""
    a, b = _pick(rng, DIRS, 2)
    start = _distractors(rng, {a, b})
    return Instance(
        "make_two_dirs",
        f"Create two directories, {a} and {b}.",
        start,
        _set(start, {a: Entry("dir"), b: Entry("dir")}),
        [f"mkdir {a} {b}"],
        paraphrases=(f"Make the directories {a} and {b}.", f"Add two new directories named {a} and {b}."),
    )


def write_into_new_dir(rng) -> Instance:
    """mkdir, then a file inside it: the parent must exist before the file."""
    d = _pick(rng, DIRS)
    (f,) = _file_names(rng, 1)
    text = _line(rng)
    start = _distractors(rng, {d, f})
    return Instance(
        "write_into_new_dir",
        f"Create a file {d}/{f} containing the line: {text} (the directory {d} does not exist yet).",
        start,
        _set(start, {d: Entry("dir"), f"{d}/{f}": Entry("file", text + "\n")}),
        [f"mkdir {d} && echo {_q(text)} > {d}/{f}"],
        mistake=f"echo {_q(text)} > {d}/{f}",
        paraphrases=(
            f"Make a new directory {d} and in it a file {f} containing the line: {text}",
            f"Inside a new directory {d}, create a file {f} holding the line: {text}",
        ),
    )


def delete_empty_dir(rng) -> Instance:
    """rmdir: an empty directory."""
    d = _pick(rng, DIRS)
    start = {d: Entry("dir"), **_distractors(rng, {d})}
    return Instance(
        "delete_empty_dir",
        f"Delete the empty directory {d}.",
        start,
        _set(start, {d: None}),
        [f"rmdir {d}"],
        paraphrases=(f"Remove the directory {d}, which is empty.", f"Get rid of the empty directory {d}."),
    )


def copy_into_dir(rng) -> Instance:
    """cp into a directory (the original stays)."""
    d = _pick(rng, DIRS)
    (f,) = _file_names(rng, 1)
    body = Entry("file", _text(_lines(rng, 1, 4)))
    start = {d: Entry("dir"), f: body, **_distractors(rng, {f})}
    return Instance(
        "copy_into_dir",
        f"Copy {f} into the directory {d}.",
        start,
        _set(start, {f"{d}/{f}": body}),
        [f"cp {f} {d}/"],
        mistake=f"cp {_stem(f)} {d}/",
        paraphrases=(
            f"Put a copy of {f} in the directory {d}, keeping the original.",
            f"Duplicate {f} into the directory {d}.",
        ),
    )


def rename_dir(rng) -> Instance:
    """mv on a directory: rename it with its files."""
    a, b = _pick(rng, DIRS, 2)
    inside = {n: Entry("file", _text(_lines(rng, 1, 2))) for n in _file_names(rng, int(rng.integers(1, 3)))}
    start = {a: Entry("dir"), **{f"{a}/{n}": e for n, e in inside.items()}}
    end = {b: Entry("dir"), **{f"{b}/{n}": e for n, e in inside.items()}}
    return Instance(
        "rename_dir",
        f"Rename the directory {a} to {b}.",
        start,
        end,
        [f"mv {a} {b}"],
        paraphrases=(f"Change the name of the directory {a} to {b}.", f"Give the directory {a} the new name {b}."),
    )


def delete_by_ext(rng) -> Instance:
    """rm with a glob: every file of one extension in a directory."""
    d = _pick(rng, DIRS)
    ext, other = _pick(rng, EXTS, 2)
    stems = _pick(rng, STEMS, int(rng.integers(3, 6)))
    n_match = int(rng.integers(1, len(stems)))
    names = [f"{s}.{ext}" for s in stems[:n_match]] + [f"{s}.{other}" for s in stems[n_match:]]
    start = {d: Entry("dir"), **{f"{d}/{n}": Entry("file", _text(_lines(rng, 1, 2))) for n in names}}
    gone = {f"{d}/{n}": None for n in names if n.endswith("." + ext)}
    return Instance(
        "delete_by_ext",
        f"Delete every .{ext} file in {d}.",
        start,
        _set(start, gone),
        [f"rm {d}/*.{ext}"],
        paraphrases=(f"Remove all the .{ext} files from {d}.", f"In {d}, delete the files ending in .{ext}."),
    )


def count_chars(rng) -> Instance:
    """wc -c: the number of characters (bytes) of a file."""
    f, out, lines = _source_and_out(rng)
    return _to_new_file(
        "count_chars",
        f,
        lines,
        out,
        f"{len(_text(lines))}\n",
        f"Write the number of characters in {f} to a new file {out}.",
        f"wc -c < {f} > {out}",
        paraphrases=(
            f"Count the characters of {f} and save the count in a new file {out}.",
            f"Put how many characters {f} has into a new file {out}.",
        ),
    )


def reverse_sort(rng) -> Instance:
    """sort -r: a file's lines in reverse order."""
    f, out, lines = _source_and_out(rng)
    return _to_new_file(
        "reverse_sort",
        f,
        lines,
        out,
        _text(sorted(lines, reverse=True)),
        f"Write the lines of {f}, sorted in reverse alphabetical order, to a new file {out}.",
        f"sort -r {f} > {out}",
        paraphrases=(
            f"Sort the lines of {f} from Z to A into a new file {out}.",
            f"Save the lines of {f} in reverse alphabetical order in a new file {out}.",
        ),
    )


def squeeze_repeats(rng) -> Instance:
    """uniq: runs of repeated adjacent lines collapsed into one."""
    f, out = _file_names(rng, 2, ext="txt")
    lines = [line for line in _lines(rng, 3, 5) for _ in range(int(rng.integers(1, 4)))]
    squeezed = [line for i, line in enumerate(lines) if i == 0 or lines[i - 1] != line]
    return _to_new_file(
        "squeeze_repeats",
        f,
        lines,
        out,
        _text(squeezed),
        f"Write the lines of {f} to a new file {out}, with each run of repeated adjacent lines kept once.",
        f"uniq {f} > {out}",
        paraphrases=(
            f"Save the lines of {f} in a new file {out}, collapsing each run of identical adjacent lines into one.",
            f"Write {f} to a new file {out} with consecutive repeated lines squeezed into one.",
        ),
    )


def join_files(rng) -> Instance:
    """cat: two files, one after the other, into a new one."""
    a, b, c = _file_names(rng, 3, ext="txt")
    ta, tb = _text(_lines(rng, 1, 3)), _text(_lines(rng, 1, 3))
    start = {a: Entry("file", ta), b: Entry("file", tb)}
    return Instance(
        "join_files",
        f"Write the contents of {a} followed by those of {b} to a new file {c}.",
        start,
        _set(start, {c: Entry("file", ta + tb)}),
        [f"cat {a} {b} > {c}"],
        paraphrases=(
            f"Join {a} and then {b} into a new file {c}.",
            f"Concatenate {a} and {b}, in that order, into a new file {c}.",
        ),
    )


def drop_matches(rng) -> Instance:
    """grep -v: the lines without a word, into a new file."""
    f, out, lines = _source_and_out(rng, 5, 9)
    w = _word_in(rng, lines)
    return _to_new_file(
        "drop_matches",
        f,
        lines,
        out,
        _text([line for line in lines if w not in line]),
        f"Write the lines of {f} that do not contain {w} to a new file {out}.",
        f"grep -v {w} {f} > {out}",
        paraphrases=(
            f"Save every line of {f} without {w} in a new file {out}.",
            f"Put the lines of {f} that lack {w} into a new file {out}.",
        ),
    )


def upper_case(rng) -> Instance:
    """tr: a file in upper case, into a new file."""
    f, out, lines = _source_and_out(rng, 2, 5)
    return _to_new_file(
        "upper_case",
        f,
        lines,
        out,
        _text([line.upper() for line in lines]),
        f"Write the text of {f} in upper case to a new file {out}.",
        f"tr a-z A-Z < {f} > {out}",
        paraphrases=(
            f"Save {f} converted to capital letters in a new file {out}.",
            f"Put an upper-case version of {f} into a new file {out}.",
        ),
    )


def make_dir_inside(rng) -> Instance:
    """mkdir with a path: a directory inside an existing one."""
    a, b = _pick(rng, DIRS, 2)
    start = {a: Entry("dir"), **_distractors(rng, {a})}
    return Instance(
        "make_dir_inside",
        f"Create a directory named {b} inside the existing directory {a}.",
        start,
        _set(start, {f"{a}/{b}": Entry("dir")}),
        [f"mkdir {a}/{b}"],
        paraphrases=(f"Make a subdirectory {b} in the directory {a}.", f"Add a directory {a}/{b}; {a} already exists."),
    )


def skip_first_line(rng) -> Instance:
    """tail -n +2: every line but the first (a header), into a new file."""
    f, out, lines = _source_and_out(rng, 3, 7)
    return _to_new_file(
        "skip_first_line",
        f,
        lines,
        out,
        _text(lines[1:]),
        f"Write every line of {f} except the first one to a new file {out}.",
        f"tail -n +2 {f} > {out}",
        paraphrases=(
            f"Save {f} without its header line in a new file {out}.",
            f"Put all lines of {f} but the first into a new file {out}.",
        ),
    )


def files_containing(rng) -> Instance:
    """grep -rl: the paths of the files under a directory that contain a word, sorted."""
    d = _pick(rng, DIRS)
    w = _pick(rng, WORDS)
    others = [x for x in WORDS if x != w]
    out = f"{_pick(rng, ['found', 'matches', 'hits'])}.txt"
    names = _file_names(rng, int(rng.integers(3, 6)), ext="txt")
    hits = set(_pick(rng, names, int(rng.integers(1, len(names)))))
    start: Tree = {d: Entry("dir")}
    for n in names:
        lines = [" ".join(_pick(rng, others, 2)) for _ in range(int(rng.integers(1, 3)))]
        if n in hits:
            lines.append(f"{_pick(rng, others)} {w}")
        start[f"{d}/{n}"] = Entry("file", _text(lines))
    found = sorted(f"{d}/{n}" for n in hits)
    return Instance(
        "files_containing",
        f"Write the paths of the files in {d} that contain {w}, one per line, sorted, to a new file {out}.",
        start,
        _set(start, {out: Entry("file", _text(found))}),
        [f"grep -rl {w} {d} | sort > {out}"],
        paraphrases=(
            f"List which files in {d} mention {w} (paths, sorted, one per line) in a new file {out}.",
            f"Save the sorted paths of the files in {d} containing {w}, one per line, in a new file {out}.",
        ),
    )


def empty_dir(rng) -> Instance:
    """rm with a glob on a whole directory: every file in it, the directory kept."""
    d = _pick(rng, DIRS)
    inside, start = _dir_of_files(rng, d)
    return Instance(
        "empty_dir",
        f"Delete every file in the directory {d}, keeping {d} itself.",
        start,
        _set(start, {p: None for p in inside}),
        [f"rm {d}/*"],
        paraphrases=(
            f"Remove all the files inside {d} but keep the directory.",
            f"Empty the directory {d} without removing it.",
        ),
    )


def copy_all_into_dir(rng) -> Instance:
    """cp with a glob: every file of one directory into another existing one."""
    a, b = _pick(rng, DIRS, 2)
    inside = {n: Entry("file", _text(_lines(rng, 1, 3))) for n in _file_names(rng, int(rng.integers(2, 4)))}
    start = {a: Entry("dir"), b: Entry("dir"), **{f"{a}/{n}": e for n, e in inside.items()}}
    return Instance(
        "copy_all_into_dir",
        f"Copy every file in the directory {a} into the existing directory {b}.",
        start,
        _set(start, {f"{b}/{n}": e for n, e in inside.items()}),
        [f"cp {a}/* {b}/"],
        paraphrases=(
            f"Put copies of all the files in {a} into {b}, which already exists.",
            f"Duplicate each file of the directory {a} into the directory {b}.",
        ),
    )


def repeated_lines(rng) -> Instance:
    """sort | uniq -d: the lines that occur more than once, each once, sorted."""
    f, out = _file_names(rng, 2, ext="txt")
    base = _lines(rng, 3, 5)
    twice = _pick(rng, base, int(rng.integers(1, len(base))))
    lines = base + twice
    rng.shuffle(lines)
    return _to_new_file(
        "repeated_lines",
        f,
        lines,
        out,
        _text(sorted({line for line in lines if lines.count(line) > 1})),
        f"Write the lines that occur more than once in {f}, each once, sorted alphabetically, to a new file {out}.",
        f"sort {f} | uniq -d > {out}",
        paraphrases=(
            f"Find the duplicated lines of {f} and save each of them once, sorted, in a new file {out}.",
            f"Put the lines that repeat in {f}, one copy each in alphabetical order, into a new file {out}.",
        ),
    )


def numeric_sort(rng) -> Instance:
    """sort -n: numbers sorted by value (not as text), into a new file."""
    f, out = _file_names(rng, 2, ext="txt")
    numbers = [int(x) for x in rng.choice(1000, size=int(rng.integers(4, 8)), replace=False)]
    lines = [str(n) for n in numbers]
    return _to_new_file(
        "numeric_sort",
        f,
        lines,
        out,
        _text([str(n) for n in sorted(numbers)]),
        f"Write the numbers in {f}, sorted from smallest to largest, to a new file {out}.",
        f"sort -n {f} > {out}",
        paraphrases=(
            f"Sort the numbers of {f} by value, ascending, into a new file {out}.",
            f"Save the numbers of {f} in increasing numeric order in a new file {out}.",
        ),
    )


def count_files(rng) -> Instance:
    """ls | wc -l: the number of files in a directory, as a number in a new file."""
    d = _pick(rng, DIRS)
    out = f"{_pick(rng, ['count', 'total', 'number'])}.txt"
    names = _file_names(rng, int(rng.integers(1, 7)))
    start = {d: Entry("dir"), **{f"{d}/{n}": Entry("file", _text(_lines(rng, 1, 2))) for n in names}}
    return Instance(
        "count_files",
        f"Write the number of files in the directory {d} to a new file {out}.",
        start,
        _set(start, {out: Entry("file", f"{len(names)}\n")}),
        [f"ls {d} | wc -l > {out}"],
        paraphrases=(
            f"Count the files in the directory {d} and save the count in a new file {out}.",
            f"Put how many files the directory {d} contains into a new file {out}.",
        ),
    )


# held-out templates: relatives of the trained ones, never trained on
def make_nested_dirs(rng) -> Instance:
    """mkdir -p (held out; a relative of make_dir): a directory inside a new one."""
    a, b = _pick(rng, DIRS, 2)
    start = _distractors(rng, {a})
    return Instance(
        "make_nested_dirs",
        f"Create the directory {a}/{b} (and {a} with it).",
        start,
        _set(start, {a: Entry("dir"), f"{a}/{b}": Entry("dir")}),
        [f"mkdir -p {a}/{b}"],
    )


def delete_dir(rng) -> Instance:
    """rm -r (held out; a relative of delete_file): a directory and its files."""
    d = _pick(rng, DIRS)
    inside, start = _dir_of_files(rng, d)
    gone = {p: None for p in [d, *inside]}
    return Instance(
        "delete_dir", f"Delete the directory {d} and everything in it.", start, _set(start, gone), [f"rm -r {d}"]
    )


def tail_lines(rng) -> Instance:
    """tail (held out; a relative of head_lines): the last k lines, into a new file."""
    f, out, lines = _source_and_out(rng, 5, 9)
    k = int(rng.integers(1, 4))
    return _to_new_file(
        "tail_lines",
        f,
        lines,
        out,
        _text(lines[-k:]),
        f"Write the last {k} lines of {f} to a new file {out}.",
        f"tail -n {k} {f} > {out}",
    )


def count_words(rng) -> Instance:
    """wc -w (held out; a relative of count_lines): the number of words of a file."""
    f, out, lines = _source_and_out(rng)
    n = sum(len(line.split()) for line in lines)
    return _to_new_file(
        "count_words",
        f,
        lines,
        out,
        f"{n}\n",
        f"Write the number of words in {f} to a new file {out}.",
        f"wc -w < {f} > {out}",
    )


def copy_dir(rng) -> Instance:
    """cp -r (held out; a relative of copy_file): copy a directory with its files."""
    a, b = _pick(rng, DIRS, 2)
    inside = {n: Entry("file", _text(_lines(rng, 1, 3))) for n in _file_names(rng, int(rng.integers(1, 4)))}
    start = {a: Entry("dir"), **{f"{a}/{n}": e for n, e in inside.items()}}
    copied = {b: Entry("dir"), **{f"{b}/{n}": e for n, e in inside.items()}}
    return Instance("copy_dir", f"Copy the directory {a} to {b}.", start, _set(start, copied), [f"cp -r {a} {b}"])


def unique_lines(rng) -> Instance:
    """sort -u (held out; a relative of sort_lines): the distinct lines, sorted."""
    f, out = _file_names(rng, 2, ext="txt")
    base = _lines(rng, 3, 5)
    lines = base + [base[int(i)] for i in rng.integers(0, len(base), size=int(rng.integers(2, 5)))]
    rng.shuffle(lines)
    return _to_new_file(
        "unique_lines",
        f,
        lines,
        out,
        _text(sorted(set(lines))),
        f"Write the distinct lines of {f}, sorted alphabetically, to a new file {out}.",
        f"sort -u {f} > {out}",
    )


Template = Callable[[np.random.Generator], Instance]
TRAIN_TEMPLATES: dict[str, Template] = {
    t.__name__: t
    for t in (
        make_dir,
        make_file,
        write_line,
        copy_file,
        rename_file,
        delete_file,
        append_line,
        count_lines,
        count_matches,
        grep_lines,
        head_lines,
        sort_lines,
        make_executable,
        find_ext,
        replace_word,
        move_into_dir,
        make_two_dirs,
        write_into_new_dir,
        delete_empty_dir,
        copy_into_dir,
        rename_dir,
        delete_by_ext,
        count_chars,
        reverse_sort,
        squeeze_repeats,
        join_files,
        drop_matches,
        upper_case,
        make_dir_inside,
        skip_first_line,
        files_containing,
        empty_dir,
        copy_all_into_dir,
        repeated_lines,
        numeric_sort,
        count_files,
    )
}
HELD_OUT_TEMPLATES: dict[str, Template] = {
    t.__name__: t for t in (make_nested_dirs, delete_dir, tail_lines, count_words, copy_dir, unique_lines)
}
TEMPLATES: dict[str, Template] = {**TRAIN_TEMPLATES, **HELD_OUT_TEMPLATES}
