"""Process lifecycle under load: signals while many keep-alive clients
post signed webhooks and meter charges. Every request gets a whole answer
or a connection error, the daemon exits 0 within its bound, and what was
acknowledged (a 202, a meter 200) is on disk after the restart."""

import collections
import http.client
import json
import os
import signal
import subprocess
import threading
import time
import uuid

from divtest import (Daemon, GITHUB_CONFIG, ScmFake, api, compact, fixture,
                     run_tests, sign, task_token, wait, with_comment)
from test_scm_commands import (CONFIG as BOT_CONFIG, bot_daemon, gh_comment,
                               seed)

NS = "default"
TASKS = "/apis/divergedev.com/v1alpha1/namespaces/%s/agenttasks" % NS
BODY = compact(with_comment(fixture(
    "github/go-playground--pull-request-issue-comment.json"),
    "/diverge fix keep it"))
CLIENTS = 64


class Load:
    """CLIENTS threads, each on one kept-alive connection (a new one after
    an error), half posting signed webhooks, half meter charges of one
    token each; results: (kind, key, status or error name)."""

    def __init__(self, d, token):
        self.d, self.token = d, token
        self.results = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.client, args=(i,))
                        for i in range(CLIENTS)]

    def one(self, c, kind, key):
        if kind == "webhook":
            c.request("POST", "/webhooks/github", body=BODY, headers={
                "Content-Type": "application/json",
                "X-GitHub-Event": "issue_comment",
                "X-GitHub-Delivery": key,
                "X-Hub-Signature-256": sign(self.d.secret, BODY)})
        else:
            c.request("POST", "/api/v1/agenttask/meter", body=json.dumps({
                "requestId": key, "iteration": 1, "model": "m",
                "tokensUsed": 1, "costUSD": 0}), headers={
                "Content-Type": "application/json",
                "Authorization": "Bearer " + self.token})
        r = c.getresponse()
        data = r.read()
        json.loads(data)        # a whole JSON body, or a half reply
        return r.status

    def client(self, i):
        kind = "webhook" if i % 2 == 0 else "meter"
        c = None
        while not self.stop.is_set():
            if c is None:
                c = http.client.HTTPConnection("127.0.0.1", self.d.port,
                                               timeout=60)
            key = str(uuid.uuid4())
            try:
                status = self.one(c, kind, key)
            except (http.client.IncompleteRead, ValueError) as e:
                status = "half reply: " + repr(e)[:80]
            except (OSError, http.client.HTTPException):
                status = "connection error"
                c.close()
                c = None
                if self.d.proc.poll() is not None:
                    return
                time.sleep(0.01)
            with self.lock:
                self.results.append((kind, key, status))

    def start(self):
        for th in self.threads:
            th.start()
        return self

    def wait_requests(self, n, timeout=60):
        return wait(lambda: len(self.results) >= n, timeout)

    def join(self):
        self.stop.set()
        for th in self.threads:
            th.join()
        return self.results


def new_task(t, d, name):
    s, _ = api(d, "POST", TASKS, {
        "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
        "metadata": {"name": name},
        "spec": {"objective": "load", "budgetUSD": "1000",
                 "budgetTokens": 100000000, "maxIterations": 5}})
    token, _ = task_token(d, name, NS, timeout=30)
    t.ok(s == 201 and token is not None, "task %s has its token" % name)
    return token


def check_after(t, d, results, name, what):
    """After the restart: every 202 on disk and handled once; the task's
    tokens are at least the charges answered 200, at most those plus the
    ones whose answer was lost (a 503 or a connection error: the contract
    lets a retry with the same requestId find them charged once)."""
    tally = collections.Counter((k, s) for k, _, s in results)
    half = [r for r in results if str(r[2]).startswith("half reply")]
    t.ok(not half, "%s: every answer whole or a connection error" % what,
         (half[:5], tally))
    acked = ["github:" + k for kind, k, s in results
             if kind == "webhook" and s == 202]
    stored = set(k for (k,) in d.query("SELECT key FROM inbox"))
    missing = [k for k in acked if k not in stored]
    t.ok(acked and not missing, "%s: every 202 (%d) is in the inbox after "
         "the restart" % (what, len(acked)), missing[:5])
    got = d.wait_handled(acked, timeout=120)
    t.eq(len([k for k in acked if k in got]), len(acked),
         "%s: every 202 handled" % what)
    over = {k: c for k, c in got.items() if c != 1}
    t.ok(not over, "%s: each handled once" % what, over)
    ok = sum(1 for kind, _, s in results if kind == "meter" and s == 200)
    lost = sum(1 for kind, _, s in results if kind == "meter" and s != 200)
    s, obj = api(d, "GET", TASKS + "/" + name)
    used = obj.get("status", {}).get("tokensConsumed", 0)
    t.ok(ok > 0 and ok <= used <= ok + lost, "%s: charges kept: %d answered "
         "200 <= %d counted <= %d sent" % (what, ok, used, ok + lost), tally)


