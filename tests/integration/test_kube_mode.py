"""diverged on a Kubernetes API server instead of its embedded store: the
fake kube-apiserver of tests/fakes (HTTPS with a test CA, a bearer token,
409s, watches) reached through a kubeconfig, and the fake GitHub of
tests/fakes/scm_fake.py. The root key Secret is made on first start; a
/diverge fix comment on a PR creates the task on the cluster; the
reconciler gives it its token Secret and Sandbox; the test plays
agent-sandbox (Sandbox Ready); the meter charges through
resourceVersion-guarded status writes; the agent completes the task; the
sticky comment on the PR follows it to Completed; SIGTERM stops the daemon
cleanly."""

import base64
import json
import os
import shutil
import sys
import time
import uuid

from divtest import Daemon, FakeKube, ScmFake, run_tests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_scm_commands import gh_comment, wait  # noqa: E402

MARKER = "<!-- diverge-agent-task -->"

NS = "default"
TASKS = "/apis/divergedev.com/v1alpha1/namespaces/%s/agenttasks" % NS
SANDBOXES = "/apis/agents.x-k8s.io/v1beta1/namespaces/%s/sandboxes" % NS
CLAIMS = ("/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/%s/"
          "sandboxclaims" % NS)
SECRETS = "/api/v1/namespaces/%s/secrets"
RBAC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                    "deploy", "kubernetes", "rbac.yaml")



SEED = {"github": {
    "user": {"login": "diverge-bot", "id": 900},
    "tokens": {"ghp_bot": "diverge-bot"},
    "users": [{"login": "alice", "id": 1}],
    "repos": [{"full_name": "myorg/checkout", "id": 501,
               "default_branch": "main",
               "collaborators": {"alice": "admin", "diverge-bot": "write"},
               "pulls": [{"number": 42, "title": "N+1", "user": "alice",
                          "head": {"ref": "fix-n1"},
                          "base": {"ref": "main"}, "comments": []},
                         {"number": 43, "title": "warm", "user": "alice",
                          "head": {"ref": "fix-warm"},
                          "base": {"ref": "main"}, "comments": []}]}]}}

CONFIG = """log: {{level: info}}
kubernetes: {{mode: kubeconfig, kubeconfig: "{tmp}/kc"}}
controller: {{namespace: diverge-system}}
github:
  enabled: true
  api_url: %s
  webhook_secrets: ["file:{secret_file}"]
  token: "file:{tmp}/gh-token"
"""


def main(t):
    if shutil.which("openssl") is None:
        t.skip_all("the fake kube-apiserver needs openssl for its CA")
    # the daemon's token is held to the RBAC we ship for it
    fake = FakeKube(rbac=[RBAC])
    scm = ScmFake()
    try:
        scm.call("POST", "/_fake/seed", SEED)
        run(t, fake, scm)
        run_warm(t, fake, scm)
    finally:
        scm.stop()
        fake.stop()


def stickies(scm):
    pulls = scm.state()["github"]["repos"]["myorg/checkout"]["pulls"]
    return [c for c in pulls["42"]["comments"] if c.get("user") ==
            "diverge-bot" and MARKER in (c.get("body") or "")]


def write_files(d, fake):
    """The daemon's kubeconfig (JSON is YAML) and GitHub token. Its user
    gets the fake's token from an exec credential plugin, as a managed
    cluster's kubeconfig does (the plugin counts its runs in a file)."""
    fake.kubeconfig(os.path.join(d.tmp, "kc"), fake.exec_user(
        d, "echo run >> \"$(dirname \"$0\")/plugin-runs\"\n"), NS)
    with open(os.path.join(d.tmp, "gh-token"), "w") as f:
        f.write("ghp_bot\n")


