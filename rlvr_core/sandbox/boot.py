"""The sandboxed program's own first code, as source text (it runs as `python -I -S -c BOOT`, inside the sandbox, and
imports nothing from the project): the audit hook, the pass signal and the plain-data server.

- `BOOT` installs the audit hook (the second layer, inside the OS sandbox of `rlvr_core.sandbox.view`), runs the
  program with `exec`, and only when the program's last statement ran without raising reads the per-run nonce
  (which the hook lets no other line open) and writes it on the parent's pipe: the pass signal. Given two more pipes
  it then *serves* a trusted process (the code verifier's tests): it answers each call of one of the program's
  functions, arguments and results as plain data.
- `CODEC` is the plain-data encoding both sides use (JSON with tags for what JSON lacks).

argv of BOOT: scratch folder, protected roots and hidden path prefixes (each `os.pathsep`-joined: nothing under them
may be read or listed), nonce file, the parent's pipe, the pass line; then, to serve calls, the call pipe and the
answer pipe. rlvr_core/verifiers/code_exec.py's docstring has the argument for the pass signal and the server.
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

# The sandboxed program's process (see the module docstring).
BOOT = CODEC + r'''
import builtins, os, sys


def _make_hook(scratch, protected, hidden, private, nonce_path, boot_frame, pass_line):
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
    list_events = ("os.listdir", "os.scandir", "glob.glob")
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

    def check_protected(path):
        if inside(path, private):
            raise refuse("sandbox: reading the harness's private files: " + path)
        for root in protected:
            if inside(path, root):
                raise refuse("sandbox: reading a protected path: " + path)
        for prefix in hidden:  # other items' folders (hook-only isolation)
            if path.startswith(prefix) and not inside(path, scratch):
                raise refuse("sandbox: reading another item's files: " + path)

    def check_open(path, writing):
        if inside(path, scratch):
            return
        if writing:
            raise refuse("sandbox: writing outside the scratch dir: " + path)
        parts = path.split("/")
        if len_(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != own_pid:
            raise refuse("sandbox: reading another process's /proc entries: " + path)
        check_protected(path)
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
        elif event in list_events:
            path = args[0]
            if kind_of(path) is not int_:  # a directory listed by path (glob: its pattern's folder)
                path = real(path if event != "glob.glob" else path[:path.rfind("/") + 1] or ".")
                if not inside(path, scratch):
                    check_protected(path)
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
    hidden = tuple(p for p in sys.argv[3].split(os.pathsep) if p)
    nonce_path = os.path.realpath(sys.argv[4])
    result_fd, pass_line = int(sys.argv[5]), int(sys.argv[6])
    # With the two call pipes, the program is only the solution, and the tests call it from their own process.
    serve = _make_server(int(sys.argv[7]), int(sys.argv[8])) if len(sys.argv) > 8 else None
    program = os.path.join(scratch, "program.py")
    with open(program) as f:
        code = compile(f.read(), "program.py", "exec")
    os.remove(program)  # the program is not left on disk for itself to read
    # What runs after the program is bound now: the program can rebind os.*, builtins, sys.modules.
    open_, read, write, close, exit_, rdonly = os.open, os.read, os.write, os.close, os._exit, os.O_RDONLY
    flushes = (sys.stdout.flush, sys.stderr.flush)
    listed, same_len, pairs = list, len, zip
    builtin_names = builtins.__dict__
    before = list(builtin_names.items())
    me = sys._getframe()
    sys.addaudithook(_make_hook(scratch, protected, hidden, os.path.dirname(nonce_path), nonce_path, me,
                                 pass_line))
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
        for flush in flushes:  # after the signal: what the program printed, nothing it could use to pass
            try:
                flush()
            except BaseException:
                pass
        exit_(0)  # at once: no atexit handler or finalizer of the program runs after the pass signal
    close(fd)
    close(result_fd)
    serve(namespace)


_boot()
'''

# The line of BOOT that opens the nonce (line numbers of `python -c` code count from BOOT's first line).
PASS_LINE = next(n for n, line in enumerate(BOOT.splitlines(), 1) if line.strip().startswith("fd = open_(nonce_path"))

