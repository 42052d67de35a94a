"""The course kit of docs/EXERCISES.md: a student copy of the repo, and the grading of submissions.

    python docs/kit.py student OUT [--exercises 1,3]    # the exercises' functions stubbed, ANSWERS.md to fill
    python docs/kit.py score [SUBMISSION ...] [--exercises 1,3] [--report grades.csv]   # default: this repo
    python docs/kit.py gradescope autograder.zip [--exercises 1,3]   # the same grading on Gradescope

A student copy holds the files of this checkout (git's, or those its docs/kit-files.txt lists), without the
history and without WITHHELD. Each exercise's functions keep their signature and docstring; the body becomes
raise NotImplementedError("exercise N") (found by name with ast: the code carries no markers). A submission
is such a copy, its exercises done, and its ANSWERS.md (the written answers) filled in.

score grades exercise N of a submission in a fresh folder: this checkout's files and tests (the teacher's,
never the submission's), with the submission's files of exercise N, in which every other exercise's
functions are put back from this checkout. Each check is one pytest process with a time limit, in
bubblewrap's namespaces where it is installed: it sees its folder and a read-only system, not this checkout
nor the other submissions, and what it starts ends with it (without bubblewrap, --as-user runs it as a user
without your rights). A submission whatever it holds or does costs only its own rows. EXERCISES below is
the one table of exercises; docs/EXERCISES.md prints it."""
import argparse
import ast
import contextlib
import csv
import errno
import glob
import importlib.util
import inspect
import io
import itertools
import json
import math
import multiprocessing.connection
import multiprocessing.forkserver
import os
import pwd
import re
import shlex
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import threading
import time
import tokenize
import types
import xml.etree.ElementTree as ET
import zipfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# With the instructor: the answers, and the tests that hold the reference's code (the pitfalls are edits of
# it; exercises 9 and 10 are checked against it). Grading copies them in; a student's self-check lacks them.
WITHHELD = {"docs/INSTRUCTOR.md", "tests/pitfalls.py", "tests/test_course_kit.py",
            "tests/test_course_judged.py"}
# A judged check (run_judged): the student's functions run in one process, the verdict comes from another
JUDGED = "tests/test_course_judged.py"
MANIFEST = "docs/kit-files.txt"  # a student copy's list of its files (it has no git)
# number: (title, points, asks for a written answer, {file: [function or Class.method]}, [pytest arguments
# of each check command])
EXERCISES = {
    1: ("chunked SSD", 3, True, {"ssm.py": ["ssd_chunked"]},
        [["tests/test_scans.py", "-k", "ssd and not triton"], [JUDGED, "-k", "exercise1"]]),
    2: ("the chunked GLA / RWKV-6 scan", 3, False, {"gla.py": ["chunked_scan"]},
        [["tests/test_scans.py", "-k", "(gla or rwkv6) and chunked"],
         ["tests/test_gla_rwkv.py", "-k", "chunked"], [JUDGED, "-k", "exercise2"]]),
    3: ("position-wise perplexity", 2, True,
        {"evaluate.py": ["position_nll_naive", "sequence_nll", "position_nll"]},
        [["tests/test_evaluate.py", "-k", "position_nll"], [JUDGED, "-k", "exercise3"]]),
    4: ("Definition 3.2", 1, True, {"evaluate.py": ["length_generalization_pstar"]},
        [["tests/test_evaluate.py", "-k", "hand_made"], [JUDGED, "-k", "exercise4"]]),
    5: ("Effective Remembrance", 2, True, {"evaluate.py": ["effective_remembrance_naive"]},
        [["tests/test_evaluate.py", "-k", "effrem and not bad"], [JUDGED, "-k", "exercise5"]]),
    6: ("fitted noise", 2, True, {"interventions.py": ["Noise.initial_state", "Noise.observe"]},
        [["tests/test_interventions.py", "-k", "fitted or random"], [JUDGED, "-k", "exercise6"]]),
    7: ("State Passing and TBTT", 2, True,
        {"interventions.py": ["PassedState.initial_state", "PassedState.observe"]},
        [["tests/test_interventions.py", "-k", "sp_ or tbtt"], [JUDGED, "-k", "exercise7"]]),
    8: ("the Markov Bayes floor", 2, True, {"data.py": ["markov_bayes_nll"]},
        [["tests/test_tasks.py", "-k", "markov_floor"], [JUDGED, "-k", "exercise8"]]),
    9: ("a mixer with an exact state split", 2, True,
        {"docs/course.py": ["DiagonalRNN.zero_state", "DiagonalRNN.forward"]},
        [["tests/test_course_kit.py", "-k", "exercise9"], [JUDGED, "-k", "exercise9"]]),
    10: ("predict, then measure", 1, True, {"docs/course.py": ["predictions", "verdict_rows"]},
         [["tests/test_course_kit.py", "-k", "exercise10"], [JUDGED, "-k", "exercise10"]]),
}
ANSWER_PLACEHOLDER = "(your answer)"
REPORT_FIELDS = ["student", "exercise", "points", "of", "status", "reason", "tests", "answer"]
PYTEST = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly"]   # a check's tests in file order: -x stops alike
RUNNING, STOPPING = set(), threading.Event()   # the process groups of the checks running; set: start none
PROCESSES = threading.Lock()   # held to start a check's process or read its exit code (forkserver_exit_code)
NEEDED = ("torch", "numpy", "pytest")  # what every check imports: missing, nothing can be graded
# The most the kit reads of a file that a student or a check wrote (an exercise's file, ANSWERS.md, a
# check's report or log): a larger one is graded as too large, and one student's 2 GB file cannot end a
# class's grading.
MAX_READ = 4 << 20
TOO_LARGE = f"too large (over {MAX_READ >> 20} MiB)"
OUTPUT = 20000   # the characters of a row's checks' output the report keeps: their end
# What one check may use, whatever its code does: address space (score --memory), the size of each file it
# writes (its log among them), processes (where it runs as a user of its own: root's are not counted),
# and no core file; its time is --timeout.
CHECK_MEMORY = 4 << 30   # the checks of the repo's reference peak below 0.9 GiB of address space
CHECK_FILE_SIZE = 256 << 20
CHECK_PROCESSES = 256
TOO_MUCH_WRITTEN = f"too large (a file over {CHECK_FILE_SIZE >> 20} MiB written)"
# Parsing a submission's file (to splice it) happens in a child process with these bounds: an honest file
# takes about 10 MiB, 4 MiB of statements about 1 GiB and 4 s.
PARSE_MEMORY = 512 << 20
PARSE_SECONDS = 60
TOO_LARGE_TO_PARSE = f"too large to parse (over {PARSE_MEMORY >> 20} MiB or {PARSE_SECONDS} s)"

NO_SANDBOX = ("each check runs as you: it can read your checkout and the other submissions, write wherever "
              "you can, and start processes that outlive it")

class KitError(Exception):
    pass

def command(args):
    """The shell command of one check, as docs/EXERCISES.md prints it."""
    return "python -m pytest -q " + shlex.join(args)

# ==== the student copy ====
def find(tree, name):
    """The function `name` ("f" or "Class.method") at the top of a module's ast, or None."""
    *owner, name = name.split(".")
    body = tree.body
    if owner:
        body = next((n.body for n in body if isinstance(n, ast.ClassDef) and n.name == owner[0]), [])
    return next((n for n in body if isinstance(n, ast.FunctionDef) and n.name == name), None)

