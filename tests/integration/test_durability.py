"""Durability: signed deliveries stream in from several threads while the
daemon is killed with SIGKILL at random moments. Every delivery that got a
202 must be on disk at once, and after restarts each is handled exactly
once; resent duplicates are never handled twice."""

import random
import threading
import time
import uuid

from divtest import (Daemon, GITHUB_CONFIG, compact, fixture, run_tests,
                     with_comment)

DOC = with_comment(fixture(
    "github/go-playground--pull-request-issue-comment.json"),
    "/diverge fix keep every delivery")


def stream(d, acked, lock, stop):
    body = compact(DOC)
    while not stop.is_set():
        key = str(uuid.uuid4())
        try:
            s, _, j = d.github("issue_comment", body, key)
        except OSError:
            continue    # the daemon died mid-request: not acknowledged
        if s == 202:
            with lock:
                acked.append(key)


def main(t):
    rng = random.Random(20261130)
    d = Daemon(GITHUB_CONFIG.replace("debug", "info")).start()
    acked, lock = [], threading.Lock()
    for cycle in range(3):
        stop = threading.Event()
        threads = [threading.Thread(target=stream, args=(d, acked, lock,
                                                         stop))
                   for _ in range(8)]
        before = len(acked)
        for th in threads:
            th.start()
        time.sleep(0.3 + rng.random() * 0.7)
        d.kill9()                       # mid-stream, no warning
        stop.set()
        for th in threads:
            th.join()
        with lock:
            keys = list(acked)
        stored = set(k for (k,) in d.query("SELECT key FROM inbox"))
        missing = [k for k in keys if "github:" + k not in stored]
        t.ok(len(keys) > before, "cycle %d: deliveries were acknowledged "
             "(%d)" % (cycle, len(keys) - before))
        t.ok(not missing, "cycle %d: every 202 is on disk after kill -9"
             % cycle, "missing %d: %s" % (len(missing), missing[:5]))
        d.start()
        # resend a few acknowledged ones: duplicates, never new work
        for k in rng.sample(keys, min(20, len(keys))):
            s, _, j = d.github("issue_comment", DOC, k)
            if s != 200 or not j.get("duplicate"):
                t.ok(False, "resent delivery %s is a duplicate" % k, (s, j))
                break
        else:
            t.ok(True, "cycle %d: resent deliveries answered duplicate"
                 % cycle)
    got = d.wait_handled(["github:" + k for k in acked], timeout=60)
    handled = [k for k in acked if "github:" + k in got]
    t.eq(len(handled), len(acked), "every acknowledged delivery handled "
         "(%d)" % len(acked))
    over = {k: c for k, c in got.items() if c != 1}
    t.ok(not over, "each handled exactly once", over)
    extra = set(got) - set("github:" + k for k in acked)
    # deliveries stored but whose 202 was lost in the kill may be handled;
    # they were never acknowledged, so handling them is allowed
    t.ok(len(extra) <= 8 * 3, "unacknowledged but stored deliveries are "
         "at most the in-flight ones (%d)" % len(extra))
    t.eq(d.stop(), 0, "clean stop after the crash cycles")


run_tests(main)