def stop_under_load(t, timeout_s):
    """SIGTERM while 64 kept-alive clients post: libmicrohttpd aborted
    (MHD_stop_daemon with suspended connections) on the requests that the
    kept-alive clients sent after the stop had answered the suspended
    ones, and the drain lasted its whole timeout while they kept
    sending."""
    what = "shutdown_timeout %ds" % timeout_s
    d = Daemon(GITHUB_CONFIG.replace("debug", "info") +
               "shutdown_timeout: %ds\n" % timeout_s).start()
    token = new_task(t, d, "load")
    load = Load(d, token).start()
    load.wait_requests(2000)
    start = time.time()
    rc = d.stop(timeout=timeout_s + 60)
    took = time.time() - start
    results = load.join()
    t.eq(rc, 0, "%s: SIGTERM under load: exit 0" % what)
    # the drain ends with the last in-flight request, not its timeout;
    # a generous bound for a loaded machine
    t.ok(took < timeout_s + 20, "%s: stopped in %.1f s" % (what, took))
    t.ok(not any("database is locked" in l for l in d.log()),
         "%s: no 'database is locked'" % what)
    d.start()
    check_after(t, d, results, "load", what)
    t.eq(d.stop(), 0, "%s: the restarted daemon stops with 0" % what)


def fault_hits(fake):
    return sum(f.get("hits", 0) for f in fake.call("GET", "/_fake/faults"))


def stop_in_bound(t, d, what):
    """SIGTERM d, with shutdown_timeout 2s, while a slow API holds one of
    its threads: exit 0 in its 2 s, about a second for a transfer to
    notice, and room for a loaded machine; not when the API answers
    (minutes)."""
    start = time.time()
    rc = d.stop(timeout=90)
    took = time.time() - start
    t.eq(rc, 0, "%s: exit 0" % what)
    t.ok(took < 20, "%s: stopped in %.1f s" % (what, took))


def slow_api(t):
    """SIGTERM while inbox workers wait on a failing, slow API (502s after
    29 s each, retried): the workers' calls retried on past
    shutdown_timeout, for minutes. Past it they give up, the entries stay
    pending, and the next start handles each once."""
    fake = ScmFake()
    fake.call("POST", "/_fake/seed", seed())
    d = bot_daemon(fake, BOT_CONFIG + "shutdown_timeout: 2s\n", {})
    fake.call("POST", "/_fake/faults", {"provider": "github", "count": 1000,
                                        "status": 502, "delay_ms": 29000})
    keys = []
    for i in range(2):
        key = str(uuid.uuid4())
        s, _, _ = d.github("issue_comment", gh_comment(
            7000 + i, 43, "alice", "/diverge fix slow api"), key)
        t.eq(s, 202, "comment %d accepted" % i)
        keys.append("github:" + key)
    t.ok(wait(lambda: fault_hits(fake) >= 2, 30), "both workers wait on "
         "the API")
    stop_in_bound(t, d, "SIGTERM with workers in slow API calls")
    t.ok(any("given up: stopping" in ln for ln in d.log()),
         "the calls gave up, saying why")
    fake.call("DELETE", "/_fake/faults")
    d.start()
    got = d.wait_handled(keys, timeout=60)
    t.eq(dict((k, got.get(k)) for k in keys), dict((k, 1) for k in keys),
         "after the restart each entry is handled once")
    t.eq(d.stop(), 0, "the restarted daemon stops with 0")
    fake.stop()


