"""The `shell` task family's templates: simple shell work with random names and contents.

A template is a function `rng -> Instance`: the instruction, the working directory's files
before (`start`) and the whole tree it must hold after (`end`), and a reference solution
(shell commands, one per turn), for the training templates other wordings of the instruction
(other verbs and word orders: "write ... to", "save ... as", "... and write the result to"),
and, for some, a plausible first command that fails with an informative error (`mistake`:
recovery demonstrations show it, the error, then the fix). The end state is complete — every
path, its type, its content and its executable bit — so a checker comparing trees rewards
only the right result: extra files, a deleted neighbour or a wrong line all score 0.

A template writes each path it mentions through `_p`, so an instance can be told, and solved,
with paths relative to the working directory or absolute (`/app/notes.txt`), as people write
tasks either way; `Instance.told`, `commands` and `wrong_command` give the text in the
instance's style, and the reference commands work from any working directory when the paths
are absolute. Some source files sit in a directory (`logs/notes.txt`), some at the top.

`TRAIN_TEMPLATES` are what a run trains on; `HELD_OUT_TEMPLATES` are never trained on and
measure generalisation (each is a near relative of a trained one: `rm -r` of `rm`, `wc -w` of
`wc -l`, `cp -r` of `cp`).
"""

from __future__ import annotations

import hashlib
import json
import re
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
WORKDIR = "/app"  # where every instance's files are (`tasks.to_task` builds them there)

# A path in a template's text sits between these marks; `render` writes it relative or absolute.
_OPEN, _CLOSE = "\x1e", "\x1f"
_AT_ROOT = "\x1d"  # before a command that needs the working directory: `cd /app && ` when paths are absolute
_MARKED = re.compile(f"{_OPEN}([^{_CLOSE}]*){_CLOSE}")


def _p(path: str) -> str:
    """`path` (relative to the working directory) as a template writes it, to be rendered either way."""
    return f"{_OPEN}{path}{_CLOSE}"