def stub(source, names, number, path):
    """source with each function of `names` reduced to its signature, docstring and the exercise's raise."""
    tree, lines, spans = ast.parse(source), source_lines(source), []
    for name in names:
        node = find(tree, name)
        if node is None or node.body[0].lineno == node.lineno:
            raise KitError(f"exercise {number}: no function {name} with a body of its own lines in {path}: "
                           "update EXERCISES in docs/kit.py")
        first = node.body[0]
        docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
            first.value.value, str)
        start = first.end_lineno if docstring else first.lineno - 1  # the first line to replace (0-based)
        spans.append((start, node.end_lineno, indent_of(lines[first.lineno - 1])))
    for start, end, indent in sorted(spans, reverse=True):
        lines[start:end] = [f'{indent}raise NotImplementedError("exercise {number}")\n']
    return "".join(lines)

def files_of(root):
    """The files of a checkout: its docs/kit-files.txt (a student copy) or what git tracks."""
    manifest = os.path.join(root, MANIFEST)
    if os.path.isfile(manifest):
        with open(manifest) as f:
            return sorted(set(f.read().split("\n")) - {""})
    listed = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, text=True)
    if listed.returncode:
        raise KitError(f"{root} is neither a git checkout nor a student copy ({MANIFEST}): use one of those")
    return sorted(set(filter(None, listed.stdout.split("\0"))))

def answers_template():
    questions = "".join(f"## {n}. {title}\n\n{ANSWER_PLACEHOLDER}\n\n"
                        for n, (title, _, written, *_) in EXERCISES.items() if written)
    return ("# Written answers\n\nEach exercise's question (docs/EXERCISES.md, \"In writing\") under its "
            "heading; keep the headings.\n\n" + questions)

def student(out, numbers):
    """Writes the student copy to out (absent or empty, outside this checkout): built beside, then renamed."""
    real = os.path.realpath(out)
    if real == os.path.realpath(ROOT) or real.startswith(os.path.realpath(ROOT) + os.sep):
        raise KitError(f"{out} is inside the repo {ROOT} (its tests would run twice): pass a path outside it")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise KitError(f"{out} exists and is not an empty directory: pass a new path")
    files = [p for p in files_of(ROOT) if p not in WITHHELD and p != MANIFEST]
    parent = os.path.dirname(real)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".kit-", dir=parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide the copy from its other users
        for path in files:
            os.makedirs(os.path.join(tmp, os.path.dirname(path)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, path), os.path.join(tmp, path))
        for n in numbers:
            for path, names in EXERCISES[n][3].items():
                with open(os.path.join(tmp, path)) as f:
                    text = stub(f.read(), names, n, path)
                with open(os.path.join(tmp, path), "w") as f:
                    f.write(text)
        with open(os.path.join(tmp, "ANSWERS.md"), "w") as f:
            f.write(answers_template())
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            f.write("".join(p + "\n" for p in sorted(files + ["ANSWERS.md", MANIFEST])))
        if os.path.isdir(out):
            os.rmdir(out)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

def source_lines(text):
    """text's lines as Python's tokenizer counts them, which ast's line numbers index: each ends at \\n,
    \\r\\n or \\r only (a form feed, U+2028 and str.splitlines()'s other breaks lie inside a line)."""
    return [line for line in re.split(r"(?<=\n)|(?<=\r)(?!\n)", text) if line]

def graded_source(text, reference, path, n):
    """A submission's file for exercise n: its text with every other exercise's functions as in reference,
    each at the indentation of the submission's own (a class indented by tabs keeps them). A text that does
    not parse is returned as it is: the check reports it."""
    bom = "\ufeff" if text.startswith("\ufeff") else ""   # (decoded as utf-8, not utf-8-sig)
    text = text[len(bom):]
    try:
        tree, ref_tree = ast.parse(text), ast.parse(reference)
    except (SyntaxError, ValueError):
        return bom + text
    lines, ref_lines, spans = source_lines(text), source_lines(reference), []
    first = lambda node: min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    for m, (*_, functions, _) in EXERCISES.items():
        for name in functions.get(path, []) if m != n else []:
            mine, ref = find(tree, name), find(ref_tree, name)
            if mine and ref:
                spans.append((first(mine), mine.end_lineno, reindented(
                    ref_lines[first(ref):ref.end_lineno], indent_of(ref_lines[first(ref)]),
                    indent_of(lines[first(mine)]))))
    for start, end, replacement in sorted(spans, key=lambda s: s[0], reverse=True):
        lines[start:end] = replacement
    return bom + "".join(lines)

def indent_of(line):
    return line[:len(line) - len(line.lstrip(" \t\f"))]

def reindented(lines, old, new):
    """lines (a function ending in a line break) with the indentation `old` of each line that starts with it
    made `new`."""
    lines = [new + line[len(old):] if old != new and line.startswith(old) else line for line in lines]
    if lines and not lines[-1].endswith(("\n", "\r")):   # (the reference's last line, without one)
        lines[-1] += "\n"
    return lines

def graded_file(data, reference, path, n):
    """graded_source on the bytes of a submission's file -> (the bytes to grade, None), or (None, why) where
    the spliced file would not compile though the submission's own does. Decoded as Python decodes it (a
    BOM, a coding line), written back in the same encoding."""
    try:
        encoding = tokenize.detect_encoding(io.BytesIO(data).readline)[0]
        text = data.decode(encoding)
        compile(data, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, UnicodeDecodeError, LookupError, RecursionError):
        return data, None   # the student's own file does not compile: the check reports it
    try:
        out = graded_source(text, reference, path, n).encode(encoding)
        compile(out, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, UnicodeEncodeError, RecursionError) as e:   # a kit bug, in the row
        where = f" line {e.lineno}" if getattr(e, "lineno", None) else ""
        return None, f"splice: {path}{where}: {type(e).__name__} once the other exercises are put back"
    return out, None

SPLICE = """import json, sys
sys.path.insert(0, sys.argv[1])
import kit
kit.set_limits(kit.PARSE_MEMORY, kit.CHECK_FILE_SIZE, None)
try:
    data, why = kit.graded_file(sys.stdin.buffer.read(), open(sys.argv[2]).read(), sys.argv[3],
                                int(sys.argv[4]))
except MemoryError:
    sys.exit(3)
if data is not None:
    with open(sys.argv[5], "wb") as f:
        f.write(data)
print(json.dumps(why))
"""

def splice_bounded(data, path, n, out):
    """graded_file of a submission's file (data) in a child process of at most PARSE_MEMORY and
    PARSE_SECONDS, which writes the file to grade at out -> None, or why not (the row's reason): the kit's
    own process never parses a student's file."""
    cmd = [sys.executable, "-I", "-S", "-c", SPLICE, os.path.dirname(os.path.abspath(__file__)),
           os.path.join(ROOT, path), path, str(n), out]
    try:
        run = subprocess.run(cmd, input=data, capture_output=True, timeout=PARSE_SECONDS)
    except subprocess.TimeoutExpired:
        return f"{TOO_LARGE_TO_PARSE}: {path}"
    if run.returncode == 3 or b"MemoryError" in run.stderr[-2000:]:
        return f"{TOO_LARGE_TO_PARSE}: {path}"
    if run.returncode:
        return f"splice: {path}: the parser ended with {run.returncode}"
    return json.loads(run.stdout)

def set_limits(memory, file_size, processes):
    """Caps this process and what it starts: its address space, the size of a file it writes, the
    processes of its user (None: not capped), and no core file; never above what the kit itself may use.
    Runs in a check's first process too (the sandbox sends its source)."""
    import resource
    for kind, value in [(resource.RLIMIT_AS, memory), (resource.RLIMIT_FSIZE, file_size),
                        (resource.RLIMIT_NPROC, processes), (resource.RLIMIT_CORE, 0)]:
        hard = resource.getrlimit(kind)[1]
        if value is not None:
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(kind, (value, value))

# a sandboxed check's first process: it caps itself, then runs the check
LIMITED = inspect.getsource(set_limits) + """
import json, os, sys
set_limits(*json.loads(sys.argv[1]))
uid = int(sys.argv[2])
if uid >= 0:   # root without a user namespace: the check becomes a user without rights
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
os.execv(sys.argv[3], sys.argv[3:])
"""

