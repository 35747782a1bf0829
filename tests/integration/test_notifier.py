"""The sticky status comment end to end: diverged with its reconciler, the
fake GitHub and GitLab of tests/fakes/scm_fake.py, and the test playing the
agent-sandbox controller (Sandbox Ready) and the agent (meter calls,
complete). Checks: one comment per PR/MR, updated in place through
Active, Paused (budget), Active again (/diverge resume +5) and Completed,
plus one notification that mentions who started the task; the same on
GitLab; a restart between a phase change and the comment update; a
comment deleted by a person; duplicates from a race; a look-alike by
another user; the comment found on page 3; a PR/MR that refuses the
bot's writes (archived, locked, access lost); several tasks on one PR
(the comment follows one, the same one every time; every task's
finished run is notified once, also across a restart); a GitLab
internal note's objective and the replies to internal notes stay
internal; gitlab.token rotated to another user's (SIGHUP): a new sticky
note by that user, the old one not edited (GitLab: 403); GitLab pages
without X-Total, X-Next-Page or Link, GitHub pages without Link (the
sticky comment on page 3, or ending a full page 2); a next page that
goes back to one read already (a retry, not a second sticky comment);
one GET /user per provider after a SIGHUP, for the daemon and the
notifier.

DIVERGED_BIN runs another diverged binary (a private build)."""

import base64
import json
import os
import re
import sys
import time
import urllib.request
import uuid

import divtest
from divtest import ScmFake, run_tests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_scm_commands import (api, bot_daemon, get_task,  # noqa
                               gh_comment, gh_reactions, gl_awards, gl_note,
                               wait)

if os.environ.get("DIVERGED_BIN"):
    divtest.DIVERGED = os.environ["DIVERGED_BIN"]

NS = "team-a"
MARKER = "<!-- diverge-agent-task -->"
SANDBOXES = "/apis/agents.x-k8s.io/v1beta1/namespaces/%s/sandboxes" % NS
TASKS = "/apis/divergedev.com/v1alpha1/namespaces/%s/agenttasks" % NS
SECRETS = "/api/v1/namespaces/%s/secrets" % NS

AGENT_YAML = ("version: \"1\"\nagent:\n  maxIterations: 50\n"
              "  budgetUSD: \"2.50\"\n  capabilities: [\"claude-*\"]\n")

THROTTLE_S = 3     # DIVERGE_TEST_NOTIFIER_THROTTLE_MS: 30 s otherwise
FILLER = 250        # comments before the sticky one on PR 43: page 3
QUOTED_MARKER = ("**diverge** could not run this comment:\n> agent.yaml: "
                 "bad key near '" + MARKER + "'")


def seed():
    pr43 = [{"id": 5000 + i, "user": "bob", "body": "filler %d" % i}
            for i in range(FILLER)]
    pr43 += [
        {"id": 5900, "user": "mallory",
         "body": MARKER + "\nlooks like the bot's"},
        # a reply of the bot's that quotes the marker (an error echoed)
        {"id": 5899, "user": "diverge-bot", "body": QUOTED_MARKER},
        {"id": 5901, "user": "diverge-bot", "body": MARKER + "\nold run"},
        {"id": 5902, "user": "diverge-bot", "body": MARKER + "\nraced"}]
    return {
        "github": {
            "user": {"login": "diverge-bot", "id": 900},
            "tokens": {"ghp_bot": "diverge-bot"},
            "users": [{"login": "alice", "id": 1}, {"login": "bob", "id": 2},
                      {"login": "mallory", "id": 4}],
            "repos": [{
                "full_name": "myorg/checkout", "id": 501,
                "default_branch": "main",
                "collaborators": {"alice": "admin", "bob": "write",
                                  "diverge-bot": "write"},
                "files": {"main": {".diverge/agent.yaml": AGENT_YAML}},
                "pulls": [
                    {"number": 42, "title": "N+1", "user": "alice",
                     "head": {"ref": "fix-n1"}, "base": {"ref": "main"},
                     "comments": [{"id": 1000 + i, "user": "alice",
                                   "body": "(c)"} for i in range(1, 20)]},
                    {"number": 43, "title": "pages", "user": "bob",
                     "head": {"ref": "pages"}, "base": {"ref": "main"},
                     "comments": pr43},
                    {"number": 44, "title": "crash", "user": "alice",
                     "head": {"ref": "crash"}, "base": {"ref": "main"},
                     "comments": [{"id": 1101, "user": "alice",
                                   "body": "(c)"}]},
                    {"number": 46, "title": "limits", "user": "alice",
                     "head": {"ref": "limits"}, "base": {"ref": "main"},
                     "comments": [{"id": 1460, "user": "alice",
                                   "body": "/diverge status"}]}]}]},
        "gitlab": {
            "user": {"username": "diverge-bot", "id": 950},
            "tokens": ["glpat-bot"],
            "users": [{"username": "pipin", "id": 11}],
            "projects": [{
                "id": 5, "path_with_namespace": "myorg/diaspora",
                "default_branch": "main", "members": {"pipin": 40},
                "files": {"main": {".diverge/agent.yaml": AGENT_YAML}},
                "merge_requests": [{
                    "iid": 2, "id": 2002, "source_branch": "feature",
                    "target_branch": "main", "author": "pipin",
                    "notes": [{"id": 3000 + i, "author": "pipin",
                               "body": "(n)"} for i in range(1, 10)] +
                    [{"id": 3460, "author": "pipin",
                      "body": "/diverge status"}]}]}]},
    }


CONFIG = """
log:
  level: info
namespace: default
repos:
  - match: "127.0.0.1/myorg/*"
    namespace: team-a
github:
  enabled: true
  api_url: {gh}
  webhook_secrets: ["file:{{secret_file}}"]
  token: "file:{{tmp}}/gh-token"
gitlab:
  enabled: true
  api_url: {gl}
  webhook_tokens: ["file:{{gitlab_token_file}}"]
  token: "file:{{tmp}}/gl-token"
"""
# the same without the controller: the tests write the tasks' status
CONFIG_NO_CONTROLLER = CONFIG.replace("namespace: default\n",
                                      "namespace: default\n"
                                      "controller:\n  enabled: false\n")


def gh_comments(fake, number):
    pulls = fake.state()["github"]["repos"]["myorg/checkout"]["pulls"]
    return pulls[str(number)]["comments"]


def gl_notes(fake):
    return fake.state()["gitlab"]["projects"]["5"]["merge_requests"][
        "2"]["notes"]


def stickies(comments, bot="diverge-bot", key="user"):
    return [c for c in comments if c.get(key) == bot and
            (c.get("body") or "").startswith(MARKER)]


def mentions(comments, who, bot="diverge-bot", key="user"):
    return [c for c in comments if c.get(key) == bot and
            MARKER not in (c.get("body") or "") and
            ("@" + who) in (c.get("body") or "")]


def phase(d, name):
    t = get_task(d, name)
    return (t or {}).get("status", {}).get("phase")


def play_ready(d, name):
    """The agent-sandbox controller: the Sandbox is Ready for its
    current generation; while it is Suspended (the reconciler restarts it
    when its pod holds a replaced token) its pod is gone first."""
    def once():
        s, sb = api(d, "GET", SANDBOXES + "/" + name)
        if s != 200:
            return False
        ts = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        gen = sb["metadata"].get("generation", 1)
        up = sb["spec"].get("operatingMode") != "Suspended"
        sb["status"] = {"conditions": [
            {"type": "Ready", "status": "True" if up else "False",
             "reason": "DependenciesReady" if up else "SandboxSuspended",
             "message": "played",
             "observedGeneration": gen, "lastTransitionTime": ts},
            {"type": "Suspended", "status": "False" if up else "True",
             "reason": "NotSuspended" if up else "PodTerminated",
             "message": "",
             "observedGeneration": gen, "lastTransitionTime": ts}]}
        if up:
            sb["status"]["podIPs"] = ["10.0.0.7"]
        s, _ = api(d, "PUT", SANDBOXES + "/" + name + "/status", sb)
        return s == 200
    return wait(lambda: once() and phase(d, name) == "Active", 20)


def token_of(d, name, old=None):
    def get():
        s, sec = api(d, "GET", SECRETS + "/" + name + "-token")
        if s != 200:
            return None
        tok = base64.b64decode(sec["data"]["token"]).decode()
        return tok if tok != old else None
    return wait(get, 20)


