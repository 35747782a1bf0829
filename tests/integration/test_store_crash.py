"""Crash safety of the embedded store: writers create and patch objects
through diverged's Kubernetes API while the daemon is killed with SIGKILL
at random moments. After each restart every acknowledged write is there,
intact, and resourceVersions keep increasing."""

import random
import threading
import time

from divtest import Daemon, api_call as call, run_tests

BASE = "/apis/divergedev.com/v1alpha1/namespaces/crash/agenttasks"


def writer(port, wid, acked, lock, stop):
    n = 0
    name = "w%d" % wid
    while not stop.is_set():
        n += 1
        try:
            if n == 1:
                s, obj = call(port, "POST", BASE, {
                    "apiVersion": "divergedev.com/v1alpha1",
                    "kind": "AgentTask", "metadata": {"name": name},
                    "spec": {"objective": "count", "maxIterations": n}})
                if s == 409:
                    s, obj = call(port, "PATCH", BASE + "/" + name,
                                  {"spec": {"maxIterations": n}},
                                  "application/merge-patch+json")
            else:
                s, obj = call(port, "PATCH", BASE + "/" + name,
                              {"spec": {"maxIterations": n}},
                              "application/merge-patch+json")
        except OSError:
            n -= 1
            continue
        if s in (200, 201):
            with lock:
                acked[name] = (n, int(obj["metadata"]["resourceVersion"]))


def main(t):
    rng = random.Random(7)
    d = Daemon("log: {{level: info}}\n")
    acked, lock = {}, threading.Lock()
    max_rv = 0
    for cycle in range(3):
        d.start()
        # wait for the API
        for _ in range(100):
            try:
                call(d.api_port, "GET", "/version")
                break
            except OSError:
                time.sleep(0.05)
        if cycle > 0:
            bad = []
            for name, (n, rv) in sorted(acked.items()):
                s, obj = call(d.api_port, "GET", BASE + "/" + name)
                got = obj.get("spec", {}).get("maxIterations") if s == 200 \
                    else None
                if s != 200 or got is None or got < n or \
                        int(obj["metadata"]["resourceVersion"]) < rv:
                    bad.append((name, n, s, got))
            t.ok(acked and not bad, "cycle %d: all %d acknowledged writes "
                 "survived kill -9, intact" % (cycle, len(acked)), bad[:5])
            s, l = call(d.api_port, "GET", BASE)
            rv_now = int(l["metadata"]["resourceVersion"])
            t.ok(rv_now >= max_rv, "cycle %d: resourceVersion did not go "
                 "back (%d >= %d)" % (cycle, rv_now, max_rv))
        stop = threading.Event()
        ws = [threading.Thread(target=writer, args=(d.api_port, i, acked,
                                                    lock, stop))
              for i in range(6)]
        for w in ws:
            w.start()
        time.sleep(0.4 + rng.random() * 0.6)
        d.kill9()
        stop.set()
        for w in ws:
            w.join()
        with lock:
            max_rv = max([rv for (_, rv) in acked.values()] + [max_rv])
    d.start()
    s, l = call(d.api_port, "GET", BASE)
    t.eq(s, 200, "the store opens after the last crash")
    t.ok(len(l["items"]) == len(acked), "every object created is listed "
         "(%d)" % len(l["items"]))
    rc = d.stop()
    t.ok(rc == 0, "clean stop", "exit status %r; the last lines:\n%s" % (
        rc, "\n".join(d.log()[-30:])))


run_tests(main)