# ==== one check: its sandbox, its process, its outcome ====
def find_sandbox():
    """bubblewrap (Linux namespaces), if it is installed and can make them here: (its path, None), else
    (None, the line that says why and what that leaves open)."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return None, ("warning: no sandbox: bubblewrap is not installed (apt install bubblewrap); "
                      f"{NO_SANDBOX}")
    folder = tempfile.mkdtemp(prefix="kit-probe-")
    try:   # the sandbox a check gets, every option of it (an older bubblewrap may lack one)
        made = subprocess.run(sandboxed(bwrap, folder, [], [], {}, os.geteuid() == 0) + [
            shutil.which("true") or "/bin/true"], capture_output=True, text=True, errors="replace")
    finally:
        os.rmdir(folder)
    if made.returncode == 0:
        return bwrap, None
    said = f" ({made.stderr.strip().splitlines()[-1][:200]})" if made.stderr.strip() else ""
    return None, f"warning: no sandbox: bubblewrap cannot make namespaces here{said}; {NO_SANDBOX}"

# What a sandboxed check sees of the system, read-only (those that exist): programs and libraries, the
# dynamic linker's cache, the time zone and the font configuration. Nothing else of the machine is there.
SYSTEM = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache",
          "/etc/localtime", "/etc/fonts"]
SANDBOX_UID = 1999999   # the kit as root: each check runs as this uid + its worker's number (no one's)
TMPFS_SIZE = 64 << 20   # a check's private /tmp and /dev/shm, each

def namespaces(root):
    """bwrap's flags for a check's namespaces: all of them (no network), capabilities dropped. As root, no
    user namespace: LIMITED then makes the check a user without rights (in a user namespace of root's the
    check stays uid 0 outside it, which may write a sysctl with no capability)."""
    if not root:
        return ["--unshare-all", "--cap-drop", "ALL"]
    return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]

def under(path, folders):
    return any(path == f or path.startswith(f.rstrip(os.sep) + os.sep) for f in folders)

def sandboxed(bwrap, folder, hidden, readable=(), env=None, root=False):
    """bwrap's command line for a check in folder: an allow-list on an empty root, SYSTEM and the paths of
    `readable` (the Python's own) read-only, folder the one writable place, a private /tmp and /dev/shm,
    /proc of its own processes (its /proc/sys read-only); each folder of `hidden` (the teacher's checkout,
    the submissions, the other checks' folders) that a SYSTEM path holds emptied. An environment of its own
    (env, nothing of the kit's); no network, no host socket; every process the check starts ends with it."""
    cmd = [bwrap, *namespaces(root), "--die-with-parent", "--new-session", "--clearenv"]
    for name, value in sorted((env or {}).items()):
        cmd += ["--setenv", name, value]
    system = [p for p in SYSTEM if os.path.lexists(p)]
    for path in sorted({os.path.dirname(p) for p in system} - {"/"}):   # (/etc: 0755, as its files')
        cmd += ["--perms", "0755", "--dir", path]
    for path in system:
        cmd += ["--symlink", os.readlink(path), path] if os.path.islink(path) else ["--ro-bind", path, path]
    cmd += ["--dev", "/dev", "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys"]
    for tmp in ("/tmp", "/dev/shm"):
        cmd += ["--size", str(TMPFS_SIZE), "--perms", "01777", "--tmpfs", tmp]
    cmd += [a for h in hidden if under(h, system) for a in ("--tmpfs", h)]
    parents = {os.path.dirname(p) for p in [*readable, folder]}
    while any(os.path.dirname(p) not in parents for p in parents):   # each folder on their way, 0755:
        parents |= {os.path.dirname(p) for p in parents}              # bwrap's own would be 0700
    for path in sorted(p for p in parents if not under(p, system + ["/dev", "/proc"]) and p not in ("/",
                                                                                                  "/tmp")):
        cmd += ["--perms", "0755", "--dir", path]
    for path in readable:
        cmd += ["--ro-bind", path, path]
    return cmd + ["--bind", folder, folder, "--chdir", folder]

class Sandbox:
    """bubblewrap's sandbox of the checks: called with a check's folder and environment, the start of its
    command line. limits: set_limits' arguments for the check's first process; seed: the class's, from
    which checks draw their inputs; the kit as root runs each check as a uid of its worker (uid())."""

    def __init__(self, bwrap, hidden, readable, limits, seed=None):
        self.bwrap = bwrap
        self.hidden = hidden
        self.readable = readable
        self.limits = limits
        self.seed = seed
        self.root = os.geteuid() == 0
        self.workers = {}

    def uid(self):
        """The uid of this thread's checks (None: the kit's own): one per worker, so that one check's
        processes count against no other's limit."""
        if not self.root:
            return None
        with PROCESSES:
            return SANDBOX_UID + self.workers.setdefault(threading.get_ident(), len(self.workers))

    def __call__(self, folder, env=None):
        return sandboxed(self.bwrap, folder, self.hidden, self.readable, env, self.root)

def python_paths():
    """What this Python reads to run a check: its prefixes and executable, its sys.path (less the kit's
    folder and PYTHONPATH: a check has its own), and where the entries of its site-packages link to."""
    skip = {"", os.path.dirname(os.path.abspath(__file__)),
            *os.environ.get("PYTHONPATH", "").split(os.pathsep)}
    sites = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, sys.executable, *sites,
             *(p for p in sys.path if p not in skip)}
    for folder in sites:   # a package linked in from elsewhere: each link on the way to it
        with contextlib.suppress(OSError):
            for path in [e.path for e in os.scandir(folder) if e.is_symlink()]:
                for _ in range(40):   # (the kernel's own limit of links followed)
                    path = os.path.join(os.path.dirname(path), os.readlink(path))
                    paths.add(path)
                    if not os.path.islink(path):
                        break
    return paths

def readable_in_sandbox(hidden, teacher_files, everywhere=False):
    """The paths of python_paths() that lie in a hidden folder (a venv inside the clone), or with everywhere
    all of them less those SYSTEM holds, as the Python names them and as they resolve, outermost first: never
    a hidden folder nor one above it, nor one whose content holds a file of the teacher's checkout
    (teacher_files: real paths): the reference and its tests stay hidden."""
    def exposes(path):
        return any(h == path or h.startswith(path + os.sep) for h in hidden) or any(
            f == path or f.startswith(path + os.sep) for f in teacher_files)
    found = set()
    for p in python_paths():
        for path in {os.path.normpath(os.path.abspath(p)), os.path.realpath(p)}:
            wanted = not under(path, SYSTEM) if everywhere else under(path, hidden) and path not in hidden
            if os.path.exists(path) and wanted and not exposes(path) and not exposes(os.path.realpath(path)):
                found.add(path)
    outermost = []
    for path in sorted(found):   # (a path inside one already bound is there)
        if not any(path.startswith(o + os.sep) for o in outermost):
            outermost.append(path)
    return outermost

def pytest_in_child(folder, xml, log, args, env, user, limits=None):
    """An unsandboxed check, in a process forked from processes()' server: pytest in folder, output to log,
    as `user` (a pwd entry) if one is given, within limits (set_limits' arguments) if given."""
    os.setsid()  # its own process group: a time-out kills whatever the check started too
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    if limits:
        set_limits(*limits)
    if user:  # the log is open; from here on the check has the user's rights, not the kit's
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
    os.chdir(folder)
    kit_dir = os.path.dirname(os.path.abspath(__file__))  # on the path of the kit, not of the check
    sys.path[:] = [folder] + [p for p in sys.path if p not in ("", kit_dir)]
    os.environ.clear()   # (the server's own environment is the few names processes() let through)
    os.environ.update(env)
    sys.dont_write_bytecode = True
    with contextlib.suppress(ImportError):  # no process lock for progress bars: os._exit below would leak
        from tqdm.std import TqdmDefaultWriteLock  # its semaphore (a warning at the kit's exit)
        TqdmDefaultWriteLock.mp_lock = None
    import pytest
    code = pytest.main([*PYTEST, f"--junitxml={xml}", *args])
    sys.stdout.flush()
    os._exit(int(code))

def processes(user=None, limits=None, seed=None):
    """Without a sandbox each check's process is forked from one server process that imported torch, numpy
    and pytest once: seconds saved per check, and nothing of the kit's own process is shared. user: a pwd
    entry the checks run as (--as-user), or None; limits: set_limits' arguments for each check; seed: the
    class's (Sandbox)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(NEEDED) + ["matplotlib.figure"])  # what most checks import, if there
    saved = dict(os.environ)   # the server starts with none of the kit's environment but these: a check
    os.environ.clear()         # could read its own /proc/self/environ, which a fork keeps
    os.environ.update({k: saved[k] for k in ("PATH", "LANG", "TMPDIR", "OMP_NUM_THREADS") if k in saved})
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return types.SimpleNamespace(Process=context.Process, user=user, limits=limits, seed=seed)

def as_user(name, jobs):
    """The pwd entry of --as-user `name`."""
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        raise KitError(f"--as-user {name}: no such user: pass one that exists, e.g. nobody") from None
    if os.geteuid() != 0 or jobs != 1:
        raise KitError(f"--as-user {name}: needs root and --jobs 1 (its processes are killed after each "
                       "check): run the kit as root with --jobs 1")
    return user

def can_run_checks(user):
    """Whether `user` can run this Python with what every check imports."""
    try:
        return subprocess.run([sys.executable, "-c", "import " + ", ".join(NEEDED)], user=user.pw_uid,
                              group=user.pw_gid, extra_groups=[], cwd="/", capture_output=True).returncode == 0
    except PermissionError:   # a folder on the way to the Python itself
        return False

def kill_all_of(uid):
    """Ends every process of uid: what a check as that user left running (setsid, double fork)."""
    for _ in range(10):   # a process may fork while the others are killed: look again
        mine = [int(p) for p in os.listdir("/proc") if p.isdigit() and owner(f"/proc/{p}") == uid]
        if not mine:
            return
        for pid in mine:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)

SHARED_TEMPORARY = ("/tmp", "/var/tmp", "/dev/shm")   # where an --as-user check can leave files for the next

def sweep(uid, folders=SHARED_TEMPORARY):
    """Removes what uid left at the top of each folder (its files, folders and links, never what a link
    points to): a check as --as-user's user leaves nothing there for the next check."""
    for folder in folders:
        with contextlib.suppress(OSError), os.scandir(folder) as found:
            for entry in [e for e in found if e.stat(follow_symlinks=False).st_uid == uid]:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)

def owner(path):
    try:
        return os.stat(path).st_uid
    except OSError:   # a process that just ended
        return None

def run_check(sandbox, folder, log, args, n, timeout, threads, extra=None):
    """One check with a time limit: (status, reason, tests passed, tests selected). sandbox: a function of
    the folder that gives bwrap's command line, or multiprocessing's context (no sandbox). The output goes
    to log, which a sandboxed check cannot reach. extra: more of the check's environment."""
    xml = os.path.join(folder, ".kit", "report.xml")
    os.makedirs(os.path.dirname(xml), exist_ok=True)
    env = dict(PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS=str(threads))
    args = pytest_confined(folder) + list(args)
    if isinstance(sandbox, Sandbox):
        env = dict(check_environment(folder, threads, getattr(sandbox, "seed", None)), **(extra or {}))
        uid = sandbox.uid()
        if uid is not None:   # the folder becomes that user's, the one place it can write
            owned_by(folder, uid, uid)
        cmd = [sys.executable, "-I", "-S", "-c", LIMITED, json.dumps(sandbox.limits),   # caps itself, then
               str(-1 if uid is None else uid), sys.executable, "-m", "pytest", *PYTEST,   # becomes pytest
               f"--junitxml={xml}", *args]
        with open(log, "w") as out:
            p = subprocess.Popen(sandbox(folder, env) + cmd, cwd=folder, stdout=out, stderr=subprocess.STDOUT,
                                 env={"PATH": os.environ.get("PATH", os.defpath)}, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        with running(p.pid), contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout)
        code = p.poll()
    elif callable(sandbox):   # a command of its own (the kit's tests): the kit's environment
        env.update(extra or {})
        cmd = [sys.executable, "-m", "pytest", *PYTEST, f"--junitxml={xml}", *args]
        with open(log, "w") as out:
            p = subprocess.Popen(sandbox(folder) + cmd, cwd=folder, stdout=out, stderr=subprocess.STDOUT,
                                 env=dict(os.environ, PYTHONPATH=folder, TMPDIR=os.path.dirname(xml), **env),
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        with running(p.pid), contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout)
        code = p.poll()
    else:
        env = dict(check_environment(folder, threads, getattr(sandbox, "seed", None)), **(extra or {}))
        if sandbox.user:  # the folder becomes the user's, the one place it can write
            owned_by(folder, sandbox.user.pw_uid, sandbox.user.pw_gid)
        p = sandbox.Process(target=pytest_in_child, args=(folder, xml, log, args, env, sandbox.user,
                                                          getattr(sandbox, "limits", None)))
        code = run_forked(p, timeout)
        if sandbox.user:
            kill_all_of(sandbox.user.pw_uid)
            sweep(sandbox.user.pw_uid)
    if code is None:   # a time-out: the check and what it started, its group (in the sandbox: all of it)
        end(p.pid)
        if callable(sandbox):
            p.wait()
        else:
            multiprocessing.connection.wait([p.sentinel])
            forkserver_exit_code(p)
        return "FAILED", "timeout", 0, 0
    if signal_of(code):
        with open(log, "a") as f:
            f.write(f"\n(the check's process ended on signal {signal_of(code)})\n")
    if signal_of(code) == signal.SIGXFSZ:
        return "FAILED", TOO_MUCH_WRITTEN, 0, 0
    return outcome(code, xml, tail_of(log, MAX_READ), n)

def check_environment(folder, threads, seed=None):
    """A check's whole environment, nothing of the kit's (a grader's tokens, its agent's socket): its home
    and temporary files in its folder's .kit, which go with it; the class's seed (KIT_CLASS_SEED), from
    which a check draws the inputs that the student copy does not show."""
    home = os.path.join(folder, ".kit")
    env = dict(PATH=os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]),
               HOME=home, TMPDIR=home, MPLCONFIGDIR=home, PYTHONPATH=folder, LANG="C.UTF-8", USER="check",
               LOGNAME="check", PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS=str(threads))
    return env if seed is None else dict(env, KIT_CLASS_SEED=str(seed))

