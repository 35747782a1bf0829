"""controller.max_active_tasks on a running diverged: with a limit of 2,
four tasks give two Provisioning and two Pending with reason Queued, in
FIFO order and with their place in status.message; a task that completes
(POST /api/v1/agenttask/complete with its token) or is deleted lets the
first queued one in at once (the resync is 10 minutes away), the other
still waits; the gauges, the log, and diverge task list/status say so.
Tasks created all at once never run more than 2 at a time, are admitted
in FIFO order as slots free, and all complete. Without a limit all four
run. On a cluster (the fake kube-apiserver, the daemon's RBAC) with the
fake GitHub: the second PR's task waits, its sticky comment says Queued
(not its place, which moves with every admission), /diverge status says
so with its place, and it starts when the first completes. A
watch follows every change of every task through each run: never more
than the limit hold a slot."""

import base64
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from divtest import (TOP_BUILDDIR, Daemon, FakeKube, ScmFake,  # noqa: E402
                     run_tests)
from test_kube_mode import RBAC, SEED, write_files  # noqa: E402
from test_scm_commands import gh_comment, wait  # noqa: E402

DIVERGE = os.path.join(TOP_BUILDDIR, "diverge")
NS = "default"
TASKS = "/apis/divergedev.com/v1alpha1/namespaces/%s/agenttasks" % NS
SANDBOXES = "/apis/agents.x-k8s.io/v1beta1/namespaces/%s/sandboxes" % NS
SECRETS = "/api/v1/namespaces/%s/secrets" % NS
HOLDING = ("Provisioning", "Active", "Pausing")
MARKER = "<!-- diverge-agent-task -->"


def msg(running, limit, ahead):
    return ("waiting for a free slot: %d of %d tasks are running; %d "
            "queued ahead" % (running, limit, ahead))


