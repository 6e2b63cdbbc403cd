# SPDX-License-Identifier: MIT
"""A PTX front end: the text `tk_cute.compile` produces, read into functions of instructions.

`parse(text) -> Module`; `Module.functions[name]` is a `Function` with its parameters, its
performance directives (`.reqntid`, `.maxnreg`, ...), its register declarations and its body as
a flat list of `Instr` with `labels` (label -> index of the instruction that follows it).
`Function.successors(i)` gives the control-flow edges (a predicated branch falls through too;
`ret` / `exit` end a path), which the static synchronization lint (`tk_cute.emulator.lint`) and
the emulator share.

Scopes: a `{ ... }` block inside a body (inline asm: the DSL's mbarrier wait loops declare
`.reg .pred P1;` and the labels `LAB_WAIT:` / `DONE:` in every copy) is flattened; the labels and
registers it declares get the suffix `#<scope number>` inside it, so every name is unique in
the function. Operands stay text (`Instr.args`, split on top-level commas); `operand()` reads
one into a small tagged tuple.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class PtxError(ValueError):
    """Text this front end cannot read (it names the line)."""


@dataclass(frozen=True)
class Instr:
    """One instruction: `@pred`/`@!pred` guard (None: always), the dotted opcode, operands."""

    op: str  # e.g. "mbarrier.try_wait.parity.shared.b64"
    args: tuple[str, ...]
    line: int  # 1-based line of the PTX text
    pred: str | None = None
    neg: bool = False  # guard is @!pred

    @property
    def base(self) -> str:
        """The opcode without qualifiers ("mbarrier" for "mbarrier.arrive.shared.b64")."""
        return self.op.split(".", 1)[0]

    def has(self, *parts: str) -> bool:
        """Whether every qualifier in `parts` is one of the opcode's dotted parts."""
        quals = self.op.split(".")
        return all(p in quals for p in parts)

    def __str__(self) -> str:
        guard = f"@{'!' * self.neg}{self.pred} " if self.pred else ""
        return f"{guard}{self.op} {', '.join(self.args)}".rstrip()


@dataclass(frozen=True)
class Param:
    """A kernel parameter: name, PTX type (".u64", ".b8", ...), byte size and alignment."""

    name: str
    type: str
    size: int
    align: int


@dataclass
class Function:
    """A `.entry` (kernel) or `.func`: parameters, directives, registers, instructions."""

    name: str
    kind: str  # ".entry" or ".func"
    params: list[Param]
    directives: dict[str, tuple[int, ...]]  # ".reqntid" -> (224, 1, 1), ...
    regs: dict[str, tuple[str, int]]  # "%r" -> (".b32", 14) for %r<14>; a plain name: count 0
    body: list[Instr]
    labels: dict[str, int]  # label -> index in body of the next instruction
    # function-scope .shared: name -> (type, align, bytes)
    shared: dict[str, tuple[str, int, int]] = field(default_factory=dict)

    def successors(self, i: int) -> list[int]:
        """Indices control may go to after `body[i]` (len(body) is the end of the function)."""
        ins = self.body[i]
        if ins.base == "bra":
            target = self.labels[ins.args[0]]
            return [target, i + 1] if ins.pred else [target]
        if ins.base in ("ret", "exit", "trap"):
            return [i + 1] if ins.pred else []
        return [i + 1]


@dataclass
class Module:
    version: str
    target: str
    address_size: int
    functions: dict[str, Function]
    shared: dict[str, tuple[str, int, int]]  # module-scope .shared: name -> (type, align, bytes)

    @property
    def kernels(self) -> list[Function]:
        return [f for f in self.functions.values() if f.kind == ".entry"]


_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_SIZES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2,
          "b32": 4, "u32": 4, "s32": 4, "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8,
          "b128": 16, "pred": 1}