def owned_by(folder, uid, gid):
    for d, dirs, files in os.walk(folder):
        for path in [d] + [os.path.join(d, f) for f in files]:
            os.chown(path, uid, gid, follow_symlinks=False)

def pytest_confined(folder):
    """pytest's flags that keep its configuration to folder: the teacher's config file there (or an empty
    one the kit writes), rootdir and conftest.py files no higher than folder. Else pytest looks up the
    folders above (a /tmp/pytest.ini, a conftest.py planted beside the kit's temporary folder)."""
    config = next((os.path.join(folder, name) for name in ("pytest.ini", ".pytest.ini", "pyproject.toml",
                                                           "tox.ini", "setup.cfg")
                   if os.path.isfile(os.path.join(folder, name))), None)
    if config is None:
        config = os.path.join(folder, ".kit", "pytest.ini")
        with open(config, "w") as f:
            f.write("[pytest]\n")
    return ["-c", config, "--rootdir", folder, "--confcutdir", folder]

def run_forked(p, timeout):
    """Starts p, a process of processes()' server, and waits for it at most timeout seconds -> its exit code,
    None while it runs (score's interrupt can end it meanwhile)."""
    with PROCESSES:
        p.start()
    with running(p.pid):
        multiprocessing.connection.wait([p.sentinel], timeout)
    return forkserver_exit_code(p)

