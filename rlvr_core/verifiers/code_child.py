"""The code verifier's tests' process, as source text (it runs as `python -I -S -c RUNNER`, in a sandbox of its own,
and imports nothing from the project). The solution's side, `BOOT`, is the sandbox's (rlvr_core/sandbox/boot.py).

- `RUNNER` is the trusted process that runs the tests (MBPP asserts, a HumanEval `check(candidate)`) against
  stand-ins of the solution's functions. The tests' code and expected values exist only there, so nothing the
  solution can reach (its frames, the tests' code objects, `gc`, patched modules) holds them, and what comes back
  is rebuilt from plain data (exactly int, float, bool, str, bytes, None, list, tuple, dict, set, frozenset,
  recursively): no object of the solution's, so no rigged `__eq__` or `__bool__`, is ever compared.

rlvr_core/verifiers/code_exec.py starts them and reads their verdicts; its docstring has the argument.
"""

from __future__ import annotations

from rlvr_core.sandbox.boot import CODEC

# The trusted side: runs the tests against stand-ins of the solution's functions (see the module docstring).
# argv: the tests' spec (a read-only JSON file in the tests' own sandbox), the request pipe, the answer pipe, the
# verdict pipe. The verdict is one JSON object: passed, a one-line detail when not, and counts of the requests.
RUNNER = CODEC + r"""
import builtins, json, os, sys

MAX_ANSWER = 64 * 1024 * 1024
PLAIN = ("int, float, complex, bool, str, bytes, None, list, tuple, dict, set, frozenset (and Counter, OrderedDict, "
         "defaultdict, deque)")
WRITE_BACK = {  # an argument the solution changed gets its new content in place, as one process would see it
    list: lambda old, new: old.__setitem__(slice(None), new),
    dict: lambda old, new: (old.clear(), old.update(new)),
    set: lambda old, new: (old.clear(), old.update(new)),
}
# Standard modules a solution's import may lend the tests (MBPP's tests sometimes use the solution's `import sys`);
# the tests' process imports its own copy. Not these: they open windows or browsers, or print on import.
NO_MODULES = {"antigravity", "this", "turtle", "turtledemo", "tkinter", "idlelib", "webbrowser"}


class SolutionFailed(BaseException):
    # A failure no test may catch (not an Exception): the solution's process ended or sent something that is not
    # an answer, the tests used an object of the solution's as a value, or passed it what cannot cross.
    pass


class SolutionError(Exception):
    # An exception the solution raised whose type is not a builtin exception (the tests see builtin ones as such).
    pass


def _exception(name, message):
    kind = getattr(builtins, name, None) if type(name) is str else None
    text = message if type(message) is str else ""
    if isinstance(kind, type) and issubclass(kind, Exception) and kind not in (StopIteration, StopAsyncIteration):
        try:
            return kind(text)
        except Exception:
            pass
    return SolutionError(str(name)[:100] + ": " + text)


class Remote:
    # Stands for an object that stays in the solution's process (one of its functions, or what one returned that
    # is not plain data): it can be called, its attributes read and set, and it can be passed back to the
    # solution. Any other use, comparing it or taking its truth value first, fails the tests: the comparison would
    # run the solution's code.
    __slots__ = ("_Remote__link", "_Remote__target", "_Remote__what")

    def __init__(self, link, target, what):
        object.__setattr__(self, "_Remote__link", link)
        object.__setattr__(self, "_Remote__target", target)
        object.__setattr__(self, "_Remote__what", what)

    def __call__(self, *args, **kwargs):
        return self.__link.request(self.__target, self.__what, "call", args=args, kwargs=kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.__link.request(self.__target, self.__what, "get", name=name)

    def __setattr__(self, name, value):
        self.__link.request(self.__target, self.__what, "set", name=name, value=value)

    def __repr__(self):
        return "<" + self.__what + ">"

    def _refuse(self, *args, **kwargs):
        raise SolutionFailed("the tests used " + self.__what + " as a value: only " + PLAIN + " go back to the tests")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __hash__ = __len__ = __iter__ = _refuse
    __contains__ = __getitem__ = __index__ = __int__ = __float__ = __complex__ = __str__ = __format__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __abs__ = _refuse
    __neg__ = __round__ = __mod__ = __floordiv__ = __pow__ = __and__ = __or__ = __xor__ = _refuse


class Link:
    def __init__(self, request_fd, answer_fd):
        self.requests, self.answers = os.fdopen(request_fd, "wb"), os.fdopen(answer_fd, "rb")
        self.counts = {"calls": 0, "arguments_written_back": 0, "arguments_returned": 0}
        self.remotes = {}

    def receive(self, what):
        line = self.answers.readline(MAX_ANSWER + 1)
        if not line:
            raise SolutionFailed("the solution's process ended before it " + what)
        if len(line) > MAX_ANSWER:
            raise SolutionFailed("the solution's answer is over 64 MiB")
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if type(message) is not dict:
            raise SolutionFailed("the solution's process sent something that is not an answer")
        return message

    def ready(self):
        message = self.receive("finished loading")
        names, modules = message.get("ready"), message.get("modules")
        if type(names) is not list or not all(type(n) is str for n in names) or type(modules) is not dict:
            raise SolutionFailed("the solution's process sent something that is not an answer")
        return set(names), {k: v for k, v in modules.items() if type(v) is str}

    def remote(self, body):
        # A handle from the solution: [target, type name]; one Remote per object, so `is` works on them.
        target, kind = body
        key = (target[0], target[1])
        if key not in self.remotes:
            self.remotes[key] = Remote(self, [target[0], target[1]], "a " + str(kind)[:200] + " of the solution's")
        return self.remotes[key]

    def encode(self, value):
        def other(v):
            if type(v) is Remote and v._Remote__link is self:
                return ["h", v._Remote__target]
            raise NotPlain(type_name(type(v)))
        return encode(value, other)

    def request(self, target, what, op, args=(), kwargs=None, name=None, value=None):
        try:
            message = {"t": target, "op": op, "a": [self.encode(a) for a in args], "n": name,
                       "k": [[k, self.encode(v)] for k, v in (kwargs or {}).items()], "v": self.encode(value)}
        except NotPlain as exc:
            raise SolutionFailed("the tests pass a " + str(exc) + " to " + what + ", which only plain data can reach")
        try:
            self.requests.write(json.dumps(message).encode() + b"\n")
            self.requests.flush()
        except OSError:
            raise SolutionFailed("the solution's process ended before the tests used " + what) from None
        answer = self.receive("answered a request for " + what)
        self.counts["calls"] += 1
        if "x" in answer:  # the solution raised: the tests see the exception (a builtin type as itself)
            raised = answer["x"]
            raise _exception(*raised) if type(raised) is list and len(raised) == 2 else _exception(None, "")
        try:
            return self.result(what, args, answer)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
            raise SolutionFailed("the solution's process sent something that is not an answer") from None

    def result(self, what, args, answer):
        if "n" in answer:
            raise SolutionFailed(what + " gave a " + str(answer["n"])[:200])
        for i, state in answer["w"].items():
            arg = args[int(i)]
            WRITE_BACK[type(arg)](arg, decode(state, self.remote))
            self.counts["arguments_written_back"] += 1
        if "arg" in answer:
            arg = args[answer["arg"]]
            if type(arg) not in WRITE_BACK:
                raise ValueError("not an argument that can be returned")
            self.counts["arguments_returned"] += 1
            return arg
        return decode(answer["r"], self.remote)


def _names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names


def _lend_modules(namespace, wanted, modules):
    for name, module in modules.items():
        top = module.split(".")[0]
        if name in wanted and name not in namespace and top in sys.stdlib_module_names and top not in NO_MODULES:
            try:
                __import__(module)
                namespace[name] = sys.modules[module]
            except Exception:
                pass


def run_tests(spec, link):
    namespace = {"__name__": "__main__"}
    entry = spec.get("entry_point")
    if spec.get("prompt"):  # HumanEval: the prompt's helpers (e.g. poly, encode_cyclic) are the tests' too
        exec(compile(spec["prompt"], "<prompt>", "exec"), namespace)
    tests = compile(spec["test"], "<tests>", "exec")
    names, modules = link.ready()
    if entry:
        if entry not in names:
            raise SolutionFailed("the solution defines no function " + entry + "()")
        namespace[entry] = Remote(link, ["g", entry], entry + "()")
    else:  # MBPP: the solution's functions the tests name; one named like a builtin or a standard module (a
        # solution's `abs`, a class called `math`) only when it is the only one: otherwise it is the tests' own
        wanted = _names(tests)
        own = wanted & names
        reserved = set(dir(builtins)) | set(sys.stdlib_module_names)
        for name in own - reserved if own - reserved else own:
            namespace[name] = Remote(link, ["g", name], name + "()")
        _lend_modules(namespace, wanted, modules)
    exec(tests, namespace)
    if entry:
        namespace["check"](namespace[entry])


def describe(exc, test_source):
    text = str(exc) if isinstance(exc, SolutionFailed) else type(exc).__name__
    if not isinstance(exc, SolutionFailed):
        try:
            message = str(exc)
        except BaseException:
            message = ""
        text += ": " + message if message else ""
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<tests>":
            line = tb.tb_lineno
        tb = tb.tb_next
    lines = test_source.splitlines()
    if line is not None and 0 < line <= len(lines):
        text += " (tests line " + str(line) + ": " + lines[line - 1].strip() + ")"
    return text[:500]


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    link = Link(int(sys.argv[2]), int(sys.argv[3]))
    try:
        run_tests(spec, link)
        verdict = {"passed": True}
    except BaseException as exc:  # every way the tests can fail, an exit of theirs included
        verdict = {"passed": False, "detail": describe(exc, spec["test"])}
    verdict.update(link.counts)
    os.write(int(sys.argv[4]), json.dumps(verdict).encode())
    os._exit(0)  # nothing the tests registered runs after the verdict


main()
"""
