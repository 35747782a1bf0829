"""The clang static analyzer over the daemon's and the CLI's sources
(every .c of libdiverge.a, diverged and diverge, as the Makefile lists
them), with its default checkers: the ones scan-build runs (core, unix,
deadcode, security, nullability). Each file is one check: it passes when
the analyzer reports nothing for it. A finding is fixed in the code, or
the code is made plain enough for the analyzer to follow; there is no
list of findings to ignore.

The preprocessor flags are the build's own (config.h, -include banned.h,
the libraries' include paths), handed over by make check in
ANALYZE_CPPFLAGS; the compiler flags are not, since they are gcc's.
Skipped where clang is not installed (scripts/install-deps installs it).
"""

import concurrent.futures
import os
import re
import shlex
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

from divtest import TOP_BUILDDIR, TOP_SRCDIR, run_tests  # noqa: E402

FINDING = re.compile(r"^(\S+?):(\d+):(\d+): warning: (.*)$", re.M)


def analyze(clang, flags, src):
    """(source, [finding lines], stderr) of one file (src relative to the
    source tree, or absolute)."""
    # niced: beside make -j check it takes the CPU the other tests leave,
    # not the time their deadlines count on
    p = subprocess.run(
        ["nice", "-n", "19", clang, "--analyze", "-Xclang",
         "-analyzer-output=text", "-o", os.devnull] + flags +
        [os.path.join(TOP_SRCDIR, src)],
        cwd=TOP_BUILDDIR, capture_output=True, text=True, timeout=1800)
    found = [m.group(0) for m in FINDING.finditer(p.stderr)]
    if p.returncode != 0 and not found:
        found = ["clang exited %d" % p.returncode]
    return src, found, p.stderr


def main(t):
    clang = os.environ.get("CLANG") or shutil.which("clang")
    flags = shlex.split(os.environ.get("ANALYZE_CPPFLAGS", ""))
    sources = [s for s in os.environ.get("ANALYZE_SOURCES", "").split()
               if s.endswith(".c")]
    if not clang:
        t.skip_all("clang is not installed (scripts/install-deps)")
    if not sources or not flags:
        t.skip_all("run by make check (ANALYZE_SOURCES, ANALYZE_CPPFLAGS)")
    # the analyzer sees a finding in this file, or the check is void
    probe = os.path.join(TOP_BUILDDIR, "tests", "static",
                         "analyzer-probe.c")
    os.makedirs(os.path.dirname(probe), exist_ok=True)
    with open(probe, "w") as f:
        f.write("int probe(int *p) { int x = 0; x = 1; return p == 0 ? "
                "*p : 0; }\n")
    _, found, err = analyze(clang, [], probe)
    os.unlink(probe)
    t.ok(any("core.NullDereference" in f for f in found) and
         any("deadcode.DeadStores" in f for f in found),
         "the analyzer runs and reports (a probe with a null dereference "
         "and a dead store)", err)
    jobs = max(1, min(len(sources), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
        results = list(ex.map(lambda s: analyze(clang, flags, s), sources))
    for src, found, err in results:
        t.ok(not found, "%s: no finding" % src,
             "\n".join(found) + "\n--- clang:\n" + err if found else None)


run_tests(main)
