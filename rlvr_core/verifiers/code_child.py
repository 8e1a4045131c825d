"""The two child processes of the code verifier, as source text (each runs as `python -I -S -c SOURCE`, and must
import nothing from the project).

- `BOOT` runs the solution in the sandbox: it installs the audit hook, runs the program with `exec`, and only
  when the program's last statement ran without raising reads the per-run nonce (which the hook lets no other
  line open) and writes it on the parent's pipe: the pass signal. With two more pipes it then *serves* the tests'
  process: it answers each call of one of the solution's functions, arguments and results as plain data.
- `RUNNER` is the trusted process that runs the tests (MBPP asserts, a HumanEval `check(candidate)`) against
  stand-ins of the solution's functions. The tests' code and expected values exist only there, so nothing the
  solution can reach (its frames, the tests' code objects, `gc`, patched modules) holds them, and what comes back
  is rebuilt from plain data (exactly int, float, bool, str, bytes, None, list, tuple, dict, set, frozenset,
  recursively): no object of the solution's, so no rigged `__eq__` or `__bool__`, is ever compared.
- `CODEC` is the plain-data encoding both use (JSON with tags for what JSON lacks).

rlvr_core/verifiers/code_exec.py starts them and reads their verdicts; its docstring has the argument.
"""

from __future__ import annotations

# Plain data as JSON: str, float, bool and None as themselves; int (any size: hex has no digit limit), bytes,
# complex, builtin types (`int` as an argument) and the containers as [tag, body], among them the standard library's
# Counter, OrderedDict, defaultdict and deque, which are rebuilt on the receiving side from plain parts (their
# comparisons then run that side's own, unpatched code). Every other value is passed to `other`: the tests' side
# refuses it, the solution's side sends a handle (an object that stays in its process). Exact type checks
# throughout: a subclass is not plain data.
CODEC = r'''
import builtins as _builtins
import collections as _collections


class NotPlain(Exception):
    """A value that is not plain data; its message names the type."""


_SEQUENCES = {list: "l", tuple: "t", set: "s", frozenset: "f", _collections.deque: "q"}
_BUILD_SEQUENCE = {"l": list, "t": tuple, "s": set, "f": frozenset, "q": _collections.deque}
_MAPPINGS = {dict: "d", _collections.Counter: "C", _collections.OrderedDict: "O"}
_BUILD_MAPPING = {"d": dict, "C": _collections.Counter, "O": _collections.OrderedDict}


def type_name(kind):
    module = getattr(kind, "__module__", "?")
    name = getattr(kind, "__qualname__", "?")
    return name if module == "builtins" else str(module) + "." + str(name)


def _builtin_type_name(value):
    name = getattr(value, "__name__", None)
    return name if type(name) is str and getattr(_builtins, name, None) is value else None


def encode(value, other):
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is float:
        return value
    if kind is int:
        return ["i", format(value, "x")]
    if kind in _SEQUENCES:
        return [_SEQUENCES[kind], [encode(item, other) for item in value]]
    if kind in _MAPPINGS:
        return [_MAPPINGS[kind], [[encode(key, other), encode(item, other)] for key, item in value.items()]]
    if kind is _collections.defaultdict:
        factory = value.default_factory
        name = _builtin_type_name(factory) if type(factory) is type else None
        return ["D", [name, [[encode(key, other), encode(item, other)] for key, item in value.items()]]]
    if kind is bytes:
        return ["b", value.decode("latin-1")]
    if kind is complex:
        return ["c", [value.real, value.imag]]
    if kind is type and _builtin_type_name(value) is not None:
        return ["B", value.__name__]
    return other(value)


def _pairs(body, handle):
    if any(type(pair) is not list or len(pair) != 2 for pair in body):
        raise ValueError("not an encoded mapping")
    return [(decode(key, handle), decode(item, handle)) for key, item in body]


def decode(data, handle):
    """The value `encode` gave `data` for (a handle through `handle`); ValueError on anything else."""
    kind = type(data)
    if data is None or kind is bool or kind is str or kind is float or kind is int:
        return data
    if kind is not list or len(data) != 2 or type(data[0]) is not str:
        raise ValueError("not an encoded value")
    tag, body = data
    if tag == "i" and type(body) is str:
        return int(body, 16)
    if tag == "b" and type(body) is str:
        return body.encode("latin-1")
    if tag == "c" and type(body) is list and len(body) == 2 and all(type(x) in (int, float) for x in body):
        return complex(body[0], body[1])
    if tag == "B" and type(body) is str and type(getattr(_builtins, body, None)) is type:
        return getattr(_builtins, body)
    if tag == "h":
        return handle(body)
    if type(body) is list and tag in _BUILD_SEQUENCE:
        return _BUILD_SEQUENCE[tag](decode(item, handle) for item in body)
    if type(body) is list and tag in _BUILD_MAPPING:
        return _BUILD_MAPPING[tag](dict(_pairs(body, handle)))  # Counter(pairs) would count the pairs
    if tag == "D" and type(body) is list and len(body) == 2 and type(body[1]) is list:
        factory = getattr(_builtins, body[0], None) if type(body[0]) is str else None
        return _collections.defaultdict(factory if type(factory) is type else None, _pairs(body[1], handle))
    raise ValueError("not an encoded value")
'''

