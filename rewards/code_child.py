"""The per-test runner: one fresh ``python -I`` process per test case, started by the harness
(:mod:`toolgym.rewards.code_harness`) inside the sandbox. Standard library only; nothing runs at import.

It reads ``{"solution", "test", "nonce", "strict"}`` from stdin (then stdin is closed), runs the candidate as
module ``solution``, then the test, and writes ``"<nonce> PASS"`` or ``"<nonce> FAIL <why>"`` to the result
file descriptor given in ``argv[1]``; exiting any other way counts as a failure.

Defences, each aimed at a known reward hack:
- ``exit(0)`` / ``sys.exit`` / ``os._exit`` in the candidate: only an explicit PASS line counts, so leaving
  early is a failure, never a pass.
- Patched stdlib or builtins (``unittest.TestCase.assertEqual = …``, ``builtins.len = …``): after the candidate
  runs, ``builtins`` is restored and every module it imported is dropped, so the test imports fresh copies.
- ``__eq__`` that is always True, and other rigged comparisons: with ``strict`` (default) every ``assert`` is
  rewritten so comparisons only accept plain data (numbers, str, bytes, None, and lists/tuples/dicts/sets of
  them), and a bare ``assert value`` needs a real bool or plain value.
- Forged reports: the nonce is a per-test secret and the result fd is not stdout, so printing "PASS" does
  nothing. Not covered: code that digs the nonce out of this process's memory (frames, ``gc``).
"""

from __future__ import annotations

from typing import Any


def main() -> None:
    import ast
    import builtins
    import json
    import operator
    import os
    import sys
    import types

    write, out_fd, exit_now = os.write, int(sys.argv[1]), os._exit
    payload = json.loads(sys.stdin.buffer.read())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    nonce: str = payload.pop("nonce")
    strict: bool = payload.get("strict", True)
    exact_type, all_ = type, all
    plain_scalars = (int, float, complex, bool, str, bytes, type(None))
    plain_containers = (list, tuple, set, frozenset)
    ops: dict[str, Any] = {
        "Eq": operator.eq, "NotEq": operator.ne, "Lt": operator.lt, "LtE": operator.le, "Gt": operator.gt,
        "GtE": operator.ge, "In": lambda a, b: a in b, "NotIn": lambda a, b: a not in b,
        "Is": operator.is_, "IsNot": operator.is_not,
    }  # fmt: skip

    def plain(x: Any, depth: int = 0) -> bool:
        if depth > 50:
            return False
        t = exact_type(x)
        if t in plain_scalars:
            return True
        if t in plain_containers:
            return all_(plain(v, depth + 1) for v in x)
        if t is dict:
            return all_(plain(k, depth + 1) and plain(v, depth + 1) for k, v in x.items())
        return False

    def tg_cmp(names: list[str], *operands: Any) -> bool:
        for i, name in enumerate(names):
            a, b = operands[i], operands[i + 1]
            if name not in ("Is", "IsNot") and not (plain(a) and plain(b)):
                return False
            result = ops[name](a, b)
            if exact_type(result) is not bool or not result:
                return False
        return True

    def tg_truth(value: Any) -> bool:
        return plain(value) and bool(value)

    class Rewrite(ast.NodeTransformer):
        def visit_Assert(self, node: ast.Assert) -> ast.Assert:
            node.test = self.wrap(node.test)
            return node

        def wrap(self, test: ast.expr) -> ast.expr:
            if isinstance(test, ast.BoolOp):
                return ast.BoolOp(op=test.op, values=[self.wrap(v) for v in test.values])
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                return ast.UnaryOp(op=test.op, operand=self.wrap(test.operand))
            if isinstance(test, ast.Compare):
                names = ast.List(
                    elts=[ast.Constant(exact_type(o).__name__) for o in test.ops], ctx=ast.Load()
                )
                args: list[ast.expr] = [names, test.left, *test.comparators]
                return ast.Call(func=ast.Name("__tg_cmp", ast.Load()), args=args, keywords=[])
            return ast.Call(func=ast.Name("__tg_truth", ast.Load()), args=[test], keywords=[])

    def compile_test(source: str, name: str) -> Any:
        tree = ast.parse(source, name)
        if strict:
            tree = ast.fix_missing_locations(Rewrite().visit(tree))
        return compile(tree, name, "exec")

    def report(ok: bool, why: str = "") -> None:
        line = f"{nonce} {'PASS' if ok else 'FAIL'} {why[:300]}".replace("\n", " ") + "\n"
        write(out_fd, line.encode("utf-8", "replace"))
        exit_now(0)

    test = payload["test"]
    if (
        "stdin" in test
    ):  # a program test: run the solution as __main__ on this input; the harness compares stdout
        import tempfile

        feed = tempfile.TemporaryFile()  # noqa: SIM115 (stays open as stdin)
        feed.write(test["stdin"].encode())
        feed.seek(0)
        os.dup2(feed.fileno(), 0)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        try:
            exec(compile(payload["solution"], "solution.py", "exec"), {"__name__": "__main__"})
        except SystemExit as exc:
            if exc.code not in (0, None):
                sys.stdout.flush()
                report(False, f"exit status {exc.code}")
        except BaseException as exc:
            sys.stdout.flush()
            report(False, f"{exact_type(exc).__name__}: {exc}")
        sys.stdout.flush()
        report(True)
    try:  # compiled before the candidate runs: the code object cannot be edited afterwards
        test_code = compile_test(test["source"], "test.py")
    except SyntaxError as exc:
        report(False, f"the test does not compile: {exc}")
    saved_builtins = dict(builtins.__dict__)
    saved_modules = set(sys.modules)
    module = types.ModuleType("solution")
    module.__file__ = "solution.py"
    sys.modules["solution"] = module
    try:
        exec(compile(payload["solution"], "solution.py", "exec"), module.__dict__)
    except BaseException as exc:  # SystemExit included: leaving early is a failure
        report(False, f"solution raised {exact_type(exc).__name__}: {exc}")
    builtins.__dict__.clear()
    builtins.__dict__.update(saved_builtins)
    for name in list(sys.modules):
        if name not in saved_modules and name != "solution":
            del sys.modules[name]
    namespace = dict(module.__dict__)
    namespace.update({"__name__": "__test__", "__tg_cmp": tg_cmp, "__tg_truth": tg_truth})
    try:
        exec(test_code, namespace)
        function = test.get("function")
        if function:
            fn = namespace.get(function)
            if callable(fn):
                fn()
            else:
                report(False, f"test function {function} not found")
    except BaseException as exc:
        report(False, f"{exact_type(exc).__name__}: {exc}")
    report(True)