def meter(d, token, rid, cost):
    return d.json("POST", "/api/v1/agenttask/meter", json.dumps(
        {"requestId": rid, "iteration": 1, "model": "claude-3",
         "tokensUsed": 1000, "costUSD": cost}),
        {"Content-Type": "application/json",
         "Authorization": "Bearer " + token})


def complete(d, token):
    return d.json("POST", "/api/v1/agenttask/complete", json.dumps(
        {"result": "succeeded", "message": "done", "branch": "x"}),
        {"Content-Type": "application/json",
         "Authorization": "Bearer " + token})


def one_with(list_fn, text, timeout=20):
    """Wait for exactly one sticky comment whose body has text."""
    def ok():
        s = list_fn()
        return s if len(s) == 1 and text in s[0]["body"] else None
    return wait(ok, timeout)


def lifecycle(t, d, name, label, send, list_fn, ment_fn, who):
    """fix -> Active -> budget -> Paused -> resume +5 -> Active ->
    Completed, with one sticky comment throughout."""
    send("/diverge fix make checkout fast")
    t.ok(wait(lambda: get_task(d, name), 20), "%s: /diverge fix makes "
         "task %s" % (label, name))
    t.ok(play_ready(d, name), "%s: the Sandbox is Ready: Active" % label)
    s = one_with(list_fn, "Running")
    t.ok(s, "%s: exactly one sticky comment, Running" % label, list_fn())
    cid = s[0]["id"] if s else None
    tok = token_of(d, name)
    codes = []
    for i in range(10):
        code, _, _ = meter(d, tok, "r%d" % i, 1.0)
        codes.append(code)
        if code == 429:
            break
    t.ok(codes and codes[-1] == 429 and phase(d, name) == "Paused",
         "%s: meter calls until the budget is exceeded: Paused" % label,
         codes)
    s = one_with(list_fn, "Paused")
    t.ok(s and s[0]["id"] == cid and "BudgetExceeded" in s[0]["body"],
         "%s: the same comment is updated (Paused, BudgetExceeded), no "
         "second one" % label, list_fn())
    send("/diverge resume +5")
    t.ok(wait(lambda: phase(d, name) in ("Provisioning", "Active"), 20),
         "%s: /diverge resume +5 restarts the task" % label, phase(d, name))
    t.ok(play_ready(d, name), "%s: Active again" % label)
    s = one_with(list_fn, "Running")
    t.ok(s and s[0]["id"] == cid and "$7.50" in s[0]["body"],
         "%s: the comment shows Running and the bumped budget" % label,
         list_fn())
    tok2 = token_of(d, name, tok)
    code, _, j = complete(d, tok2)
    t.eq(code, 200, "%s: the agent completes" % label)
    s = one_with(list_fn, "Completed")
    t.ok(s and s[0]["id"] == cid and "\u2705" in s[0]["body"],
         "%s: the comment shows \u2705 Completed" % label, list_fn())
    t.ok(wait(lambda: len(ment_fn()) == 1, 20), "%s: one notification "
         "comment mentions @%s" % (label, who), ment_fn())
    time.sleep(1.5)
    t.ok(len(list_fn()) == 1 and len(ment_fn()) == 1, "%s: nothing more "
         "is posted once the comment matches" % label)
    return cid


