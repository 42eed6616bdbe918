"""`Dockerfile`, read the way Docker reads it, for the daemonless image build.

`Dockerfile` is the product image's only recipe: users run it with `docker build`, and
`make image` (hack/image/build.sh) runs the same file, instruction by instruction, in
chroots. This module turns the file into a plan: the stages the last one needs, each
instruction's effect with its variables substituted as Docker substitutes them, and the
image config the last stage ends with. Every instruction and flag is either implemented
with Docker's meaning or refused with its line number: a Dockerfile edit this builder
cannot follow fails the build instead of quietly producing a different image.

Pure: no root, no filesystem writes (the unit tests run it on the real Dockerfile).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import posixpath
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

# What `FROM debian:<suite>[-slim]` inherits on Docker Hub: the base is made from Debian's
# packages by build.py (mmdebstrap) and must start from the same config.
# A digest (`@sha256:...`) pins what Docker pulls; the daemonless build makes the same suite
# from Debian's packages and keys its cache on the digest (a new digest, a fresh base).
DEBIAN_REF = re.compile(
    r"(?:docker\.io/)?(?:library/)?debian:(?P<suite>[a-z]+)(?P<slim>-slim)?"
    r"(?:@sha256:(?P<digest>[0-9a-f]{64}))?"
)
DEBIAN_CONFIG_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
DEBIAN_CONFIG_CMD = ["bash"]

# Flags each instruction may carry; anything else is refused (e.g. RUN --mount, COPY
# --chown): their meaning would have to be implemented here first.
ALLOWED_FLAGS: dict[str, frozenset[str]] = {
    "ARG": frozenset(),
    "FROM": frozenset(),
    "RUN": frozenset(),
    "COPY": frozenset({"from"}),
    "ENV": frozenset(),
    "LABEL": frozenset(),
    "WORKDIR": frozenset(),
    "USER": frozenset(),
    "EXPOSE": frozenset(),
    "CMD": frozenset(),
    "ENTRYPOINT": frozenset(),
}


class DockerfileError(Exception):
    """The Dockerfile uses something this builder does not implement, or is malformed."""


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    flags: tuple[tuple[str, str], ...]
    args: str

    def where(self) -> str:
        return f"Dockerfile line {self.line} ({self.keyword})"

    def text(self) -> str:
        flags = " ".join(f"--{k}={v}" for k, v in self.flags)
        return " ".join(part for part in (self.keyword, flags, self.args) if part)


@dataclass(frozen=True)
class Run:
    """RUN: argv executed in the stage's root with exactly this environment."""

    line: int
    where: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    workdir: str
    user: str


@dataclass(frozen=True)
class Copy:
    """COPY: sources from the build context, or absolute paths in an earlier stage."""

    line: int
    where: str
    sources: tuple[str, ...]
    dest: str
    dest_is_dir: bool
    from_stage: int | None


@dataclass(frozen=True)
class MakeDir:
    """WORKDIR creates its directory when it is declared, as Docker does."""

    line: int
    where: str
    path: str


Step = Run | Copy | MakeDir


@dataclass
class Config:
    """The image config (the OCI config's `config` object) a stage ends with."""

    env: dict[str, str] = field(default_factory=dict)
    cmd: list[str] | None = None
    entrypoint: list[str] | None = None
    user: str = ""
    workdir: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    exposed_ports: list[str] = field(default_factory=list)

    def to_oci(self) -> dict[str, object]:
        out: dict[str, object] = {"Env": [f"{k}={v}" for k, v in self.env.items()]}
        if self.user:
            out["User"] = self.user
        if self.entrypoint is not None:
            out["Entrypoint"] = list(self.entrypoint)
        if self.cmd is not None:
            out["Cmd"] = list(self.cmd)
        if self.workdir:
            out["WorkingDir"] = self.workdir
        if self.labels:
            out["Labels"] = dict(self.labels)
        if self.exposed_ports:
            out["ExposedPorts"] = {port: {} for port in self.exposed_ports}
        return out


@dataclass
class Stage:
    index: int
    name: str | None
    base_ref: str | None  # an external image (FROM debian:...), or None
    parent: int | None  # FROM an earlier stage
    instructions: list[Instruction]
    steps: list[Step]
    config: Config

    def label(self) -> str:
        return self.name or f"stage{self.index}"

    def dependencies(self) -> list[int]:
        deps = [] if self.parent is None else [self.parent]
        deps += [
            s.from_stage for s in self.steps if isinstance(s, Copy) and s.from_stage is not None
        ]
        return deps