def forkserver_exit_code(p):
    """p's exit code, None while it runs. Under PROCESSES, as every start(): start() polls all the other
    checks' processes, and two threads polling one forkserver child at once leave one of them a false 255."""
    with PROCESSES:
        p.join(0)
        return p.exitcode

@contextlib.contextmanager
def running(pid):
    """Marks the check whose process group is pid as running, for score's interrupt to end it."""
    RUNNING.add(pid)
    try:
        if STOPPING.is_set():   # interrupted as it started
            end(pid)
        yield
    finally:
        RUNNING.discard(pid)

def end(pid):
    """SIGKILL to the check whose process is pid and to its process group (which it makes first thing)."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError):
            kill(pid, signal.SIGKILL)

def signal_of(returncode):
    """The signal that ended a check's process, or None: Python says -N, bwrap exits with 128 + N."""
    return -returncode if returncode < 0 else returncode - 128 if returncode > 128 else None

def outcome(returncode, xml, out, n):
    """(status, reason, tests passed, tests selected) of a pytest process that ended with returncode, its
    junit XML report at xml (absent if pytest never finished) and its output out, checking exercise n."""
    if signal_of(returncode):
        return "FAILED", "crashed", 0, 0
    if not os.path.lexists(xml):  # pytest never finished: os._exit, or a kill from inside
        return "FAILED", "exited", 0, 0
    report = read_capped(xml)   # (the check's code could write it: a link, a FIFO, gigabytes)
    try:
        if report is None or len(report) > MAX_READ:
            raise ET.ParseError
        cases = list(ET.fromstring(report).iter("testcase"))
    except ET.ParseError:  # not pytest's report: written over, or cut short
        return "FAILED", "bad report", 0, 0
    bad = [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
    skipped = [c for c in cases if c.find("skipped") is not None]
    passed = len(cases) - len(bad) - len(skipped)
    if returncode == 5 or not cases:
        return "FAILED", "no tests", 0, 0
    if bad or returncode:
        stubs = set(re.findall(r"NotImplementedError: exercise (\d+)", out))
        others = sorted(stubs - {str(n)}, key=int)
        memory = re.search(r"\bMemoryError\b|[Cc]an(no|')t allocate memory", out)
        reason = ("needs " + ",".join(others) if others else "stubbed" if stubs else "out of memory" if memory
                  else TOO_MUCH_WRITTEN if f"[Errno {errno.EFBIG}]" in out else
                  "error" if returncode > 1 or any(c.find("error") is not None for c in bad) else "failed")
        return "FAILED", reason, passed, len(cases)
    if skipped:
        return "FAILED", "skipped", passed, len(cases)
    return "passed", "", passed, len(cases)

# ==== one submission's exercise, then a class ====
def grade(sandbox, submission, n, workdir, timeout, threads, fail_fast):
    """Exercise n of one submission: (status, reason, tests passed, tests selected). fail_fast: each check
    stops at its first failure (pytest -x), and an exercise at its first failed check. Whatever the
    submission holds or does, the outcome is its own row: never an error of the whole class."""
    try:
        return grade_in(sandbox, submission, n, workdir, timeout, threads, fail_fast)
    except Exception as e:  # noqa: BLE001 (a kit bug or an odd file: this row says so, the class goes on)
        return "FAILED", f"kit error: {type(e).__name__}: {e}".splitlines()[0][:200], 0, 0
    finally:
        shutil.rmtree(os.path.join(workdir, "tree"), ignore_errors=True)  # a class: one tree at a time

def read_capped(path):
    """At most MAX_READ + 1 bytes from the start of the regular file at path (more than MAX_READ: it is too
    large), None if there is none: a link is not followed, a FIFO not waited for."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ELOOP):
            return None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):   # a folder, a FIFO, a device
        os.close(fd)
        return None
    with open(fd, "rb") as f:
        return f.read(MAX_READ + 1)

def tail_of(path, size):
    """The last `size` bytes of the kit's file at path (a check's log), as text."""
    with open(path, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - size))
        return f.read(size).decode(errors="replace")

def read_exercise_file(submission, path):
    """The text of a submission's file, None if missing (or not a regular file); a KitError if it or a
    folder on its way is a link, or if it holds more than MAX_READ bytes."""
    data = read_exercise_bytes(submission, path)
    return None if data is None else data.decode(errors="replace")

def read_exercise_bytes(submission, path):
    """read_exercise_file's bytes, undecoded."""
    mine = os.path.join(submission, path)
    if os.path.realpath(mine) != os.path.join(os.path.realpath(submission), path):
        raise KitError("symlink")
    data = read_capped(mine)   # (nor a folder, nor a FIFO that would never be written)
    if data is not None and len(data) > MAX_READ:
        raise KitError(TOO_LARGE)
    return data

def teachers_files(folder, n):
    """folder: the teacher's files and tests, copied for exercise n: of the withheld ones only those its
    checks run (tests/test_course_kit.py with what it imports), never the notes: a check's code can read
    its folder, and the tests of other exercises hold their oracles."""
    needed = {args[0] for args in EXERCISES[n][4]}
    if "tests/test_course_kit.py" in needed:
        needed |= {"tests/pitfalls.py", JUDGED}
    for path in files_of(ROOT):
        if path == MANIFEST or path in WITHHELD and path not in needed:
            continue
        os.makedirs(os.path.join(folder, os.path.dirname(path)), exist_ok=True)
        shutil.copyfile(os.path.join(ROOT, path), os.path.join(folder, path))

def grade_in(sandbox, submission, n, workdir, timeout, threads, fail_fast):
    folder = os.path.join(workdir, "tree")
    teachers_files(folder, n)
    for path in EXERCISES[n][3]:
        try:
            data = read_exercise_bytes(submission, path)
        except KitError as e:
            return "FAILED", f"{e}: {path}", 0, 0
        if data is None:
            return "FAILED", "missing", 0, 0
        why = splice_bounded(data, path, n, os.path.join(folder, path))
        if why:
            return "FAILED", why, 0, 0
    checks = [args for args in EXERCISES[n][4] if os.path.isfile(os.path.join(folder, args[0]))]
    if not checks:
        return "FAILED", "withheld", 0, 0   # a self-check in a student copy: the instructor's tests grade it
    status, reason, passed, total = "passed", "", 0, 0
    for k, args in enumerate(checks):   # (a self-check: those of the copy; the instructor's grade them all)
        log = os.path.join(workdir, f"check{k}.log")
        args = (["-x"] if fail_fast else []) + args
        if JUDGED in args and status != "passed":   # the judge confirms a pass, or denies it: no more
            continue
        if JUDGED in args:
            s, r, p, t = run_judged(sandbox, folder, workdir, log, args, n, timeout, threads)
        else:
            s, r, p, t = run_check(sandbox, folder, log, args, n, timeout, threads)
        passed, total = passed + p, total + t
        if s != "passed" and status == "passed":
            status, reason = s, r
            if fail_fast:
                break
    return status, reason, passed, total

RESULTS = 256   # the most files, and MAX_READ bytes each, of a worker's results that reach the judge
WORKER_ENDED = ("timeout", "crashed", "exited", "out of memory", "error", TOO_MUCH_WRITTEN)

