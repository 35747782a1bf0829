"""Credentials quoted by an upstream error never reach diverged's log or
what users see. The fake GitHub answers the permission check with a 403
whose message quotes the token it was sent (bare, then as the whole
Authorization line, as a proxy in front of an API may, then only its
last 20 characters): the log line that refuses the comment says
[redacted], in text and in JSON format, also for the token github.token
is rotated to by SIGHUP.
The fake kube-apiserver refuses the reconciler's writes with a Status
that quotes the Authorization header (the exec plugin's token): the log
and the task's Stalled condition say [redacted], never the token."""

import copy
import json
import os
import shutil
import signal
import sys
import uuid

from divtest import Daemon, FakeKube, ScmFake, run_tests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_kube_mode  # noqa: E402
from test_kube_mode import write_files  # noqa: E402
from test_scm_commands import bot_daemon, gh_comment, wait  # noqa: E402

GH_TOKEN = "ghp_botREDACTme0123456789abcdef"
GH_TOKEN2 = "ghp_rotREDACTme9876543210fedcba"   # after SIGHUP
# what shows either token, whole or cut to its last 20 characters
TAILS = (GH_TOKEN[-20:], GH_TOKEN2[-20:])
KUBE_TOKEN = "kube-tok-REDACTme-9876543210"
NS = "default"
TASKS = "/apis/divergedev.com/v1alpha1/namespaces/%s/agenttasks" % NS

# test_kube_mode's GitHub, with long tokens and the comments PR 42 gets
SEED = copy.deepcopy(test_kube_mode.SEED)
SEED["github"]["tokens"] = {GH_TOKEN: "diverge-bot", GH_TOKEN2: "diverge-bot"}
SEED["github"]["repos"][0]["pulls"][0]["comments"] = [
    {"id": cid, "user": "alice", "body": "/diverge fix it"}
    for cid in (2001, 2002, 2003, 2004)]

SCM_CONFIG = """
log:
  level: info
  format: {fmt}
controller:
  enabled: false
github:
  enabled: true
  api_url: {{gh}}
  webhook_secrets: ["file:{{{{secret_file}}}}"]
  token: "file:{{{{tmp}}}}/gh-token"
"""

KUBE_CONFIG = """log: {{level: info}}
kubernetes: {{mode: kubeconfig, kubeconfig: "{tmp}/kc"}}
controller: {{namespace: diverge-system}}
"""


def scm(t, fmt):
    fake = ScmFake()
    fake.call("POST", "/_fake/seed", SEED)

    def token(d):
        with open(os.path.join(d.tmp, "gh-token"), "w") as f:
            f.write(GH_TOKEN + "\n")
    d = bot_daemon(fake, SCM_CONFIG.format(fmt=fmt), {}, token)
    for cid, echo in ((2001, "token"), (2002, "header"), (2003, "token"),
                      (2004, "tail")):
        if cid == 2003:
            # SIGHUP re-reads github.token: the new one is hidden too
            with open(os.path.join(d.tmp, "gh-token"), "w") as f:
                f.write(GH_TOKEN2 + "\n")
            n = sum("reloaded secrets" in ln for ln in d.log())
            d.send_signal(signal.SIGHUP)
            t.ok(wait(lambda: sum("reloaded secrets" in ln
                                  for ln in d.log()) > n),
                 "%s: SIGHUP: github.token rotated" % fmt)
        fake.call("POST", "/_fake/faults", {
            "status": 403, "count": 1, "provider": "github",
            "match": "/permission", "echo_auth": echo})
        s, _, _ = d.github("issue_comment", gh_comment(
            cid, 42, "alice", "/diverge fix it"), str(uuid.uuid4()))
        t.eq(s, 202, "%s %s: a /diverge fix comment: 202" % (fmt, echo))
        n = cid - 2000
        lines = wait(lambda: (lambda ls: ls if len(ls) >= n else None)(
            [ln for ln in d.log() if "author check failed" in ln]))
        t.ok(lines, "%s %s: the refusal is logged" % (fmt, echo),
             d.log()[-10:])
        line = lines[n - 1] if lines else ""
        t.ok("[redacted]" in line and not [x for x in TAILS if x in line],
             "%s %s: the log line quotes the 403's message with the "
             "token [redacted]" % (fmt, echo), line)
        if fmt == "json" and line:
            t.ok("[redacted]" in json.loads(line).get("error", ""),
                 "json %s: the line is valid JSON, the error redacted" %
                 echo, line)
    t.ok(not [ln for ln in d.log() for x in TAILS if x in ln],
         "%s: neither token, nor its last 20 characters, is in any log "
         "line" % fmt)
    comments = fake.state()["github"]["repos"]["myorg/checkout"][
        "pulls"]["42"]["comments"]
    t.ok(comments and not [c for c in comments for x in TAILS
                           if x in (c.get("body") or "")],
         "%s: the replies on the PR do not quote it" % fmt, comments)
    t.eq(d.stop(), 0, "%s: clean stop" % fmt)
    fake.stop()


def kube(t):
    if shutil.which("openssl") is None:
        t.skip("the fake kube-apiserver needs openssl for its CA")
        return
    fake = FakeKube(token=KUBE_TOKEN)
    d = Daemon(KUBE_CONFIG)
    write_files(d, fake)    # an exec plugin gives KUBE_TOKEN
    try:
        d.start()
        # every child the reconciler writes is refused by a proxy that
        # quotes the request's Authorization header
        fake.control("POST", "/_fake/faults", {
            "status": 403, "count": 100000, "method": "POST",
            "match": "/namespaces/%s/sandboxes" % NS, "echo_auth": True})
        s, _ = fake.request("POST", TASKS, {
            "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": "fix-redact"},
            "spec": {"objective": "x"}})
        t.eq(s, 201, "kube: a task on the cluster")

        def stalled():
            s, task = fake.request("GET", TASKS + "/fix-redact")
            for c in (task or {}).get("status", {}).get("conditions", []):
                if c.get("type") == "Stalled" and c.get("status") == "True":
                    return c
            return None
        c = wait(stalled, 30)
        t.ok(c and "[redacted]" in c.get("message", "") and
             KUBE_TOKEN not in json.dumps(c),
             "kube: the Stalled condition quotes the refusal, the token "
             "[redacted]", c or fake.request("GET", TASKS + "/fix-redact"))
        # the line follows the status write the condition came from
        lines = wait(lambda: [ln for ln in d.log() if "[redacted]" in ln],
                     10)
        t.ok(lines, "kube: the log quotes the refusal with [redacted]",
             d.log()[-10:])
        t.ok(not [ln for ln in d.log() if KUBE_TOKEN in ln],
             "kube: the token is in no log line",
             [ln for ln in d.log() if KUBE_TOKEN in ln][:3])
        t.eq(d.stop(), 0, "kube: clean stop")
    finally:
        fake.stop()


def main(t):
    scm(t, "text")
    scm(t, "json")
    kube(t)


if __name__ == "__main__":
    run_tests(main)
