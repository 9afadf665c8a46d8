"""Program mutations for SWE task synthesis, in the manner of SWE-smith's procedural modifications: each
is one small, local edit of a function body found with `ast` and applied to the source text, so every
other byte of the file (comments, formatting) stays as it was and the gold fix is a minimal diff.

Operators: `compare` (< ↔ <=, > ↔ >=, == ↔ !=, is ↔ is not, in ↔ not in), `boolop` (and ↔ or),
`off_by_one` (range stops, slice bounds, constant indices), `constant` (ints ± 1, True ↔ False),
`swap_args` (first two positional arguments of a call), `remove_stmt` (a one-line statement),
`remove_return` (an early `if …: return/raise`), `invert_if` (an `if`/`elif` condition negated)."""

from __future__ import annotations

import ast
import hashlib
import re
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass

OPERATORS = ("compare", "boolop", "off_by_one", "constant", "swap_args", "remove_stmt", "remove_return",
             "invert_if")
# operator → (how it is written, what replaces it); the text searched is only what lies between the two
# operands (whitespace, brackets, the operator)
_FLIP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
         ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Is: (r"\bis\b", "is not"),
         ast.IsNot: (r"\bis\s+not\b", "is"), ast.In: (r"\bin\b", "not in"), ast.NotIn: (r"\bnot\s+in\b", "in")}
_SIMPLE = (ast.Name, ast.Constant, ast.Attribute, ast.Call, ast.Subscript)
# CPython 3.11 keeps the AST converter's recursion depth in interpreter-wide state: two threads parsing at
# once can fail with "SystemError: AST constructor recursion depth mismatch" (seen here on 3.11.7 in a
# clean-clone test run; cf. python/cpython gh-106905). Builds check mutants from a thread pool, so every
# parse here takes this lock.
_AST_LOCK = threading.Lock()


@dataclass(frozen=True)
class Mutation:
    path: str  # file, relative to the repository root
    function: str  # qualified name of the enclosing function
    op: str
    line: int  # first line of the statement that changes
    end_line: int  # last line of that statement (coverage is looked up over these)
    start: int  # byte offsets of the replaced span in the UTF-8 source
    end: int
    replacement: str

    def apply(self, source: str) -> str:
        b = source.encode("utf-8")
        return (b[: self.start] + self.replacement.encode("utf-8") + b[self.end:]).decode("utf-8")

    @property
    def key(self) -> str:
        raw = f"{self.path}|{self.op}|{self.start}|{self.end}|{self.replacement}"
        return hashlib.sha256(raw.encode()).hexdigest()[:12]

    def to_dict(self) -> dict:
        return asdict(self)


class _Source:
    def __init__(self, text: str):
        self.bytes = text.encode("utf-8")
        self.starts = [0]
        for line in self.bytes.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def text(self, start: int, end: int) -> str:
        return self.bytes[start:end].decode("utf-8")

    def node_text(self, node: ast.AST) -> str:
        return self.text(*self.span(node))


def _paren(text: str, node: ast.AST) -> str:
    return text if isinstance(node, _SIMPLE) else f"({text})"


def find_mutations(path: str, source: str) -> list[Mutation]:
    """Every candidate mutation inside the functions of one file (none if it does not parse)."""
    try:
        with _AST_LOCK:
            tree = ast.parse(source)
    except SyntaxError:
        return []
    src = _Source(source)
    out: list[Mutation] = []
    for qualname, fn in _functions(tree):
        body_nodes = fn.body[1:] if _is_docstring(fn.body[0]) else fn.body
        for stmt in _statements(body_nodes):
            for op, start, end, new in _sites(stmt, src):
                out.append(Mutation(path, qualname, op, stmt.lineno, stmt.end_lineno, start, end, new))
    return out


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of a function body, nested blocks included, nested functions and classes excluded
    (they are visited as functions of their own)."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield stmt
        for field in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(stmt, field, None) or [])
        for handler in getattr(stmt, "handlers", None) or []:
            yield from _statements(handler.body)


def _own_expressions(stmt: ast.stmt) -> Iterator[ast.AST]:
    """Expression nodes of a statement, without descending into nested statements or lambdas' bodies."""
    todo = [c for c in ast.iter_child_nodes(stmt) if not isinstance(c, ast.stmt)]
    while todo:
        node = todo.pop(0)
        yield node
        todo.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, (ast.stmt, ast.Lambda)))