def run_judged(sandbox, folder, workdir, log, args, n, timeout, threads):
    """A judged check (tests/test_course_judged.py): the worker runs args in the student's folder
    (KIT_JUDGE=work) and saves its results; those, read bounded, go to a new folder of the teacher's files
    alone, where the judge runs args (KIT_JUDGE=judge), which compares them with the reference's. The
    judge's outcome is the check's, unless the worker ended without results (a time-out, a crash)."""
    results = os.path.join(folder, ".kit", "judged")
    os.makedirs(results, exist_ok=True)
    worker = run_check(sandbox, folder, log.replace(".log", "-work.log"), args, n, timeout, threads,
                       dict(KIT_JUDGE="work", KIT_JUDGE_DIR=results))
    if worker[0] != "passed" and worker[1] in WORKER_ENDED:
        return worker
    judge = os.path.join(workdir, "judge")
    try:
        teachers_files(judge, n)
        inbox = os.path.join(judge, ".kit", "judged")
        os.makedirs(inbox)
        with contextlib.suppress(OSError), os.scandir(results) as found:
            names = [e.name for e in itertools.islice(found, 100 * RESULTS)
                     if re.fullmatch(r"[A-Za-z0-9_.-]+\.(npy|json)", e.name)]
        for name in sorted(names)[:RESULTS]:
            data = read_capped(os.path.join(results, name))   # (a regular file, never through a link)
            if data is not None and len(data) <= MAX_READ:
                with open(os.path.join(inbox, name), "wb") as f:
                    f.write(data)
        return run_check(sandbox, judge, log, args, n, timeout, threads,
                         dict(KIT_JUDGE="judge", KIT_JUDGE_DIR=inbox))
    finally:
        shutil.rmtree(judge, ignore_errors=True)

def not_a_copy(submission):
    """Why a submission folder cannot be graded (every row of it FAILED so), or None."""
    if os.path.islink(submission.rstrip(os.sep) or os.sep):
        return "symlink"
    if not os.path.isdir(submission):
        return "no such folder"
    if not any(os.path.isfile(os.path.join(submission, f)) for e in EXERCISES.values() for f in e[3]):
        return "not a copy"
    return None

def graded_folder(submission):
    """The folder graded for a submission: itself, or else the one folder it holds (dot-files and macOS's
    __MACOSX aside) where that one is a copy: a Gradescope upload that zipped the copy's folder."""
    if not_a_copy(submission) != "not a copy":
        return submission
    try:
        with os.scandir(submission) as found:
            entries = [e for e in found if not e.name.startswith(".") and e.name != "__MACOSX"][:2]
    except OSError:
        return submission
    if len(entries) == 1 and entries[0].is_dir(follow_symlinks=False) and not not_a_copy(entries[0].path):
        return entries[0].path
    return submission

def answers(submission):
    """{exercise: "written" | "empty"} from the submission's ANSWERS.md, or {} without one; a file that
    cannot be read as one (too large, a link, unreadable) says so for every exercise. Only printable
    characters are an answer: not the NULs that pad a file."""
    written = [n for n, (_, _, w, *_) in EXERCISES.items() if w]
    try:
        text = read_exercise_file(submission, "ANSWERS.md")
    except KitError as e:
        return dict.fromkeys(written, f"ANSWERS.md: {e}")
    except OSError as e:
        return dict.fromkeys(written, f"ANSWERS.md: unreadable ({e.strerror})")
    if text is None:
        return {}
    parts = re.split(r"^## +(\d+)\.", text, flags=re.M)
    bodies = {int(n): body.partition("\n")[2].replace(ANSWER_PLACEHOLDER, "")  # (below the heading)
              for n, body in zip(parts[1::2], parts[2::2])}
    return {n: "written" if any(c.isprintable() and not c.isspace() for c in bodies.get(n, "")) else "empty"
            for n in written}

def shown(name):
    """A folder name as text for the report and the table, whatever bytes it holds."""
    return name.encode(errors="surrogateescape").decode(errors="backslashreplace")

def score(submissions, numbers, timeout=120, jobs=1, fail_fast=False, sandbox=True, user=None,
          memory=CHECK_MEMORY, seed=0):
    """Grades each submission's exercises `numbers`, jobs checks at a time, each in the sandbox if there is
    one and `sandbox`, else as `user` (a pwd entry) if given, each check within `memory` bytes of address
    space and drawing its hidden inputs from the class's `seed`; prints the table and returns the report's
    rows (dicts of REPORT_FIELDS)."""
    threads = 1 if jobs > 1 else max(1, min(2, os.cpu_count() or 1))
    bwrap, warning = find_sandbox() if sandbox else (None, "warning: --no-sandbox: " + NO_SANDBOX)
    if user and not bwrap and not can_run_checks(user):
        raise KitError(f"--as-user {user.pw_name} cannot run {sys.executable} with {', '.join(NEEDED)}: make "
                       "its folders readable to others")
    if warning and user:
        leaves = (f"each check runs as {user.pw_name}: it can read what others may read (your checkout "
                  "and the submissions, unless only you may) and reach the network; what it starts is "
                  "killed, and what it leaves in /tmp, /var/tmp and /dev/shm removed, after it")
        warning = warning.replace(NO_SANDBOX, leaves)
    if warning:
        print(warning, file=sys.stderr)
    as_other = user or bwrap and os.geteuid() == 0   # (processes are counted per user; root's are not)
    limits = (memory, CHECK_FILE_SIZE, CHECK_PROCESSES if as_other else None)
    with tempfile.TemporaryDirectory(prefix="kit-score-", ignore_cleanup_errors=True) as tmp, \
            ThreadPoolExecutor(jobs) as pool:
        hidden = sorted({os.path.realpath(p) for p in [ROOT, tmp, *submissions] if os.path.isdir(p)})
        if bwrap:
            readable = readable_in_sandbox(hidden, {os.path.realpath(os.path.join(ROOT, f)) for f in
                                                    files_of(ROOT)}, everywhere=True)
        sandbox = Sandbox(bwrap, hidden, readable, limits, seed) if bwrap else processes(user, limits, seed)
        if user and not bwrap:
            os.chmod(tmp, 0o711)   # the user passes through to its check's folder, and lists nothing here
        futures = {}
        folders = [graded_folder(s) for s in submissions]
        for i, s in enumerate(submissions):
            for n in numbers:
                workdir = os.path.join(tmp, f"{i}-{n}")
                os.mkdir(workdir, 0o711)   # (--as-user: its check passes through to its folder; logs are 0600)
                futures[s, n] = pool.submit(grade, sandbox, folders[i], n, workdir, timeout, threads,
                                            fail_fast) if not not_a_copy(folders[i]) else None
        try:
            return [row for i, s in enumerate(submissions) for row in submission_rows(
                s, numbers, futures, os.path.join(tmp, f"{i}-"), len(submissions) == 1, folders[i])]
        except BaseException:   # Ctrl-C or SIGTERM: no check is waited for, and the folders go
            STOPPING.set()
            pool.shutdown(wait=False, cancel_futures=True)
            for pid in list(RUNNING):
                end(pid)
            if user:
                kill_all_of(user.pw_uid)
            raise