def gh_delete(fake, cid):
    req = urllib.request.Request(
        fake.base + "/github/repos/myorg/checkout/issues/comments/%d" % cid,
        method="DELETE", headers={"Authorization": "Bearer ghp_bot"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status


def main(t):
    fake = ScmFake()
    fake.call("POST", "/_fake/seed", seed())
    d = bot_daemon(fake, CONFIG, {"DIVERGE_SCM_MAX_WAIT_MS": "2000",
                                  "DIVERGE_TEST_NOTIFIER_THROTTLE_MS":
                                  str(THROTTLE_S * 1000)})
    if not d.wait_log("notifier started", 5):
        d.stop()
        fake.stop()
        t.skip_all("this diverged does not run the notifier "
                   "(notifier_start not wired)")

    n = [0]

    def gh_send(number):
        def send(body):
            n[0] += 1
            cid = 1000 + n[0]
            s, _, _ = d.github("issue_comment", gh_comment(
                cid, number, "alice", body), str(uuid.uuid4()))
            return s
        return send

    def gl_send(body):
        n[0] += 1
        s, _, _ = d.gitlab("Note Hook", gl_note(3000 + n[0], 2, "pipin",
                                                11, body),
                           str(uuid.uuid4()))
        return s

    # ---- GitHub lifecycle on PR 42
    gh42 = lambda: stickies(gh_comments(fake, 42))  # noqa: E731
    cid = lifecycle(t, d, "fix-pr-42", "github", gh_send(42), gh42,
                    lambda: mentions(gh_comments(fake, 42), "alice"),
                    "alice")
    task = get_task(d, "fix-pr-42")
    nt = (task or {}).get("status", {}).get("notifier", {})
    t.ok(nt.get("commentId") == str(cid) and
         nt.get("reportedPhase") == "Completed" and
         len(nt.get("bodyHash", "")) == 64,
         "status.notifier holds commentId, reportedPhase and bodyHash", nt)

    # ---- GitLab lifecycle on MR 2
    gl2 = lambda: stickies(gl_notes(fake), key="author")  # noqa: E731
    lifecycle(t, d, "fix-mr-2", "gitlab", gl_send, gl2,
              lambda: mentions(gl_notes(fake), "pipin", key="author"),
              "pipin")

    # ---- the metrics count what was sent
    mt = d.metrics()
    upd = re.search(r'^diverge_notifier_updates_total\{result="updated"\} '
                    r'(\d+)', mt, re.M)
    fin = re.search(r'^diverge_notifier_notifications_total (\d+)', mt, re.M)
    t.ok(upd is not None and int(upd.group(1)) >= 8,
         "metrics: every phase of both lifecycles counted as an update",
         upd and upd.group(0))
    t.ok(fin is not None and int(fin.group(1)) == 2,
         "metrics: two finished-run notifications", fin and fin.group(0))

    # ---- a person deletes the comment: it is recreated, once
    t.eq(gh_delete(fake, cid), 204, "a person deletes the sticky comment")
    gh_send(42)("/diverge fix again")
    t.ok(wait(lambda: phase(d, "fix-pr-42") in ("Pending", "Provisioning"),
              20), "the finished task runs again")
    s = wait(lambda: (lambda v: v if len(v) == 1 and v[0]["id"] != cid
                      else None)(gh42()), 20)
    t.ok(s, "the deleted comment is recreated, once", gh42())
    time.sleep(1.5)
    t.eq(len(gh42()), 1, "still one sticky comment on PR 42")

    # ---- a rate limit is the credential's, not the PR's: GitHub counts
    # per token (or App installation) and asks clients to stop while
    # limited. PR 42's comment update meets a secondary limit with
    # Retry-After: 5; until it ends no request with that token goes out
    # (PR 46's update and a command's reaction wait, requeued to the
    # reset rather than a fixed minute), then both go through; GitLab's
    # token is another credential and is not held
    gh_send(46)("/diverge fix rate limits")
    gh46 = lambda: stickies(gh_comments(fake, 46))  # noqa: E731
    t.ok(wait(lambda: len(gh46()) == 1, 20), "PR 46: one sticky comment",
         gh46())
    cid42 = (gh42() or [{"id": 0}])[0]["id"]
    cid46 = (gh46() or [{"id": 0}])[0]["id"]
    fake.call("POST", "/_fake/faults", {"status": 403, "count": 1,
                                        "secondary": True, "retry_after": 5,
                                        "method": "PATCH",
                                        "match": "/issues/comments/%d" %
                                        cid42})

    def limited():
        return [r for r in fake.requests() if r.get("status") == 403 and
                r.get("path", "").endswith("/comments/%d" % cid42)]
    t.ok(play_ready(d, "fix-pr-42"), "PR 42: Active")
    hit = wait(lambda: limited(), 15)
    t.ok(hit, "PR 42: its comment update meets a secondary limit (403, "
         "Retry-After: 5)")
    t0 = hit[0]["time"] if hit else time.time()
    seq0 = hit[0]["seq"] if hit else 0
    t.ok(play_ready(d, "fix-pr-46"), "PR 46: Active while the token is "
         "limited")
    d.github("issue_comment", gh_comment(1460, 46, "alice",
                                         "/diverge status"),
             str(uuid.uuid4()))
    d.gitlab("Note Hook", gl_note(3460, 2, "pipin", 11, "/diverge status"),
             str(uuid.uuid4()))
    t.ok(wait(lambda: gl_awards(fake, 2, 3460) == ["eyes"], 10) and
         time.time() < t0 + 5,
         "GitLab (another credential) is not held: its reaction is posted "
         "while GitHub's token is limited", time.time() - t0)
    s46 = one_with(gh46, "Running", 25)
    t.ok(s46 and wait(lambda: gh_reactions(fake, 46, 1460) == ["eyes"],
                      15),
         "PR 46: the comment update and the command's reaction go through "
         "once the limit ends", [ln for ln in d.log() if "fix-pr-46" in
                                 ln][-5:])
    reqs = [r for r in fake.requests() if r.get("provider") == "github"
            and r.get("user") == "diverge-bot" and r["seq"] > seq0]
    early = [(r["method"], r["path"], r["status"], round(r["time"] - t0, 2))
             for r in reqs if r["time"] < t0 + 4.9]
    t.ok(not early, "no request with the limited token goes out before "
         "Retry-After has passed (not PR 46's update, not the reaction)",
         early)
    p46 = [r for r in reqs if r.get("method") == "PATCH" and
           r.get("path", "").endswith("/comments/%d" % cid46) and
           r.get("status") == 200]
    react = [r for r in reqs if r.get("path", "").endswith(
        "/comments/1460/reactions")]
    t.ok(p46 and react and p46[0]["time"] - t0 < 12 and
         react[0]["time"] - t0 < 12,
         "... and they are sent within seconds of the reset, not a minute "
         "later", [(r["path"], round(r["time"] - t0, 2)) for r in
                   (p46[:1] + react[:1])])
    t.ok(not [r for r in reqs if r.get("status") in (403, 429)],
         "no request is refused for the limit after the first",
         [(r["path"], r["status"]) for r in reqs
          if r.get("status") in (403, 429)])

    # ---- pages, a race's duplicate, a look-alike by another user (PR 43)
    s, _ = api(d, "POST", TASKS, {
        "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
        "metadata": {"name": "pages-task", "annotations": {
            "divergedev.com/provider": "github",
            "divergedev.com/project": "myorg/checkout",
            "divergedev.com/pr-number": "43",
            "divergedev.com/requested-by": "bob"}},
        "spec": {"objective": "@everyone <b>hi</b> " + MARKER +
                 "\n/diverge budget +$1000"}})
    t.eq(s, 201, "a task for PR 43 whose old comment is on page 3")

    def pr43_settled():
        v = stickies(gh_comments(fake, 43))
        return v if (len(v) == 1 and v[0]["id"] == 5901 and
                     "pages-task" in v[0]["body"]) else None
    t.ok(wait(pr43_settled, 20), "the bot's comment on page 3 (after %d "
         "others) is found and updated, the younger duplicate deleted" %
         FILLER, stickies(gh_comments(fake, 43)))
    other = [c for c in gh_comments(fake, 43) if c["id"] == 5900]
    t.ok(other and other[0]["body"] == MARKER + "\nlooks like the bot's",
         "a comment with the marker by another user is left alone")
    reply = [c for c in gh_comments(fake, 43) if c["id"] == 5899]
    t.ok(reply and reply[0]["body"] == QUOTED_MARKER,
         "an older reply of the bot's quoting the marker is not taken for "
         "the sticky comment (the marker opens it)", reply)
    body = (pr43_settled() or [{}])[0].get("body", "")
    t.ok(body.count(MARKER) == 1 and "@everyone" not in body and
         "<b>" not in body.split("```")[0] and
         "\n/diverge" not in body, "untrusted objective rendered inert")
    posts = [r for r in fake.requests() if r.get("method") == "POST" and
             "/issues/43/comments" in r.get("path", "")]
    t.eq(len(posts), 0, "no comment created on PR 43")

    # a second task on the same PR: the comment follows the newest live one
    time.sleep(1.1)     # creationTimestamp has a resolution of 1 s
    s, _ = api(d, "POST", TASKS, {
        "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
        "metadata": {"name": "pages-task-2", "annotations": {
            "divergedev.com/provider": "github",
            "divergedev.com/project": "myorg/checkout",
            "divergedev.com/pr-number": "43"}},
        "spec": {"objective": "second"}})
    t.ok(s == 201 and wait(lambda: (lambda v: len(v) == 1 and "pages-task-2"
                                    in v[0]["body"])(
        stickies(gh_comments(fake, 43))), 20),
         "two tasks on one PR: one comment, for the newest live task")

    def patches43():
        return len([r for r in fake.requests() if r.get("method") == "PATCH"
                    and r.get("path", "").endswith("/comments/5901")])
    before = patches43()
    time.sleep(2)
    t.ok(patches43() - before <= 1, "the two tasks do not fight over it")

    # ---- restart between a phase change and the comment update (PR 44)
    gh_send(44)("/diverge fix crash test")
    t.ok(play_ready(d, "fix-pr-44"), "PR 44: Active")
    gh44 = lambda: stickies(gh_comments(fake, 44))  # noqa: E731
    s = one_with(gh44, "Running")
    t.ok(s, "PR 44: one sticky comment, Running")
    # while Active, spend changes reach the comment at most once a period
    tok = token_of(d, "fix-pr-44")
    meter(d, tok, "t1", 0.25)
    t.ok(one_with(gh44, "$0.25"), "PR 44: the spend reaches the comment "
         "while Active")
    # ... and 5xx bursts beyond the client's own retries are retried
    fake.call("POST", "/_fake/faults", {"status": 503, "count": 12,
                                        "method": "PATCH",
                                        "match": "/issues/comments/"})
    meter(d, tok, "t2", 0.25)
    time.sleep(THROTTLE_S / 3.0)
    s = gh44()
    t.ok(len(s) == 1 and "$0.25" in s[0]["body"], "PR 44: a second charge "
         "within the throttle period is not sent at once")
    t.ok(one_with(gh44, "$0.50", THROTTLE_S + 30), "PR 44: it is sent "
         "when the period ends, through a burst of 503s")
    t.ok(not [f for f in fake.call("GET", "/_fake/faults")
              if f.get("status") == 503] and
         any("will retry" in ln and "fix-pr-44" in ln for ln in d.log()),
         "PR 44: the failed update was requeued and retried")
    fake.call("POST", "/_fake/faults", {"status": 503, "count": 100000,
                                        "method": "PATCH",
                                        "match": "/issues/comments/"})
    for i in range(10):
        code, _, _ = meter(d, tok, "c%d" % i, 1.0)
        if code == 429:
            break
    t.ok(wait(lambda: phase(d, "fix-pr-44") == "Paused", 10) and
         "Running" in (gh44() or [{}])[0]["body"], "PR 44: Paused, the "
         "comment update failing")
    d.kill9()
    fake.call("DELETE", "/_fake/faults")
    d.start()
    s = one_with(gh44, "Paused")
    t.ok(s, "after kill -9 and restart: the comment is updated once, not "
         "duplicated", gh44())
    time.sleep(1.5)
    t.eq(len(gh44()), 1, "PR 44: still one sticky comment")

    t.eq(d.stop(), 0, "clean stop")
    fake.stop()
    app_and_token(t)
    rotated_to_another_user(t)
    pages_without_headers(t)
    stale_next_page(t)
    one_identity_per_reload(t)
    refused(t)
    several_tasks(t)
    internal_notes(t)
    system_note_not_sticky(t)
    own_comment_checked_once(t)
    refused_gone(t)
    throttled(t)


def app_and_token(t):
    """github.token and github.app both set: the notifier posts on a
    task's PR (no installation id) with the token, so it must know its
    comment by the token's user, not by the App's "<slug>[bot]"; else
    each lost commentId (the task made again) posts one more comment."""
    fake = ScmFake()
    sd = seed()
    sd["github"]["app"] = {
        "id": 77, "slug": "diverge-app", "installations": [
            {"id": 8, "account": "myorg"}],
        "private_key_file": os.path.join(divtest.DATA, "api", "github",
                                         "jwt-test-key.pem")}
    fake.call("POST", "/_fake/seed", sd)
    cfg = CONFIG_NO_CONTROLLER
    cfg = cfg.replace('  token: "file:{{tmp}}/gh-token"\n',
                      '  token: "file:{{tmp}}/gh-token"\n  app:\n'
                      '    id: "77"\n    private_key: "file:%s"\n' %
                      sd["github"]["app"]["private_key_file"], 1)
    d = bot_daemon(fake, cfg, {"DIVERGE_SCM_MAX_WAIT_MS": "2000"})
    task = {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": "fix-pr-42", "annotations": {
                "divergedev.com/provider": "github",
                "divergedev.com/project": "myorg/checkout",
                "divergedev.com/pr-number": "42"}},
            "spec": {"objective": "x"}}
    gh42 = lambda: stickies(gh_comments(fake, 42))  # noqa: E731
    for run in (1, 2):
        s, _ = api(d, "POST", TASKS, task)
        s2, _ = api(d, "PATCH", TASKS + "/fix-pr-42/status",
                    {"status": {"phase": "Active"}},
                    "application/merge-patch+json")
        t.ok(s == 201 and s2 == 200 and wait(
            lambda: get_task(d, "fix-pr-42").get("status", {}).get(
                "notifier", {}).get("commentId"), 20),
            "token and app: task made (%d), its comment reported" % run)
        if run == 1:
            api(d, "DELETE", TASKS + "/fix-pr-42")
            wait(lambda: get_task(d, "fix-pr-42") is None)
    t.ok(len(gh42()) == 1, "token and app: the task made again finds "
         "the comment the token posted: still one sticky comment", gh42())
    t.eq(d.stop(), 0, "token and app: clean stop")
    fake.stop()


