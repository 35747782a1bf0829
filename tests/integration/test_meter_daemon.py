"""The meter endpoints of a running diverged: the root key file; the token
the reconciler issues for a new task (Secret <task>-token); charges over
real HTTP until the budget stops the task; and a token minted with the
root key by an independent tool, which the meter must take too."""

import base64
import json
import os
import stat
import subprocess
import time

from divtest import (TOP_BUILDDIR, Daemon, api, meter, run_tests,
                     task_token, wait)

TOOL = os.path.join(TOP_BUILDDIR, "tests", "tools", "macaroon_tool")
NS = "default"
TASKS = "/apis/divergedev.com/v1alpha1/namespaces/%s/agenttasks" % NS
SECRETS = "/api/v1/namespaces/%s/secrets" % NS



def metric(text, series):
    """The value of one series (name and labels, as rendered), or None."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line[len(series) + 1:])
    return None


def main(t):
    if not os.access(TOOL, os.X_OK):
        t.skip_all("tests/tools/macaroon_tool is not built")
    d = Daemon("log: {{level: info}}\n").start()
    keyfile = os.path.join(d.state_dir, "macaroon-root-key")
    mode = stat.S_IMODE(os.stat(keyfile).st_mode)
    t.eq(mode, 0o600, "the root key file is created with mode 0600")
    with open(keyfile) as f:
        keyhex = f.read().strip()
    t.eq(len(keyhex), 64, "the root key is 64 hex characters")

    # a task: the reconciler issues its token
    s, obj = api(d, "POST", TASKS, {
        "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
        "metadata": {"name": "fix-pr-7"},
        "spec": {"objective": "fix it", "budgetUSD": "0.05",
                 "maxIterations": 5}})
    t.eq(s, 201, "task created")
    token, obj = task_token(d, "fix-pr-7", NS, timeout=10)
    tid = obj.get("status", {}).get("tokenId")
    t.ok(token is not None, "the reconciler issued a token in Secret "
         "fix-pr-7-token and recorded status.tokenId")
    phase = obj.get("status", {}).get("phase")
    t.ok(phase in ("Provisioning", "Active"), "the task is live (%s): the "
         "agent may meter before its sandbox is Ready" % phase)

    # the token verifies with the root key through an independent tool
    out = subprocess.run([TOOL, "verify", keyhex, token, "fix-pr-7", NS,
                          "-", str(int(time.time()))], capture_output=True,
                         text=True)
    t.eq(out.stdout.strip(), "ok", "the issued token verifies against the "
         "root key file")

    s, _, j = meter(d, None, {"requestId": "a", "iteration": 1,
                              "tokensUsed": 10, "costUSD": 0.01})
    t.ok(s == 401 and j["error"] == "missing token", "no token: 401", j)
    s, _, j = meter(d, token, {"requestId": "a", "iteration": 1})
    t.ok(s == 400 and j.get("field") == "tokensUsed", "bad body: 400 "
         "naming the field", j)
    s, _, j = meter(d, token, {"requestId": "a", "iteration": 1,
                               "model": "m", "tokensUsed": 10,
                               "costUSD": 0.0225})
    t.ok(s == 200 and j["allowed"] and j["totalCostUSD"] == 0.0225 and
         j["totalTokensUsed"] == 10 and j["maxIterations"] == 5,
         "a charge: 200 with totals", j)
    s, _, j = meter(d, token, {"requestId": "a", "iteration": 1,
                               "model": "m", "tokensUsed": 10,
                               "costUSD": 0.0225})
    t.ok(s == 200 and j["totalCostUSD"] == 0.0225, "a retry is not "
         "charged twice", j)
    s, _, j = meter(d, token, {"requestId": "b", "iteration": 2,
                               "model": "m", "tokensUsed": 10,
                               "costUSD": 0.03})
    t.ok(s == 429 and j["reason"] == "budget exceeded",
         "crossing spec.budgetUSD 0.05: 429 budget exceeded", j)
    s, obj = api(d, "GET", TASKS + "/fix-pr-7")
    t.ok(obj["status"]["phase"] == "Paused" and
         obj["status"]["reason"] == "BudgetExceeded" and
         obj["spec"]["suspended"] is True and
         obj["status"]["costUSD"] == "0.052500",
         "the task is Paused, suspended, and charged exactly",
         obj.get("status"))
    s, sec = api(d, "GET", SECRETS + "/diverge-agenttask-tokens")
    state = json.loads(base64.b64decode(sec["data"][tid]))["state"]
    t.eq(state, "revoked", "the token is revoked in the index")
    s, _, j = meter(d, token, {"requestId": "c", "iteration": 2,
                               "model": "m", "tokensUsed": 1,
                               "costUSD": 0})
    t.eq(s, 401, "after the suspension: 401")
    s, _, j = meter(d, token, {"result": "succeeded"},
                    "/api/v1/agenttask/complete")
    t.eq(s, 401, "complete with a revoked token of a paused task: 401")
    s, _, j = d.json("POST", "/api/v1/agenttask/meter", "{}",
                     {"Content-Type": "text/plain"})
    t.eq(s, 415, "meter with a wrong content type: 415")
    m = d.metrics()
    t.ok("diverge_http_requests_total{route=\"/api/v1/agenttask/meter\","
         "code=\"429\"}" in m, "meter requests in the metrics")
    # what the meter did, in its own metrics: two charges (a, b) of 10
    # tokens, $0.0525 in all, one retry, one suspension, the refusals
    want = {
        "diverge_meter_charges_total": 2,
        "diverge_meter_charged_tokens_total": 20,
        "diverge_meter_charged_usd_total": 0.0525,
        "diverge_meter_duplicates_total": 1,
        'diverge_meter_suspensions_total{reason="budget exceeded"}': 1,
        'diverge_meter_refusals_total{endpoint="meter",code="401",'
        'reason="missing token"}': 1,
        'diverge_meter_refusals_total{endpoint="meter",code="400",'
        'reason="invalid body"}': 1,
        'diverge_meter_refusals_total{endpoint="meter",code="429",'
        'reason="budget exceeded"}': 1,
        'diverge_meter_refusals_total{endpoint="meter",code="401",'
        'reason="task not live"}': 1,
        'diverge_meter_refusals_total{endpoint="complete",code="401",'
        'reason="task not live"}': 1,
    }
    got = {k: metric(m, k) for k in want}
    t.ok(all(got[k] is not None and abs(got[k] - v) < 1e-9
             for k, v in want.items()), "meter metrics: charges, tokens, "
         "dollars, retries, suspensions and refusals counted exactly", got)
    s, _, j = d.json("POST", "/api/v1/agenttask/meter", "{}",
                     {"Content-Type": "application/jsonx"})
    t.eq(s, 415, "meter with a content type that only starts like JSON's: "
         "415")
    s, _, j = d.json("POST", "/api/v1/agenttask/meter", "{}",
                     {"Content-Type": "Application/JSON; charset=utf-8"})
    t.eq(s, 400, "meter with JSON's content type and parameters: read "
         "(an empty body: 400)")
    t.ok((metric(m, 'diverge_agenttask_phase_transitions_total'
                    '{phase="Provisioning"}') or 0) >= 1 and
         (metric(m, 'diverge_reconciles_total{result="success"}') or 0) +
         (metric(m, 'diverge_reconciles_total{result="requeue"}') or 0)
         >= 1 and
         (metric(m, "diverge_reconcile_duration_seconds_count") or 0) >= 1
         and metric(m, 'diverge_workqueue_depth{queue="reconciler"}')
         is not None, "reconciler metrics: phase changes, reconciles by "
         "result, their duration, the queue's depth",
         [ln for ln in m.splitlines() if "reconcil" in ln or "phase" in ln
          or "workqueue" in ln])
    t.eq(d.stop(), 0, "clean stop")

    # a key file with loose permissions: refuse to start
    os.chmod(keyfile, 0o644)
    d2 = Daemon("log: {{level: info}}\n", state_dir=d.state_dir)
    d2.start(wait=False)
    rc = d2.proc.wait(20)
    time.sleep(0.1)
    t.ok(rc != 0 and any("macaroon-root-key" in l and "0644" in l
                         for l in d2.log()),
         "a root key readable by others: refuses to start, naming the file",
         "\n".join(d2.log()[-3:]))

    def refused(what, want):
        d3 = Daemon("log: {{level: info}}\n", state_dir=d.state_dir)
        d3.start(wait=False)
        rc = d3.proc.wait(20)
        time.sleep(0.1)
        t.ok(rc != 0 and any(want in l for l in d3.log()),
             "%s: refuses to start, saying why" % what,
             "\n".join(d3.log()[-3:]))

    # a key that is a link to a 0600 file elsewhere (someone else's)
    os.chmod(keyfile, 0o600)
    other = keyfile + ".real"
    os.rename(keyfile, other)
    os.symlink(other, keyfile)
    refused("a root key that is a symbolic link", "is a symbolic link")
    os.unlink(keyfile)
    os.rename(other, keyfile)
    # a key owned by another user (needs root to give it away)
    if os.geteuid() == 0:
        os.chown(keyfile, 65534, 65534)
        refused("a root key owned by another user", "owned by uid 65534")
        os.chown(keyfile, 0, 0)
    else:
        t.skip("a root key owned by another user (needs root to chown)")
    # a state directory anyone may write to
    mode = os.stat(d.state_dir).st_mode & 0o7777
    os.chmod(d.state_dir, 0o777)
    refused("a world-writable state_dir", "let any user write")
    os.chmod(d.state_dir, mode)
    children_deleted(t)


def children_deleted(t):
    """Someone deletes a live task's children: the reconciler makes them
    again. The Sandbox comes back (a warning says so: the agent's run
    starts over); the token Secret comes back with a new token, the old
    one revoked and refused by the meter, the new one charged."""
    d = Daemon("log: {{level: info}}\n").start()
    SB = "/apis/agents.x-k8s.io/v1beta1/namespaces/%s/sandboxes" % NS
    s, _ = api(d, "POST", TASKS, {
        "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
        "metadata": {"name": "fix-pr-8"}, "spec": {"objective": "heal"}})

    def get(path):
        s, obj = api(d, "GET", path)
        return obj if s == 200 else None

    sb = wait(lambda: get(SB + "/fix-pr-8"))
    t.ok(s == 201 and sb, "a task and its Sandbox")
    uid = (sb or {}).get("metadata", {}).get("uid")
    t.eq(api(d, "DELETE", SB + "/fix-pr-8")[0], 200, "its Sandbox deleted")
    again = wait(lambda: (lambda o: o if o and o["metadata"]["uid"] != uid
                           else None)(get(SB + "/fix-pr-8")))
    t.ok(again and d.wait_log("sandbox missing, made again"),
         "made again, with a warning", again and again["metadata"])

    old_id = get(TASKS + "/fix-pr-8")["status"]["tokenId"]
    old = base64.b64decode(get(SECRETS + "/fix-pr-8-token")["data"][
        "token"]).decode()
    t.eq(api(d, "DELETE", SECRETS + "/fix-pr-8-token")[0], 200,
         "its token Secret deleted")
    task = wait(lambda: (lambda o: o if o and o.get("status", {}).get(
        "tokenId") not in (None, old_id) else None)(
        get(TASKS + "/fix-pr-8")))
    sec = get(SECRETS + "/fix-pr-8-token")
    new = base64.b64decode(sec["data"]["token"]).decode() if sec else ""
    t.ok(task and new and new != old, "made again with a new token",
         task and task.get("status"))
    body = {"requestId": "h1", "iteration": 1, "model": "m",
            "tokensUsed": 5, "costUSD": 0.001}
    s1, _, j1 = meter(d, old, body)
    s2, _, j2 = meter(d, new, body)
    t.ok(s1 == 401 and s2 == 200 and j2.get("totalTokensUsed") == 5,
         "the old token is refused, the new one charged", (s1, j1, s2, j2))
    t.eq(d.stop(), 0, "clean stop")


run_tests(main)