def _sites(stmt: ast.stmt, src: _Source) -> Iterator[tuple[str, int, int, str]]:
    slice_parts: set[int] = set()
    for node in _own_expressions(stmt):
        if isinstance(node, ast.Compare):
            yield from _compare(node, src)
        elif isinstance(node, ast.BoolOp) and len(node.values) >= 2:
            a_end = src.span(node.values[0])[1]
            b_start = src.span(node.values[1])[0]
            gap = src.text(a_end, b_start)
            word, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            m = re.search(rf"\b{word}\b", gap)
            if m:
                yield "boolop", a_end + m.start(), a_end + m.end(), new
        elif isinstance(node, ast.Call):
            yield from _call(node, src)
        elif isinstance(node, ast.Slice):
            for part in (node.upper, node.lower):
                if part is not None:
                    slice_parts.add(id(part))
                    s, e = src.span(part)
                    yield "off_by_one", s, e, _plus_minus_one(part, src.node_text(part))
                    break
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and type(node.slice.value) is int:
            slice_parts.add(id(node.slice))
            s, e = src.span(node.slice)
            v = node.slice.value
            yield "off_by_one", s, e, str(v - 1 if v < 0 else v + 1)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            slice_parts.add(id(node.operand))  # -1 is one constant to a reader: mutate it whole or not at all
        elif isinstance(node, ast.Constant) and id(node) not in slice_parts:
            if type(node.value) is bool:
                yield "constant", *src.span(node), str(not node.value)
            elif type(node.value) is int and node.value < 1_000_000:
                yield "constant", *src.span(node), str(node.value + 1)
    yield from _statement_sites(stmt, src)


def _compare(node: ast.Compare, src: _Source) -> Iterator[tuple[str, int, int, str]]:
    operands = [node.left, *node.comparators]
    for i, op in enumerate(node.ops):
        written, new = _FLIP[type(op)]
        a_end, b_start = src.span(operands[i])[1], src.span(operands[i + 1])[0]
        pattern = written if written.startswith("\\b") else re.escape(written)
        m = re.search(pattern, src.text(a_end, b_start))
        if m:
            yield "compare", a_end + m.start(), a_end + m.end(), new


def _call(node: ast.Call, src: _Source) -> Iterator[tuple[str, int, int, str]]:
    args = node.args
    if isinstance(node.func, ast.Name) and node.func.id == "range" and args and not any(
            isinstance(a, ast.Starred) for a in args):
        stop = args[1] if len(args) >= 2 else args[0]
        s, e = src.span(stop)
        yield "off_by_one", s, e, _plus_minus_one(stop, src.node_text(stop))
    if len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2]):
        a, b = src.node_text(args[0]), src.node_text(args[1])
        if a != b:
            s0, e0 = src.span(args[0])
            s1, e1 = src.span(args[1])
            yield "swap_args", s0, e1, b + src.text(e0, s1) + a


def _plus_minus_one(node: ast.AST, text: str) -> str:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return str(node.value + 1)
    return f"{_paren(text, node)} + 1"


def _statement_sites(stmt: ast.stmt, src: _Source) -> Iterator[tuple[str, int, int, str]]:
    if isinstance(stmt, ast.If):
        s, e = src.span(stmt.test)
        t = stmt.test
        if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
            yield "invert_if", s, e, src.node_text(t.operand)
        else:
            yield "invert_if", s, e, f"not {_paren(src.node_text(t), t)}"
        body = stmt.body
        if not stmt.orelse and len(body) == 1 and isinstance(body[0], (ast.Return, ast.Raise)):
            start, end = _whole_lines(stmt, src)
            if start is not None:
                yield "remove_return", start, end, ""
    elif isinstance(stmt, (ast.Expr, ast.Assign, ast.AugAssign)) and stmt.lineno == stmt.end_lineno \
            and not _is_docstring(stmt):
        start, end = _whole_lines(stmt, src)
        if start is not None:
            yield "remove_stmt", start, end, ""


def _whole_lines(stmt: ast.stmt, src: _Source) -> tuple[int | None, int]:
    """The byte span of the lines a statement occupies, if nothing but a comment shares them."""
    start = src.offset(stmt.lineno, 0)
    end = src.offset(stmt.end_lineno + 1, 0) if stmt.end_lineno + 1 < len(src.starts) else len(src.bytes)
    before = src.text(start, src.offset(stmt.lineno, stmt.col_offset))
    after = src.text(src.offset(stmt.end_lineno, stmt.end_col_offset), end).strip()
    if before.strip() or (after and not after.startswith("#")):
        return None, 0
    return start, end


def mutant_ok(original: str, mutant: str) -> bool:
    """The mutant parses, differs in meaning (not just formatting), and keeps every function non-empty."""
    with _AST_LOCK:
        try:
            a, b = ast.parse(original), ast.parse(mutant)
        except SyntaxError:
            return False
        return ast.dump(a) != ast.dump(b)