def task_on(d, name, prov, number):
    """A task on MR number of project 5 (myorg/diaspora) or, prov
    "github", PR number of myorg/checkout: the status code."""
    if prov == "github":
        where = {"divergedev.com/project": "myorg/checkout",
                 "divergedev.com/pr-number": str(number)}
    else:
        where = {"divergedev.com/project": "myorg/diaspora",
                 "divergedev.com/mr-iid": str(number),
                 "divergedev.com/project-id": "5"}
    where["divergedev.com/provider"] = prov
    return api(d, "POST", TASKS, {
        "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
        "metadata": {"name": name, "annotations": where},
        "spec": {"objective": "x"}})[0]


def rotated_to_another_user(t):
    """The token rotated (SIGHUP) to a token of another user. The sticky
    comment of the old user is not the bot's any more, and an edit that
    goes through does not tell: GitHub lets anyone with write access edit
    anyone's comment, GitLab a Maintainer (only a Developer gets 403).
    So the comment's author is looked up once before it is edited in
    place: a new sticky comment is made by the new user and followed from
    then on, the old one is left as it was; and the daemon ignores the
    new user's own comments at the door."""
    for prov, level in (("gitlab", 30), ("gitlab", 40), ("github", "write")):
        rotated_case(t, prov, level)


def rotated_case(t, prov, level):
    label = "rotation (%s, %s)" % (prov, level)
    fake = ScmFake()
    sd = seed()
    if prov == "gitlab":
        sd["gitlab"]["tokens"] = {"glpat-bot": "diverge-bot",
                                  "glpat-rot": "diverge-rot"}
        sd["gitlab"]["users"].append({"username": "diverge-rot", "id": 951})
        sd["gitlab"]["projects"][0]["members"]["diverge-rot"] = level
        token_file, token, number = "gl-token", "glpat-rot\n", 2
        comments = lambda: gl_notes(fake)  # noqa: E731
        key = "author"
        path = "/gitlab/api/v4/projects/5/merge_requests/2/notes/%s"
        edit = "PUT"
    else:
        sd["github"]["tokens"]["ghp_rot"] = "diverge-rot"
        sd["github"]["users"].append({"login": "diverge-rot", "id": 951})
        sd["github"]["repos"][0]["collaborators"]["diverge-rot"] = level
        token_file, token, number = "gh-token", "ghp_rot\n", 42
        comments = lambda: gh_comments(fake, 42)  # noqa: E731
        key = "user"
        path = "/github/repos/myorg/checkout/issues/comments/%s"
        edit = "PATCH"
    fake.call("POST", "/_fake/seed", sd)
    cfg = CONFIG_NO_CONTROLLER
    d = bot_daemon(fake, cfg, {
        "DIVERGE_SCM_MAX_WAIT_MS": "2000",
        "DIVERGE_TEST_NOTIFIER_THROTTLE_MS": "100",
        "DIVERGE_TEST_NOTIFIER_REFUSED_MS": "1000"})
    name = "rot-%s-%s" % (prov, level)
    s = task_on(d, name, prov, number)

    def status(**kw):
        return api(d, "PATCH", TASKS + "/%s/status" % name,
                   {"status": kw}, "application/merge-patch+json")[0]

    def cid():
        return (get_task(d, name) or {}).get("status", {}).get(
            "notifier", {}).get("commentId")
    old = lambda: stickies(comments(), key=key)  # noqa: E731
    new = lambda: stickies(comments(), "diverge-rot",  # noqa: E731
                           key=key)
    t.ok(s == 201 and status(phase="Active", iteration=1) == 200 and
         one_with(old, "**Iteration:** 1"),
         "%s: the sticky comment is posted by diverge-bot" % label, old())
    old_id = old()[0]["id"] if old() else None
    t.ok(wait(lambda: cid() == str(old_id)), "%s: its id is in "
         "status.notifier" % label, cid())
    with open(os.path.join(d.tmp, token_file), "w") as f:
        f.write(token)
    d.send_signal(__import__("signal").SIGHUP)
    t.ok(d.wait_log('msg="%s identity" %s=diverge-rot' % (
        prov, "username" if prov == "gitlab" else "login"), 20),
         "%s: the daemon asks who the bot is again after SIGHUP" % label,
         [ln for ln in d.log() if "identity" in ln])
    if prov == "gitlab":
        s, _, j = d.gitlab("Note Hook", gl_note(3801, 2, "diverge-rot", 951,
                                                "/diverge fix loop"),
                           str(uuid.uuid4()))
        t.eq((s, j.get("ignored")), (200, "comment by diverge itself"),
             "%s: the new user's own note is ignored at the door" % label)
    status(iteration=2)
    t.ok(one_with(new, "**Iteration:** 2", 20),
         "%s: a new sticky comment is made by diverge-rot" % label,
         [(n[key], n["body"][:60]) for n in comments()][-3:])
    new_id = new()[0]["id"] if new() else None
    t.ok(new_id is not None and new_id != old_id and
         wait(lambda: cid() == str(new_id)),
         "%s: status.notifier follows the new comment" % label,
         (cid(), new_id))
    status(iteration=3)
    t.ok(one_with(new, "**Iteration:** 3", 20) and len(old()) == 1 and
         "**Iteration:** 1" in old()[0]["body"],
         "%s: the next update edits the new comment in place; the old one "
         "is left as it was" % label, (new(), old()))
    reqs = fake.requests()
    edits = [r.get("status") for r in reqs if r.get("method") == edit and
             r.get("path") == path % old_id]
    gets = [r.get("status") for r in reqs if r.get("method") == "GET" and
            r.get("path") == path % old_id]
    t.ok(edits == [] and gets == [200],
         "%s: the old comment's author looked up once, no edit of it "
         "tried" % label, (edits, gets))
    t.ok(not [ln for ln in d.log() if "notifier: the provider refuses" in
              ln], "%s: not reported as a refusing PR/MR" % label)
    t.eq(d.stop(), 0, "%s: clean stop" % label)
    fake.stop()