def submission_rows(s, numbers, futures, workdirs, alone, folder=None):
    """Prints one submission's table (waiting for its checks) and returns its rows. alone: a self-check,
    whose failed rows say how to rerun the check; folder: the copy graded (graded_folder), if not s."""
    folder = folder or s
    written = answers(folder) if not not_a_copy(folder) else {}
    answered = sum(v == "written" for v in written.values())
    unread = next((v for v in written.values() if v not in ("written", "empty")), None)  # its reason
    count = f"ANSWERS.md: {f'{answered} of {len(written)} answered' if written else 'none'}"
    print(f"\n{shown(s)}   {unread or count}")
    rows = []
    for n in numbers:
        title, points, w, _, checks = EXERCISES[n]
        status, reason, passed, total = futures[s, n].result() if futures[s, n] else \
            ("FAILED", not_a_copy(folder), 0, 0)
        got = points if status == "passed" else 0
        hint = f"   {' && '.join(command(a) for a in checks)}" if reason and alone else ""
        if reason == "withheld":
            hint = "   (its tests are the instructor's: graded on submission)"
        elif alone and not reason and not all(os.path.isfile(os.path.join(ROOT, a[0])) for a in checks):
            hint = "   (and a check on inputs drawn at grading, the instructor's)"
        print(f"exercise {n:2d}  {title:<34} {got}/{points} pts {passed:3d}/{total:<3d} tests  "
              f"{status}{f' ({reason})' if reason else ''}{hint}")
        logs = sorted(glob.glob(os.path.join(workdirs + str(n), "check*.log")))
        output = "".join(tail_of(log, OUTPUT) for log in logs)
        rows.append(dict(student=shown(s), exercise=n, points=got, of=points, status=status, reason=reason,
                         tests=f"{passed}/{total}", answer=written.get(n, "none") if w else "",
                         output=output[-OUTPUT:]))
    print(f"total: {sum(r['points'] for r in rows)}/{sum(r['of'] for r in rows)} points, "
          f"{sum(r['status'] == 'passed' for r in rows)}/{len(rows)} exercises passed")
    return rows

# ==== the report, and Gradescope's autograder ====
VISIBILITY = ["visible", "after_due_date", "after_published", "hidden"]   # Gradescope's words

def gradescope_results(rows, visibility="visible"):
    """rows as Gradescope's results.json: a test per exercise, its points, and its checks' output, shown to
    the student as `visibility` says."""
    tests = []
    for r in rows:
        outcome_line = r["status"] + (f" ({r['reason']})" if r["reason"] else "") + f", {r['tests']} tests"
        tests.append(dict(name=f"exercise {r['exercise']}: {EXERCISES[r['exercise']][0]}", score=r["points"],
                          max_score=r["of"], status="passed" if r["status"] == "passed" else "failed",
                          output=f"{outcome_line}\n\n{r['output']}"))
    return {"score": sum(r["points"] for r in rows), "visibility": visibility, "tests": tests}

