"""The test harness that runs *inside* the sandbox (shipped there as main.py; stdlib only).

It runs the untrusted solution, then each test, and reports one line per test on its own channel
(the original stdout; the solution's prints go to stderr), each line prefixed by a random nonce the
parent checks. What it defends against, because RL policies find these: exiting before the tests
(tests without a report count as failed), printing fake results (no nonce), exceptions and SystemExit
inside tests, replacing builtins or the harness's checks (tampering is detected after every test), and
objects whose __eq__ / __bool__ always agree (comparisons are checked for such objects, also inside
containers). A program that introspects this harness's frames to steal the nonce is out of scope:
run each test in its own process if you need that.
"""

import ast
import builtins
import json
import os
import signal

_write, _dumps, _type, _isinstance = os.write, json.dumps, type, isinstance
SOLUTION_MODULE = "__solution__"


class _TestTimeout(BaseException):
    pass


def _suspicious(x, depth=0):
    """True if x (or an element of it) is an object of the solution's own class that overrides the
    operations a test assertion relies on."""
    t = _type(x)
    if t.__module__ == SOLUTION_MODULE:
        for name in ("__eq__", "__ne__", "__bool__", "__len__"):
            if any(name in vars(k) for k in t.__mro__ if k.__module__ == SOLUTION_MODULE):
                return True
    if depth < 3 and t in (list, tuple, set, frozenset):
        return any(_suspicious(e, depth + 1) for e in list(x)[:1000])
    if depth < 3 and t is dict:
        return any(_suspicious(k, depth + 1) or _suspicious(v, depth + 1) for k, v in list(x.items())[:1000])
    return False


def _check_compare(*operands):
    if any(_suspicious(o) for o in operands):
        raise AssertionError("an operand overrides __eq__/__bool__ (an object that always compares equal)")
    return True


class _Guard(ast.NodeTransformer):
    """`assert a == b` → `v0 = a; v1 = b; assert __sleuth_check(v0, v1) and v0 == v1`: each operand is
    evaluated once, and checked before the comparison trusts it."""

    count = 0

    def visit_Assert(self, node):
        test = node.test
        operands = [test.left, *test.comparators] if _isinstance(test, ast.Compare) else [test]
        names = []
        stmts = []
        for op in operands:
            _Guard.count += 1
            name = f"__sleuth_v{_Guard.count}"
            names.append(name)
            stmts.append(ast.Assign([ast.Name(name, ast.Store())], op))
        loads = [ast.Name(n, ast.Load()) for n in names]
        if _isinstance(test, ast.Compare):
            checked = ast.Compare(loads[0], test.ops, loads[1:])
        else:
            checked = loads[0]
        call = ast.Call(ast.Name("__sleuth_check", ast.Load()), [ast.Name(n, ast.Load()) for n in names], [])
        stmts.append(ast.Assert(ast.BoolOp(ast.And(), [call, checked]), node.msg))
        return [ast.copy_location(st, node) for st in stmts]


def _guarded(source, filename):
    tree = _Guard().visit(ast.parse(source, filename))
    return compile(ast.fix_missing_locations(tree), filename, "exec")


def _kind(exc):
    if _isinstance(exc, _TestTimeout):
        return "timeout"
    if _isinstance(exc, AssertionError):
        return "assertion"
    if _isinstance(exc, SyntaxError):
        return "syntax_error"
    if _isinstance(exc, SystemExit):
        return "exit"
    if _isinstance(exc, MemoryError):
        return "memory"
    return "exception:" + _type(exc).__name__


def main():
    spec = json.loads(open("spec.json").read())
    nonce = spec["nonce"]
    channel = os.dup(1)
    os.dup2(2, 1)  # the solution's prints go to stderr; results stay on their own channel

    def report(**rec):
        _write(channel, (nonce + " " + _dumps(rec) + "\n").encode())

    def on_alarm(signum, frame):
        raise _TestTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    tests = spec["tests"]
    ns = {"__name__": SOLUTION_MODULE, "__builtins__": builtins}
    snapshot = dict(vars(builtins))
    check = _check_compare
    check_code = check.__code__
    try:
        signal.setitimer(signal.ITIMER_REAL, spec["per_test_s"])
        exec(compile(open("solution.py").read(), "solution.py", "exec"), ns)
        if spec.get("setup"):
            exec(compile(spec["setup"], "setup.py", "exec"), ns)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as e:  # noqa: BLE001 - the solution failed to load: every test fails the same way
        signal.setitimer(signal.ITIMER_REAL, 0)
        for i in range(len(tests)):
            report(test=i, status="fail", kind=_kind(e), message=("solution: " + repr(e))[:300])
        report(done=True)
        return
    ns["__sleuth_check"] = check
    tampered = False
    for i, source in enumerate(tests):
        if tampered:
            report(test=i, status="fail", kind="tampering", message="builtins or the harness were modified")
            continue
        try:
            code = _guarded(source, f"test_{i}.py")
            signal.setitimer(signal.ITIMER_REAL, spec["per_test_s"])
            exec(code, ns)
            signal.setitimer(signal.ITIMER_REAL, 0)
            status, kind, message = "pass", None, None
        except BaseException as e:  # noqa: BLE001 - every failure of untrusted code is a result
            signal.setitimer(signal.ITIMER_REAL, 0)
            status, kind, message = "fail", _kind(e), repr(e)[:300]
        current = vars(builtins)
        if (ns.get("__sleuth_check") is not check or check.__code__ is not check_code
                or any(current.get(k) is not v for k, v in snapshot.items())):
            tampered = True
            status, kind, message = "fail", "tampering", "builtins or the harness were modified"
        report(test=i, status=status, kind=kind, message=message)
    report(done=True)


if __name__ == "__main__":
    main()