def paged_bot(fake, prs):
    """Seed the fake with seed() and PRs/MRs (provider, number, filler):
    filler comments by a person (ids 1000 * (number + 3) + i), then the
    bot's sticky one (+ 900); start a daemon without the reconciler.
    (daemon, comments(provider, number))."""
    sd = seed()
    mrs = sd["gitlab"]["projects"][0]["merge_requests"]
    pulls = sd["github"]["repos"][0]["pulls"]
    for prov, num, filler in prs:
        base = 1000 * (num + 3)
        key, person = (("author", "pipin") if prov == "gitlab" else
                       ("user", "bob"))
        old = [{"id": base + i, key: person, "body": "(n)"}
               for i in range(filler)]
        old.append({"id": base + 900, key: "diverge-bot",
                    "body": MARKER + "\nold run"})
        if prov == "gitlab":
            mrs.append({"iid": num, "id": 2000 + num,
                        "source_branch": "b%d" % num,
                        "target_branch": "main", "author": "pipin",
                        "notes": old})
        else:
            pulls.append({"number": num, "title": "pages", "user": "bob",
                          "head": {"ref": "b%d" % num},
                          "base": {"ref": "main"}, "comments": old})
    fake.call("POST", "/_fake/seed", sd)
    cfg = CONFIG_NO_CONTROLLER
    d = bot_daemon(fake, cfg, {"DIVERGE_SCM_MAX_WAIT_MS": "2000",
                               "DIVERGE_TEST_NOTIFIER_THROTTLE_MS": "100"})

    def comments(prov, num):
        if prov == "github":
            return gh_comments(fake, num)
        return fake.state()["gitlab"]["projects"]["5"]["merge_requests"][
            str(num)]["notes"]
    return d, comments


def pages_without_headers(t):
    """The bot's sticky comment on page 3 of an MR's notes or a PR's
    comments is found when the pagination headers are missing: GitLab.com
    sends no X-Total, X-Total-Pages (nor rel="last") for more than 10,000
    records, and a proxy may strip the X-* headers (the Link rel="next"
    left) or all of them (then a full page means look at the next); a
    proxy or API gateway in front of GitHub may strip its Link (the same:
    a full page of 100 means look at the next, until a short or an empty
    one; PR 48's sticky comment ends a full page 2, page 3 is empty). Not
    found, the notifier would post a second sticky comment."""
    gl_x = ["X-Total", "X-Total-Pages", "X-Next-Page", "X-Page",
            "X-Per-Page", "X-Prev-Page"]
    cases = [
        ("gitlab", 3, "no X-Total", ["X-Total", "X-Total-Pages"], FILLER),
        ("gitlab", 4, "no X-* (Link only)", gl_x, FILLER),
        ("gitlab", 5, "no X-*, no Link", gl_x + ["Link"], FILLER),
        ("github", 47, "GitHub, no Link", ["Link"], FILLER),
        ("github", 48, "GitHub, no Link, a full last page", ["Link"], 199)]
    fake = ScmFake()
    d, comments = paged_bot(fake, [(p, n, f) for p, n, _, _, f in cases])
    for prov, num, label, omit, filler in cases:
        where = ("/merge_requests/%d/notes" if prov == "gitlab" else
                 "/issues/%d/comments") % num
        fake.call("POST", "/_fake/faults", {
            "provider": prov, "method": "GET", "count": 1000,
            "match": where, "omit_headers": omit})
        name = "fix-%s-%d" % ("mr" if prov == "gitlab" else "pr", num)
        s = task_on(d, name, prov, num)
        s2 = api(d, "PATCH", TASKS + "/%s/status" % name,
                 {"status": {"phase": "Active", "iteration": 7}},
                 "application/merge-patch+json")[0]
        key = "author" if prov == "gitlab" else "user"
        mine = lambda: stickies(comments(prov, num), key=key)  # noqa: E731
        got = one_with(mine, "**Iteration:** 7")
        reqs = [r for r in fake.requests() if where in r.get("path", "")]
        t.ok(s == 201 and s2 == 200 and got and
             got[0]["id"] == 1000 * (num + 3) + 900 and
             not [r for r in reqs if r.get("method") == "POST"],
             "pages, %s: the sticky comment on page %d is found and "
             "edited, no second one" % (label, filler // 100 + 1),
             [(n["id"], n["body"][:40]) for n in mine()])
        lists = [r.get("query") for r in reqs if r.get("method") == "GET"]
        t.ok(len(lists) == 3 and (prov == "gitlab" or lists == [
            "per_page=100", "per_page=100&page=2", "per_page=100&page=3"]),
             "pages, %s: three pages listed" % label, lists)
        fake.call("DELETE", "/_fake/faults")
    t.eq(d.stop(), 0, "pages: clean stop")
    fake.stop()


def one_identity_per_reload(t):
    """After a SIGHUP (the tokens re-read: perhaps another user's), the
    daemon (to ignore the bot's own comments) and the notifier (to find
    its sticky comment) both need to know who the bot is: one GET /user
    per provider serves both."""
    fake = ScmFake()
    d, _ = paged_bot(fake, [])

    def learned():
        return sum('msg="github identity"' in ln or
                   'msg="gitlab identity"' in ln for ln in d.log())
    t.ok(wait(lambda: learned() == 2), "identity: learned at the start")
    fake.call("DELETE", "/_fake/requests")
    d.send_signal(__import__("signal").SIGHUP)
    t.ok(wait(lambda: learned() == 4, 20),
         "identity: asked again after SIGHUP, for both providers",
         [ln for ln in d.log() if "identity" in ln])
    for prov, num, name in (("github", 42, "who-pr-42"),
                            ("gitlab", 2, "who-mr-2")):
        task_on(d, name, prov, num)
        api(d, "PATCH", TASKS + "/%s/status" % name,
            {"status": {"phase": "Active", "iteration": 4}},
            "application/merge-patch+json")
    t.ok(one_with(lambda: stickies(gh_comments(fake, 42)),
                  "**Iteration:** 4") and
         one_with(lambda: stickies(gl_notes(fake), key="author"),
                  "**Iteration:** 4"),
         "identity: the notifier, its identity stale after SIGHUP, finds "
         "no comment of the bot's and posts one on PR 42 and MR 2")
    time.sleep(0.5)
    users = [(r.get("provider"), r.get("path")) for r in fake.requests()
             if r.get("method") == "GET" and
             r.get("path", "").endswith("/user")]
    t.eq(sorted(users), [("github", "/github/user"),
                         ("gitlab", "/gitlab/api/v4/user")],
         "identity: one GET /user per provider after SIGHUP, for the "
         "daemon and the notifier")
    t.eq(d.stop(), 0, "identity: clean stop")
    fake.stop()


STALE = "the next page of a list goes back to one read already"


def stale_next_page(t):
    """A server or proxy whose next page goes back to one read already
    (GitHub's Link rel="next", GitLab's X-Next-Page naming the page just
    served, or page 1 again): the list stops there, one warning without
    the Link's query, and the search fails (a retry later) instead of
    reading up to 200 pages or taking the pages read for the whole list,
    which would post a second sticky comment (the bot's is on a later
    page). Once the pages move on again, the comment is found and edited."""
    cases = [
        ("github", 49, "GitHub, next = this page", "same", 150, 1),
        ("github", 50, "GitHub, next = page 1 from page 2", "back", 250, 2),
        ("gitlab", 6, "GitLab, next = this page", "same", 150, 1)]
    fake = ScmFake()
    d, comments = paged_bot(fake, [(p, n, f) for p, n, _, _, f, _ in cases])
    for prov, num, label, how, _, read in cases:
        where = ("/merge_requests/%d/notes" if prov == "gitlab" else
                 "/issues/%d/comments") % num
        fake.call("POST", "/_fake/faults", {
            "provider": prov, "method": "GET", "count": 1000,
            "match": where, "stale_next": how})
        warned = len([ln for ln in d.log() if STALE in ln])
        name = "stale-%s-%d" % ("mr" if prov == "gitlab" else "pr", num)
        s = task_on(d, name, prov, num)
        s2 = api(d, "PATCH", TASKS + "/%s/status" % name,
                 {"status": {"phase": "Active", "iteration": 7}},
                 "application/merge-patch+json")[0]
        warns = wait(lambda: [ln for ln in d.log() if STALE in ln][warned:],
                     20)
        fake.call("DELETE", "/_fake/faults")
        reqs = [r for r in fake.requests() if where in r.get("path", "")]
        lists = [r for r in reqs if r.get("method") == "GET"]
        t.ok(s == 201 and s2 == 200 and warns and
             len(lists) <= read * len(warns) + read,
             "stale next, %s: the list stops at the page that goes back "
             "(%d page(s) read per try)" % (label, read),
             (len(lists), len(warns)))
        t.ok(warns and "?" not in warns[0] and "per_page" not in warns[0],
             "stale next, %s: warned without the Link's query" % label,
             warns[:1])
        t.ok(not [r for r in reqs if r.get("method") == "POST"],
             "stale next, %s: no second sticky comment" % label,
             [(r.get("method"), r.get("path")) for r in reqs])
        key = "author" if prov == "gitlab" else "user"
        mine = lambda: stickies(comments(prov, num), key=key)  # noqa: E731
        got = one_with(mine, "**Iteration:** 7")
        reqs = [r for r in fake.requests() if where in r.get("path", "")]
        t.ok(got and got[0]["id"] == 1000 * (num + 3) + 900 and
             not [r for r in reqs if r.get("method") == "POST"],
             "stale next, %s: once the pages move on, the comment is "
             "found and edited, no second one" % label,
             [(n["id"], n["body"][:40]) for n in mine()])
    t.eq(d.stop(), 0, "stale next: clean stop")
    fake.stop()


REFUSED_WAIT_S = 6     # DIVERGE_TEST_NOTIFIER_REFUSED_MS


def refusing_setup():
    """A fake with the seed, and diverged (no controller) with a short
    throttle and a short wait after the provider refused a write."""
    fake = ScmFake()
    fake.call("POST", "/_fake/seed", seed())
    d = bot_daemon(fake, CONFIG_NO_CONTROLLER, {
        "DIVERGE_SCM_MAX_WAIT_MS": "2000",
        "DIVERGE_TEST_NOTIFIER_THROTTLE_MS": "100",
        "DIVERGE_TEST_NOTIFIER_REFUSED_MS": str(REFUSED_WAIT_S * 1000)})
    return fake, d


def refused(t):
    """The PR/MR refuses the bot's writes (GitHub: an archived repository,
    a locked conversation, a revoked permission; GitLab: a locked
    discussion): the notifier gives up on the PR/MR with one log line and
    a metric, does not try again on every status change of a busy task,
    and picks up again once writes are allowed."""
    fake, d = refusing_setup()
    # the writes are refused, as on an archived repository or a locked
    # discussion; reads still work
    cases = [
        ("github", "fix-pr-42", {"divergedev.com/pr-number": "42"},
         "/issues/comments/", "PATCH",
         "Repository was archived so is read-only.",
         lambda: stickies(gh_comments(fake, 42))),
        ("gitlab", "fix-mr-2", {"divergedev.com/mr-iid": "2",
                                "divergedev.com/project-id": "5"},
         "/notes", "PUT", None,
         lambda: stickies(gl_notes(fake), key="author"))]
    for prov, name, anns, match, method, msg, list_fn in cases:
        anns = dict(anns)
        anns["divergedev.com/provider"] = prov
        anns["divergedev.com/project"] = ("myorg/checkout" if
                                          prov == "github" else
                                          "myorg/diaspora")
        s, _ = api(d, "POST", TASKS, {
            "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": name, "annotations": anns},
            "spec": {"objective": "x"}})

        def status(**kw):
            return api(d, "PATCH", TASKS + "/%s/status" % name,
                       {"status": kw}, "application/merge-patch+json")[0]
        t.ok(s == 201 and status(phase="Active", iteration=1) == 200 and
             one_with(list_fn, "**Iteration:** 1"),
             "%s refused: the task's comment is posted" % prov, list_fn())

        def writes(code):
            return [r for r in fake.requests() if r.get("method") in
                    ("PATCH", "PUT", "POST") and match in r.get("path", "")
                    and r.get("status") == code]
        fault = {"status": 403, "count": 100000, "provider": prov,
                 "match": match, "method": method}
        if msg:
            fault["message"] = msg
        fake.call("POST", "/_fake/faults", fault)
        # a busy task: its status changes every 100 ms for 3 s
        for i in range(30):
            status(iteration=2 + i)
            time.sleep(0.1)
        refused_n = len(writes(403))
        warns = [ln for ln in d.log() if name in ln and
                 "update failed" in ln]
        t.ok(1 <= refused_n <= 2, "%s refused: one write refused with 403, "
             "not one for each of 30 status changes" % prov, refused_n)
        t.ok(len(warns) == 0 and len([
            ln for ln in d.log() if name in ln and
            "notifier: the provider refuses" in ln]) == 1,
             "%s refused: one log line says so" % prov,
             [ln for ln in d.log() if name in ln][-6:])
        mt = d.metrics()
        m = re.search(r'^diverge_notifier_updates_total\{result='
                      r'"refused"\} (\d+)', mt, re.M)
        t.ok(m is not None and int(m.group(1)) >= 1,
             "%s refused: counted as refused" % prov, m and m.group(0))
        fake.call("DELETE", "/_fake/faults")
        t.ok(one_with(list_fn, "**Iteration:** 31", REFUSED_WAIT_S + 15),
             "%s refused: writes allowed again: the comment is brought up "
             "to date, no second one" % prov, list_fn())
        t.ok(wait(lambda: [ln for ln in d.log() if name in ln and
                           "notifier: the provider accepts writes again"
                           in ln], 5),
             "%s refused: ... and a log line says so" % prov)
    # any failure backs off the same way: a 422 ("Validation failed, or
    # the endpoint has been spammed") is not tried again on every change
    fake.call("POST", "/_fake/faults", {
        "status": 422, "count": 100000, "provider": "github",
        "method": "PATCH", "match": "/issues/comments/"})
    before = len([r for r in fake.requests() if r.get("status") == 422])
    for i in range(30):
        api(d, "PATCH", TASKS + "/fix-pr-42/status",
            {"status": {"iteration": 40 + i}}, "application/merge-patch+json")
        time.sleep(0.1)
    failed = len([r for r in fake.requests() if r.get("status") == 422])
    t.ok(1 <= failed - before <= 5, "a failing update backs off: a few "
         "tries, not one for each of 30 status changes", failed - before)
    fake.call("DELETE", "/_fake/faults")
    t.ok(one_with(lambda: stickies(gh_comments(fake, 42)),
                  "**Iteration:** 69", 20),
         "... and the comment is brought up to date after it")
    t.eq(d.stop(), 0, "refused: clean stop")
    fake.stop()