class Embedded:
    """The daemon's embedded Kubernetes API."""

    def __init__(self, d):
        self.d = d

    def request(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.d.api_port,
                                       timeout=10)
        try:
            c.request(method, path, body=json.dumps(body)
                      if body is not None else None,
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, json.loads(r.read() or b"null")
        finally:
            c.close()


def new_task(api, name):
    return api.request("POST", TASKS, {
        "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
        "metadata": {"name": name},
        "spec": {"objective": "fix " + name, "maxIterations": 5}})[0]


def tasks(api):
    s, lst = api.request("GET", TASKS)
    return {i["metadata"]["name"]: i for i in lst["items"]} if s == 200 \
        else {}


def phase(task):
    return (task or {}).get("status", {}).get("phase")


def queued_as(task, message):
    st = (task or {}).get("status", {})
    return st.get("phase") == "Pending" and st.get("reason") == "Queued" \
        and st.get("message") == message


class Watcher:
    """Follows every change of every task through a watch of the API
    (each write is one event): the most that held a slot at once, and
    the order in which tasks first held one."""

    def __init__(self, connect, headers=None):
        self.conn = connect()
        self.most = 0
        self.events = 0
        self.admitted = []
        self.phases = {}
        self.conn.request("GET", TASKS + "?watch=1",
                          headers=headers or {})
        self.resp = self.conn.getresponse()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        try:
            for line in iter(self.resp.readline, b""):
                ev = json.loads(line)
                obj = ev.get("object") or {}
                name = obj.get("metadata", {}).get("name")
                if ev.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
                    continue
                self.events += 1
                if ev["type"] == "DELETED":
                    self.phases.pop(name, None)
                else:
                    self.phases[name] = phase(obj)
                held = sorted(n for n, p in self.phases.items()
                              if p in HOLDING)
                self.most = max(self.most, len(held))
                for n in held:
                    if n not in self.admitted:
                        self.admitted.append(n)
        except (OSError, ValueError, http.client.HTTPException):
            pass

    def stop(self):
        time.sleep(0.5)     # the last changes reach the watch
        try:
            self.conn.sock.shutdown(2)
        except OSError:
            pass
        self.thread.join(10)
        self.conn.close()


def embedded_watch(d):
    return Watcher(lambda: http.client.HTTPConnection(
        "127.0.0.1", d.api_port, timeout=None))


def cluster_watch(fake):
    ctx = ssl.create_default_context(cafile=fake.info["ca_file"])
    return Watcher(lambda: http.client.HTTPSConnection(
        "127.0.0.1", fake.info["port"], timeout=None, context=ctx),
        {"Authorization": "Bearer " + fake.own_token})


def token_of(api, name):
    s, sec = api.request("GET", SECRETS + "/%s-token" % name)
    return base64.b64decode(sec["data"]["token"]).decode() if s == 200 \
        else None


def complete(d, api, name):
    tok = token_of(api, name)
    s, _, body = d.json("POST", "/api/v1/agenttask/complete", json.dumps(
        {"result": "succeeded"}), {"Content-Type": "application/json",
                                    "Authorization": "Bearer %s" % tok})
    return s


def play_ready(api, name):
    """Play agent-sandbox: the task's Sandbox is Ready."""
    s, sb = api.request("GET", SANDBOXES + "/" + name)
    if s != 200:
        return False
    ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    sb["status"] = {"conditions": [
        {"type": "Ready", "status": "True", "reason": "DependenciesReady",
         "message": "played",
         "observedGeneration": sb["metadata"].get("generation", 1),
         "lastTransitionTime": ts}], "podIPs": ["10.0.0.7"]}
    return api.request("PUT", SANDBOXES + "/%s/status" % name, sb)[0] == 200


def metric(d, name):
    for line in d.metrics().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def cli(d, *args):
    p = subprocess.run([DIVERGE, "--server", "http://127.0.0.1:%d" %
                        d.api_port] + list(args), capture_output=True,
                       text=True, timeout=30)
    return p.returncode, p.stdout, p.stderr


def four_tasks(t):
    d = Daemon("log: {{level: info}}\ncontroller: {{max_active_tasks: 2}}\n")
    d.start()
    api = Embedded(d)
    poll = embedded_watch(d)
    t.eq([new_task(api, "q%d" % i) for i in range(1, 5)], [201] * 4,
         "four tasks created, q1 to q4")
    settled = wait(lambda: (lambda ts: ts if phase(ts.get("q1")) ==
                            "Provisioning" and phase(ts.get("q2")) ==
                            "Provisioning" and queued_as(
                                ts.get("q3"), msg(2, 2, 0)) and queued_as(
                                ts.get("q4"), msg(2, 2, 1)) else None)(
                                    tasks(api)), 20)
    ts = tasks(api)
    t.ok(settled, "limit 2: q1 and q2 Provisioning, q3 and q4 Pending, "
         "reason Queued, 0 and 1 queued ahead",
         {n: x.get("status", {}) for n, x in ts.items()})
    t.ok(all(api.request("GET", SECRETS + "/%s-token" % n)[0] == 404 and
             api.request("GET", SANDBOXES + "/" + n)[0] == 404
             for n in ("q3", "q4")),
         "the queued tasks have no token and no Sandbox")
    t.ok(wait(lambda: metric(d, "diverge_tasks_queued") == 2 and
              metric(d, "diverge_tasks_active") == 2),
         "diverge_tasks_queued 2, diverge_tasks_active 2",
         [ln for ln in d.metrics().splitlines() if "tasks_" in ln])
    log = d.log()
    t.ok(all(any("task queued" in ln and "task=%s " % n in ln for ln in log)
             for n in ("q3", "q4")) and
         all(any("task admitted" in ln and "task=%s " % n in ln and
                 "limit=2" in ln for ln in log) for n in ("q1", "q2")),
         "the log says which tasks were queued and admitted",
         [ln for ln in log if "task queued" in ln or "admitted" in ln])
    rc, out, err = cli(d, "task", "list")
    rows = {ln.split()[0]: ln for ln in out.splitlines()[1:]}
    t.ok(rc == 0 and "Pending (Queued)" in rows.get("q3", "") and
         "Pending (Queued)" in rows.get("q4", "") and
         "Provisioning" in rows.get("q1", ""),
         "diverge task list: the queued tasks are Pending (Queued)",
         (rc, out, err))
    rc, out, err = cli(d, "task", "status", "q4")
    t.ok(rc == 0 and "Pending (Queued: %s)" % msg(2, 2, 1) in out and
         "leave the queue" in out,
         "diverge task status: the reason, the place, what to do",
         (rc, out, err))

    # q1 runs (Active), then completes: q3 takes its slot at once
    t.ok(wait(lambda: play_ready(api, "q1") and
              phase(tasks(api).get("q1")) == "Active"),
         "q1's Sandbox Ready: Active")
    t0 = time.time()
    t.eq(complete(d, api, "q1"), 200, "q1 completes (its runner's report)")
    ok = wait(lambda: phase(tasks(api).get("q3")) == "Provisioning", 10)
    took = time.time() - t0
    t.ok(ok and took < 5, "the first queued task, q3, is admitted at once "
         "(%.1f s)" % took, tasks(api).get("q3", {}).get("status"))
    t.ok(wait(lambda: queued_as(tasks(api).get("q4"), msg(2, 2, 0))),
         "q4 still waits, now first in the queue",
         tasks(api).get("q4", {}).get("status"))
    # q2 deleted: q4 runs
    t0 = time.time()
    t.eq(api.request("DELETE", TASKS + "/q2")[0], 200, "q2 deleted")
    ok = wait(lambda: phase(tasks(api).get("q4")) == "Provisioning", 10)
    took = time.time() - t0
    t.ok(ok and took < 5, "q4 is admitted at once (%.1f s)" % took,
         tasks(api).get("q4", {}).get("status"))
    t.ok(wait(lambda: metric(d, "diverge_tasks_queued") == 0 and
              metric(d, "diverge_tasks_active") == 2),
         "diverge_tasks_queued 0, diverge_tasks_active 2")
    poll.stop()
    t.ok(poll.most == 2 and poll.events > 10,
         "never more than 2 held a slot (%d changes)" % poll.events,
         poll.most)
    # q1 and q2 fit the two slots at once: whichever pass writes first
    t.ok(sorted(poll.admitted[:2]) == ["q1", "q2"] and
         poll.admitted[2:] == ["q3", "q4"], "admitted in FIFO order",
         poll.admitted)
    t.eq(d.stop(), 0, "clean stop")


def at_once(names, fn):
    """fn(name) for every name, from one thread each, released together;
    {name: its result}."""
    go = threading.Barrier(len(names))
    out = {}

    def run(n):
        go.wait()
        out[n] = fn(n)
    threads = [threading.Thread(target=run, args=(n,)) for n in names]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    return out


def concurrent(t):
    """Eight tasks made at once race for two slots, eight workers deciding
    at once, first while two earlier tasks hold both slots (they all
    queue), then as slots free. Their order is only defined among tasks
    that want a slot when a decision is made: made at once, one could be
    decided before a task of the same second with an earlier name existed,
    so the order is checked from the moment every one waits."""
    d = Daemon("log: {{level: info}}\n"
               "controller: {{workers: 8, max_active_tasks: 2}}\n")
    d.start()
    api = Embedded(d)
    poll = embedded_watch(d)
    blockers = ["b1", "b2"]
    t.eq([new_task(api, n) for n in blockers], [201] * 2, "b1 and b2 made")
    t.ok(wait(lambda: [phase(tasks(api).get(n)) for n in blockers] ==
              ["Provisioning"] * 2), "and hold both slots")
    names = ["c%d" % i for i in range(1, 9)]
    codes = at_once(names, lambda n: new_task(api, n))
    t.eq(sorted(codes.values()), [201] * 8, "8 tasks created at once")
    t.ok(wait(lambda: all(
        (ts.get(n) or {}).get("status", {}).get("reason") == "Queued" and
        phase(ts.get(n)) == "Pending" for ts in [tasks(api)] for n in names)),
        "all 8 queued behind them",
        {n: (x.get("status") or {}).get("reason") for n, x in
         tasks(api).items()})
    order = [n for _, n in sorted(
        (x["metadata"]["creationTimestamp"], n)
        for n, x in tasks(api).items() if n in names)]
    done = []
    end = time.time() + 90
    # as each runs, complete it: the next one in the queue takes its slot
    while len(done) < len(names) + 2 and time.time() < end:
        ts = tasks(api)
        held = [n for n in blockers + order if phase(ts.get(n)) in HOLDING]
        if len(held) < 2 and len(done) + len(held) < len(names) + 2:
            time.sleep(0.05)
            continue
        first = held[0]
        if complete(d, api, first) == 200:
            done.append(first)
            wait(lambda: phase(tasks(api).get(first)) == "Completed")
    poll.stop()
    ts = tasks(api)
    t.ok(all(phase(ts.get(n)) == "Completed" for n in names),
         "all 8 ran and completed, 2 at a time",
         {n: phase(x) for n, x in ts.items()})
    t.ok(poll.most == 2, "never more than 2 held a slot (%d changes)" %
         poll.events, poll.most)
    admitted = [n for n in poll.admitted if n in names]
    t.ok(sorted(admitted[:2]) == sorted(order[:2]) and
         admitted[2:] == order[2:],
         "admitted in FIFO order (creationTimestamp, then name)",
         (admitted, order))
    t.eq(d.stop(), 0, "clean stop")


def unlimited(t):
    d = Daemon("log: {{level: info}}\n").start()
    api = Embedded(d)
    poll = embedded_watch(d)
    t.eq([new_task(api, "u%d" % i) for i in range(1, 5)], [201] * 4,
         "no limit: four tasks created")
    t.ok(wait(lambda: all(phase(x) == "Provisioning"
                          for x in tasks(api).values())),
         "all four are Provisioning",
         {n: x.get("status") for n, x in tasks(api).items()})
    poll.stop()
    t.eq(poll.most, 4, "four held a slot at once")
    t.eq(d.stop(), 0, "clean stop")


KUBE_CONFIG = """log: {{level: info}}
kubernetes: {{mode: kubeconfig, kubeconfig: "{tmp}/kc"}}
controller: {{namespace: diverge-system, max_active_tasks: 1}}
github:
  enabled: true
  api_url: %s
  webhook_secrets: ["file:{secret_file}"]
  token: "file:{tmp}/gh-token"
"""


def sticky(scm, number):
    pulls = scm.state()["github"]["repos"]["myorg/checkout"]["pulls"]
    c = [c for c in pulls[str(number)]["comments"]
         if c.get("user") == "diverge-bot" and MARKER in (c.get("body") or "")]
    return c[0]["body"] if c else ""


def replies(scm, number):
    pulls = scm.state()["github"]["repos"]["myorg/checkout"]["pulls"]
    return [c["body"] for c in pulls[str(number)]["comments"]
            if c.get("user") == "diverge-bot" and MARKER not in c["body"]]


def on_cluster(t):
    if shutil.which("openssl") is None:
        t.skip("on a cluster (the fake kube-apiserver needs openssl)")
        return
    fake = FakeKube(rbac=[RBAC])
    scm = ScmFake()
    try:
        scm.call("POST", "/_fake/seed", SEED)
        cluster_run(t, fake, scm)
    finally:
        scm.stop()
        fake.stop()


def cluster_run(t, fake, scm):
    d = Daemon(KUBE_CONFIG % (scm.base + "/github"),
               env={"DIVERGE_TEST_NOTIFIER_THROTTLE_MS": "100"})
    write_files(d, fake)
    d.start()
    poll = cluster_watch(fake)
    for cid, n in ((1001, 42), (1002, 43)):
        s, _, _ = d.github("issue_comment", gh_comment(
            cid, n, "alice", "/diverge fix PR %d" % n), str(uuid.uuid4()))
        t.eq(s, 202, "/diverge fix on PR %d: 202" % n)
        if n == 42:
            t.ok(wait(lambda: phase(tasks(fake).get("fix-pr-42")) ==
                      "Provisioning", 20),
                 "on the cluster: fix-pr-42 is Provisioning")
    t.ok(wait(lambda: queued_as(tasks(fake).get("fix-pr-43"),
                                msg(1, 1, 0)), 20),
         "limit 1: fix-pr-43 waits, Pending, reason Queued",
         tasks(fake).get("fix-pr-43", {}).get("status"))
    t.ok(wait(lambda: "\u23f3 Queued" in sticky(scm, 43) and
              "waiting for a free slot (its place: `/diverge status`)" in
              sticky(scm, 43) and "queued ahead" not in sticky(scm, 43),
              20),
         "PR 43's status comment: Queued, its place left to /diverge status",
         sticky(scm, 43))
    s, _, _ = d.github("issue_comment", gh_comment(
        1003, 43, "alice", "/diverge status"), str(uuid.uuid4()))
    t.ok(wait(lambda: [r for r in replies(scm, 43)
                       if "Pending, queued (0 ahead)" in r and
                       "waits for a free slot (limit: 1 running at once)" in r], 20),
         "/diverge status on PR 43 says it is queued", replies(scm, 43))
    tok = base64.b64decode(fake.request("GET", SECRETS + "/fix-pr-42-token")[
        1]["data"]["token"]).decode()
    t0 = time.time()
    s, _, _ = d.json("POST", "/api/v1/agenttask/complete", json.dumps(
        {"result": "succeeded"}), {"Content-Type": "application/json",
                                    "Authorization": "Bearer " + tok})
    t.eq(s, 200, "fix-pr-42 completes")
    ok = wait(lambda: phase(tasks(fake).get("fix-pr-43")) == "Provisioning",
              10)
    took = time.time() - t0
    t.ok(ok and took < 5, "fix-pr-43 is admitted at once (%.1f s)" % took,
         tasks(fake).get("fix-pr-43", {}).get("status"))
    t.ok(wait(lambda: "\U0001f680 Running" in sticky(scm, 43), 20),
         "PR 43's status comment: Running", sticky(scm, 43))
    poll.stop()
    t.ok(poll.most == 1 and poll.events > 10,
         "never more than 1 held a slot (%d changes)" % poll.events,
         poll.most)
    t.eq(d.stop(), 0, "clean stop")


def reload_limit(t):
    """controller.max_active_tasks changed on SIGHUP: a higher limit admits
    the queued task at once; a lower one stops nothing that runs and
    admits no more; to 0 (no limit) it waits for a restart, and says so."""
    d = Daemon("log: {{level: info}}\ncontroller: {{max_active_tasks: 1}}\n")
    d.start()
    api = Embedded(d)
    t.eq([new_task(api, n) for n in ("r1", "r2")], [201] * 2,
         "r1 and r2 made, limit 1")
    t.ok(wait(lambda: [phase(tasks(api).get(n)) for n in ("r1", "r2")] ==
              ["Provisioning", "Pending"]), "r1 runs, r2 is queued")

    def hup(limit):
        with open(d.config_file, "w") as f:
            f.write("log: {level: info}\n"
                    "controller: {max_active_tasks: %d}\n" % limit)
        d.send_signal(signal.SIGHUP)
    t0 = time.time()
    hup(2)
    ok = wait(lambda: phase(tasks(api).get("r2")) == "Provisioning", 10)
    t.ok(ok and time.time() - t0 < 5, "limit 2 on SIGHUP: r2 admitted at "
         "once (%.1f s)" % (time.time() - t0))
    t.ok(d.wait_log("reload: controller.max_active_tasks changed") and
         any("from=1 to=2" in l for l in d.log()) and
         not any("take effect only at a restart" in l for l in d.log()),
         "logged as applied, not as waiting for a restart")
    hup(1)
    t.ok(d.wait_log("from=2 to=1"), "limit 1 again")
    t.eq(new_task(api, "r3"), 201, "r3 made")
    time.sleep(1)
    ts = tasks(api)
    t.ok([phase(ts.get(n)) for n in ("r1", "r2", "r3")] ==
         ["Provisioning", "Provisioning", "Pending"],
         "the two running go on, r3 waits",
         {n: phase(x) for n, x in ts.items()})
    hup(0)
    t.ok(d.wait_log("keys=controller.max_active_tasks"), "to 0 (no limit): "
         "a restart is needed, and the warning says so")
    time.sleep(0.5)
    t.eq(phase(tasks(api).get("r3")), "Pending", "r3 still waits")
    t.eq(d.stop(), 0, "clean stop")


def main(t):
    four_tasks(t)
    concurrent(t)
    reload_limit(t)
    unlimited(t)
    on_cluster(t)


run_tests(main)