# The solution's process (see the module docstring). argv: scratch folder, protected roots, nonce file, the
# parent's pipe, the pass line; then, to serve the tests' calls, the call pipe and the answer pipe.
BOOT = CODEC + r'''
import builtins, os, sys


def _make_hook(scratch, protected, private, nonce_path, boot_frame, pass_line):
    """The audit hook. Everything it calls is bound here, before the program runs: C functions, strings and
    tuples in closure cells, which no code of the program can reach (the hook is stored nowhere but in the
    interpreter's hook list) or replace (it can rebind module attributes and builtins, not these)."""
    lstat, readlink, stat, getframe = os.lstat, os.readlink, os.stat, sys._getframe
    kind_of, str_, bytes_, int_ = type, str, bytes, int
    refuse, os_error, len_ = PermissionError, OSError, len
    own_pid = str(os.getpid())
    o_write = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    blocked = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.forkpty",
               "os.kill", "os.killpg", "ctypes.", "pty.", "winreg.", "os.startfile", "sqlite3.connect")
    # A tracer/profiler can rebind names or skip lines of the tests; gc's walkers reach every object;
    # chdir and symlinks would let a checked path name another file by the time it is opened; a
    # sub-interpreter has no audit hook.
    refused = {"sys.settrace", "sys.setprofile", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
               "os.chdir", "os.symlink", "cpython.PyInterpreterState_New"}
    # Modules that start processes or interpreters without an audit event (_posixsubprocess.fork_exec), read
    # a file by path without one (readline.read_history_file), or reach raw memory.
    blocked_modules = ("ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters", "_xxinterpchannels",
                       "readline", "_testcapi", "_testinternalcapi")
    write_events = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod", "os.chown", "os.link",
                    "os.truncate", "os.utime", "shutil.rmtree"}

    def inside(path, root):
        return path == root or path.startswith(root + "/")

    def resolve(path):
        """The absolute path with every symbolic link followed (os.path.realpath, from captured C calls)."""
        if path[:1] != "/":
            path = scratch + "/" + path  # the cwd: chdir is refused
        todo, out, links = path.split("/")[::-1], "", 0
        while todo:
            name = todo.pop()
            if name == "" or name == ".":
                continue
            if name == "..":
                out = out[:out.rfind("/")]
                continue
            candidate = out + "/" + name
            try:
                mode = lstat(candidate).st_mode
            except os_error:
                mode = 0
            if mode & 0o170000 != 0o120000:
                out = candidate
                continue
            links += 1
            if links > 40:
                raise refuse("sandbox: too many levels of symbolic links")
            target = readlink(candidate)
            if target[:1] == "/":
                out = ""
            todo.extend(target.split("/")[::-1])
        return out or "/"

    def real(path):
        """The resolved path of a path argument. Only str and bytes (what CPython passes after converting an
        os.PathLike): an object converted again here could name one file to the check and another to the open."""
        kind = kind_of(path)
        if kind is bytes_:
            path = path.decode("utf-8", "surrogateescape")
        elif kind is not str_:
            raise refuse("sandbox: a file path must be str or bytes here")
        if path[:1] != "/" and ".." in path.split("/"):  # relative to a dir_fd the check cannot see
            raise refuse("sandbox: relative paths with '..' are not allowed: " + path)
        return resolve(path)

    def check_open(path, writing):
        if inside(path, scratch):
            return
        if writing:
            raise refuse("sandbox: writing outside the scratch dir: " + path)
        if inside(path, private):
            raise refuse("sandbox: reading the harness's private files: " + path)
        parts = path.split("/")
        if len_(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != own_pid:
            raise refuse("sandbox: reading another process's /proc entries: " + path)
        for root in protected:
            if inside(path, root):
                raise refuse("sandbox: reading a protected path: " + path)
        try:
            is_dir = stat(path).st_mode & 0o170000 == 0o040000
        except os_error:
            is_dir = False
        if is_dir:  # a directory fd outside scratch would let relative paths escape every check here
            raise refuse("sandbox: opening a directory outside the scratch dir: " + path)

    def hook(event, args):
        if event.startswith(blocked) or event in refused:
            raise refuse("sandbox: " + event + " is not allowed")
        if event == "import":
            if args[0] in blocked_modules:
                raise refuse("sandbox: importing " + args[0] + " is not allowed")
        elif event == "open":
            path, mode, flags = args
            if kind_of(path) is int_:
                return  # a file descriptor: opened under this hook (or inherited)
            resolved = real(path)
            caller = getframe(1)
            if resolved == nonce_path and caller is boot_frame and caller.f_lineno == pass_line:
                # The boot's pass line, reached only after the program returned (see _boot). The line matters
                # as much as the frame: a finalizer or signal handler that is a C callable (a partial of
                # os.open) has no frame of its own and runs on whatever frame is current, the boot's included
                # while an exception unwinds through it.
                return
            writing = (kind_of(mode) is str_ and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or (
                kind_of(flags) is int_ and flags & o_write != 0)
            check_open(resolved, writing)
        elif event in write_events:
            for arg in args[:2] if event in ("os.rename", "os.link") else args[:1]:
                if kind_of(arg) is int_ and event == "os.truncate":
                    continue  # ftruncate: the fd was opened for writing under this hook
                resolved = real(arg)
                if not inside(resolved, scratch):
                    raise refuse("sandbox: " + event + " outside the scratch dir: " + resolved)

    return hook


def _make_server(request_fd, reply_fd):
    """The solution's side of the requests from the tests' process, one JSON line each way. A request calls a
    function of the program's globals or an object the tests hold a handle to, or gets or sets an attribute of
    one; arguments and results go as plain data, any other result as a handle (the object stays here). The answer
    also carries the arguments the call changed (list, dict and set arguments, written back there) and whether the
    result *is* one of the arguments. What the program does to this code (rebinding it, writing on the pipes
    itself) can only spoil its own answers: the tests' side decodes plain data and handles, nothing else."""
    import json

    loads, dumps, exit_, module_type = json.loads, json.dumps, os._exit, type(os)
    requests, replies = os.fdopen(request_fd, "rb"), os.fdopen(reply_fd, "wb")
    mutable = (list, dict, set)
    objects, numbers = [], {}  # the objects the tests hold handles to, kept alive so their ids stay theirs
    program = []  # the program's globals, once it has run

    def send(message):
        replies.write(dumps(message).encode() + b"\n")
        replies.flush()

    def register(value):
        number = numbers.get(id(value))
        if number is None:
            number = numbers[id(value)] = len(objects)
            objects.append(value)
        return ["h", [["o", number], type_name(type(value))]]

    def resolve(target):
        kind, key = target
        if kind == "g":
            if key not in program[0]:
                raise NameError("name %r is not defined" % key)
            return program[0][key]
        return objects[key]

    def exception_name(exc):
        kind = type(exc)
        return kind.__name__ if getattr(builtins, kind.__name__, None) is kind else kind.__qualname__

    def answer(result, args, sent):
        written = {}
        for i, arg in enumerate(args):
            if type(arg) in mutable:
                state = encode(arg, register)
                if state != sent[i]:
                    written[str(i)] = state
        for i, arg in enumerate(args):
            if result is arg and type(arg) in mutable:
                return {"arg": i, "w": written}
        return {"r": encode(result, register), "w": written}

    def perform(request):
        target = resolve(request["t"])
        if request["op"] == "get":
            return {"r": encode(getattr(target, request["n"]), register), "w": {}}
        if request["op"] == "set":
            setattr(target, request["n"], decode(request["v"], resolve))
            return {"r": None, "w": {}}
        args = [decode(a, resolve) for a in request["a"]]
        kwargs = {key: decode(v, resolve) for key, v in request["k"]}
        return answer(target(*args, **kwargs), args, request["a"])

    def handle(request):
        try:
            return perform(request)
        except RecursionError:
            return {"n": "structure nested too deep (or containing itself)"}
        except Exception as exc:  # the tests see it, as they would in one process
            try:
                message = str(exc)[:1000]
            except Exception:
                message = ""
            return {"x": [exception_name(exc), message]}

    def serve(program_globals):
        program.append(program_globals)
        items = list(program_globals.items())
        modules = {name: value.__name__ for name, value in items
                   if type(value) is module_type and type(name) is str and type(value.__name__) is str}
        send({"ready": [name for name, value in items if type(name) is str and callable(value)],
              "modules": modules})
        while True:
            line = requests.readline()
            if not line:  # the tests' process is done
                exit_(0)
            send(handle(loads(line)))

    return serve


def _boot():
    scratch = os.path.realpath(sys.argv[1])
    protected = tuple(os.path.realpath(p) for p in sys.argv[2].split(os.pathsep) if p)
    nonce_path = os.path.realpath(sys.argv[3])
    result_fd, pass_line = int(sys.argv[4]), int(sys.argv[5])
    # With the two call pipes, the program is only the solution, and the tests call it from their own process.
    serve = _make_server(int(sys.argv[6]), int(sys.argv[7])) if len(sys.argv) > 7 else None
    program = os.path.join(scratch, "program.py")
    with open(program) as f:
        code = compile(f.read(), "program.py", "exec")
    os.remove(program)  # the program is not left on disk for itself to read
    # What runs after the program is bound now: the program can rebind os.*, builtins, sys.modules.
    open_, read, write, close, exit_, rdonly = os.open, os.read, os.write, os.close, os._exit, os.O_RDONLY
    listed, same_len, pairs = list, len, zip
    builtin_names = builtins.__dict__
    before = list(builtin_names.items())
    me = sys._getframe()
    sys.addaudithook(_make_hook(scratch, protected, os.path.dirname(nonce_path), nonce_path, me, pass_line))
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec(code, namespace)
    # Reached only when every statement of the program ran without raising: an exit, an exception or a signal
    # ends the process before this line.
    after = listed(builtin_names.items())
    intact = same_len(after) == same_len(before)
    for (name, value), (name_after, value_after) in pairs(before, after):  # identity only: runs no program code
        intact = intact and name is name_after and value is value_after
    if not intact:
        write(2, b"sandbox: the program replaced or added builtins\n")
        exit_(1)
    fd = open_(nonce_path, rdonly)  # the pass line: the hook lets only this line of this frame open it
    write(result_fd, read(fd, 64))
    if serve is None:
        exit_(0)  # at once: no atexit handler or finalizer of the program runs after the pass signal
    close(fd)
    close(result_fd)
    serve(namespace)


_boot()
'''

# The line of BOOT that opens the nonce (line numbers of `python -c` code count from BOOT's first line).
PASS_LINE = next(n for n, line in enumerate(BOOT.splitlines(), 1) if line.strip().startswith("fd = open_(nonce_path"))

# The trusted side: runs the tests against stand-ins of the solution's functions (see the module docstring).
# argv: the tests' spec (a JSON file in the harness's private folder), the request pipe, the answer pipe, the
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