def run(t, fake, scm):
    d = Daemon(CONFIG % (scm.base + "/github"))
    write_files(d, fake)
    d.start()
    t.ok(any("diverged started" in l and "store=kubernetes" in l
             for l in d.log()), "diverged starts on the cluster's API",
         "\n".join(d.log()[-10:]))
    with open(os.path.join(d.tmp, "plugin-runs")) as f:
        runs = len(f.readlines())
    t.ok(runs == 1, "with the token its kubeconfig's exec plugin gave, "
         "run once (%d)" % runs)

    s, sec = fake.request("GET", SECRETS % "diverge-system" +
                          "/diverge-macaroon-root-key")
    key = base64.b64decode((sec or {}).get("data", {}).get("root-key", ""))
    t.ok(s == 200 and len(key.strip()) == 64,
         "the root key Secret is created in controller.namespace", (s, sec))

    s, _, _ = d.github("issue_comment", gh_comment(
        1001, 42, "alice", "/diverge fix the N+1 queries"), str(uuid.uuid4()))
    t.eq(s, 202, "a /diverge fix comment on PR 42: 202")
    task = wait(lambda: (lambda r: r[1] if r[0] == 200 else None)(
        fake.request("GET", TASKS + "/fix-pr-42")))
    t.ok(task and task["spec"]["objective"] == "the N+1 queries",
         "the command created the task on the cluster", task)

    def provisioned():
        s, task = fake.request("GET", TASKS + "/fix-pr-42")
        s2, _ = fake.request("GET", SANDBOXES + "/fix-pr-42")
        s3, _ = fake.request("GET", SECRETS % NS + "/fix-pr-42-token")
        return task if s == 200 and s2 == 200 and s3 == 200 and \
            task.get("status", {}).get("phase") == "Provisioning" else None
    task = wait(provisioned)
    t.ok(task, "the reconciler: Provisioning, a Sandbox and a token "
         "Secret on the cluster", task)

    # play agent-sandbox: the Sandbox is Ready for its generation
    def ready():
        s, sb = fake.request("GET", SANDBOXES + "/fix-pr-42")
        if s != 200:
            return None
        ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        gen = sb["metadata"].get("generation", 1)
        sb["status"] = {"conditions": [
            {"type": "Ready", "status": "True", "reason": "DependenciesReady",
             "message": "played", "observedGeneration": gen,
             "lastTransitionTime": ts}], "podIPs": ["10.0.0.7"]}
        fake.request("PUT", SANDBOXES + "/fix-pr-42/status", sb)
        s, task = fake.request("GET", TASKS + "/fix-pr-42")
        return s == 200 and task.get("status", {}).get("phase") == "Active"
    t.ok(wait(ready), "the Sandbox Ready: the task is Active")

    s, sec = fake.request("GET", SECRETS % NS + "/fix-pr-42-token")
    token = base64.b64decode(sec["data"]["token"]).decode()
    hdr = {"Content-Type": "application/json",
           "Authorization": "Bearer " + token}
    charges = []  # (status, headers, body)
    for rid in ("r1", "r2", "r1"):
        charges.append(d.json("POST", "/api/v1/agenttask/meter", json.dumps(
            {"requestId": rid, "iteration": 1, "model": "claude-3",
             "tokensUsed": 1000, "costUSD": 0.01}), hdr))
    t.ok([c[0] for c in charges] == [200, 200, 200] and
         [(c[2] or {}).get("charged") for c in charges] ==
         [True, True, False],
         "meter: two charges and a retry, through the cluster", charges)
    # the API server refuses the read: nothing charged, retry later
    fake.request("POST", "/_fake/faults", {
        "status": 403, "count": 1, "method": "GET",
        "match": "/agenttasks/fix-pr-42"})
    s, h, j = d.json("POST", "/api/v1/agenttask/meter", json.dumps(
        {"requestId": "r9", "iteration": 1, "model": "claude-3",
         "tokensUsed": 1000, "costUSD": 0.01}), hdr)
    t.ok(s == 503 and h.get("retry-after") == "5" and
         j == {"error": "the store is unavailable, retry"},
         "meter: the store failing is 503 with Retry-After", (s, h, j))
    s, task = fake.request("GET", TASKS + "/fix-pr-42")
    st = task.get("status", {})
    t.ok(st.get("tokensConsumed") == 2000 and
         st.get("costUSD") == "0.020000",
         "the charges are in the task's status on the cluster", st)

    # the timeout raised past the token's expiry: the token is extended in
    # its Secret (the pod's volume), the Sandbox keeps running
    old_id = st.get("tokenId")
    s, _ = fake.request("PATCH", TASKS + "/fix-pr-42", {"spec": {"sandbox": {
        "timeoutSeconds": 4 * 3600}}}, ctype="application/merge-patch+json")
    t.eq(s, 200, "spec.sandbox.timeoutSeconds raised to 4 h")

    def extended():
        s, sec = fake.request("GET", SECRETS % NS + "/fix-pr-42-token")
        s2, task = fake.request("GET", TASKS + "/fix-pr-42")
        ann = (sec or {}).get("metadata", {}).get("annotations", {})
        st = (task or {}).get("status", {})
        if s != 200 or s2 != 200 or \
                ann.get("divergedev.com/token-id") in (None, old_id) or \
                st.get("tokenId") != ann.get("divergedev.com/token-id"):
            return None
        return sec, st
    ext = wait(extended)
    t.ok(ext and ext[0]["metadata"]["annotations"].get(
        "divergedev.com/token-extends") == old_id,
         "a new token in the Secret and status.tokenId, extending the old",
         ext)
    sec, st = ext or ({"data": {"token": ""}}, {})
    s, sb = fake.request("GET", SANDBOXES + "/fix-pr-42")
    t.ok(st.get("phase") == "Active" and sb["spec"]["operatingMode"] ==
         "Running" and sb["metadata"]["annotations"].get(
             "divergedev.com/token-id") == st.get("tokenId"),
         "the task stays Active, its Sandbox Running (not restarted)",
         (st.get("phase"), sb["spec"], sb["metadata"].get("annotations")))
    new_hdr = dict(hdr, Authorization="Bearer " + base64.b64decode(
        sec["data"]["token"]).decode())
    ok = [d.json("POST", "/api/v1/agenttask/meter", json.dumps(
        {"requestId": rid, "iteration": 1, "model": "claude-3",
         "tokensUsed": 1, "costUSD": 0}), h)[0]
        for rid, h in (("x1", new_hdr), ("x2", hdr))]
    t.eq(ok, [200, 200], "both the new and the old token charge")

    repo_url = fake.request("GET", TASKS + "/fix-pr-42")[1]["spec"][
        "repository"]["url"]
    report = {"commit": "0123abcd", "branch": "x",
              "pullRequestUrl": repo_url.rstrip("/") + "/pull/42"}
    s, _, body = d.json("POST", "/api/v1/agenttask/complete", json.dumps(
        dict(report, result="succeeded", message="done")), hdr)
    t.eq(s, 200, "complete: 200")
    done = wait(lambda: (lambda r: r[0] == 200 and r[1].get(
        "status", {}).get("phase") == "Completed")(
        fake.request("GET", TASKS + "/fix-pr-42")))
    t.ok(done, "the task is Completed on the cluster")
    # the API server prunes what the CRD's schema does not know
    t.eq(fake.request("GET", TASKS + "/fix-pr-42")[1]["status"].get(
        "result"), report, "the runner's report (commit, branch, pull "
        "request) is kept in status.result on the cluster")
    sticky = wait(lambda: [c for c in stickies(scm)
                           if "Completed" in c.get("body", "")])
    t.ok(sticky and len(stickies(scm)) == 1,
         "one sticky comment on the PR, now saying Completed", stickies(scm))
    pulls = scm.state()["github"]["repos"]["myorg/checkout"]["pulls"]
    t.ok([c for c in pulls["42"]["comments"] if c.get("user") ==
          "diverge-bot" and MARKER not in (c.get("body") or "") and
          "@alice" in (c.get("body") or "")],
         "and one new comment tells @alice the run finished",
         pulls["42"]["comments"])
    s, _, _ = d.json("POST", "/api/v1/agenttask/meter", json.dumps(
        {"requestId": "r3", "iteration": 1, "model": "claude-3",
         "tokensUsed": 1, "costUSD": 0}), hdr)
    t.eq(s, 401, "after completion the token is refused")

    s, _ = fake.request("DELETE", TASKS + "/fix-pr-42")
    t.eq(s, 200, "the task deleted")
    gone = wait(lambda: fake.request("GET", SANDBOXES +
                                     "/fix-pr-42")[0] == 404)
    t.ok(gone, "its Sandbox goes with it (owner reference)")
    t.eq(d.stop(), 0, "SIGTERM: exit 0")

    # everything above ran as the service account of deploy/kubernetes
    reqs = fake.control("GET", "/_fake/requests")
    mine = [r for r in reqs if r.get("user") ==
            "system:serviceaccount:diverge-system:diverged"]
    verbs = {(r["method"], r["path"].split("/")[-1]) for r in mine}
    t.ok(len(mine) > 20 and ("PUT", "status") in verbs,
         "the daemon's requests were all made as the service account",
         (len(mine), sorted(verbs)[:20]))
    denied = [(r["method"], r["path"], r["query"]) for r in mine
              if r.get("forbidden")]
    t.eq(denied, [], "deploy/kubernetes/rbac.yaml grants every request the "
         "whole flow made")
    s, st = fake.request("DELETE", TASKS, token=fake.info["token"])
    t.ok(s == 403 and (st or {}).get("reason") == "Forbidden" and
         "cannot deletecollection resource \"agenttasks\"" in
         (st or {}).get("message", ""),
         "and nothing more: a deletecollection it was not granted is a 403",
         (s, st))


