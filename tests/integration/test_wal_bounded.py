#!/usr/bin/env python3
"""The write-ahead logs stay bounded under a steady stream of deliveries:
the checkpointer copies each shard's WAL into its database and, once the
WAL is longer than 4096 frames, rewinds it (a RESTART checkpoint), so the
next commit writes at its head again (the WAL header's checkpoint
sequence number moves on) instead of the file growing without end, and
each commit paying the kernel for new blocks."""

import os
import struct
import threading
import time
import uuid

from divtest import (Daemon, GITHUB_CONFIG, compact, fixture, run_tests,
                     with_comment)

# a long comment: about 16 WAL frames per stored delivery
DOC = with_comment(fixture(
    "github/go-playground--pull-request-issue-comment.json"),
    "/diverge fix keep the logs short\n\n" + "lorem ipsum dolor " * 3000)
SHARDS = ("diverge.db", "inbox-1.db", "inbox-2.db", "inbox-3.db")
RESTART_FRAMES = 4096
FRAME = 4096 + 24


def wal_state(d, name):
    """(checkpoint sequence, size in frames) of one shard's WAL."""
    path = os.path.join(d.state_dir, name + "-wal")
    try:
        with open(path, "rb") as f:
            head = f.read(32)
        size = os.path.getsize(path)
    except OSError:
        return 0, 0
    if len(head) < 32:
        return 0, 0
    return struct.unpack(">I", head[12:16])[0], size // FRAME


def stream(d, sent, lock, stop):
    body = compact(DOC)
    while not stop.is_set():
        try:
            s, _, _ = d.github("issue_comment", body, str(uuid.uuid4()))
        except OSError:
            continue
        if s == 202:
            with lock:
                sent[0] += 1


def main(t):
    d = Daemon(GITHUB_CONFIG.replace("debug", "info")).start()
    sent, lock, stop = [0], threading.Lock(), threading.Event()
    threads = [threading.Thread(target=stream, args=(d, sent, lock, stop))
               for _ in range(6)]
    for th in threads:
        th.start()
    largest = dict((s, 0) for s in SHARDS)
    end = time.time() + 90
    try:
        # until each shard's WAL was rewound twice (or 90 s)
        while time.time() < end:
            states = dict((s, wal_state(d, s)) for s in SHARDS)
            for s, (_, frames) in states.items():
                largest[s] = max(largest[s], frames)
            if all(seq >= 2 for seq, _ in states.values()):
                break
            time.sleep(0.2)
    finally:
        stop.set()
        for th in threads:
            th.join()
    states = dict((s, wal_state(d, s)) for s in SHARDS)
    t.ok(sent[0] > 0, "deliveries stored: %d" % sent[0])
    t.ok(all(seq >= 2 for seq, _ in states.values()),
         "under load every shard's WAL is rewound again and again "
         "(checkpoint sequence numbers)",
         dict((s, seq) for s, (seq, _) in states.items()))
    # rewound past RESTART_FRAMES, plus what commits add while the
    # checkpointer copies: a few times the threshold, never the stream
    t.ok(all(n <= 4 * RESTART_FRAMES for n in largest.values()),
         "no WAL grew beyond 4 x %d frames" % RESTART_FRAMES, largest)
    t.eq(d.stop(), 0, "clean stop")


run_tests(main)
