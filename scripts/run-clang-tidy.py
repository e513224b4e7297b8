#!/usr/bin/env python3
"""clang-tidy over the project's translation units, with its results reused.

    scripts/run-clang-tidy.py [FILE.cc ...]     (default: every tracked .cc but fuzz/'s)

Each file is checked with the compile commands of its build tree: build/ (KDA_BUILD_DIR) for the
library, tests, tools and benchmarks; the Python build tree (build-py/*/, KDA_PY_BUILD_DIR, written
by scripts/python-env.sh) for python/. A file with several commands (the per-ISA kernel sources) is
checked under each, as clang-tidy itself does.

A clean result is remembered in KDA_TIDY_CACHE (default ~/.cache/kda/clang-tidy, outside the clone)
under a key that covers everything clang-tidy's verdict depends on: the clang-tidy (and clang++) version, the
.clang-tidy file, each compile command's flags, and the translation unit's preprocessed input with
its comments (clang++ -E -C, so that a NOLINT comment or a header's change counts). The clone's own
path is taken out of the key, so another clone of the same code hits. A file is checked again when
any of that changed; a failing file is never remembered. KDA_TIDY_CACHE=off checks every file.
"""

import concurrent.futures
import glob
import hashlib
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_db(build_dir):
    path = os.path.join(build_dir, "compile_commands.json")
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)
    db = {}
    for e in entries:
        src = os.path.normpath(os.path.join(e["directory"], e["file"]))
        db.setdefault(src, []).append(e)
    return db


def entry_args(entry):
    return entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])


def preprocess_args(args):
    """The compile command turned into clang++ -E -C to standard output (no object file)."""
    out = ["clang++"]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a == "-c" or a.startswith("-o"):
            continue
        out.append(a)
    return out + ["-E", "-C", "-w", "-Qunused-arguments", "-Wno-unknown-warning-option", "-o", "-"]


def cache_key(src, entries, common):
    h = hashlib.sha256(common)
    h.update(os.path.relpath(src, ROOT).encode())
    root = ROOT.encode()
    for e in entries:
        args = entry_args(e)
        h.update(b"\0args\0" + "\0".join(args).replace(ROOT, "@ROOT@").encode())
        pre = subprocess.run(preprocess_args(args), cwd=e["directory"], capture_output=True, check=False)
        if pre.returncode != 0:
            return None  # not reproducible here: check it, remember nothing
        h.update(b"\0pre\0" + pre.stdout.replace(root, b"@ROOT@"))
    return h.hexdigest()


def check(src, build_dir, entries, cache_dir, common):
    key = cache_key(src, entries, common) if cache_dir else None
    stamp = os.path.join(cache_dir, key[:2], key) if key else None
    if stamp and os.path.exists(stamp):
        return src, True, "", True
    r = subprocess.run(["clang-tidy", "-p", build_dir, "--quiet", src], capture_output=True, text=True,
                       check=False)
    ok = r.returncode == 0
    if ok and stamp:
        os.makedirs(os.path.dirname(stamp), exist_ok=True)
        with open(stamp, "w", encoding="utf-8"):
            pass
    return src, ok, "" if ok else (r.stdout or r.stderr), False


def main(argv):
    os.chdir(ROOT)
    # By default every tracked .cc but the fuzz harnesses, which only build-fuzz/ (clang) compiles.
    files = argv or [f for f in subprocess.run(["git", "ls-files", "*.cc"], capture_output=True, text=True,
                                               check=True).stdout.split() if not f.startswith("fuzz/")]
    lib_dir = os.environ.get("KDA_BUILD_DIR", "build")
    jobs = []
    dbs = {}
    for f in files:
        if f.startswith("python/"):
            pattern = os.environ.get("KDA_PY_BUILD_DIR", "build-py/*")
            found = sorted(glob.glob(os.path.join(pattern, "compile_commands.json")))
            if not found:
                print("no build-py/*/compile_commands.json: run 'make python-env' first", file=sys.stderr)
                return 1
            build_dir = os.path.dirname(found[0])
        else:
            build_dir = lib_dir
        if build_dir not in dbs:
            if not os.path.isfile(os.path.join(build_dir, "compile_commands.json")):
                print(f"no {build_dir}/compile_commands.json: run 'make build' first", file=sys.stderr)
                return 1
            dbs[build_dir] = load_db(build_dir)
        src = os.path.abspath(f)
        entries = dbs[build_dir].get(src)
        if not entries:
            print(f"{f}: not in {build_dir}/compile_commands.json", file=sys.stderr)
            return 1
        jobs.append((src, build_dir, entries))

    cache_dir = os.environ.get("KDA_TIDY_CACHE",
                               os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                                            "kda", "clang-tidy"))
    if cache_dir == "off":
        cache_dir = ""
    # Both tools' versions: clang-tidy gives the verdict, clang++ the preprocessed input it is keyed by.
    version = b"".join(subprocess.run([tool, "--version"], capture_output=True, check=True).stdout
                       for tool in ("clang-tidy", "clang++"))
    with open(".clang-tidy", "rb") as f:
        common = version + b"\0" + f.read()

    failed = 0
    reused = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = [pool.submit(check, src, b, e, cache_dir, common) for src, b, e in jobs]
        for fut in concurrent.futures.as_completed(futures):
            src, ok, out, hit = fut.result()
            reused += hit
            if not ok:
                failed += 1
                sys.stdout.write(out or f"{os.path.relpath(src, ROOT)}: clang-tidy failed\n")
    print(f"clang-tidy: {len(jobs)} files, {reused} unchanged since a clean check, {failed} failed",
          file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