def hup_slow_identity(t):
    """A SIGHUP while the bot's identity is unknown (GitHub down at the
    start) asks GET /user again. Asked from the signal thread, a slow
    GitHub (502 after 29 s, retried) kept it from taking the SIGTERM that
    followed for minutes; asked from the pruner, the stop gives it up."""
    fake = ScmFake()
    fake.call("POST", "/_fake/seed", seed())
    fake.call("POST", "/_fake/faults", {"provider": "github", "count": 1000,
                                        "status": 502, "match": "/user"})
    d = bot_daemon(fake, BOT_CONFIG + "shutdown_timeout: 2s\n",
                   {"DIVERGE_SCM_MAX_WAIT_MS": "2000"})
    t.ok(d.wait_log("github identity unknown", 30), "GitHub down at the "
         "start: the bot's identity is unknown")
    fake.call("DELETE", "/_fake/faults")
    fake.call("POST", "/_fake/faults", {"provider": "github", "count": 1000,
                                        "status": 502, "delay_ms": 29000,
                                        "match": "/user"})
    d.send_signal(signal.SIGHUP)
    t.ok(d.wait_log("reloaded secrets") and
         wait(lambda: fault_hits(fake) >= 1, 30),
         "SIGHUP: GET /user asked again, and slow")
    stop_in_bound(t, d, "SIGTERM during that call")
    fake.stop()


def start_slow_identity(t):
    """SIGTERM while the start asks a slow GitHub who the bot is (502
    after 29 s, retried): the signal waited for the start, minutes. Now
    the start's call gives up, and the daemon stops once started."""
    fake = ScmFake()
    fake.call("POST", "/_fake/seed", seed())
    fake.call("POST", "/_fake/faults", {"provider": "github", "count": 1000,
                                        "status": 502, "delay_ms": 29000,
                                        "match": "/user"})
    d = bot_daemon(fake, BOT_CONFIG + "shutdown_timeout: 2s\n", {},
                   wait=False)
    t.ok(wait(lambda: fault_hits(fake) >= 1, 30), "the start asks GitHub "
         "who the bot is, and waits")
    stop_in_bound(t, d, "SIGTERM during the start")
    t.ok(d.wait_log("github identity unknown", 5) and
         d.wait_log("diverged started", 5),
         "the start ends without the identity, then the daemon stops")
    fake.stop()


def fifo_start(t, sig, check=False):
    """sig while the start reads its configuration from a pipe (as in
    `--config <(make-config)`): it is in main(), before anything is open.
    Returns the Daemon, the pipe written and closed."""
    d = Daemon("")
    os.unlink(d.config_file)
    os.mkfifo(d.config_file)
    if check:
        d.args = ["--check-config"]
    d.start(wait=False)
    try:
        # returns once diverged has opened it: it is reading it
        with open(d.config_file, "w") as f:
            d.send_signal(sig)
            time.sleep(0.2)     # delivered: the default action would act
            f.write("log:\n  level: info\n")
    except BrokenPipeError:
        pass
    return d


def signals_at_start(t):
    """Signals while the configuration is read. SIGHUP killed the daemon
    there (its default action: the mask came later); now the reload
    waits for the start. SIGTERM there is a clean stop, exit 0, before
    anything is made; --check-config stopped so does not exit 0 ("ok").
    The reload reads a regular file only: it waited on the pipe, for
    ever, and took no SIGTERM."""
    d = fifo_start(t, signal.SIGHUP)
    try:
        d.wait_started()
        started = True
    except RuntimeError as e:
        started = False
        print("# " + str(e).replace("\n", "\n# "))
    t.ok(started, "SIGHUP while the configuration is read: the daemon "
         "starts")
    # the reload does not open the pipe again: it would wait there for a
    # writer, and take no SIGTERM
    t.ok(started and d.wait_log("not a regular file (a pipe is read once",
                                10),
         "and takes the reload once started (a pipe is not read again)")
    t.ok(started and d.request("GET", "/healthz")[0] == 200, "and serves")
    t.eq(d.stop(), 0, "and stops with 0")
    d = fifo_start(t, signal.SIGTERM)
    try:
        rc = d.proc.wait(10)
    except subprocess.TimeoutExpired:
        d.proc.kill()
        rc = d.proc.wait()
    t.eq(rc, 0, "SIGTERM while the configuration is read: exit 0")
    t.ok(not os.path.exists(d.state_dir), "nothing was made (no state "
         "dir)")
    d = fifo_start(t, signal.SIGTERM, check=True)
    try:
        rc = d.proc.wait(10)
    except subprocess.TimeoutExpired:
        d.proc.kill()
        rc = d.proc.wait()
    t.ok(rc != 0 and not any("configuration ok" in ln for ln in d.log()),
         "--check-config stopped while reading: not ok (%r)" % rc)


def main(t):
    signals_at_start(t)
    stop_under_load(t, 30)
    stop_under_load(t, 0)
    slow_api(t)
    hup_slow_identity(t)
    start_slow_identity(t)


run_tests(main)