def write_report(rows, path, gradescope=None):
    """rows as CSV, as JSON when path ends in .json, or as Gradescope's results.json (gradescope: its
    visibility); written beside, then renamed into place."""
    if gradescope or path.endswith(".json"):
        report = gradescope_results(rows, gradescope) if gradescope else {"kit": "docs/kit.py score",
                                                                           "rows": rows}
        text = json.dumps(report, indent=1) + "\n"
    else:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, REPORT_FIELDS, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows([{k: inert(v) for k, v in r.items()} for r in rows])
        text = buf.getvalue()
    fd, tmp = tempfile.mkstemp(prefix=".kit-report-", dir=os.path.dirname(os.path.abspath(path)))
    try:  # a new file of its own (never one planted there), then renamed over path (never through a link)
        with open(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise

def inert(cell):
    """A CSV cell a spreadsheet shows as text: a string starting with =, +, -, @, a tab or a carriage return
    (a formula, or one hidden behind a blank) gets a leading quote, and a carriage return inside it (which
    the csv module leaves unquoted beside "\\n" line ends: a row break) is written \\r; numbers stay
    numbers."""
    if not isinstance(cell, str):
        return cell
    return ("'" if cell.startswith(("=", "+", "-", "@", "\t", "\r")) else "") + cell.replace("\r", "\\r")

def check_report_path(path):
    """A report may replace only a report the kit wrote: anything else at path is the user's. Checked
    before the grading, which a report that cannot be written would lose."""
    if os.path.islink(path):
        raise KitError(f"--report {path} is a link: pass the report's own path")
    folder = os.path.dirname(os.path.abspath(path))
    if not path or path.endswith(os.sep) or os.path.isdir(path) or not os.path.isdir(folder):
        raise KitError(f"--report {path!r}: not a file in an existing folder: pass e.g. --report grades.csv")
    if os.path.exists(path) and not os.path.isfile(path):
        raise KitError(f"--report {path}: not a regular file (a FIFO, a device): pass a new path")
    try:
        fd, probe = tempfile.mkstemp(prefix=".kit-report-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise KitError(f"--report {path}: cannot write in {folder} ({e.strerror}): pass a path you can write")
    if os.path.exists(path):
        with open(path, errors="replace") as f:
            head = f.read(64)
        if not head.startswith((",".join(REPORT_FIELDS), '{\n "kit": "docs/kit.py score"', '{\n "score": ')):
            raise KitError(f"--report {path}: the file exists and is not a kit report: pass a new path")

def class_seed(seed):
    """--class-seed, or a new one: each class (each autograder) draws its own hidden inputs."""
    if seed is None:
        return int.from_bytes(os.urandom(4), "big") >> 1
    if not 0 <= seed < 1 << 63:
        raise KitError(f"--class-seed {seed}: pass a number from 0 to 2**63 - 1, or none (a new one)")
    return seed

def exercise_numbers(text):
    numbers = [int(n) for n in text.split(",") if n.strip().isdigit() and int(n) in EXERCISES]
    if not numbers or len(numbers) != len(text.split(",")) or len(set(numbers)) != len(numbers):
        raise KitError(f"--exercises {text}: use distinct numbers from 1 to {len(EXERCISES)}, e.g. 1,3")
    return numbers

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image: Python 3.11, bubblewrap (the
# checks' sandbox, where the container allows it) and the repo's pinned packages.
set -euo pipefail
apt-get update
apt-get install -y software-properties-common bubblewrap
add-apt-repository -y ppa:deadsnakes/ppa && apt-get update && apt-get install -y python3.11 python3.11-venv
python3.11 -m venv /autograder/venv
/autograder/venv/bin/pip install torch==2.13.0
/autograder/venv/bin/pip install -r /autograder/source/repo/requirements.txt
"""
RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission, in a container of its own: the student's copy (uploaded as a
# zip of the folder) in /autograder/submission, the grades to /autograder/results/results.json.
root=${{AUTOGRADER:-/autograder}}
mkdir -p "$root/results"
# Where its container denies bubblewrap's namespaces, each check runs as nobody, who cannot read source/
chmod -R go-rwx "$root/source"
as_user=$([ "$(id -u)" = 0 ] && echo "--as-user nobody")
exec "${{KIT_PYTHON:-$root/venv/bin/python}}" "$root/source/repo/docs/kit.py" score "$root/submission" \\
    --exercises {exercises} --class-seed {seed} --jobs 1 --report "$root/results/results.json" \\
    --gradescope {visibility} $as_user
"""

def autograder(path, numbers, visibility, seed):
    """Writes the zip of a Gradescope autograder: setup.sh and run_autograder at its root (which grades with
    the class's seed), this checkout's files (the withheld tests included) and their list under repo/.
    Never over a file already at path (nor one another run puts there meanwhile): it is written beside,
    then linked into place."""
    if os.path.isfile(os.path.join(ROOT, MANIFEST)):
        raise KitError(f"{ROOT} is a student copy ({MANIFEST}): its exercises are stubbed and it lacks the "
                       "instructor's tests: run gradescope from the teacher's checkout")
    if not path.endswith(".zip"):
        raise KitError(f"{path}: pass a new path ending in .zip")
    if os.path.lexists(path):
        raise KitError(f"{path} exists: pass a new path ending in .zip")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise KitError(f"{path}: the folder {folder} does not exist: make it, or pass a path in an existing "
                       "one")
    files = [p for p in files_of(ROOT) if p != MANIFEST]
    missing = sorted(WITHHELD - set(files))
    if missing:
        raise KitError(f"{ROOT} lacks {', '.join(missing)}: run gradescope from the teacher's checkout")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".kit-", suffix=".zip", dir=folder)
    except OSError as e:
        raise KitError(f"{path}: cannot write in {folder} ({e.strerror}): pass a path you can write") \
            from None
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for name, text in [("setup.sh", SETUP_SH), ("run_autograder", RUN_AUTOGRADER.format(
                    exercises=",".join(map(str, numbers)), visibility=visibility, seed=seed))]:
                info = zipfile.ZipInfo(name)
                info.external_attr = 0o755 << 16   # executable
                z.writestr(info, text)
            for f in files:
                z.write(os.path.join(ROOT, f), f"repo/{f}")
            z.writestr(f"repo/{MANIFEST}", "".join(f + "\n" for f in files + [MANIFEST]))
        place_new(tmp, path)
    finally:
        os.unlink(tmp)

def place_new(tmp, path):
    """Puts the file tmp at path, which must not exist: a hard link, which fails on anything there (a rename
    would replace it); where the filesystem has no hard links, a copy into a file created exclusively."""
    try:
        os.link(tmp, path)
        return
    except FileExistsError:
        raise KitError(f"{path} exists (another run wrote it meanwhile?): pass a new path ending in .zip") \
            from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP):
            raise
    try:
        out = open(path, "xb")
    except FileExistsError:
        raise KitError(f"{path} exists (another run wrote it meanwhile?): pass a new path ending in .zip") \
            from None
    try:
        with out, open(tmp, "rb") as f:
            shutil.copyfileobj(f, out)
    except BaseException:
        os.unlink(path)
        raise

# ==== the command line ====
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.error = lambda message: ap.exit(2, f"error: {message}\n")
    sub = ap.add_subparsers(dest="what", required=True)
    everything = ",".join(map(str, EXERCISES))
    s = sub.add_parser("student", help="write a student copy to OUT (absent or empty, outside the repo)")
    s.add_argument("out", metavar="OUT")
    s.add_argument("--exercises", default=everything, help="which to stub (default: all)")
    g = sub.add_parser("score", help="grade submissions (student copies) with this checkout's tests")
    g.add_argument("submissions", metavar="SUBMISSION", nargs="*", default=[ROOT],
                   help="folders to grade (default: this checkout, a self-check)")
    g.add_argument("--exercises", default=everything, help="the exercises assigned (default: all)")
    g.add_argument("--timeout", type=float, default=120, help="seconds a check may take (default: 120)")
    g.add_argument("--memory", type=float, default=CHECK_MEMORY / (1 << 30), metavar="GIB",
                   help=f"GiB of address space a check may use (default: {CHECK_MEMORY >> 30})")
    g.add_argument("--class-seed", type=int, metavar="N", help="the seed from which checks draw the inputs "
                   "the student copy does not show (default: a new one, printed)")
    g.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="checks at once (default: cores)")
    g.add_argument("--fail-fast", action="store_true",
                   help="stop each exercise at its first failing test (faster; fewer tests counted)")
    g.add_argument("--no-sandbox", action="store_true", help="run the checks unsandboxed, faster: for code "
                   "you trust (your checkout, the reference's variants); default: in bubblewrap if installed")
    g.add_argument("--report", default="grades.csv",
                   help="the machine-readable report: CSV, or JSON for a .json name (default: grades.csv)")
    g.add_argument("--as-user", metavar="USER", help="without bubblewrap, run each check as USER (root "
                   "only, --jobs 1; a user that runs nothing else: its processes are killed after each check), "
                   "e.g. nobody in a container that denies namespaces")
    g.add_argument("--gradescope", metavar="VISIBILITY", choices=VISIBILITY, help="write --report as "
                   f"Gradescope's results.json, its tests shown to students: {', '.join(VISIBILITY)}")
    a = sub.add_parser("gradescope", help="write ZIP, a Gradescope autograder: setup.sh, run_autograder and "
                       "this checkout, grading as score does")
    a.add_argument("zip", metavar="ZIP")
    a.add_argument("--exercises", default=everything, help="the exercises assigned (default: all)")
    a.add_argument("--class-seed", type=int, metavar="N", help="the seed from which its checks draw the "
                   "inputs the student copy does not show, one for every submission (default: a new one)")
    a.add_argument("--visibility", choices=VISIBILITY, default="visible", help="when students see each "
                   "exercise's points and its checks' output (which can carry any file of the check's folder: "
                   "your tests, the reference for the other exercises); default: visible")
    for parser in (s, g, a):   # a bad value of a subcommand's flag: one line too
        parser.error = ap.error
    args = ap.parse_args(argv)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):   # (a closed terminal: SIGHUP)
        signal.signal(signum, interrupted)
    try:
        numbers = exercise_numbers(args.exercises)
        seed = None if args.what == "student" else class_seed(args.class_seed)
        if args.what == "student":
            student(args.out, numbers)
            print(f"wrote {args.out}: exercises {','.join(map(str, numbers))} stubbed, ANSWERS.md to fill; "
                  f"check: python docs/kit.py score {args.out}")
            return 0
        if args.what == "gradescope":
            autograder(args.zip, numbers, args.visibility, seed)
            print(f"wrote {args.zip}: upload it as the assignment's autograder (students upload their copy)")
            return 0
        if not 0 < args.timeout < math.inf or args.jobs < 1:
            raise KitError(f"--timeout {args.timeout:g} --jobs {args.jobs}: pass a finite time > 0 and >= 1 job")
        if not 0.25 <= args.memory < 1 << 20:
            raise KitError(f"--memory {args.memory:g}: pass the GiB a check may use, at least 0.25, e.g. 4")
        same = [p for i, p in enumerate(args.submissions) if os.path.realpath(p) in
                {os.path.realpath(q) for q in args.submissions[:i]}]
        if same:
            raise KitError(f"{shown(same[0])} is given twice: pass each submission once")
        missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
        if missing:
            raise KitError(f"{sys.executable} lacks {', '.join(missing)}: install the README's requirements "
                           "for it, or run the kit with the Python that has them")
        check_report_path(args.report)
        copy = os.path.isfile(os.path.join(ROOT, MANIFEST))
        missing = [] if copy else sorted(WITHHELD - set(files_of(ROOT)))
        if missing:   # (a student copy lacks them: its self-check says so; a teacher's checkout must not)
            raise KitError(f"{ROOT} lacks {', '.join(missing)}, which grading runs: add it to git (the kit "
                           "grades with the files git tracks)")
        user = as_user(args.as_user, args.jobs) if args.as_user else None
        start = time.time()
        rows = score(args.submissions, numbers, args.timeout, args.jobs, args.fail_fast, not args.no_sandbox,
                     user, int(args.memory * (1 << 30)), seed)
        try:
            write_report(rows, args.report, args.gradescope)
        except OSError as e:   # (a full disk): the grading is not lost
            fd, kept = tempfile.mkstemp(prefix="kit-report-", suffix=os.path.splitext(args.report)[1])
            os.close(fd)
            write_report(rows, kept, args.gradescope)
            raise KitError(f"--report {args.report}: {e.strerror or e}; the report is in {kept}") from None
        print(f"\nwrote {args.report} ({len(rows)} rows) in {time.time() - start:.0f} s; hidden inputs drawn "
              f"with --class-seed {seed}")
    except (KitError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: nothing written (each report, copy and zip is written whole or not at all)",
              file=sys.stderr)
        return 130
    return 0

def interrupted(signum, frame):
    """Ctrl-C, SIGTERM or SIGHUP, the first one: the work stops and cleans up, undisturbed by another."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    raise KeyboardInterrupt

if __name__ == "__main__":
    sys.exit(main())