def system_note_not_sticky(t):
    """A GitLab system note is never the sticky comment, even one of the
    bot's user whose body opens with the marker (GitLab writes system
    notes in the name of whoever acted): the notifier makes its own note
    and leaves the system note as it was."""
    fake = ScmFake()
    sd = seed()
    sysnote = MARKER + "\nchanged the description"
    sd["gitlab"]["projects"][0]["merge_requests"].append({
        "iid": 6, "id": 2006, "source_branch": "b6",
        "target_branch": "main", "author": "pipin",
        "notes": [{"id": 9600, "author": "pipin", "body": "(n)"},
                  {"id": 9601, "author": "diverge-bot", "system": True,
                   "body": sysnote}]})
    fake.call("POST", "/_fake/seed", sd)
    cfg = CONFIG_NO_CONTROLLER
    d = bot_daemon(fake, cfg, {"DIVERGE_SCM_MAX_WAIT_MS": "2000",
                               "DIVERGE_TEST_NOTIFIER_THROTTLE_MS": "100"})

    def notes():
        return fake.state()["gitlab"]["projects"]["5"]["merge_requests"][
            "6"]["notes"]

    def mine():
        return [n for n in stickies(notes(), key="author")
                if not n.get("system")]
    s = task_on(d, "fix-mr-6", "gitlab", 6)
    s2 = api(d, "PATCH", TASKS + "/fix-mr-6/status",
             {"status": {"phase": "Active", "iteration": 5}},
             "application/merge-patch+json")[0]
    got = one_with(mine, "**Iteration:** 5")
    t.ok(s == 201 and s2 == 200 and got and got[0]["id"] != 9601,
         "system note: the bot makes its own sticky note",
         [(n["id"], n.get("system"), n["body"][:40]) for n in notes()])
    sn = [n for n in notes() if n["id"] == 9601]
    t.ok(sn and sn[0]["body"] == sysnote and sn[0].get("system"),
         "system note: the bot's system note with the marker is left "
         "alone", sn)
    t.eq(d.stop(), 0, "system note: clean stop")
    fake.stop()