def render(text: str, absolute: bool) -> str:
    """A template's text with its marked paths written relative to the working directory, or absolute
    (a script run as `./name` runs as `/app/name`)."""
    text = text.replace(_AT_ROOT, f"cd {WORKDIR} && " if absolute else "")
    if absolute:
        text = text.replace("./" + _OPEN, _OPEN)
    return _MARKED.sub(lambda m: f"{WORKDIR}/{m.group(1)}" if absolute else m.group(1), text)


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
    """One generated task: what the agent is told, the tree before and after, and a reference solution.

    `instruction`, `paraphrases`, `solution` and `mistake` are the template's text, paths marked
    (`_p`); read them rendered in the instance's style through `told`, `wordings`, `commands` and
    `wrong_command`."""

    template: str
    instruction: str
    start: Tree
    end: Tree
    solution: list[str]  # one shell command per turn
    # A plausible first command that fails with an error naming what is wrong; a recovery
    # demonstration runs it, shows the error, then the solution (never part of `solution`).
    mistake: str | None = None
    # Other wordings of `instruction`, the same task in other words; `wording` picks the one the
    # agent is told (0: `instruction`), `absolute` whether its paths are absolute. None of them is
    # part of `key`: a held-out instance stays held out however it is worded.
    paraphrases: tuple[str, ...] = ()
    wording: int = 0
    absolute: bool = False

    @property
    def wordings(self) -> tuple[str, ...]:
        """Every wording of the instruction, in the instance's path style."""
        return tuple(render(w, self.absolute) for w in (self.instruction, *self.paraphrases))

    @property
    def told(self) -> str:
        """The instruction in the words the agent gets."""
        return self.wordings[self.wording]

    @property
    def commands(self) -> list[str]:
        """The reference solution's commands, in the instance's path style."""
        return [render(c, self.absolute) for c in self.solution]

    @property
    def wrong_command(self) -> str | None:
        """The typical mistake's command, in the instance's path style (None: the template has none)."""
        return None if self.mistake is None else render(self.mistake, self.absolute)

    @property
    def key(self) -> str:
        """A digest of everything that defines the instance (two equal instances share it)."""
        told = render(self.instruction, False)
        blob = json.dumps(
            [self.template, told, {p: e.to_json() for p, e in sorted(self.start.items())}], sort_keys=True
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


LEVELS = ("INFO", "WARN", "ERROR", "DEBUG")  # log levels: upper case, never inside a word of WORDS
SETTINGS = ("port", "timeout", "limit", "size", "retries", "workers")


def _record(rng: np.random.Generator) -> str:
    """A line as configuration and data files hold them: a hosts entry, a setting, a version pin or a CSV row."""
    w, n = _pick(rng, WORDS), int(rng.integers(1, 1000))
    kind = int(rng.integers(4))
    if kind == 0:
        return f"10.0.{int(rng.integers(0, 10))}.{int(rng.integers(1, 100))} {w}.lan"
    if kind == 1:
        return f"{w}_{_pick(rng, SETTINGS)} = {n}"
    if kind == 2:
        return "{}=={}.{}.{}".format(w, *(int(x) for x in rng.integers(0, 10, size=3)))
    return f"{w},{n},{_pick(rng, WORDS)}"


def _log_lines(rng: np.random.Generator, lo: int, hi: int) -> list[str]:
    """Log lines, each a date, a level and a few words."""
    return [
        f"2024-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d} {_pick(rng, LEVELS)} {_line(rng)}"
        for _ in range(int(rng.integers(lo, hi + 1)))
    ]


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


def _with_parents(tree: Tree) -> Tree:
    """`tree` with a directory entry for the parent of every path in it that sits in a directory."""
    out = dict(tree)
    for path in tree:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            out.setdefault("/".join(parts[:i]), Entry("dir"))
    return out


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
    D = _p(d)
    return Instance(
        "make_dir",
        f"Create a directory named {D}.",
        start,
        _set(start, {d: Entry("dir")}),
        [f"mkdir {D}"],
        paraphrases=(
            f"Make a new directory called {D}.",
            f"Add an empty directory {D} to the working directory.",
            f"I need an empty folder {D}; create it.",
        ),
    )


def make_file(rng) -> Instance:
    """touch: create an empty file."""
    (f,) = _file_names(rng, 1)
    start = _distractors(rng, {f})
    F = _p(f)
    return Instance(
        "make_file",
        f"Create an empty file named {F}.",
        start,
        _set(start, {f: Entry("file")}),
        [f"touch {F}"],
        paraphrases=(
            f"Make a new, empty file called {F}.",
            f"Add an empty file {F} to the working directory.",
            f"{F} should exist as an empty file. Create it.",
        ),
    )


def write_line(rng) -> Instance:
    """echo >: a new file holding one line."""
    (f,) = _file_names(rng, 1)
    text = _line(rng)
    start = _distractors(rng, {f})
    F = _p(f)
    return Instance(
        "write_line",
        f"Create a file named {F} containing the line: {text}",
        start,
        _set(start, {f: Entry("file", text + "\n")}),
        [f"echo {_q(text)} > {F}"],
        paraphrases=(
            f"Make a new file {F} whose only line is: {text}",
            f"Save this line in a new file {F}: {text}",
            f"Write the line {text} to a new file {F}.",
        ),
    )


def copy_file(rng) -> Instance:
    """cp: copy a file (the original stays); one time in three a backup beside it (`name.bak`), in a
    directory half of those times."""
    a, b = _file_names(rng, 2)
    backup = rng.random() < 1 / 3
    if backup:
        d = _pick(rng, DIRS) if rng.random() < 0.5 else ""
        a = f"{d}/{a}" if d else a
        b = a + ".bak"
    body = Entry("file", _text(_lines(rng)))
    start = _with_parents({a: body, **_distractors(rng, {a.split("/")[-1], b.split("/")[-1]})})
    A, B = _p(a), _p(b)
    if backup:
        wordings = (
            f"Make a backup copy of {A} named {B}.",
            f"Back up {A} to {B}, leaving the original as it is.",
            f"Copy {A} to {B} as a backup; {A} must not change.",
            f"Save a backup of {A} as {B}.",
        )
    else:
        wordings = (
            f"Copy {A} to {B}.",
            f"Make a copy of {A} named {B}.",
            f"Duplicate {A} as {B}, keeping {A}.",
            f"Make a backup copy of {A} and save it as {B}.",
        )
    return Instance(
        "copy_file",
        wordings[0],
        start,
        _set(start, {b: body}),
        [f"cp {A} {B}"],
        mistake=f"cp {B} {A}",
        paraphrases=wordings[1:],
    )


def rename_file(rng) -> Instance:
    """mv: rename a file; one time in three a file in a directory, renamed where it is."""
    a, b = _file_names(rng, 2)
    d = _pick(rng, DIRS) if rng.random() < 1 / 3 else ""
    at = (lambda name: f"{d}/{name}") if d else (lambda name: name)
    body = Entry("file", _text(_lines(rng)))
    start = _with_parents({at(a): body, **_distractors(rng, {a, b})})
    A, B = _p(at(a)), _p(at(b))
    if d:
        D = _p(d)
        wordings = (
            f"Rename {A} to {B}.",
            f"Rename {A} to {b}, keeping it in {D}.",
            f"In {D}, rename {a} to {b}.",
            f"Give the file {A} the new name {b}; it stays in the folder {D}.",
        )
    else:
        wordings = (
            f"Rename {A} to {B}.",
            f"Change the name of {A} to {B}.",
            f"Give the file {A} the new name {B}.",
            f"{A} should be called {B} from now on; rename it.",
        )
    return Instance(
        "rename_file",
        wordings[0],
        start,
        _set(start, {at(a): None, at(b): body}),
        [f"mv {A} {B}"],
        mistake=f"mv {_p(at(_stem(a)))} {B}",
        paraphrases=wordings[1:],
    )


def delete_file(rng) -> Instance:
    """rm: delete one file, leaving its neighbours."""
    (a,) = _file_names(rng, 1)
    start = {a: Entry("file", _text(_lines(rng))), **_distractors(rng, {a}, k=int(rng.integers(1, 3)))}
    A = _p(a)
    return Instance(
        "delete_file",
        f"Delete the file {A}.",
        start,
        _set(start, {a: None}),
        [f"rm {A}"],
        mistake=f"rm {_p(_stem(a))}",
        paraphrases=(
            f"Remove {A}.",
            f"Get rid of the file {A}, leaving the other files.",
            f"{A} is no longer needed. Delete it and keep everything else.",
        ),
    )


def append_line(rng) -> Instance:
    """echo >>: append a line to a file (half the time a file of records: hosts, settings, pins, CSV rows)."""
    records = rng.random() < 0.5
    (f,) = _file_names(rng, 1, ext=_pick(rng, ["txt", "cfg", "csv"]) if records else None)
    line = _record if records else _line
    lines, extra = [line(rng) for _ in range(int(rng.integers(2, 6)))], line(rng)
    start = {f: Entry("file", _text(lines)), **_distractors(rng, {f})}
    F = _p(f)
    return Instance(
        "append_line",
        f"Append the line {extra} to the end of {F}.",
        start,
        _set(start, {f: Entry("file", _text(lines + [extra]))}),
        [f"echo {_q(extra)} >> {F}"],
        paraphrases=(
            f"Add the line {extra} at the end of {F}.",
            f"Add a line to {F} after its existing ones: {extra}",
            f"Add the line `{extra}` to the end of {F}. Keep the lines that are already there.",
        ),
    )


def _source_and_out(rng, lo: int = 4, hi: int = 9) -> tuple[str, str, list[str]]:
    """A source file (in a directory one time in three) and a new output file, with the source's lines."""
    f, out = _file_names(rng, 2, ext="txt")
    if rng.random() < 1 / 3:
        f = f"{_pick(rng, DIRS)}/{f}"
    return f, out, _lines(rng, lo, hi)


def _result_wordings(what: str, do: str, out: str) -> tuple[str, ...]:
    """The ways people ask for a result in a new file: `what` it holds (a noun phrase), or what to `do`
    (an imperative) and then where the result goes."""
    o = _p(out)
    return (f"Save {what} as {o}.", f"{do} and write the result to {o}.", f"{do}, then save the result as {o}.")


def _to_new_file(
    name: str,
    f: str,
    lines: list[str],
    out: str,
    text: str,
    what: str,
    do: str,
    command: str,
    paraphrases: tuple[str, ...] = (),
    prompt: str | None = None,
) -> Instance:
    """An instance whose start is one file `f` of `lines` (and its directory) and whose end adds a new file
    `out` holding `text`; told "Write `what` to a new file `out`." (or `prompt`), in other words by
    `paraphrases` and `_result_wordings`."""
    start = _with_parents({f: Entry("file", _text(lines))})
    told = prompt or f"Write {what} to a new file {_p(out)}."
    wordings = paraphrases + _result_wordings(what, do, out)
    return Instance(name, told, start, _set(start, {out: Entry("file", text)}), [command], paraphrases=wordings)


def _held_out_new_file(name: str, f: str, lines: list[str], out: str, text: str, prompt: str, command: str) -> Instance:
    """As `_to_new_file`, told in one wording only (a held-out template's test does not move)."""
    start = _with_parents({f: Entry("file", _text(lines))})
    return Instance(name, prompt, start, _set(start, {out: Entry("file", text)}), [command])


def count_lines(rng) -> Instance:
    """wc -l: the number of lines of a file, as a number in a new file."""
    f, out, lines = _source_and_out(rng)
    F, OUT = _p(f), _p(out)
    return _to_new_file(
        "count_lines",
        f,
        lines,
        out,
        f"{len(lines)}\n",
        f"the number of lines in {F}",
        f"Count the lines in {F}",
        f"wc -l < {F} > {OUT}",
        paraphrases=(
            f"Count the lines of {F} and save the count in a new file {OUT}.",
            f"Put how many lines {F} has into a new file {OUT}.",
        ),
    )


def _word_in(rng, lines: list[str]) -> str:
    return _pick(rng, sorted({w for line in lines for w in line.split()}))


def _source_with_word(rng, lo: int, hi: int) -> tuple[str, str, list[str], str]:
    """As `_source_and_out`, with a word of the source to search for; one time in three the source is a log
    (`.log`, a date and a level per line) and the word a level it holds (ERROR, WARN, ...)."""
    f, out, lines = _source_and_out(rng, lo, hi)
    if rng.random() >= 1 / 3:
        return f, out, lines, _word_in(rng, lines)
    logs = _log_lines(rng, lo, hi)
    while len({line.split()[1] for line in logs}) < 2:  # some line lacks the level: grep -v keeps one
        logs = _log_lines(rng, lo, hi)
    return f"{_stem(f)}.log", out, logs, _pick(rng, sorted({line.split()[1] for line in logs}))


def count_matches(rng) -> Instance:
    """grep -c: the number of lines containing a word."""
    f, out, lines, w = _source_with_word(rng, 5, 9)
    n = sum(w in line for line in lines)
    F, OUT = _p(f), _p(out)
    return _to_new_file(
        "count_matches",
        f,
        lines,
        out,
        f"{n}\n",
        f"the number of lines in {F} that contain {w}",
        f"Count the lines of {F} that contain {w}",
        f"grep -c {w} {F} > {OUT}",
        paraphrases=(
            f"Count the lines of {F} containing {w}; save the count in a new file {OUT}.",
            f"Put how many lines of {F} mention {w} into a new file {OUT}.",
        ),
    )


def grep_lines(rng) -> Instance:
    """grep: the lines containing a word, into a new file."""
    f, out, lines, w = _source_with_word(rng, 5, 9)
    F, OUT = _p(f), _p(out)
    return _to_new_file(
        "grep_lines",
        f,
        lines,
        out,
        _text([line for line in lines if w in line]),
        f"the lines of {F} that contain {w}",
        f"Find the lines of {F} containing {w}",
        f"grep {w} {F} > {OUT}",
        paraphrases=(
            f"Save every line of {F} containing {w} in a new file {OUT}.",
            f"Put the lines of {F} that mention {w} into a new file {OUT}.",
        ),
    )


def head_lines(rng) -> Instance:
    """head: the first k lines, into a new file."""
    f, out, lines = _source_and_out(rng, 5, 9)
    k = int(rng.integers(1, 4))
    F, OUT = _p(f), _p(out)
    first = "first line" if k == 1 else f"first {k} lines"
    return _to_new_file(
        "head_lines",
        f,
        lines,
        out,
        _text(lines[:k]),
        f"the {first} of {F}",
        f"Take the {first} of {F}",
        f"head -n {k} {F} > {OUT}",
        paraphrases=(
            f"Save the top {'line' if k == 1 else f'{k} lines'} of {F} in a new file {OUT}.",
            f"Put the opening {'line' if k == 1 else f'{k} lines'} of {F} into a new file {OUT}.",
        ),
    )


def sort_lines(rng) -> Instance:
    """sort: a file's lines sorted, into a new file."""
    f, out, lines = _source_and_out(rng)
    F, OUT = _p(f), _p(out)
    return _to_new_file(
        "sort_lines",
        f,
        lines,
        out,
        _text(sorted(lines)),
        f"the lines of {F} in alphabetical order",
        f"Sort the lines of {F} alphabetically",
        f"sort {F} > {OUT}",
        paraphrases=(
            f"Sort the lines of {F} alphabetically into a new file {OUT}.",
            f"Save the lines of {F} in alphabetical order in a new file {OUT}.",
        ),
        prompt=f"Write the lines of {F}, sorted alphabetically, to a new file {OUT}.",
    )


def make_executable(rng) -> Instance:
    """chmod +x: make a script executable."""
    f = f"{_pick(rng, STEMS)}.sh"
    body = f"#!/bin/sh\necho {_line(rng)}\n"
    start = {f: Entry("file", body), **_distractors(rng, {f})}
    F = _p(f)
    return Instance(
        "make_executable",
        f"Make {F} executable.",
        start,
        _set(start, {f: Entry("file", body, True)}),
        [f"chmod +x {F}"],
        mistake=f"chmod +x {_p(_stem(f))}",
        paraphrases=(
            f"Give {F} permission to execute.",
            f"Set the executable bit on {F}.",
            f"The script {F} cannot be run yet; make it executable.",
        ),
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
    D, OUT = _p(d), _p(out)
    return Instance(
        "find_ext",
        f"Write the names of the .{ext} files in {D}, one per line, sorted, to a new file {OUT}.",
        start,
        _set(start, {out: Entry("file", _text(found))}),
        [f"ls {D} | grep '\\.{ext}$' | sort > {OUT}"],
        paraphrases=(
            f"List the .{ext} files in {D} (names only, sorted, one per line) in a new file {OUT}.",
            f"Save the sorted names of the .{ext} files in {D}, one per line, in a new file {OUT}.",
            f"Which files in {D} end in .{ext}? Save their names, sorted, one per line, as {OUT}.",
        ),
    )


def replace_word(rng) -> Instance:
    """sed: replace every occurrence of a word in a file."""
    (f,) = _file_names(rng, 1, ext="txt")
    lines = _lines(rng, 3, 6)
    a = _word_in(rng, lines)
    b = _pick(rng, [w for w in WORDS if w not in " ".join(lines).split()])
    start = {f: Entry("file", _text(lines)), **_distractors(rng, {f})}
    F = _p(f)
    return Instance(
        "replace_word",
        f"In {F}, replace every {a} with {b}.",
        start,
        _set(start, {f: Entry("file", _text([line.replace(a, b) for line in lines]))}),
        [f"sed -i 's/{a}/{b}/g' {F}"],
        paraphrases=(
            f"Change each {a} in {F} to {b}.",
            f"Edit {F} so that every {a} becomes {b}.",
            f"Replace every occurrence of the word {a} with {b} in {F}.",
        ),
    )


def move_into_dir(rng) -> Instance:
    """mv into a directory."""
    d = _pick(rng, DIRS)
    (f,) = _file_names(rng, 1)
    body = Entry("file", _text(_lines(rng, 1, 4)))
    start = {d: Entry("dir"), f: body, **_distractors(rng, {f})}
    D, F = _p(d), _p(f)
    return Instance(
        "move_into_dir",
        f"Move {F} into the directory {D}.",
        start,
        _set(start, {f: None, f"{d}/{f}": body}),
        [f"mv {F} {D}/"],
        paraphrases=(
            f"Put {F} inside {D}, leaving no copy behind.",
            f"Relocate {F} to the directory {D}.",
            f"{F} belongs in {D}. Move it there.",
        ),
    )


def make_two_dirs(rng) -> Instance:
    """mkdir with two operands: two directories at once."""
    a, b = _pick(rng, DIRS, 2)
    start = _distractors(rng, {a, b})
    A, B = _p(a), _p(b)
    return Instance(
        "make_two_dirs",
        f"Create two directories, {A} and {B}.",
        start,
        _set(start, {a: Entry("dir"), b: Entry("dir")}),
        [f"mkdir {A} {B}"],
        paraphrases=(
            f"Make the directories {A} and {B}.",
            f"Add two new directories named {A} and {B}.",
            f"I need two empty folders: {A} and {B}.",
        ),
    )


def write_into_new_dir(rng) -> Instance:
    """mkdir, then a file inside it: the parent must exist before the file."""
    d = _pick(rng, DIRS)
    (f,) = _file_names(rng, 1)
    text = _line(rng)
    start = _distractors(rng, {d, f})
    D, DF = _p(d), _p(f"{d}/{f}")
    return Instance(
        "write_into_new_dir",
        f"Create a file {DF} containing the line: {text} (the directory {D} does not exist yet).",
        start,
        _set(start, {d: Entry("dir"), f"{d}/{f}": Entry("file", text + "\n")}),
        [f"mkdir {D} && echo {_q(text)} > {DF}"],
        mistake=f"echo {_q(text)} > {DF}",
        paraphrases=(
            f"Make a new directory {D} and in it a file {f} containing the line: {text}",
            f"Inside a new directory {D}, create a file {f} holding the line: {text}",
            f"Write the line {text} to {DF}; the directory {D} has to be created first.",
        ),
    )


def delete_empty_dir(rng) -> Instance:
    """rmdir: an empty directory."""
    d = _pick(rng, DIRS)
    start = {d: Entry("dir"), **_distractors(rng, {d})}
    D = _p(d)
    return Instance(
        "delete_empty_dir",
        f"Delete the empty directory {D}.",
        start,
        _set(start, {d: None}),
        [f"rmdir {D}"],
        paraphrases=(
            f"Remove the directory {D}, which is empty.",
            f"Get rid of the empty directory {D}.",
            f"The directory {D} is empty and no longer needed. Remove it.",
        ),
    )


def copy_into_dir(rng) -> Instance:
    """cp into a directory (the original stays)."""
    d = _pick(rng, DIRS)
    (f,) = _file_names(rng, 1)
    body = Entry("file", _text(_lines(rng, 1, 4)))
    start = {d: Entry("dir"), f: body, **_distractors(rng, {f})}
    D, F = _p(d), _p(f)
    return Instance(
        "copy_into_dir",
        f"Copy {F} into the directory {D}.",
        start,
        _set(start, {f"{d}/{f}": body}),
        [f"cp {F} {D}/"],
        mistake=f"cp {_p(_stem(f))} {D}/",
        paraphrases=(
            f"Put a copy of {F} in the directory {D}, keeping the original.",
            f"Duplicate {F} into the directory {D}.",
            f"Save a copy of {F} in {D}; the original stays where it is.",
        ),
    )


def rename_dir(rng) -> Instance:
    """mv on a directory: rename it with its files."""
    a, b = _pick(rng, DIRS, 2)
    inside = {n: Entry("file", _text(_lines(rng, 1, 2))) for n in _file_names(rng, int(rng.integers(1, 3)))}
    start = {a: Entry("dir"), **{f"{a}/{n}": e for n, e in inside.items()}}
    end = {b: Entry("dir"), **{f"{b}/{n}": e for n, e in inside.items()}}
    A, B = _p(a), _p(b)
    return Instance(
        "rename_dir",
        f"Rename the directory {A} to {B}.",
        start,
        end,
        [f"mv {A} {B}"],
        paraphrases=(
            f"Change the name of the directory {A} to {B}.",
            f"Give the directory {A} the new name {B}.",
            f"The folder {A} should be called {B}; rename it with everything in it.",
        ),
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
    D = _p(d)
    return Instance(
        "delete_by_ext",
        f"Delete every .{ext} file in {D}.",
        start,
        _set(start, gone),
        [f"rm {D}/*.{ext}"],
        paraphrases=(
            f"Remove all the .{ext} files from {D}.",
            f"In {D}, delete the files ending in .{ext}.",
            f"Clean up {D}: remove its .{ext} files and keep the others.",
        ),
    )


def count_chars(rng) -> Instance:
    """wc -c: the number of characters (bytes) of a file."""
    f, out, lines = _source_and_out(rng)
    F, OUT = _p(f), _p(out)
    return _to_new_file(
        "count_chars",
        f,
        lines,
        out,
        f"{len(_text(lines))}\n",
        f"the number of characters in {F}",
        f"Count the characters in {F}",
        f"wc -c < {F} > {OUT}",
        paraphrases=(
            f"Count the characters of {F} and save the count in a new file {OUT}.",
            f"Put how many characters {F} has into a new file {OUT}.",
        ),
    )


def reverse_sort(rng) -> Instance:
    """sort -r: a file's lines in reverse order."""
    f, out, lines = _source_and_out(rng)
    F, OUT = _p(f), _p(out)
    return _to_new_file(
        "reverse_sort",
        f,
        lines,
        out,
        _text(sorted(lines, reverse=True)),
        f"the lines of {F} in reverse alphabetical order",
        f"Sort the lines of {F} in reverse alphabetical order",
        f"sort -r {F} > {OUT}",
        paraphrases=(
            f"Sort the lines of {F} from Z to A into a new file {OUT}.",
            f"Save the lines of {F} in reverse alphabetical order in a new file {OUT}.",
        ),
        prompt=f"Write the lines of {F}, sorted in reverse alphabetical order, to a new file {OUT}.",
    )


def squeeze_repeats(rng) -> Instance:
    """uniq: runs of repeated adjacent lines collapsed into one."""
    f, out = _file_names(rng, 2, ext="txt")
    lines = [line for line in _lines(rng, 3, 5) for _ in range(int(rng.integers(1, 4)))]
    squeezed = [line for i, line in enumerate(lines) if i == 0 or lines[i - 1] != line]
    F, OUT = _p(f), _p(out)
    return _to_new_file(
        "squeeze_repeats",
        f,
        lines,
        out,
        _text(squeezed),
        f"the lines of {F} with each run of repeated adjacent lines kept once",
        f"Collapse each run of identical adjacent lines of {F} into one",
        f"uniq {F} > {OUT}",
        paraphrases=(
            f"Save the lines of {F} in a new file {OUT}, collapsing each run of identical adjacent lines into one.",
            f"Write {F} to a new file {OUT} with consecutive repeated lines squeezed into one.",
        ),
        prompt=f"Write the lines of {F} to a new file {OUT}, with each run of repeated adjacent lines kept once.",
    )


def join_files(rng) -> Instance:
    """cat: two files, one after the other, into a new one."""
    a, b, c = _file_names(rng, 3, ext="txt")
    ta, tb = _text(_lines(rng, 1, 3)), _text(_lines(rng, 1, 3))
    start = {a: Entry("file", ta), b: Entry("file", tb)}
    A, B, C = _p(a), _p(b), _p(c)
    return Instance(
        "join_files",
        f"Write the contents of {A} followed by those of {B} to a new file {C}.",
        start,
        _set(start, {c: Entry("file", ta + tb)}),
        [f"cat {A} {B} > {C}"],
        paraphrases=(
            f"Join {A} and then {B} into a new file {C}.",
            f"Concatenate {A} and {B}, in that order, into a new file {C}.",
            f"Concatenate {A} and {B} (in that order) and save the result as {C}.",
        ),
    )


def drop_matches(rng) -> Instance:
    """grep -v: the lines without a word, into a new file."""
    f, out, lines, w = _source_with_word(rng, 5, 9)
    F, OUT = _p(f), _p(out)
    return _to_new_file(
        "drop_matches",
        f,
        lines,
        out,
        _text([line for line in lines if w not in line]),
        f"the lines of {F} that do not contain {w}",
        f"Keep only the lines of {F} that do not contain {w}",
        f"grep -v {w} {F} > {OUT}",
        paraphrases=(
            f"Save every line of {F} without {w} in a new file {OUT}.",
            f"Put the lines of {F} that lack {w} into a new file {OUT}.",
        ),
    )


def upper_case(rng) -> Instance:
    """tr: a file in upper case, into a new file."""
    f, out, lines = _source_and_out(rng, 2, 5)
    F, OUT = _p(f), _p(out)
    return _to_new_file(
        "upper_case",
        f,
        lines,
        out,
        _text([line.upper() for line in lines]),
        f"the text of {F} in upper case",
        f"Convert the text of {F} to upper case",
        f"tr a-z A-Z < {F} > {OUT}",
        paraphrases=(
            f"Save {F} converted to capital letters in a new file {OUT}.",
            f"Put an upper-case version of {F} into a new file {OUT}.",
        ),
    )


def make_dir_inside(rng) -> Instance:
    """mkdir with a path: a directory inside an existing one."""
    a, b = _pick(rng, DIRS, 2)
    start = {a: Entry("dir"), **_distractors(rng, {a})}
    A, AB = _p(a), _p(f"{a}/{b}")
    return Instance(
        "make_dir_inside",
        f"Create a directory named {b} inside the existing directory {A}.",
        start,
        _set(start, {f"{a}/{b}": Entry("dir")}),
        [f"mkdir {AB}"],
        paraphrases=(
            f"Make a subdirectory {b} in the directory {A}.",
            f"Add a directory {AB}; {A} already exists.",
            f"Create the directory {AB} (its parent {A} is there already).",
        ),
    )


def skip_first_line(rng) -> Instance:
    """tail -n +2: every line but the first (a header), into a new file."""
    f, out, lines = _source_and_out(rng, 3, 7)
    F, OUT = _p(f), _p(out)
    return _to_new_file(
        "skip_first_line",
        f,
        lines,
        out,
        _text(lines[1:]),
        f"every line of {F} except the first one",
        f"Drop the first line of {F}",
        f"tail -n +2 {F} > {OUT}",
        paraphrases=(
            f"Save {F} without its header line in a new file {OUT}.",
            f"Put all lines of {F} but the first into a new file {OUT}.",
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
    OUT = _p(out)  # the paths written are relative, so the directory is named as it is
    return Instance(
        "files_containing",
        f"Write the paths of the files in {d} that contain {w}, one per line, sorted, to a new file {OUT}.",
        start,
        _set(start, {out: Entry("file", _text(found))}),
        [f"{_AT_ROOT}grep -rl {w} {d} | sort > {OUT}"],
        paraphrases=(
            f"List which files in {d} mention {w} (paths, sorted, one per line) in a new file {OUT}.",
            f"Save the sorted paths of the files in {d} containing {w}, one per line, in a new file {OUT}.",
            f"Find the files in {d} that contain {w} and write their paths (like {d}/name, sorted) to {OUT}.",
        ),
    )


def empty_dir(rng) -> Instance:
    """rm with a glob on a whole directory: every file in it, the directory kept."""
    d = _pick(rng, DIRS)
    inside, start = _dir_of_files(rng, d)
    D = _p(d)
    return Instance(
        "empty_dir",
        f"Delete every file in the directory {D}, keeping {D} itself.",
        start,
        _set(start, {p: None for p in inside}),
        [f"rm {D}/*"],
        paraphrases=(
            f"Remove all the files inside {D} but keep the directory.",
            f"Empty the directory {D} without removing it.",
            f"Clean up {D}: delete the files in it, not the directory.",
        ),
    )


def copy_all_into_dir(rng) -> Instance:
    """cp with a glob: every file of one directory into another existing one."""
    a, b = _pick(rng, DIRS, 2)
    inside = {n: Entry("file", _text(_lines(rng, 1, 3))) for n in _file_names(rng, int(rng.integers(2, 4)))}
    start = {a: Entry("dir"), b: Entry("dir"), **{f"{a}/{n}": e for n, e in inside.items()}}
    A, B = _p(a), _p(b)
    return Instance(
        "copy_all_into_dir",
        f"Copy every file in the directory {A} into the existing directory {B}.",
        start,
        _set(start, {f"{b}/{n}": e for n, e in inside.items()}),
        [f"cp {A}/* {B}/"],
        paraphrases=(
            f"Put copies of all the files in {A} into {B}, which already exists.",
            f"Duplicate each file of the directory {A} into the directory {B}.",
            f"Back up the files of {A} by copying them all into {B}.",
        ),
    )


def repeated_lines(rng) -> Instance:
    """sort | uniq -d: the lines that occur more than once, each once, sorted."""
    f, out = _file_names(rng, 2, ext="txt")
    base = _lines(rng, 3, 5)
    twice = _pick(rng, base, int(rng.integers(1, len(base))))
    lines = base + twice
    rng.shuffle(lines)
    F, OUT = _p(f), _p(out)
    return _to_new_file(
        "repeated_lines",
        f,
        lines,
        out,
        _text(sorted({line for line in lines if lines.count(line) > 1})),
        f"the lines that occur more than once in {F}, each once, sorted alphabetically",
        f"Find the lines that occur more than once in {F}, each once and sorted",
        f"sort {F} | uniq -d > {OUT}",
        paraphrases=(
            f"Find the duplicated lines of {F} and save each of them once, sorted, in a new file {OUT}.",
            f"Put the lines that repeat in {F}, one copy each in alphabetical order, into a new file {OUT}.",
        ),
    )


def numeric_sort(rng) -> Instance:
    """sort -n: numbers sorted by value (not as text), into a new file."""
    f, out = _file_names(rng, 2, ext="txt")
    numbers = [int(x) for x in rng.choice(1000, size=int(rng.integers(4, 8)), replace=False)]
    lines = [str(n) for n in numbers]
    F, OUT = _p(f), _p(out)
    return _to_new_file(
        "numeric_sort",
        f,
        lines,
        out,
        _text([str(n) for n in sorted(numbers)]),
        f"the numbers in {F}, sorted from smallest to largest",
        f"Sort the numbers in {F} from smallest to largest",
        f"sort -n {F} > {OUT}",
        paraphrases=(
            f"Sort the numbers of {F} by value, ascending, into a new file {OUT}.",
            f"Save the numbers of {F} in increasing numeric order in a new file {OUT}.",
        ),
        prompt=f"Write the numbers in {F}, sorted from smallest to largest, to a new file {OUT}.",
    )


def count_files(rng) -> Instance:
    """ls | wc -l: the number of files in a directory, as a number in a new file."""
    d = _pick(rng, DIRS)
    out = f"{_pick(rng, ['count', 'total', 'number'])}.txt"
    names = _file_names(rng, int(rng.integers(1, 7)))
    start = {d: Entry("dir"), **{f"{d}/{n}": Entry("file", _text(_lines(rng, 1, 2))) for n in names}}
    D, OUT = _p(d), _p(out)
    return Instance(
        "count_files",
        f"Write the number of files in the directory {D} to a new file {OUT}.",
        start,
        _set(start, {out: Entry("file", f"{len(names)}\n")}),
        [f"ls {D} | wc -l > {OUT}"],
        paraphrases=(
            f"Count the files in the directory {D} and save the count in a new file {OUT}.",
            f"Put how many files the directory {D} contains into a new file {OUT}.",
            f"How many files are in {D}? Write just the number to {OUT}.",
        ),
    )


# held-out templates: relatives of the trained ones, never trained on
def move_into_new_dir(rng) -> Instance:
    """mkdir, then mv into it: a file moved into a directory that does not exist yet."""
    d = _pick(rng, DIRS)
    (f,) = _file_names(rng, 1)
    body = Entry("file", _text(_lines(rng, 1, 4)))
    start = {f: body, **_distractors(rng, {f, d}, k=int(rng.integers(1, 3)))}
    D, F = _p(d), _p(f)
    return Instance(
        "move_into_new_dir",
        f"Create a directory {D} and move {F} into it.",
        start,
        _set(start, {d: Entry("dir"), f: None, f"{d}/{f}": body}),
        [f"mkdir {D} && mv {F} {D}/"],
        mistake=f"mv {F} {D}/",
        paraphrases=(
            f"Make a new directory called {D}, then move {F} there.",
            f"Move {F} into a new directory {D}.",
            f"{F} should end up inside {D}, a directory that does not exist yet.",
        ),
    )


def run_script(rng) -> Instance:
    """chmod +x, then run: a script that cannot be run yet, made executable and run to write its output."""
    f, out = f"{_pick(rng, STEMS)}.sh", f"{_pick(rng, ['output', 'result', 'status', 'done'])}.txt"
    text = _line(rng)
    body = f'#!/bin/sh\ncd "$(dirname "$0")"\necho {text} > {out}\n'
    start = {f: Entry("file", body), **_distractors(rng, {f, out})}
    F, OUT = _p(f), _p(out)
    return Instance(
        "run_script",
        f"Make {F} executable and run it; it writes {OUT}.",
        start,
        _set(start, {f: Entry("file", body, True), out: Entry("file", text + "\n")}),
        [f"chmod +x {F} && ./{F}"],
        mistake=f"./{F}",
        paraphrases=(
            f"The script {F} cannot be run yet. Make it executable, then run it once so that it creates {OUT}.",
            f"Run the script {F} (it needs the executable bit first) to produce {OUT}.",
            f"Give {F} permission to execute and run it, so that {OUT} appears.",
        ),
    )


def make_nested_dirs(rng) -> Instance:
    """mkdir -p: a directory inside a new one, both made in one command (plain mkdir fails)."""
    a, b = _pick(rng, DIRS, 2)
    start = _distractors(rng, {a})
    A, AB = _p(a), _p(f"{a}/{b}")
    return Instance(
        "make_nested_dirs",
        f"Create the directory {AB} (and {A} with it).",
        start,
        _set(start, {a: Entry("dir"), f"{a}/{b}": Entry("dir")}),
        [f"mkdir -p {AB}"],
        mistake=f"mkdir {AB}",
        paraphrases=(
            f"Set up the directory {AB}; {A} does not exist yet either.",
            f"Make the nested directories {AB}, creating the parent {A} as well.",
            f"Create {AB}, including its missing parent directory {A}.",
        ),
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
    """tail -n: the last k lines, into a new file."""
    f, out, lines = _source_and_out(rng, 5, 9)
    k = int(rng.integers(1, 6))
    F, OUT = _p(f), _p(out)
    last = "last line" if k == 1 else f"last {k} lines"
    return _to_new_file(
        "tail_lines",
        f,
        lines,
        out,
        _text(lines[-k:]),
        f"the {last} of {F}",
        f"Take the {last} of {F}",
        f"tail -n {k} {F} > {OUT}",
        paraphrases=(
            f"Save the final {'line' if k == 1 else f'{k} lines'} of {F} in a new file {OUT}.",
            f"Put the bottom {'line' if k == 1 else f'{k} lines'} of {F} into a new file {OUT}.",
        ),
    )


def count_words(rng) -> Instance:
    """wc -w (held out; a relative of count_lines): the number of words of a file."""
    f, out, lines = _source_and_out(rng)
    n = sum(len(line.split()) for line in lines)
    return _held_out_new_file(
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
    """sort -u: the distinct lines, sorted, into a new file."""
    f, out = _file_names(rng, 2, ext="txt")
    base = _lines(rng, 3, 5)
    lines = base + [base[int(i)] for i in rng.integers(0, len(base), size=int(rng.integers(2, 5)))]
    rng.shuffle(lines)
    F, OUT = _p(f), _p(out)
    return _to_new_file(
        "unique_lines",
        f,
        lines,
        out,
        _text(sorted(set(lines))),
        f"each distinct line of {F} once, sorted alphabetically",
        f"Sort the lines of {F} and drop the repeats",
        f"sort -u {F} > {OUT}",
        paraphrases=(
            f"{F} has repeated lines. Save each line just once, in sorted order, in a new file {OUT}.",
            f"Put the unique lines of {F}, sorted, into a new file {OUT}.",
        ),
        prompt=f"Write the distinct lines of {F}, sorted alphabetically, to a new file {OUT}.",
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
        move_into_new_dir,
        run_script,
        make_nested_dirs,
        tail_lines,
        unique_lines,
    )
}
HELD_OUT_TEMPLATES: dict[str, Template] = {t.__name__: t for t in (delete_dir, count_words, copy_dir)}
TEMPLATES: dict[str, Template] = {**TRAIN_TEMPLATES, **HELD_OUT_TEMPLATES}