@dataclass
class Plan:
    stages: list[Stage]
    global_args: list[Instruction]
    build_args: dict[str, str] = field(default_factory=dict)

    @property
    def target(self) -> Stage:
        return self.stages[-1]

    def needed(self) -> list[Stage]:
        """The stages the last one depends on, dependencies first (BuildKit skips the rest)."""
        order: list[int] = []

        def visit(index: int) -> None:
            if index in order:
                return
            for dep in self.stages[index].dependencies():
                visit(dep)
            order.append(index)

        visit(self.target.index)
        return [self.stages[i] for i in order]

    def parents(self) -> set[int]:
        """Stages another needed stage starts FROM: their roots are worth caching."""
        return {s.parent for s in self.needed() if s.parent is not None}


# --------------------------------------------------------------------------- parsing


def parse(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined; comments and blank lines dropped."""
    lines = text.splitlines()
    out: list[Instruction] = []
    i = 0
    while i < len(lines):
        number = i + 1
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [line]
        # Docker joins a line ending in the escape character with the next one, skipping
        # comment and empty lines in between, and keeps the next line's indentation.
        while parts[-1].rstrip().endswith("\\"):
            parts[-1] = parts[-1].rstrip()[:-1]
            while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
                i += 1
            if i >= len(lines):
                break
            parts.append(lines[i])
            i += 1
        joined = "".join(parts).strip()
        keyword, _, rest = joined.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        flags: list[tuple[str, str]] = []
        while rest.startswith("--"):
            word, _, rest = rest.partition(" ")
            rest = rest.strip()
            name, eq, value = word[2:].partition("=")
            flags.append((name, value if eq else "true"))
        ins = Instruction(number, keyword, tuple(flags), rest)
        if keyword not in ALLOWED_FLAGS:
            raise DockerfileError(
                f"{ins.where()}: hack/image does not implement {keyword}; implement it in "
                "hack/image/dockerfile.py with Docker's meaning, or express the step with "
                f"the instructions it does ({', '.join(sorted(ALLOWED_FLAGS))})"
            )
        for name, _ in flags:
            if name not in ALLOWED_FLAGS[keyword]:
                raise DockerfileError(f"{ins.where()}: the flag --{name} is not implemented")
        if "<<" in rest and keyword in ("RUN", "COPY"):
            raise DockerfileError(f"{ins.where()}: here-documents are not implemented")
        out.append(ins)
    return out


def _variable(text: str, i: int, env: dict[str, str]) -> tuple[str, int]:
    """Expands the variable at text[i] == '$'; returns (value, index after it)."""
    if text.startswith("${", i):
        end = text.find("}", i)
        if end < 0:
            raise DockerfileError(f"unterminated ${{ in {text!r}")
        body = text[i + 2 : end]
        match = re.fullmatch(r"(\w+)(?::([-+])(.*))?", body, re.DOTALL)
        if not match:
            raise DockerfileError(f"unsupported substitution ${{{body}}} in {text!r}")
        name, op, word = match.groups()
        value = env.get(name, "")
        if op == "-":
            value = value or expand(word, env)
        elif op == "+":
            value = expand(word, env) if value else ""
        return value, end + 1
    match = re.compile(r"\w+").match(text, i + 1)
    if not match:
        return "$", i + 1
    return env.get(match.group(0), ""), match.end()


def _lex(text: str, env: dict[str, str], split: bool) -> list[str]:
    """Docker's word processing: quotes, escapes and $VAR/${VAR} (none in single quotes)."""
    words: list[str] = []
    cur: list[str] = []
    have = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if split and c in " \t\n":
            if have:
                words.append("".join(cur))
                cur, have = [], False
            i += 1
            continue
        have = True
        if c == "\\":
            cur.append(text[i + 1] if i + 1 < n else "")
            i += 2
        elif c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise DockerfileError(f"unterminated quote in {text!r}")
            cur.append(text[i + 1 : end])
            i = end + 1
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n and text[i + 1] in '"$\\':
                    cur.append(text[i + 1])
                    i += 2
                elif text[i] == "$":
                    value, i = _variable(text, i, env)
                    cur.append(value)
                else:
                    cur.append(text[i])
                    i += 1
            if i >= n:
                raise DockerfileError(f"unterminated quote in {text!r}")
            i += 1
        elif c == "$":
            value, i = _variable(text, i, env)
            cur.append(value)
        else:
            cur.append(c)
            i += 1
    if have:
        words.append("".join(cur))
    return words


def expand(text: str, env: dict[str, str]) -> str:
    """One word, spaces kept (FROM, WORKDIR, USER)."""
    return "".join(_lex(text, env, split=False))


def words(text: str, env: dict[str, str]) -> list[str]:
    return _lex(text, env, split=True)


def _pairs(ins: Instruction, env: dict[str, str]) -> list[tuple[str, str]]:
    """`key=value ...`, or the legacy `ENV key value with spaces`."""
    first = ins.args.split(None, 1)
    if ins.keyword == "ENV" and first and "=" not in first[0]:
        if len(first) < 2:
            raise DockerfileError(f"{ins.where()}: ENV needs a value")
        return [(first[0], expand(first[1], env))]
    out = []
    for word in words(ins.args, env):
        key, eq, value = word.partition("=")
        if not eq or not key:
            raise DockerfileError(f"{ins.where()}: expected key=value, got {word!r}")
        out.append((key, value))
    return out


def _exec_or_shell(ins: Instruction) -> list[str]:
    if ins.args.startswith("["):
        try:
            argv = json.loads(ins.args)
        except json.JSONDecodeError:
            argv = None
        if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
            return argv
    return ["/bin/sh", "-c", ins.args]


def _arg_declarations(ins: Instruction, env: dict[str, str]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for word in ins.args.split():
        name, eq, default = word.partition("=")
        if not re.fullmatch(r"\w+", name):
            raise DockerfileError(f"{ins.where()}: bad ARG name {name!r}")
        out.append((name, expand(default, env) if eq else None))
    return out


def plan(text: str, build_args: Mapping[str, str] | None = None) -> Plan:
    """The stages of a Dockerfile with each instruction evaluated (refuses what it cannot).

    build_args: `--build-arg NAME=VALUE` with Docker's meaning: the value replaces the
    default of every ARG NAME declaration. One the Dockerfile never declares is refused
    (Docker only warns; a misspelt name would silently build something else).
    """
    given = dict(build_args or {})
    declared: set[str] = set()
    instructions = parse(text)
    global_args: list[Instruction] = []
    globals_: dict[str, str] = {}
    chunks: list[list[Instruction]] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            chunks.append([ins])
        elif not chunks:
            if ins.keyword != "ARG":
                raise DockerfileError(f"{ins.where()}: only ARG may come before the first FROM")
            global_args.append(ins)
            for arg, default in _arg_declarations(ins, globals_):
                declared.add(arg)
                value = given.get(arg, default)
                if value is not None:
                    globals_[arg] = value
        else:
            chunks[-1].append(ins)
    if not chunks:
        raise DockerfileError("the Dockerfile has no FROM")

    stages: list[Stage] = []
    names: dict[str, int] = {}
    for index, chunk in enumerate(chunks):
        head = chunk[0]
        parts = words(head.args, globals_)
        name: str | None = None
        if len(parts) == 3 and parts[1].lower() == "as":
            ref, name = parts[0], parts[2].lower()
        elif len(parts) == 1:
            ref = parts[0]
        else:
            raise DockerfileError(f"{head.where()}: expected FROM <image> [AS <name>]")
        parent: int | None = None
        base_ref: str | None = None
        if ref.lower() in names:
            parent = names[ref.lower()]
            config = copy.deepcopy(stages[names[ref.lower()]].config)
        elif DEBIAN_REF.fullmatch(ref):
            base_ref = ref
            config = Config(env=dict(DEBIAN_CONFIG_ENV), cmd=list(DEBIAN_CONFIG_CMD))
        else:
            raise DockerfileError(
                f"{head.where()}: the daemonless build starts only FROM debian:<suite>[-slim] "
                f"(made from Debian's packages by mmdebstrap) or an earlier stage, not {ref!r}"
            )
        steps = _evaluate(chunk[1:], config, globals_, names, given, declared)
        stages.append(Stage(index, name, base_ref, parent, chunk, steps, config))
        if name:
            names[name] = index
    unused = sorted(set(given) - declared)
    if unused:
        raise DockerfileError(
            f"--build-arg {', '.join(unused)}: the Dockerfile declares no such ARG"
        )
    return Plan(stages, global_args, given)


def _evaluate(
    instructions: list[Instruction],
    config: Config,
    globals_: dict[str, str],
    names: dict[str, int],
    given: dict[str, str],
    declared: set[str],
) -> list[Step]:
    """Applies a stage's instructions to its config (in place); returns its build steps."""
    steps: list[Step] = []
    args: dict[str, str] = {}
    for ins in instructions:
        # ENV wins over ARG when both name a variable (Docker's precedence).
        env = {**args, **config.env}
        where = ins.where()
        match ins.keyword:
            case "ARG":
                for name, default in _arg_declarations(ins, env):
                    declared.add(name)
                    if name in given:
                        value: str | None = given[name]
                    else:
                        value = default if default is not None else globals_.get(name)
                    if value is not None:
                        args[name] = value
            case "ENV":
                config.env.update(_pairs(ins, env))
            case "LABEL":
                config.labels.update(_pairs(ins, env))
            case "WORKDIR":
                path = expand(ins.args, env)
                path = posixpath.normpath(posixpath.join(config.workdir or "/", path))
                config.workdir = path
                steps.append(MakeDir(ins.line, where, path))
            case "USER":
                config.user = expand(ins.args, env)
            case "EXPOSE":
                for port in words(ins.args, env):
                    number, _, proto = port.partition("/")
                    if not number.isdigit():
                        raise DockerfileError(f"{where}: bad port {port!r}")
                    spec = f"{number}/{proto or 'tcp'}"
                    if spec not in config.exposed_ports:
                        config.exposed_ports.append(spec)
            case "CMD":
                config.cmd = _exec_or_shell(ins)
            case "ENTRYPOINT":
                config.entrypoint = _exec_or_shell(ins)
                config.cmd = None  # Docker drops an inherited CMD when ENTRYPOINT is set
            case "RUN":
                run_env = {**args, **config.env}
                steps.append(
                    Run(
                        ins.line,
                        where,
                        tuple(_exec_or_shell(ins)),
                        tuple(run_env.items()),
                        config.workdir or "/",
                        config.user or "0:0",
                    )
                )
            case "COPY":
                steps.append(_copy(ins, env, config.workdir or "/", names))
            case "FROM":  # pragma: no cover - chunks start at FROM
                raise DockerfileError(f"{where}: unexpected FROM")
    return steps


def _copy(ins: Instruction, env: dict[str, str], workdir: str, names: dict[str, int]) -> Copy:
    where = ins.where()
    parts = json.loads(ins.args) if ins.args.startswith("[") else words(ins.args, env)
    if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
        raise DockerfileError(f"{where}: COPY's JSON form must be a list of strings")
    if len(parts) < 2:
        raise DockerfileError(f"{where}: COPY needs a source and a destination")
    *sources, dest = parts
    for src in sources:
        if re.search(r"[*?\[]", src):
            raise DockerfileError(f"{where}: wildcards in COPY sources are not implemented")
    from_stage = None
    for name, value in ins.flags:
        if name == "from":
            key = value.lower()
            if key not in names:
                raise DockerfileError(
                    f"{where}: --from={value} names no earlier stage (use its AS name)"
                )
            from_stage = names[key]
    dest_is_dir = dest.endswith("/") or len(sources) > 1
    dest = posixpath.normpath(posixpath.join(workdir, dest))
    return Copy(ins.line, where, tuple(sources), dest, dest_is_dir, from_stage)


# --------------------------------------------------------------------------- build context


class DockerIgnore:
    """.dockerignore with Docker's rules: the last matching pattern wins, `!` re-includes,
    and a pattern that matches a directory matches everything under it."""

    def __init__(self, text: str) -> None:
        self.patterns: list[tuple[re.Pattern[str], bool]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            line = line[1:].strip() if negate else line
            line = posixpath.normpath(line).lstrip("/")
            self.patterns.append((re.compile(self._regex(line)), negate))

    @staticmethod
    def _regex(pattern: str) -> str:
        out, i = [], 0
        while i < len(pattern):
            c = pattern[i]
            if pattern.startswith("**/", i):
                out.append("(?:.*/)?")
                i += 3
            elif pattern.startswith("**", i):
                out.append(".*")
                i += 2
            elif c == "*":
                out.append("[^/]*")
                i += 1
            elif c == "?":
                out.append("[^/]")
                i += 1
            elif c == "[":
                end = pattern.find("]", i + 1)
                if end < 0:
                    out.append(re.escape(c))
                    i += 1
                else:
                    body = pattern[i + 1 : end]
                    out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                    i = end + 1
            else:
                out.append(re.escape(c))
                i += 1
        return "".join(out)

    def excluded(self, rel: str) -> bool:
        parts = rel.split("/")
        candidates = ["/".join(parts[: k + 1]) for k in range(len(parts))]
        result = False
        for regex, negate in self.patterns:
            if any(regex.fullmatch(c) for c in candidates):
                result = not negate
        return result

    def has_exceptions(self) -> bool:
        return any(negate for _, negate in self.patterns)


def context_entries(context: Path, src: str, ignore: DockerIgnore) -> list[tuple[str, Path]]:
    """What `COPY <src>` takes from the context: (path relative to src, host path).

    A file gives one entry named ""; a directory gives its contents (not itself), sorted,
    without what .dockerignore excludes. Symbolic links are entries, never followed.
    """
    rel = posixpath.normpath(src).lstrip("/")
    if rel == ".." or rel.startswith("../"):
        raise DockerfileError(f"COPY source {src!r} is outside the build context")
    rel = "" if rel == "." else rel
    top = context / rel
    if (rel and ignore.excluded(rel)) or not (top.exists() or top.is_symlink()):
        raise DockerfileError(
            f"COPY source {src!r} is not in the build context (missing or in .dockerignore)"
        )
    if top.is_symlink() or not top.is_dir():
        return [("", top)]
    out: list[tuple[str, Path]] = []
    prune = not ignore.has_exceptions()
    for dirpath, dirnames, filenames in os.walk(top):
        base = Path(dirpath)
        dirnames.sort()
        kept = []
        for d in dirnames:
            path = base / d
            crel = path.relative_to(context).as_posix()
            if path.is_symlink():
                filenames.append(d)
            elif not ignore.excluded(crel):
                out.append((path.relative_to(top).as_posix(), path))
                kept.append(d)
            elif not prune:
                kept.append(d)  # an exception may re-include something below
        dirnames[:] = kept
        for f in sorted(filenames):
            path = base / f
            if not ignore.excluded(path.relative_to(context).as_posix()):
                out.append((path.relative_to(top).as_posix(), path))
    return sorted(out)


def _entry_digest(path: Path) -> str:
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        return f"link {os.readlink(path)}"
    if stat.S_ISDIR(st.st_mode):
        return f"dir {stat.S_IMODE(st.st_mode):o}"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return f"file {stat.S_IMODE(st.st_mode):o} {digest}"


@dataclass(frozen=True)
class Keys:
    """Cache keys of the needed stages' roots.

    final: per stage, over everything that decides its root and config: its parent's key
    (or base image), each instruction's text, the content and modes of the context files
    its COPYs take, and the keys of the stages it copies from.
    before_copy: per stage with steps before its first COPY, (that COPY's step index, the
    key of the root just before it): what a change of the copied sources leaves valid,
    like Docker's layer cache for the instructions above a COPY.
    """

    final: dict[int, str]
    before_copy: dict[int, tuple[int, str]]


def stage_keys(plan_: Plan, context: Path, ignore: DockerIgnore, salt: str) -> Keys:
    """`salt` covers the builder itself: a change to how roots are made invalidates them."""
    final: dict[int, str] = {}
    before: dict[int, tuple[int, str]] = {}
    for stage in plan_.needed():
        h = hashlib.sha256()
        h.update(salt.encode())
        if stage.parent is not None:
            h.update(f"parent {final[stage.parent]}\n".encode())
        else:
            h.update(f"image {stage.base_ref}\n".encode())
        for ins in plan_.global_args:
            h.update(f"global {ins.text()}\n".encode())
        for arg, value in sorted(plan_.build_args.items()):
            h.update(f"build-arg {arg}={value}\n".encode())
        first = next((n for n, s in enumerate(stage.steps) if isinstance(s, Copy)), None)
        for ins in stage.instructions:
            if first and ins.line == stage.steps[first].line:
                before[stage.index] = (first, h.copy().hexdigest())
            h.update(f"{ins.text()}\n".encode())
        for step in stage.steps:
            if not isinstance(step, Copy):
                continue
            if step.from_stage is not None:
                h.update(f"from {final[step.from_stage]}\n".encode())
                continue
            for src in step.sources:
                for rel, path in context_entries(context, src, ignore):
                    h.update(f"{src} {rel} {_entry_digest(path)}\n".encode())
        final[stage.index] = h.hexdigest()
    return Keys(final, before)


def iter_files(paths: list[Path]) -> Iterator[Path]:
    """Files under the given paths, sorted (for hashing the builder itself)."""
    for path in sorted(paths):
        if path.is_dir():
            yield from sorted(
                p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts
            )
        elif path.is_file():
            yield path