def own_comment_checked_once(t):
    """Before an edit in place the notifier makes sure the comment is still
    the bot's own, once per comment while the bot's identity stays the
    same: a comment it made itself is known to be its own, so a run of
    updates costs no GET of the comment (a read against the bot's rate
    limit on every status change)."""
    fake = ScmFake()
    sd = seed()
    sd["github"]["repos"][0]["pulls"].append({
        "number": 49, "title": "own", "user": "alice",
        "head": {"ref": "b49"}, "base": {"ref": "main"},
        "comments": [{"id": 4900, "user": "alice", "body": "(c)"}]})
    fake.call("POST", "/_fake/seed", sd)
    cfg = CONFIG_NO_CONTROLLER
    d = bot_daemon(fake, cfg, {"DIVERGE_SCM_MAX_WAIT_MS": "2000",
                               "DIVERGE_TEST_NOTIFIER_THROTTLE_MS": "100"})
    mine = lambda: stickies(gh_comments(fake, 49))  # noqa: E731
    s = task_on(d, "fix-pr-49", "github", 49)
    seen = []
    for it in (1, 2, 3, 4):
        api(d, "PATCH", TASKS + "/fix-pr-49/status",
            {"status": {"phase": "Active", "iteration": it}},
            "application/merge-patch+json")
        seen.append(bool(one_with(mine, "**Iteration:** %d" % it)))
    cid = (mine() or [{"id": 0}])[0]["id"]
    reqs = [(r["method"], r["path"]) for r in fake.requests()
            if r.get("path", "").endswith("/issues/comments/%d" % cid)]
    t.ok(s == 201 and all(seen) and
         len([r for r in reqs if r[0] == "PATCH"]) >= 3,
         "own comment: four status changes, one comment edited in place",
         (seen, reqs))
    t.ok(len([r for r in reqs if r[0] == "GET"]) <= 1,
         "own comment: its author is not asked again before each edit",
         reqs)
    t.eq(d.stop(), 0, "own comment: clean stop")
    fake.stop()


def refused_gone(t):
    """A 404 to the bot's write (no access any more, the PR or repository
    gone) is a refusal like a 403: one log line that the provider refuses
    the bot's writes, counted as refused, and no "update failed" warning
    with a quick retry."""
    fake, d = refusing_setup()
    fake.call("POST", "/_fake/faults", {
        "status": 404, "count": 100000, "provider": "github",
        "match": "/issues/42/comments", "method": "POST"})
    s = task_on(d, "fix-pr-42", "github", 42)
    s2 = api(d, "PATCH", TASKS + "/fix-pr-42/status",
             {"status": {"phase": "Active", "iteration": 1}},
             "application/merge-patch+json")[0]

    def lines(text):
        return [ln for ln in d.log() if "fix-pr-42" in ln and text in ln]
    t.ok(s == 201 and s2 == 200 and
         wait(lambda: lines("notifier: the provider refuses"), 10),
         "404 refused: one log line says the provider refuses the writes",
         [ln for ln in d.log() if "fix-pr-42" in ln][-6:])
    m = re.search(r'^diverge_notifier_updates_total\{result='
                  r'"refused"\} (\d+)', d.metrics(), re.M)
    t.ok(m is not None and int(m.group(1)) >= 1 and
         not lines("update failed"),
         "404 refused: counted as refused, not as a failed update",
         (m and m.group(0), lines("update failed")))
    fake.call("DELETE", "/_fake/faults")
    t.eq(d.stop(), 0, "404 refused: clean stop")
    fake.stop()


def throttled(t):
    """While the phase stays the same, a busy task's changes (only the
    numbers moved) reach its comment at most once a throttle period: not
    one edit for each change, and the last change is sent when the period
    ends."""
    fake = ScmFake()
    fake.call("POST", "/_fake/seed", seed())
    cfg = CONFIG_NO_CONTROLLER
    d = bot_daemon(fake, cfg, {"DIVERGE_SCM_MAX_WAIT_MS": "2000",
                               "DIVERGE_TEST_NOTIFIER_THROTTLE_MS":
                               str(THROTTLE_S * 1000)})
    mine = lambda: stickies(gh_comments(fake, 42))  # noqa: E731
    s = task_on(d, "fix-pr-42", "github", 42)

    def status(**kw):
        return api(d, "PATCH", TASKS + "/fix-pr-42/status", {"status": kw},
                   "application/merge-patch+json")[0]
    got = status(phase="Active", iteration=1) == 200 and one_with(
        mine, "**Iteration:** 1")
    cid = (mine() or [{"id": 0}])[0]["id"]

    def edits():
        return [r for r in fake.requests() if r.get("method") == "PATCH"
                and r.get("path", "").endswith("/issues/comments/%d" % cid)]
    t0 = time.time()
    for it in range(2, 7):
        status(iteration=it)
        time.sleep(0.1)
    time.sleep(0.5)
    early = [round(r["time"] - t0, 2) for r in edits()
             if r["time"] < t0 + THROTTLE_S - 1.5]
    t.ok(s == 201 and got and not early,
         "throttle: five changes right after the comment was made are not "
         "sent at once", early)
    t.ok(one_with(mine, "**Iteration:** 6", THROTTLE_S + 10) and
         len(edits()) <= 2,
         "throttle: the last change is sent when the period ends, in one "
         "edit", [round(r["time"] - t0, 2) for r in edits()])
    t.eq(d.stop(), 0, "throttle: clean stop")
    fake.stop()