def pod_token(sb):
    """The DIVERGE_MACAROON_TOKEN of a Sandbox's pod template."""
    for c in sb["spec"]["podTemplate"]["spec"]["containers"]:
        for e in c.get("env") or []:
            if e["name"] == "DIVERGE_MACAROON_TOKEN":
                return e["value"]
    return None


def run_warm(t, fake, scm):
    """Warm-pool mode, paused and resumed: the test plays the claim
    controller (a claim with env is cold-started as a Sandbox named as the
    claim, its env applied then only) and agent-sandbox."""
    d = Daemon(CONFIG % (scm.base + "/github") +
               "sandbox: {{warm_pool: 1}}\n")
    write_files(d, fake)
    fake.control("DELETE", "/_fake/requests")
    d.start()
    name = "fix-pr-43"
    s, _, _ = d.github("issue_comment", gh_comment(
        1002, 43, "alice", "/diverge fix warm it up"), str(uuid.uuid4()))
    t.eq(s, 202, "warm pool: a /diverge fix comment on PR 43: 202")
    claim = wait(lambda: (lambda r: r[1] if r[0] == 200 else None)(
        fake.request("GET", CLAIMS + "/" + name)))
    t.ok(claim and pod_token({"spec": {"podTemplate": {"spec": {
        "containers": [claim["spec"]]}}}}),
         "a SandboxClaim whose env carries the token", claim)

    def play(ready, reason, suspended, ip):
        # as a controller does: a write that lost a race with diverged's
        # own (409 Conflict: a stale resourceVersion) is made again from
        # a fresh read
        for _ in range(20):
            s, sb = fake.request("GET", SANDBOXES + "/" + name)
            ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            gen = sb["metadata"].get("generation", 1)
            cond = {"type": "Ready", "status": ready, "reason": reason,
                    "message": "played", "observedGeneration": gen,
                    "lastTransitionTime": ts}
            sb["status"] = {"conditions": [cond, {
                "type": "Suspended",
                "status": suspended and "True" or "False",
                "reason": suspended and "PodTerminated" or "NotSuspended",
                "message": "", "observedGeneration": gen,
                "lastTransitionTime": ts}]}
            if ip:
                sb["status"]["podIPs"] = [ip]
            if fake.request("PUT", SANDBOXES + "/" + name + "/status",
                            sb)[0] != 409:
                break
        # the claim mirrors its Sandbox's Ready (diverged watches claims)
        for _ in range(20):
            s, c = fake.request("GET", CLAIMS + "/" + name)
            c["status"] = {"sandbox": {"name": name}, "conditions": [
                dict(cond, observedGeneration=c["metadata"]["generation"])]}
            if fake.request("PUT", CLAIMS + "/" + name + "/status",
                            c)[0] != 409:
                break

    # the claim controller: a cold start from the pool's template
    s, _ = fake.request("POST", SANDBOXES, {
        "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
        "metadata": {"name": name, "labels": {
            "agents.x-k8s.io/claim-uid": claim["metadata"]["uid"],
            "agents.x-k8s.io/launch-type": "cold"},
            "ownerReferences": [{
                "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                "kind": "SandboxClaim", "name": name,
                "uid": claim["metadata"]["uid"], "controller": True,
                "blockOwnerDeletion": True}]},
        "spec": {"operatingMode": "Running", "podTemplate": {
            "metadata": {"labels": {"app": "pool-template"}},
            "spec": {"containers": [{"name": "runner", "image": "r:1",
                                     "env": claim["spec"]["env"]}]}}}})
    t.eq(s, 201, "the claim's Sandbox is cold-started")
    play("True", "DependenciesReady", False, "10.0.0.9")

    def phase(want):
        def f():
            s, task = fake.request("GET", TASKS + "/" + name)
            return task if s == 200 and task.get("status", {}).get(
                "phase") == want else None
        return f
    t.ok(wait(phase("Active")), "the claim's Sandbox Ready: Active")
    s, sb = fake.request("GET", SANDBOXES + "/" + name)
    old_tok = pod_token(sb)

    fake.request("PATCH", TASKS + "/" + name, {"spec": {"suspended": True}},
                 ctype="application/merge-patch+json")
    t.ok(wait(lambda: fake.request("GET", SANDBOXES + "/" + name)[1][
        "spec"]["operatingMode"] == "Suspended"),
         "paused: the claim's Sandbox is Suspended")
    play("False", "SandboxSuspended", True, None)
    t.ok(wait(phase("Paused")), "its pod gone: Paused")

    fake.request("PATCH", TASKS + "/" + name, {"spec": {"suspended": False}},
                 ctype="application/merge-patch+json")

    def resumed():
        # the pass's writes in their order: the token's Secret, the
        # Sandbox, then the task's status (a status write that lost a race
        # with the notifier's is made again by the next pass): done when
        # the status names the token the Sandbox records
        s, sb = fake.request("GET", SANDBOXES + "/" + name)
        s2, sec = fake.request("GET", SECRETS % NS + "/" + name + "-token")
        s3, task = fake.request("GET", TASKS + "/" + name)
        if s != 200 or s2 != 200 or s3 != 200 or \
                sb["spec"]["operatingMode"] != "Running" or \
                task.get("status", {}).get("phase") not in (
                    "Provisioning", "Active") or \
                task["status"].get("tokenId") != sb["metadata"].get(
                    "annotations", {}).get("divergedev.com/token-id"):
            return None
        tok = base64.b64decode(sec["data"]["token"]).decode()
        return (sb, tok) if tok != old_tok else None
    res = wait(resumed)
    sb, tok = res or ({"spec": {"podTemplate": {"spec": {
        "containers": []}}}, "metadata": {}}, "")
    s, claim = fake.request("GET", CLAIMS + "/" + name)
    s, task = fake.request("GET", TASKS + "/" + name)
    t.ok(res and pod_token(sb) == tok and sb["metadata"].get(
        "annotations", {}).get("divergedev.com/token-id") ==
        task["status"].get("tokenId") and sb["spec"]["podTemplate"][
            "metadata"] == {"labels": {"app": "pool-template"}},
         "resumed: the Sandbox's pod template carries the new token (its "
         "id recorded), its metadata untouched",
         (sb.get("metadata", {}).get("annotations"), sb["spec"]))
    t.ok(pod_token({"spec": {"podTemplate": {"spec": {
        "containers": [claim["spec"]]}}}}) == tok,
         "and so does the claim's env", claim["spec"])

    def meter(token, rid):
        return d.json("POST", "/api/v1/agenttask/meter", json.dumps(
            {"requestId": rid, "iteration": 1, "model": "claude-3",
             "tokensUsed": 1, "costUSD": 0}),
            {"Content-Type": "application/json",
             "Authorization": "Bearer " + (token or "")})[0]
    t.eq([meter(pod_token(sb), "w1"), meter(old_tok, "w2")], [200, 401],
         "the token the resumed pod has charges, the old one is revoked")
    t.eq(d.stop(), 0, "warm pool: SIGTERM: exit 0")

    reqs = fake.control("GET", "/_fake/requests")
    denied = [(r["method"], r["path"], r["query"]) for r in reqs
              if r.get("user") ==
              "system:serviceaccount:diverge-system:diverged" and
              r.get("forbidden")]
    t.ok(len(reqs) > 20 and denied == [],
         "warm pool: deploy/kubernetes/rbac.yaml grants every request",
         (len(reqs), denied))


if __name__ == "__main__":
    run_tests(main)
