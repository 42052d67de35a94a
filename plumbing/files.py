"""Files, read and written safely: DataError (the one-line bad input), checks that a path is a file we may
read, JSON read with one-line errors, and atomic writes that leave nothing half-written."""
import glob
import json
import os
import pathlib
import shutil
import signal
import stat

import numpy as np

class DataError(ValueError):
    """Bad input (data, tokenizer, task or metric arguments); the message is one line naming the fix."""

def require(ok, message):   # bad input: a one-line DataError naming the problem and the fix
    if not ok:
        raise DataError(message)

def is_int(x, minimum=1):
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= minimum

def int_list(text, minimum=1):
    """"8,16" -> [8, 16]: distinct integers in [minimum, 2**63); None where text is not such a list."""
    values = [int(v) if v.isdecimal() else -1 for v in text.split(",")]
    if not all(minimum <= v < 2**63 for v in values) or len(set(values)) < len(values):
        return None
    return values

KINDS = {stat.S_IFREG: "a regular file", stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO",
         stat.S_IFCHR: "a device", stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket"}   # by os.stat's mode

def _kind(mode):   # -> what a file of this st_mode is, to name it in a message
    return KINDS.get(stat.S_IFMT(mode), "not a file")

def require_file(path, fix):   # -> os.stat of a regular file we may read, else DataError (a FIFO would hang)
    try:
        st = os.stat(path)
    except OSError as e:
        raise DataError(f"{path}: {e.strerror}: {fix}") from None
    require(stat.S_ISREG(st.st_mode), f"{path} is {_kind(st.st_mode)}, not a regular file: {fix}")
    require(os.access(path, os.R_OK), f"{path}: permission denied: {fix}")
    return st

def require_not_special(path, fix):   # a path that exists is a regular file or a folder: opened, a FIFO hangs
    try:
        mode = os.stat(path).st_mode
    except OSError:   # missing: its reader says so
        return
    require(stat.S_ISREG(mode) or stat.S_ISDIR(mode), f"{path} is {_kind(mode)}, not a regular file: {fix}")

def read_json(file, fix):   # -> the JSON object file holds, else a one-line DataError ending in fix
    require_not_special(file, fix)
    try:
        obj = json.loads(pathlib.Path(file).read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{file} is not readable JSON ({type(e).__name__}): {fix}") from None
    require(isinstance(obj, dict), f"{file} is not a JSON object: {fix}")
    return obj

def write_atomically(path, write):
    """write(tmp) under a name unique to this process, then rename: a kill leaves the old file or the new.
    write a dict {name: write} of files in the folder path: all renamed at once, Ctrl-C and SIGTERM held
    meanwhile: the folder keeps its previous files or gets all the new ones, never a mix."""
    several = isinstance(write, dict)
    paths = {os.path.join(path, name): w for name, w in write.items()} if several else {path: write}
    tmps = {p: tmp_name(p) for p in paths}
    for p in paths:
        _remove_stale_tmps(p)
    try:
        for p, w in paths.items():
            w(tmps[p])
        held = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM) if several}
        try:
            for p, tmp in tmps.items():
                os.replace(tmp, p)
        finally:
            for s, handler in held.items():
                signal.signal(s, handler)
    except BaseException as e:  # also Ctrl-C, SIGTERM: no temporary file is left
        for tmp in tmps.values():
            shutil.rmtree(tmp, ignore_errors=True)   # a directory's (a corpus's)
            if os.path.lexists(tmp):   # (not when its folder is missing or a file)
                os.unlink(tmp)
        if not isinstance(e, (OSError, RuntimeError)):  # torch.save reports a full disk as a RuntimeError
            raise
        folder = os.path.dirname(next(iter(paths))) or "."
        why = f"{str(e).splitlines()[0]}; disk full?" if isinstance(e, RuntimeError) else e.strerror or e
        if isinstance(e, RuntimeError) and not os.path.isdir(folder):   # removed meanwhile: not a full disk
            why = f"the folder {folder} no longer exists"
        kept = "the previous one is intact" if os.path.exists(next(iter(paths))) else "nothing was written"
        raise OSError(f"cannot write {', '.join(paths)} ({why}): {kept}") from None

def tmp_name(path):   # -> PATH.<pid>.tmp, this process's temporary name for path (_remove_stale_tmps)
    return f"{path}.{os.getpid()}.tmp"

def _remove_stale_tmps(path):
    """The temporary files of path that a killed process (kill -9: no clean-up) left, PATH.<pid>.tmp whose
    process is gone; a live writer's are its own."""
    for tmp in glob.glob(f"{glob.escape(path)}.*.tmp"):
        pid = tmp[len(path) + 1:-4]
        if not pid.isdecimal():   # (this process's own: alive, so kept below)
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            if os.path.isdir(tmp):   # a corpus cache's
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                os.unlink(tmp)
        except OSError:   # alive, another user's
            pass