def several_tasks(t):
    """Several tasks report to one PR (a task made by hand with the same
    annotations as the one /diverge fix made): the comment follows one of
    them, always the same one, and every task's finished run gets its
    notification, once, also across a restart."""
    fake = ScmFake()
    fake.call("POST", "/_fake/seed", seed())
    cfg = CONFIG_NO_CONTROLLER
    d = bot_daemon(fake, cfg, {"DIVERGE_SCM_MAX_WAIT_MS": "2000",
                               "DIVERGE_TEST_NOTIFIER_THROTTLE_MS": "100"})

    def make(name, number, who):
        s, _ = api(d, "POST", TASKS, {
            "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": name, "annotations": {
                "divergedev.com/provider": "github",
                "divergedev.com/project": "myorg/checkout",
                "divergedev.com/pr-number": str(number),
                "divergedev.com/requested-by": who}},
            "spec": {"objective": "x"}})
        return s == 201

    def set_phase(name, ph):
        return api(d, "PATCH", TASKS + "/%s/status" % name,
                   {"status": {"phase": ph}},
                   "application/merge-patch+json")[0] == 200

    def created(name):
        return (get_task(d, name) or {}).get("metadata", {}).get(
            "creationTimestamp")

    # ---- two live tasks made in the same second (PR 46): the comment
    # follows the same one whatever order they are listed in, before and
    # after a restart (the list order changes with it)
    gh46 = lambda: stickies(gh_comments(fake, 46))  # noqa: E731
    same = False
    for _ in range(3):
        # made in the order opposite to the one they sort in
        same = make("pair-b", 46, "bob") and make("pair-a", 46, "alice") \
            and created("pair-b") == created("pair-a")
        if same:
            break
        for name in ("pair-a", "pair-b"):
            api(d, "DELETE", TASKS + "/" + name)
        wait(lambda: get_task(d, "pair-a") is None and
             get_task(d, "pair-b") is None)
    t.ok(same and set_phase("pair-b", "Active") and
         set_phase("pair-a", "Active"),
         "two tasks on PR 46 with the same creationTimestamp",
         (created("pair-a"), created("pair-b")))

    seen = []

    def watch(secs):
        end = time.time() + secs
        while time.time() < end:
            v = gh46()
            if v:
                seen.append("pair-a" if "pair-a" in v[0]["body"] else
                            "pair-b" if "pair-b" in v[0]["body"] else "?")
            time.sleep(0.1)
    t.ok(wait(lambda: (lambda v: len(v) == 1 and "pair-a" in v[0]["body"])(
        gh46()), 20), "the comment follows pair-a (same second: by name)",
        gh46())
    # an update of pair-b (not followed) and of pair-a do not move it
    api(d, "PATCH", TASKS + "/pair-b/status", {"status": {"iteration": 2}},
        "application/merge-patch+json")
    api(d, "PATCH", TASKS + "/pair-a/status", {"status": {"iteration": 3}},
        "application/merge-patch+json")
    watch(2)
    t.eq(d.stop(), 0, "PR 46: stop")
    d.start()
    api(d, "PATCH", TASKS + "/pair-b/status", {"status": {"iteration": 4}},
        "application/merge-patch+json")
    watch(3)
    t.ok(seen and set(seen) == {"pair-a"} and len(gh46()) == 1,
         "... and keeps following it through updates and a restart",
         sorted(set(seen)))

    # ---- a second task on PR 44 completes while the comment follows the
    # newer one: its starter is told, once, also across restarts
    gh44 = lambda: stickies(gh_comments(fake, 44))  # noqa: E731
    alice = lambda: mentions(gh_comments(fake, 44), "alice")  # noqa: E731
    bob = lambda: mentions(gh_comments(fake, 44), "bob")  # noqa: E731
    t.ok(make("fix-pr-44", 44, "alice") and set_phase("fix-pr-44", "Active")
         and one_with(gh44, "fix-pr-44"), "PR 44: fix-pr-44's comment")
    time.sleep(1.1)     # creationTimestamp has a resolution of 1 s
    t.ok(make("hand-44", 44, "bob") and set_phase("hand-44", "Active")
         and one_with(gh44, "hand-44"),
         "PR 44: a task made by hand, newer: the comment follows it")
    t.ok(set_phase("fix-pr-44", "Completed") and
         wait(lambda: len(alice()) == 1, 20),
         "PR 44: fix-pr-44 completes while the comment follows hand-44: "
         "alice is told", alice())
    body = (alice() or [{}])[0].get("body", "")
    t.ok("fix-pr-44" in body and "completed" in body and
         "/diverge status" in body, "... in a comment naming the task and "
         "pointing to /diverge status", body)
    nt = wait(lambda: (get_task(d, "fix-pr-44") or {}).get("status", {}).get(
        "notifier", {}).get("reportedPhase") == "Completed", 10)
    time.sleep(1.5)
    t.ok(nt and len(alice()) == 1 and one_with(gh44, "hand-44", 1),
         "PR 44: once, recorded in its reportedPhase; the comment still "
         "follows hand-44", (alice(), gh44()))
    d.kill9()
    d.start()
    api(d, "PATCH", TASKS + "/hand-44/status", {"status": {"iteration": 5}},
        "application/merge-patch+json")
    time.sleep(3)
    t.ok(len(alice()) == 1 and len(gh44()) == 1,
         "PR 44: after the restart fix-pr-44's run is not notified again",
         alice())
    t.ok(set_phase("hand-44", "Failed") and wait(lambda: len(bob()) == 1,
                                                  20) and
         one_with(gh44, "Failed"),
         "PR 44: hand-44 fails: bob is told, the comment shows it", bob())
    t.eq(d.stop(), 0, "PR 44: stop")
    d.start()
    time.sleep(3)
    t.ok(len(alice()) == 1 and len(bob()) == 1 and len(gh44()) == 1,
         "PR 44: after another restart, still one notification each and "
         "one comment", (alice(), bob()))
    t.eq(d.stop(), 0, "several tasks: clean stop")
    fake.stop()


def internal_notes(t):
    """A GitLab internal note (Confidential Note Hook, internal: true) is
    read by project members only (Reporter and up): a fix from it runs,
    but its objective is not shown in the sticky comment, which anyone
    who sees the MR reads, and the bot's replies to internal notes are
    internal notes too. A later public fix's objective is shown."""
    spec = seed()
    proj = spec["gitlab"]["projects"][0]
    proj["members"] = {"pipin": 30, "guest": 10}
    spec["gitlab"]["users"].append({"username": "guest", "id": 12})
    mr = proj["merge_requests"][0]
    mr["notes"] = [{"id": 3700 + i, "author": "pipin", "body": "(n)",
                    "internal": i < 3 or i == 5} for i in range(6)]
    mr["notes"][2]["author"] = "guest"
    fake = ScmFake()
    fake.call("POST", "/_fake/seed", spec)
    d = bot_daemon(fake, CONFIG, {"DIVERGE_SCM_MAX_WAIT_MS": "2000",
                                  "DIVERGE_TEST_NOTIFIER_THROTTLE_MS":
                                  str(THROTTLE_S * 1000)})

    def note(nid, who, uid, body, internal):
        doc = gl_note(nid, 2, who, uid, body)
        doc["object_attributes"]["internal"] = internal
        doc["object_attributes"]["confidential"] = internal
        return d.gitlab("Confidential Note Hook" if internal else
                        "Note Hook", doc, str(uuid.uuid4()))[0]

    gl2 = lambda: stickies(gl_notes(fake), key="author")  # noqa: E731

    def replies():
        return [(n["body"], n["internal"]) for n in gl_notes(fake)
                if n["author"] == "diverge-bot" and
                not n["body"].startswith(MARKER)]

    t.eq(note(3700, "pipin", 11, "/diverge fix secret-plan-XYZ", True),
         202, "internal note: a Developer's fix is accepted")
    task = wait(lambda: get_task(d, "fix-mr-2"), 20)
    t.ok(task and task["spec"]["objective"] == "secret-plan-XYZ" and
         task["metadata"]["annotations"].get(
             "divergedev.com/internal-objective") == "true",
         "internal note: the task has the objective and is marked "
         "divergedev.com/internal-objective", task and task["metadata"])
    t.ok(play_ready(d, "fix-mr-2"), "internal note: the task runs")
    s = one_with(gl2, "Running")
    body = s[0]["body"] if s else ""
    t.ok(s and "secret-plan-XYZ" not in body and
         "(set in an internal note)" in body and not s[0]["internal"],
         "the public sticky comment shows a placeholder, not the "
         "internal objective", gl2())
    t.ok(wait(lambda: gl_awards(fake, 2, 3700) == ["eyes"]),
         "internal note: the eyes award emoji as usual",
         gl_awards(fake, 2, 3700))

    note(3701, "pipin", 11, "/diverge status", True)
    r = wait(lambda: replies())
    t.ok(r and len(r) == 1 and "fix-mr-2" in r[0][0] and r[0][1] is True,
         "the reply to an internal /diverge status is an internal note", r)
    note(3702, "guest", 12, "/diverge pause", True)
    r = wait(lambda: len(replies()) == 2 and replies())
    t.ok(r and "access" in r[1][0] and r[1][1] is True,
         "a refused internal command's reply is an internal note", r)
    posts = [q.get("json") or {} for q in fake.requests()
             if q["method"] == "POST" and
             q["path"].endswith("/merge_requests/2/notes")]
    t.ok([p.get("internal") for p in posts
          if not p.get("body", "").startswith(MARKER)] == [True, True],
         "both replies were created with internal: true", posts)

    t.eq(note(3703, "pipin", 11, "/diverge status", False), 202,
         "a public /diverge status")
    r = wait(lambda: len(replies()) == 3 and replies())
    t.ok(r and r[2][1] is False, "its reply is public", r)
    t.eq(note(3705, "pipin", 11, "/diverge guide secret-hint-QRS", True),
         202, "internal note: a Developer's guide is accepted")
    t.ok(wait(lambda: (get_task(d, "fix-mr-2") or {}).get(
        "metadata", {}).get("annotations", {}).get(
        "divergedev.com/guidance") == "secret-hint-QRS"),
         "the internal guidance reaches the task (and so the agent)")
    s = one_with(gl2, "Latest guidance")
    body = s[0]["body"] if s else ""
    t.ok(s and "secret-hint-QRS" not in body and
         body.count("(set in an internal note)") == 2,
         "the sticky comment shows a placeholder for the internal "
         "guidance too, not its text", gl2())
    note(3704, "pipin", 11, "/diverge fix public-plan-ABC", False)
    s = one_with(gl2, "public-plan-ABC")
    task = get_task(d, "fix-mr-2")
    t.ok(s and s[0]["body"].count("(set in an internal note)") == 1 and
         "divergedev.com/internal-objective" not in
         task["metadata"]["annotations"],
         "a public fix's objective replaces it and is shown (the "
         "internal guidance stays hidden)", gl2())
    t.eq(d.stop(), 0, "internal notes: clean stop")
    fake.stop()


if __name__ == "__main__":
    run_tests(main)
