"""A full disk under the state directory, for real: a 3 MiB tmpfs filled
by the daemon's own writes. Webhooks then get 503 with Retry-After and are
not stored, a meter charge gets 503 with Retry-After and is not charged,
the daemon keeps serving; once the disk has room again (the tmpfs grown),
both go through, every acknowledged delivery is handled exactly once, the
retried charge is charged once, and the state survives a restart. Needs
root (mount); skipped otherwise."""

import errno
import os
import sqlite3
import subprocess
import tempfile
import time
import uuid

from divtest import (Daemon, GITHUB_CONFIG, api, compact, fixture, meter,
                     run_tests, task_token, with_comment)

DOC = with_comment(fixture(
    "github/go-playground--pull-request-issue-comment.json"),
    "/diverge fix until the disk is full")
NS = "default"
TASKS = "/apis/divergedev.com/v1alpha1/namespaces/%s/agenttasks" % NS



def charge(d, token, rid):
    return meter(d, token, {"requestId": rid, "iteration": 1, "model": "m",
                            "tokensUsed": 7, "costUSD": 0.0001})


def settle(path, quiet=1.0, limit=20.0):
    """Wait until no file under path has changed its size for quiet
    seconds (the inbox's checkpoints, which free WAL space, are done)."""
    def sizes():
        out = {}
        for root, _, files in os.walk(path):
            for n in files:
                try:
                    out[os.path.join(root, n)] = os.path.getsize(
                        os.path.join(root, n))
                except OSError:
                    pass
        return out
    end = time.time() + limit
    last, since = sizes(), time.time()
    while time.time() < end:
        time.sleep(0.1)
        now = sizes()
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= quiet:
            return


def fill(mnt):
    """Take every page left on the tmpfs: a checkpoint that truncated a
    WAL after the inbox's last failed write gave some back, and the
    store's next write could then fit."""
    fd = os.open(os.path.join(mnt, "filler-%s" % uuid.uuid4().hex),
                 os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)


def mount(mnt, opts):
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", mnt],
                       capture_output=True, text=True)
    return p.returncode == 0


def main(t):
    if os.geteuid() != 0:
        t.skip_all("needs root to mount a small tmpfs")
    mnt = tempfile.mkdtemp(prefix="diverge-full-")
    if not mount(mnt, "size=3m,mode=0700"):
        os.rmdir(mnt)
        t.skip_all("cannot mount a tmpfs here")
    try:
        run(t, mnt)
    finally:
        Daemon.kill_all()
        subprocess.run(["umount", "-l", mnt])
        os.rmdir(mnt)


def run(t, mnt):
    d = Daemon(GITHUB_CONFIG.replace("debug", "info"),
               state_dir=os.path.join(mnt, "state")).start()
    s, _ = api(d, "POST", TASKS, {
        "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
        "metadata": {"name": "fix-pr-9"},
        "spec": {"objective": "meter on a full disk", "budgetUSD": "100",
                 "capabilities": ["m"]}})
    token = task_token(d, "fix-pr-9")[0]
    t.ok(s == 201 and token, "a task and its token, on the small disk")
    t.eq(charge(d, token, "before")[0], 200, "a charge while there is room")

    body = compact(DOC)
    acked, full = [], None
    for _ in range(5000):
        key = str(uuid.uuid4())
        s, h, j = d.github("issue_comment", body, key)
        if s == 202:
            acked.append(key)
            continue
        full = (s, h.get("retry-after"), j)
        break
    t.ok(acked and full == (503, "5", {"error": "cannot store the delivery"}),
         "the disk fills: 503 with Retry-After, after %d deliveries stored"
         % len(acked), full)
    refused = key
    # A charge writes two or three WAL frames. Room given back after the
    # fill (an inbox checkpoint truncating its WAL, a worker's last
    # write failing) can hold that; so can the WAL file itself once a
    # checkpoint has copied all of it (which the full disk usually
    # prevents, not always): the next write starts again at its head,
    # over blocks it already has. Such a charge is durable and answered
    # 200. So once a charge fits, a reader holds the WAL (as a backup
    # would: it can no longer be rewound) and the charges go on until
    # one must grow it, on the full disk. A reader that starts just after
    # a checkpoint has copied the whole WAL reads the database file alone
    # and holds nothing; then the charges keep fitting, more of them than
    # a 3 MiB WAL has frames for (a charge writes one frame at least), and
    # the reader starts again after the next one.
    fits, pin, pinned_at = 0, None, 0
    frames = 3 * 1024 * 1024 // (4096 + 24)
    settle(mnt)
    fill(mnt)
    for attempt in range(5000):
        rid = "on-full-%d" % attempt
        s, h, j = charge(d, token, rid)
        if s != 200:
            break
        fits += 1
        if pin is not None and fits - pinned_at > frames:
            pin.execute("COMMIT")
            pin.close()
            pin = None
        if pin is None:
            pin = sqlite3.connect(d.db(), isolation_level=None)
            pin.execute("BEGIN")
            pin.execute("SELECT count(*) FROM sqlite_master").fetchall()
            pinned_at = fits
    if pin is not None:
        pin.execute("COMMIT")
        pin.close()
    t.ok(s == 503 and h.get("retry-after") == "5" and
         j == {"error": "the store is unavailable, retry"},
         "a charge on the full disk: 503 with Retry-After (%d charge(s) "
         "found room first)" % fits, (s, h, j))
    total = 14 + 7 * fits
    t.eq(d.request("GET", "/healthz")[0], 200, "the daemon keeps serving")
    t.ok(d.wait_log("inbox write failed") and
         d.wait_log("meter: store failed"), "and says why in its log")

    subprocess.run(["mount", "-o", "remount,size=64m", mnt], check=True)
    s, _, j = d.github("issue_comment", body, refused)
    t.ok(s == 202, "room again: the refused delivery is taken", (s, j))
    acked.append(refused)
    s, _, j = charge(d, token, rid)
    t.ok(s == 200 and j.get("charged") is True, "and the refused charge, "
         "retried, is charged", j)
    s, _, j = charge(d, token, rid)
    t.ok(s == 200 and j.get("charged") is False and
         j.get("totalTokensUsed") == total, "once", j)
    got = d.wait_handled(["github:" + k for k in acked], timeout=60)
    t.ok(len(got) == len(acked) and set(got.values()) == {1},
         "every acknowledged delivery handled exactly once (%d)"
         % len(acked), len(got))
    t.eq(d.stop(), 0, "clean stop")
    d.start()
    s, task = api(d, "GET", TASKS + "/fix-pr-9")
    t.ok(s == 200 and task["status"].get("tokensConsumed") == total,
         "after a restart: the charges made, no more", task.get("status"))
    s, _, j = d.github("issue_comment", body, acked[0])
    t.ok(s == 200 and j.get("duplicate") is True, "and a stored delivery "
         "is still a duplicate", j)
    t.eq(d.stop(), 0, "clean stop")


run_tests(main)