def _strip_comments(text: str) -> str:
    """Comments replaced by spaces of the same line count (line numbers stay right)."""
    return _COMMENTS.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def split_args(text: str) -> tuple[str, ...]:
    """Operands split on commas outside [], {} and ()."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    last = "".join(cur).strip()
    if last:
        out.append(last)
    return tuple(out)


def _decl_size(type_: str, count: str | None) -> int:
    return _SIZES[type_.lstrip(".")] * (int(count) if count else 1)


def _params(text: str) -> list[Param]:
    out = []
    for piece in split_args(text):
        words = piece.split()
        name = words[-1]
        count = None
        m = re.match(r"([\w$]+)\[(\d+)\]$", name)
        if m:
            name, count = m.group(1), m.group(2)
        types = [w for w in words[1:-1] if w.lstrip(".") in _SIZES]
        align = 0
        if ".align" in words:
            align = int(words[words.index(".align") + 1])
        if not types:
            raise PtxError(f"parameter {piece!r}: no type")
        size = _decl_size(types[-1], count)
        out.append(Param(name, types[-1], size, align or size))
    return out


def _shared_decl(stmt: str):
    """`.shared .align A .b8 name[n]` (also `.extern`) -> (name, (type, align, bytes))."""
    m = re.search(r"\.shared\s+(?:\.align\s+(\d+)\s+)?(\.\w+)\s+([\w$]+)(?:\[(\d*)\])?", stmt)
    if not m:
        raise PtxError(f"shared declaration {stmt!r}")
    align, type_, name, count = m.groups()
    size = _decl_size(type_, count) if count else 0
    return name, (type_, int(align or _SIZES[type_.lstrip('.')]), size)


_LABEL = re.compile(r"^([A-Za-z_$%][\w$]*):")
_INSTR = re.compile(r"^(?:@(?P<neg>!?)(?P<pred>[%\w$#]+)\s+)?(?P<op>[a-z_][\w.:]*)\s*(?P<args>.*)$",
                    re.S)


class _Scopes:
    """Renames labels and registers declared inside nested `{ }` blocks."""

    def __init__(self):
        self.stack: list[dict[str, str]] = [{}]
        self.count = 0

    def push(self, names: set[str]):
        self.count += 1
        self.stack.append({n: f"{n}#{self.count}" for n in names})

    def pop(self):
        self.stack.pop()

    def name(self, n: str) -> str:
        for scope in reversed(self.stack):
            if n in scope:
                return scope[n]
        return n

    def rename(self, text: str) -> str:
        if len(self.stack) == 1:
            return text
        return re.sub(r"[%A-Za-z_$][\w$]*", lambda m: self.name(m.group(0)), text)


def _statements(body: str, first_line: int):
    """(line, text) of each statement, label and brace of a body (comments already gone)."""
    line, i, n = first_line, 0, len(body)
    cur, start = [], None
    while i < n:
        ch = body[i]
        if ch == "\n":
            line += 1
        if ch in "{}" and not "".join(cur).strip():
            yield line, ch
            i += 1
            continue
        if ch == ";":
            yield start or line, "".join(cur).strip()
            cur, start = [], None
            i += 1
            continue
        if ch == ":" and not "".join(cur).strip().startswith(("@", ".")) and re.fullmatch(
                r"\s*[A-Za-z_$%][\w$]*", "".join(cur)) and body[i + 1:i + 2] != ":":
            yield start or line, "".join(cur).strip() + ":"
            cur, start = [], None
            i += 1
            continue
        if not ch.isspace() and start is None:
            start = line
        cur.append(ch)
        i += 1
    if "".join(cur).strip():
        raise PtxError(f"line {line}: statement without ';': {''.join(cur).strip()[:60]!r}")


def _declared_in_block(stmts, k) -> set[str]:
    """Labels and registers declared directly inside the block opened at statement k."""
    names, depth = set(), 0
    for _, s in stmts[k + 1:]:
        if s == "{":
            depth += 1
        elif s == "}":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0:
            if s.endswith(":") and _LABEL.match(s):
                names.add(s[:-1])
            elif s.startswith(".reg"):
                for piece in split_args(s.split(None, 2)[2] if len(s.split()) > 2 else ""):
                    names.add(re.sub(r"<\d+>$", "", piece.strip()))
    return names


def _body(fn: Function, text: str, first_line: int):
    stmts = list(_statements(text, first_line))
    scopes = _Scopes()
    for k, (line, s) in enumerate(stmts):
        if s == "{":
            scopes.push(_declared_in_block(stmts, k))
        elif s == "}":
            scopes.pop()
        elif s.endswith(":") and _LABEL.match(s):
            fn.labels[scopes.name(s[:-1])] = len(fn.body)
        elif s.startswith(".reg"):
            words = s.split(None, 2)
            for piece in split_args(words[2]):
                m = re.match(r"([%\w$]+)(?:<(\d+)>)?$", piece.strip())
                if m:
                    # %r<14> -> ("%r", 14): %r0 .. %r13; a plain name -> (name, 0)
                    fn.regs[scopes.name(m.group(1))] = (words[1], int(m.group(2) or 0))
        elif s.startswith(".shared"):
            name, decl = _shared_decl(s)
            fn.shared[name] = decl
        elif s.startswith("."):  # .pragma, .local and other directives inside a body
            continue
        else:
            m = _INSTR.match(scopes.rename(s))
            if not m:
                raise PtxError(f"line {line}: cannot read {s[:80]!r}")
            args = split_args(m.group("args"))
            fn.body.append(Instr(m.group("op"), args, line, m.group("pred"), m.group("neg") == "!"))
    for ins in fn.body:
        if ins.base == "bra" and ins.args[0] not in fn.labels:
            raise PtxError(f"line {ins.line}: branch to unknown label {ins.args[0]!r}")


_FUNC = re.compile(r"(?P<vis>\.visible\s+|\.weak\s+|\.extern\s+)?(?P<kind>\.entry|\.func)\s+"
                   r"(?:\((?P<ret>[^)]*)\)\s*)?(?P<name>[\w$]+)\s*(?:\((?P<params>[^)]*)\))?")


def parse(text: str) -> Module:
    """Read PTX text into a `Module` (raises `PtxError` naming the line it cannot read)."""
    src = _strip_comments(text)
    head = lambda d: (re.search(rf"^\s*\.{d}\s+(\S+)", src, re.M) or [None, ""])[1]
    mod = Module(head("version"), head("target"), int(head("address_size") or 64), {}, {})
    pos = 0
    while True:
        m = _FUNC.search(src, pos)
        if not m:
            break
        for stmt in re.findall(r"^\s*(?:\.extern\s+)?\.shared[^;]*;", src[pos:m.start()], re.M):
            name, decl = _shared_decl(stmt)
            mod.shared[name] = decl
        semi = src.find(";", m.end())
        open_ = src.find("{", m.end())
        if 0 <= semi < open_ or open_ < 0:  # a declaration without a body
            pos = m.end()
            continue
        dirs = {}
        for d, vals in re.findall(r"(\.\w+)\s+([\d,\s]+)", src[m.end():open_]):
            dirs[d] = tuple(int(v) for v in vals.replace(",", " ").split())
        depth, j = 0, open_
        while True:
            if src[j] == "{":
                depth += 1
            elif src[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        fn = Function(m.group("name"), m.group("kind"), _params(m.group("params") or ""),
                      dirs, {}, [], {})
        _body(fn, src[open_ + 1:j], src.count("\n", 0, open_ + 1) + 1)
        mod.functions[fn.name] = fn
        pos = j + 1
    return mod


def operand(text: str):
    """One operand as a tagged tuple: ("reg", name), ("imm", int | float), ("addr", base,
    offset), ("vec", [operands]), ("sink",), ("pair", a, b) for `%r|%p`, or ("sym", name)."""
    t = text.strip()
    if t == "_":
        return ("sink",)
    if t.startswith("[") and t.endswith("]"):
        inner = t[1:-1].strip()
        if inner.startswith("{") or "," in inner:  # a tensor coordinate list: [map, {c0, c1}]
            return ("vec", [operand(p) for p in split_args(inner)])
        m = re.fullmatch(r"([%\w$#]+)?\s*(?:\+\s*(-?\w+))?", inner)
        if m and m.group(1) and not re.fullmatch(r"-?(0[xX][0-9a-fA-F]+|\d+)", m.group(1)):
            return ("addr", m.group(1), int(m.group(2), 0) if m.group(2) else 0)
        return ("addr", None, int(inner, 0))
    if t.startswith("{") and t.endswith("}"):
        return ("vec", [operand(p) for p in split_args(t[1:-1])])
    if "|" in t:
        a, b = t.split("|")
        return ("pair", a.strip(), b.strip())
    if t.startswith("%"):
        return ("reg", t)
    m = re.fullmatch(r"0[fF]([0-9a-fA-F]{8})|0[dD]([0-9a-fA-F]{16})", t)
    if m:
        import struct

        if m.group(1):
            return ("imm", struct.unpack(">f", bytes.fromhex(m.group(1)))[0])
        return ("imm", struct.unpack(">d", bytes.fromhex(m.group(2)))[0])
    try:
        return ("imm", int(t.rstrip("U"), 0))
    except ValueError:
        pass
    try:
        return ("imm", float(t))
    except ValueError:
        return ("sym", t)  # a label, parameter, shared symbol or scoped register (P1#3)
