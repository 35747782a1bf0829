"""Running the commands end to end: signed webhooks into diverged, the
fake GitHub and GitLab APIs of tests/fakes/scm_fake.py behind it, and the
resulting AgentTasks read back through the store's API. Each case states
what it expects of the API calls (reactions, replies) and of the task."""

import base64
import http.client
import json
import os
import re
import signal
import sqlite3
import threading
import time
import uuid

from divtest import (Daemon, ScmFake, api, compact, fixture, run_tests,
                     wait, with_comment)

NS = "team-a"
TASKS = "/apis/divergedev.com/v1alpha1/namespaces/%s/agenttasks"

AGENT_YAML = ("version: \"1\"\nagent:\n  maxIterations: 3\n"
              "  budgetUSD: \"2.50\"\n  capabilities: [\"claude-*\"]\n")
HEAD_AGENT_YAML = "version: \"1\"\nagent:\n  maxIterations: 99\n"
# the value comes back in the error: a carriage return in it ends a line
# for Markdown as a newline does
BROKEN_AGENT_YAML = ("version: \"1\"\nagent:\n"
                     "  maxIterations: \"many\\r@myorg/reviewers\"\n")
# on a branch a write-access user pushed and made the base of their PR
OWN_BASE_AGENT_YAML = ("version: \"1\"\nagent:\n  maxIterations: 500\n"
                       "  budgetUSD: \"900.00\"\n  capabilities: [\"*\"]\n")

SEED = {
    "github": {
        "user": {"login": "diverge-bot", "id": 900},
        # ghp_rot: the token github.token is rotated to (SIGHUP)
        "tokens": {"ghp_bot": "diverge-bot", "ghp_rot": "diverge-rot"},
        "users": [{"login": "diverge-rot", "id": 901},
                  {"login": "alice", "id": 1}, {"login": "bob", "id": 2},
                  {"login": "carol", "id": 3}, {"login": "mallory", "id": 4}],
        "repos": [
            {"full_name": "myorg/checkout", "id": 501,
             "default_branch": "main",
             "collaborators": {"alice": "admin", "bob": "write",
                               "carol": "read", "diverge-bot": "write"},
             "files": {"main": {".diverge/agent.yaml": AGENT_YAML},
                       "fix-n1": {".diverge/agent.yaml": HEAD_AGENT_YAML},
                       "bob-base": {".diverge/agent.yaml":
                                    OWN_BASE_AGENT_YAML}},
             "pulls": [
                 {"number": 42, "title": "N+1", "user": "alice",
                  "head": {"ref": "fix-n1"}, "base": {"ref": "main"}},
                 {"number": 43, "title": "other", "user": "bob",
                  "head": {"ref": "other"}, "base": {"ref": "main"}},
                 {"number": 7, "title": "From a fork", "user": "mallory",
                  "head": {"ref": "evil", "repo": "mallory/checkout"},
                  "base": {"ref": "main"}},
                 {"number": 50, "title": "own base", "user": "bob",
                  "head": {"ref": "bob-head"}, "base": {"ref": "bob-base"}},
                 {"number": 44, "title": "abandoned", "user": "bob",
                  "state": "closed", "head": {"ref": "gone"},
                  "base": {"ref": "main"}},
                 {"number": 45, "title": "shipped", "user": "bob",
                  "merged": True, "head": {"ref": "shipped"},
                  "base": {"ref": "main"}}]},
            {"full_name": "myorg/broken", "id": 502,
             "default_branch": "main",
             "collaborators": {"alice": "admin"},
             "files": {"main": {".diverge/agent.yaml": BROKEN_AGENT_YAML}},
             "pulls": [{"number": 1, "title": "x", "user": "alice",
                        "head": {"ref": "x"}, "base": {"ref": "main"}}]},
            # a PR numbered as one of myorg/checkout's, in the same
            # namespace: its task cannot take the name fix-pr-42
            {"full_name": "myorg/twin", "id": 503,
             "default_branch": "main",
             "collaborators": {"alice": "admin"},
             "pulls": [{"number": 42, "title": "twin", "user": "alice",
                        "head": {"ref": "t"}, "base": {"ref": "main"}}]}]},
    "gitlab": {
        "user": {"username": "diverge-bot", "id": 950},
        # glpat-rot: the token gitlab.token is rotated to (SIGHUP)
        "tokens": {"glpat-bot": "diverge-bot", "glpat-rot": "diverge-rot"},
        "users": [{"username": "diverge-rot", "id": 951},
                  {"username": "pipin", "id": 11},
                  {"username": "guest", "id": 12},
                  # a service account named like a person: only the
                  # Users API says it is a bot
                  {"username": "release-helper", "id": 13, "bot": True},
                  {"username": "dana", "id": 15},
                  # a maintainer whose membership expired (members/all
                  # still lists it) and a blocked maintainer
                  {"username": "lapsed", "id": 16},
                  {"username": "blocked", "id": 17}],
        "projects": [
            {"id": 5, "path_with_namespace": "myorg/diaspora",
             "default_branch": "main",
             "members": {"pipin": 40, "guest": 10, "release-helper": 30,
                         "dana": 30,
                         "lapsed": {"access_level": 40,
                                    "expires_at": "2020-01-31"},
                         "blocked": {"access_level": 40,
                                     "state": "blocked"}},
             "files": {"main": {".diverge/agent.yaml": AGENT_YAML}},
             "merge_requests": [
                 {"iid": 2, "id": 2002, "source_branch": "feature",
                  "target_branch": "main", "author": "pipin"},
                 {"iid": 3, "id": 2003, "source_branch": "release",
                  "target_branch": "main", "author": "pipin"},
                 {"iid": 4, "id": 2004, "source_branch": "dropped",
                  "target_branch": "main", "author": "pipin",
                  "state": "closed"}]}]},
}

# The comments the webhooks below announce exist on the fake first, as
# they would on GitHub: (id, pull, author). Bodies do not matter there.
GH_COMMENTS = [(1001, 42, "alice"), (1002, 43, "carol"), (1003, 43, "bob"),
               (1006, 43, "alice"), (1007, 1, "alice"), (1008, 7, "alice"),
               (1010, 42, "alice"), (1011, 42, "alice"), (1012, 42, "alice"),
               (1013, 42, "alice"), (1014, 42, "bob"), (1015, 42, "carol"),
               (1016, 42, "carol"), (1017, 42, "alice"), (1018, 42, "alice"),
               (1019, 42, "alice"), (1020, 43, "alice"),
               (1030, 50, "bob"), (1031, 1, "bob"), (1032, 42, "bob"),
               (1033, 42, "alice"),
               (1021, 43, "alice"), (1022, 43, "alice"),
               (1023, 43, "alice"), (1024, 43, "alice"),
               (1025, 43, "alice"), (4101, 42, "alice"),
               (1009, 42, "alice"), (1040, 43, "alice"),
               (1060, 43, "alice"), (1061, 43, "alice"),
               (1062, 43, "alice"), (1063, 43, "alice"),
               (1064, 43, "alice"), (1065, 43, "alice"),
               (1066, 43, "alice"),
               (1070, 44, "alice"), (1071, 45, "alice")]
# Comments on myorg/twin's PR 42.
TWIN_COMMENTS = [1051, 1052]
# Review comments (on the diff), numbered apart from the issue comments as
# on GitHub: 1040 is both an issue comment and a review comment on PR 43.
GH_REVIEW_COMMENTS = [(1040, 43, "alice")]
GL_NOTES = [(3001, 2, "pipin"), (3002, 2, "guest"), (3003, 2, "pipin"),
            (3004, 2, "pipin"), (3101, 3, "release-helper"),
            (3102, 3, "release-helper"), (3103, 3, "pipin"),
            (3104, 3, "dana"), (3201, 4, "pipin"), (3005, 2, "lapsed"),
            (3006, 2, "blocked")]


def seed():
    spec = json.loads(json.dumps(SEED))
    for repo in spec["github"]["repos"]:
        if repo["full_name"] == "myorg/twin":
            repo["pulls"][0]["comments"] = [
                {"id": cid, "user": "alice", "body": "(comment %d)" % cid}
                for cid in TWIN_COMMENTS]
            continue
        for pr in repo["pulls"]:
            pr["comments"] = [
                {"id": cid, "user": who, "body": "(comment %d)" % cid}
                for (cid, n, who) in GH_COMMENTS
                if n == pr["number"] and (repo["full_name"] ==
                                          "myorg/checkout") == (n != 1)]
            pr["review_comments"] = [
                {"id": cid, "user": who, "body": "(review comment %d)" % cid,
                 "path": "checkout.py", "line": 1}
                for (cid, n, who) in GH_REVIEW_COMMENTS
                if n == pr["number"] and repo["full_name"] ==
                "myorg/checkout"]
    for mr in spec["gitlab"]["projects"][0]["merge_requests"]:
        mr["notes"] = [{"id": nid, "author": who, "body": "(note %d)" % nid}
                       for (nid, iid, who) in GL_NOTES if iid == mr["iid"]]
    return spec


CONFIG = """
log:
  level: info
namespace: default
controller:
  enabled: false
repos:
  # spelled in another case than the repositories (myorg/checkout): GitHub
  # and GitLab names are case-insensitive, so is the match
  - match: "127.0.0.1/MyOrg/*"
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


def gh_comment(cid, number, login, body, repo="myorg/checkout", uid=1,
               utype="User"):
    doc = with_comment(fixture(
        "github/go-playground--pull-request-issue-comment.json"), body)
    doc["repository"]["full_name"] = repo
    doc["repository"]["clone_url"] = "https://github.com/%s.git" % repo
    doc["issue"]["number"] = number
    doc["comment"]["id"] = cid
    doc["comment"]["user"]["login"] = login
    doc["comment"]["user"]["id"] = uid
    doc["comment"]["user"]["type"] = utype
    return doc


def gh_review_comment(cid, number, login, body, repo="myorg/checkout",
                      uid=1):
    """A pull_request_review_comment "created" webhook (a comment on the
    diff) of a same-repository PR."""
    doc = with_comment(fixture("github/octokit-webhooks--pull_request_"
                               "review_comment.created.payload.json"), body)
    doc.pop("installation", None)
    url = "https://github.com/%s.git" % repo
    doc["repository"]["full_name"] = repo
    doc["repository"]["clone_url"] = url
    doc["pull_request"]["number"] = number
    doc["pull_request"]["head"]["repo"]["clone_url"] = url
    doc["pull_request"]["base"]["repo"]["clone_url"] = url
    doc["comment"]["id"] = cid
    doc["comment"]["user"]["login"] = login
    doc["comment"]["user"]["id"] = uid
    return doc


def gl_note(nid, iid, username, uid, body):
    doc = with_comment(fixture(
        "gitlab/gitlab-docs--comment-on-a-merge-request.json"), body)
    doc["project_id"] = 5
    doc["project"]["id"] = 5
    doc["project"]["path_with_namespace"] = "myorg/diaspora"
    doc["merge_request"]["iid"] = iid
    doc["merge_request"]["source_project_id"] = 5
    doc["merge_request"]["target_project_id"] = 5
    doc["object_attributes"]["id"] = nid
    doc["user"]["username"] = username
    doc["user"]["id"] = uid
    return doc



def first_change(d, path, rv, pred, timeout=20):
    """The first object a watch from rv reports that satisfies pred."""
    c = http.client.HTTPConnection("127.0.0.1", d.api_port, timeout=timeout)
    try:
        c.request("GET", "%s?watch=1&resourceVersion=%s" % (path, rv))
        r = c.getresponse()
        end = time.time() + timeout
        while time.time() < end:
            line = r.readline()
            if not line:
                return None
            obj = json.loads(line).get("object") or {}
            if pred(obj):
                return obj
        return None
    finally:
        c.close()


def get_task(d, name, ns=NS):
    s, obj = api(d, "GET", TASKS % ns + "/" + name)
    return obj if s == 200 else None



def gh_reactions(fake, number, cid, kind="comments"):
    """The reactions on issue comment cid (kind "review_comments": on
    review comment cid) of PR number."""
    pulls = fake.state()["github"]["repos"]["myorg/checkout"]["pulls"]
    for c in pulls[str(number)][kind]:
        if c["id"] == cid:
            return [r["content"] for r in c["reactions"]]
    return []


def gh_bot_replies(fake, number):
    pulls = fake.state()["github"]["repos"]["myorg/checkout"]["pulls"]
    return [c["body"] for c in pulls[str(number)]["comments"]
            if c["user"] == "diverge-bot"]


def handled(d, key, provider="github"):
    rows = d.query("SELECT count FROM handled_events WHERE key = ?",
                   (provider + ":" + key,))
    return rows[0][0] if rows else 0


def gl_mr_notes(fake, iid):
    return fake.state()["gitlab"]["projects"]["5"]["merge_requests"][
        str(iid)]["notes"]


def gl_awards(fake, iid, nid, field="name"):
    return [a[field] for n in gl_mr_notes(fake, iid) if n["id"] == nid
            for a in n["award_emoji"]]


def gl_bot_replies(fake, iid):
    return [n["body"] for n in gl_mr_notes(fake, iid)
            if n["author"] in ("diverge-bot", "diverge-rot")]


def gl_user_lookups(fake, uid):
    return [r["status"] for r in fake.requests()
            if r["method"] == "GET" and
            r["path"] == "/gitlab/api/v4/users/%d" % uid]


def bot_daemon(fake, config, env, prepare=None, wait=True):
    """diverged started with config (its {gh} and {gl} the fake's API
    URLs) and the bot's tokens in the files config names; prepare(d), if
    given, runs just before the start; without wait, the start is not
    waited for."""
    d = Daemon(config.format(gh=fake.base + "/github",
                             gl=fake.base + "/gitlab/api/v4"), env=env)
    with open(os.path.join(d.tmp, "gh-token"), "w") as f:
        f.write("ghp_bot\n")
    with open(os.path.join(d.tmp, "gl-token"), "w") as f:
        f.write("glpat-bot\n")
    if prepare is not None:
        prepare(d)
    return d.start(wait=wait)


def old_comment_table(d):
    """A state database from before scm_comments recorded the progress
    of a comment's commands: diverged adds the columns."""
    os.makedirs(d.state_dir, exist_ok=True)
    con = sqlite3.connect(d.db())
    con.execute("CREATE TABLE scm_comments (key TEXT PRIMARY KEY,"
                " delivery TEXT NOT NULL, state INTEGER NOT NULL,"
                " at INTEGER NOT NULL)")
    con.commit()
    con.close()


def main(t):
    fake = ScmFake()
    fake.call("POST", "/_fake/seed", seed())
    d = bot_daemon(fake, CONFIG, {"DIVERGE_SCM_MAX_WAIT_MS": "2000"},
                   old_comment_table)
    t.ok(d.wait_log("github identity") and
         any("login=diverge-bot" in l for l in d.log()),
         "the bot's own identity comes from GET /user at start")

    # --- fix by a write-access author on a same-repository PR
    key = str(uuid.uuid4())
    s, _, j = d.github("issue_comment", gh_comment(
        1001, 42, "alice", "please\n/diverge fix make checkout fast"), key)
    t.eq(s, 202, "fix comment: 202")
    task = wait(lambda: get_task(d, "fix-pr-42"))
    t.ok(task is not None, "AgentTask fix-pr-42 created in the namespace "
         "the repos rule gives (team-a)")
    spec = (task or {}).get("spec", {})
    ann = (task or {}).get("metadata", {}).get("annotations", {})
    t.eq(spec.get("objective"), "make checkout fast", "objective from "
         "the command")
    t.eq(spec.get("repository", {}).get("baseBranch"), "main",
         "baseBranch from the PR")
    t.eq(spec.get("repository", {}).get("workingBranch"), "fix-n1",
         "workingBranch is the PR's head branch")
    t.eq((spec.get("maxIterations"), spec.get("budgetUSD"),
          spec.get("capabilities")), (3, "2.50", ["claude-*"]),
         ".diverge/agent.yaml of the default branch applied (not the head's "
         "maxIterations 99)")
    t.eq((ann.get("divergedev.com/provider"), ann.get(
        "divergedev.com/project"), ann.get("divergedev.com/pr-number")),
        ("github", "myorg/checkout", "42"), "provider, project and "
        "pr-number annotations")
    t.ok(wait(lambda: gh_reactions(fake, 42, 1001) == ["eyes"]),
         "eyes reaction on the accepted comment",
         gh_reactions(fake, 42, 1001))
    t.eq(gh_bot_replies(fake, 42), [], "nothing else posted for an "
         "accepted command")
    t.eq(wait(lambda: handled(d, key)), 1, "the delivery was handled once")

    # --- the same comment under a second delivery id: nothing more
    key2 = str(uuid.uuid4())
    s, _, _ = d.github("issue_comment", gh_comment(
        1001, 42, "alice", "please\n/diverge fix make checkout fast"), key2)
    t.eq(s, 202, "the same comment under another delivery id: 202")
    wait(lambda: handled(d, key2))
    time.sleep(0.3)
    posts = [r for r in fake.requests() if r["method"] == "POST" and
             "/comments/1001/reactions" in r["path"]]
    t.eq(len(posts), 1, "one reaction request in all: the comment was "
         "handled once")

    # --- a read-only author: refused
    s, _, _ = d.github("issue_comment", gh_comment(
        1002, 43, "carol", "/diverge fix something", uid=3),
        str(uuid.uuid4()))
    t.ok(wait(lambda: gh_reactions(fake, 43, 1002) == ["confused"]),
         "read-only author: confused reaction")
    replies = wait(lambda: gh_bot_replies(fake, 43))
    t.ok(len(replies) == 1 and "write access" in replies[0],
         "read-only author: one reply explaining why", replies)
    t.ok(get_task(d, "fix-pr-43") is None, "read-only author: no task")

    # --- the permission API refusing the bot (403): fail closed
    fake.call("POST", "/_fake/faults", {"status": 403, "count": 20,
                                        "match": "/collaborators/bob"})
    s, _, _ = d.github("issue_comment", gh_comment(
        1003, 43, "bob", "/diverge fix something", uid=2),
        str(uuid.uuid4()))
    t.ok(wait(lambda: "confused" in gh_reactions(fake, 43, 1003), 30),
         "permission API failing: confused reaction")
    t.ok(get_task(d, "fix-pr-43") is None, "permission API failing: "
         "nothing created")
    fake.call("DELETE", "/_fake/faults")

    # --- the author's login names another account by the time of the
    # check (renamed, and taken by alice): alice's access is not theirs
    s, _, _ = d.github("issue_comment", gh_comment(
        1009, 42, "alice", "/diverge pause", uid=4), str(uuid.uuid4()))
    t.ok(wait(lambda: gh_reactions(fake, 42, 1009) == ["confused"], 20),
         "a login that is another account's now: refused (confused)",
         gh_reactions(fake, 42, 1009))
    t.ok(not (get_task(d, "fix-pr-42") or {}).get("spec", {}).get(
        "suspended"), "... and the task is not paused")

    # --- the bot's own comments, other bots, our help text: nothing
    n_before = len(fake.requests())
    s, _, j = d.github("issue_comment", gh_comment(
        1004, 43, "diverge-bot", "/diverge fix loop", uid=900),
        str(uuid.uuid4()))
    t.eq((s, j.get("ignored")), (200, "comment by diverge itself"),
         "our own comment: ignored at the door")
    s, _, j = d.github("issue_comment", gh_comment(
        1005, 43, "renovate[bot]", "/diverge fix deps", uid=77,
        utype="Bot"), str(uuid.uuid4()))
    t.eq((s, j.get("ignored")), (200, "comment by a bot"),
         "another bot's comment: ignored")
    help_reply = [b for b in gh_bot_replies(fake, 43)][0]
    s, _, j = d.github("issue_comment", gh_comment(
        1006, 43, "alice", "> " + help_reply.replace("\n", "\n> ")),
        str(uuid.uuid4()))
    time.sleep(0.5)
    t.ok(gh_reactions(fake, 43, 1006) == [], "a comment quoting our reply "
         "runs nothing", gh_reactions(fake, 43, 1006))
    edited = fixture("github/octokit-webhooks--issue_comment.edited."
                     "payload.json")
    s, _, j = d.github("issue_comment", with_comment(edited,
                                                     "/diverge fix x"),
                       str(uuid.uuid4()))
    t.eq(s, 200, "an edit: ignored")

    # --- a broken agent.yaml on the base branch: reported by line
    s, _, _ = d.github("issue_comment", gh_comment(
        1007, 1, "alice", "/diverge fix it", repo="myorg/broken"),
        str(uuid.uuid4()))

    def broken_reply():
        pulls = fake.state()["github"]["repos"]["myorg/broken"]["pulls"]
        return [c["body"] for c in pulls["1"]["comments"]
                if c["user"] == "diverge-bot"]
    r = wait(broken_reply)
    t.ok(r and ".diverge/agent.yaml:3:" in r[0], "a broken agent.yaml: "
         "the reply names the line", r)
    # every line of the quoted error stays in the quote, whatever ends it
    t.ok(r and all(line.startswith(">     ") for line in
                   re.split(r"\r\n|\r|\n", r[0])[1:]),
         "a broken agent.yaml: the error is quoted line by line", r)
    t.ok(get_task(d, "fix-pr-1") is None, "a broken agent.yaml: no task")

    # --- a fork PR: refused with a reason
    s, _, _ = d.github("issue_comment", gh_comment(
        1008, 7, "alice", "/diverge fix from fork"), str(uuid.uuid4()))
    r = wait(lambda: gh_bot_replies(fake, 7))
    t.ok(r and "fork" in r[0], "a fork PR: a reply saying why", r)
    t.ok(get_task(d, "fix-pr-7") is None, "a fork PR: no task")

    # --- a closed or merged PR/MR: no agent is started on it (its close
    # already ended its tasks, and no later event would end this one)
    for cid, n, state in ((1070, 44, "closed"), (1071, 45, "merged")):
        d.github("issue_comment", gh_comment(
            cid, n, "alice", "/diverge fix it anyway"), str(uuid.uuid4()))
        r = wait(lambda: gh_bot_replies(fake, n))
        t.ok(r and state in r[0] and wait(
            lambda: gh_reactions(fake, n, cid) == ["confused"]),
            "a %s PR: confused and a reply saying why" % state, r)
        t.ok(get_task(d, "fix-pr-%d" % n) is None, "a %s PR: no task" %
             state)
    d.gitlab("Note Hook", gl_note(3201, 4, "pipin", 11,
                                  "/diverge fix it anyway"),
             str(uuid.uuid4()))
    r = wait(lambda: gl_bot_replies(fake, 4))
    t.ok(r and "closed" in r[0] and wait(
        lambda: gl_awards(fake, 4, 3201) == ["confused"]),
        "a closed MR: confused and a reply saying why", r)
    t.ok(get_task(d, "fix-mr-4") is None, "a closed MR: no task")

    # --- agent.yaml comes from the default branch, not the PR's base,
    # which the PR's author picks (bob has write access, not maintainer)
    d.github("issue_comment", gh_comment(1030, 50, "bob", "/diverge fix it",
                                         uid=2), str(uuid.uuid4()))
    spec = (wait(lambda: get_task(d, "fix-pr-50")) or {}).get("spec", {})
    t.eq((spec.get("maxIterations"), spec.get("budgetUSD"),
          spec.get("capabilities")), (3, "2.50", ["claude-*"]),
         "a PR based on a branch its author pushed: agent.yaml of the "
         "default branch, not of that base branch")
    t.eq(spec.get("repository", {}).get("baseBranch"), "bob-base",
         "the task's baseBranch is still the PR's")
    # bob's write access here, just checked, is no access to myorg/broken
    d.github("issue_comment", gh_comment(1031, 1, "bob", "/diverge fix it",
                                         repo="myorg/broken", uid=2),
             str(uuid.uuid4()))

    def bob_refused():
        pulls = fake.state()["github"]["repos"]["myorg/broken"]["pulls"]
        return [c["body"] for c in pulls["1"]["comments"]
                if c["user"] == "diverge-bot" and "@bob" in c["body"]]
    r = wait(bob_refused)
    t.ok(r and "needs write access" in r[0], "an author's access is checked "
         "repository by repository: refused in another one", r)
    t.ok(get_task(d, "fix-pr-1") is None, "... and no task there")

    # --- guide, budget, pause, resume, status, help on PR 42
    def steer(cid, body, who="alice", uid=1):
        d.github("issue_comment", gh_comment(cid, 42, who, body, uid=uid),
                 str(uuid.uuid4()))
        wait(lambda: gh_reactions(fake, 42, cid))
        return get_task(d, "fix-pr-42")

    task = steer(1010, "/diverge guide keep the API stable")
    t.eq(task["metadata"]["annotations"].get("divergedev.com/guidance"),
         "keep the API stable", "guide sets divergedev.com/guidance")
    task = steer(1011, "/diverge pause")
    t.eq(task["spec"].get("suspended"), True, "pause sets spec.suspended")
    task = steer(1012, "/diverge budget +$2.50 500k")
    t.eq((task["spec"].get("budgetUSD"), task["spec"].get("budgetTokens")),
         ("5.00", 1500000), "budget adds to the effective budgets "
         "(2.50 + 2.50, 1M default + 500k)")
    t.eq(task["spec"].get("suspended"), True, "budget leaves suspension "
         "unchanged")
    task = steer(1013, "/diverge resume +1")
    t.eq((task["spec"].get("suspended"), task["spec"].get("budgetUSD")),
         (False, "6.00"), "resume +1: bump then spec.suspended false")
    before = len(gh_bot_replies(fake, 42))
    task = steer(1014, "/diverge budget +1", who="bob", uid=2)
    t.eq(gh_reactions(fake, 42, 1014), ["confused"], "budget needs a "
         "maintainer: bob (write) is refused")
    wait(lambda: len(gh_bot_replies(fake, 42)) == before + 1)
    steer(1015, "/diverge status", who="carol", uid=3)
    replies = wait(lambda: (lambda r: r if len(r) == before + 2 else None)(
        gh_bot_replies(fake, 42))) or gh_bot_replies(fake, 42)
    t.ok(len(replies) == before + 2 and "fix-pr-42" in replies[-1],
         "status (anyone may ask): one reply with the task", replies[-1:])
    steer(1016, "/diverge help", who="carol", uid=3)
    replies = wait(lambda: (lambda r: r if len(r) == before + 3 else None)(
        gh_bot_replies(fake, 42))) or gh_bot_replies(fake, 42)
    t.ok("/diverge fix" in replies[-1] and not any(
        l.startswith("/diverge") for l in replies[-1].splitlines()),
        "help: the command table, every example inert")

    # --- one comment, commands of two roles: the highest is needed before
    # any of them runs (bob may guide, not add to the budget)
    was = get_task(d, "fix-pr-42")
    before = len(gh_bot_replies(fake, 42))
    task = steer(1032, "/diverge guide mixed-roles-hint\n/diverge budget +1",
                 who="bob", uid=2)
    replies = wait(lambda: (lambda r: r if len(r) == before + 1 else None)(
        gh_bot_replies(fake, 42))) or gh_bot_replies(fake, 42)
    t.ok(gh_reactions(fake, 42, 1032) == ["confused"] and
         len(replies) == before + 1 and
         "`budget` needs maintain access" in replies[-1],
         "guide and budget in one comment by bob (write): refused, the "
         "reply names budget", (gh_reactions(fake, 42, 1032), replies[-1:]))
    t.eq((task["metadata"]["annotations"].get("divergedev.com/guidance"),
          task["spec"].get("budgetUSD")),
         (was["metadata"]["annotations"].get("divergedev.com/guidance"),
          was["spec"].get("budgetUSD")),
         "... and neither command ran (guidance and budget unchanged)")

    # --- a reply quotes what it could not run, and a credential pasted
    # there by mistake is not posted back for everyone to read
    # (a GitLab token is short enough to be echoed: 26 characters)
    pasted = "glpat-" + "R3dact3dT0kenAbCdEfG"
    before = len(gh_bot_replies(fake, 42))
    steer(1033, "/diverge budget " + pasted)
    replies = wait(lambda: (lambda r: r if len(r) == before + 1 else None)(
        gh_bot_replies(fake, 42))) or gh_bot_replies(fake, 42)
    t.ok(len(replies) == before + 1 and "is not an amount" in replies[-1]
         and pasted not in replies[-1] and pasted[6:14] not in replies[-1],
         "a token pasted into a command: the reply quotes the error, the "
         "token redacted", replies[-1:])
    # quoted as code: what the comment wrote is never read as Markdown
    t.ok(replies[-1:] and all(line.startswith(">     ") for line in
                              replies[-1].splitlines()[1:]),
         "... the error in a quoted code block", replies[-1:])

    # --- a comment retried for its reaction or reply runs its commands once
    fake.call("POST", "/_fake/faults", {"status": 429, "count": 1,
                                        "retry_after": 3,
                                        "match": "/comments/1018/reactions"})
    task = steer(1018, "/diverge budget +$1")
    t.eq((gh_reactions(fake, 42, 1018), task["spec"].get("budgetUSD")),
         (["eyes"], "7.00"), "a rate-limited reaction is retried, the "
         "budget bump is not applied again (6.00 + 1)")
    fake.call("POST", "/_fake/faults", {"status": 503, "count": 1,
                                        "retry_after": 3, "method": "POST",
                                        "match": "/issues/42/comments"})
    n = len(gh_bot_replies(fake, 42))
    steer(1019, "/diverge resume +$1\n/diverge status")
    replies = wait(lambda: (lambda r: r if len(r) > n else None)(
        gh_bot_replies(fake, 42)), 20) or []
    time.sleep(1)
    task = get_task(d, "fix-pr-42")
    t.ok(len(gh_bot_replies(fake, 42)) == n + 1 and "| `fix-pr-42` |" in
         replies[-1] and (task["spec"].get("budgetUSD"),
                          task["spec"].get("suspended")) == ("8.00", False),
         "a failed reply is posted on the retry, with the status the first "
         "attempt took; resume +$1 applied once",
         (task["spec"].get("budgetUSD"), replies[n:]))

    # --- a finished task re-runs on /diverge fix
    s, done = api(d, "PATCH", TASKS % NS + "/fix-pr-42/status",
                  {"status": {"phase": "Completed", "run": 1,
                              "costUSD": "1.000000", "tokensConsumed": 10,
                              "notifier": {"reportedPhase": "Completed"}}},
                  "application/merge-patch+json")
    rerun = {}
    watcher = threading.Thread(target=lambda: rerun.update(first_change(
        d, TASKS % NS + "/fix-pr-42", done["metadata"]["resourceVersion"],
        lambda o: (o.get("status") or {}).get("run") == 2) or {}))
    watcher.start()
    steer(1017, "/diverge fix again, better")
    task = wait(lambda: (lambda x: x if x and x.get("status", {}).get(
        "run") == 2 else None)(get_task(d, "fix-pr-42")))
    t.ok(task and task["status"]["phase"] == "Pending" and
         task["status"]["tokensConsumed"] == 0 and
         task["spec"]["objective"] == "again, better",
         "a finished task re-runs: run + 1, counters reset",
         (task or {}).get("status"))
    watcher.join(30)
    nt = (rerun.get("status") or {}).get("notifier")
    t.ok(rerun and "reportedPhase" not in (nt or {}),
         "the re-run's write forgets the notifier's reportedPhase, so the "
         "run's end is reported even if the phases in between are missed",
         rerun.get("status"))

    # --- GitLab: a note on an MR
    key = str(uuid.uuid4())
    s, _, _ = d.gitlab("Note Hook", gl_note(3001, 2, "pipin", 11,
                                            "/diverge fix the MR"), key)
    t.eq(s, 202, "gitlab note: 202")
    task = wait(lambda: get_task(d, "fix-mr-2"))
    ann = (task or {}).get("metadata", {}).get("annotations", {})
    t.eq((ann.get("divergedev.com/project-id"),
          ann.get("divergedev.com/mr-iid"),
          (task or {}).get("spec", {}).get("repository", {}).get(
              "workingBranch")), ("5", "2", "feature"),
         "GitLab: task fix-mr-2 with project-id, mr-iid and the source "
         "branch")
    t.eq(((task or {}).get("spec", {}).get("maxIterations"),
          (task or {}).get("spec", {}).get("budgetUSD")), (3, "2.50"),
         "GitLab: .diverge/agent.yaml of the default branch applied")

    t.ok(wait(lambda: gl_awards(fake, 2, 3001) == ["eyes"]),
         "GitLab: eyes award emoji", gl_awards(fake, 2, 3001))
    s, _, _ = d.gitlab("Note Hook", gl_note(3002, 2, "guest", 12,
                                            "/diverge pause"),
                       str(uuid.uuid4()))

    r = wait(lambda: gl_bot_replies(fake, 2))
    t.ok(r and "write access" in r[0], "GitLab guest (10): refused with a "
         "reply", r)
    # a maintainer's expired membership, a blocked maintainer: no access
    for nid, who, uid in ((3005, "lapsed", 16), (3006, "blocked", 17)):
        seen = len(gl_bot_replies(fake, 2))
        d.gitlab("Note Hook", gl_note(nid, 2, who, uid, "/diverge pause"),
                 str(uuid.uuid4()))
        r = wait(lambda: (lambda x: x if len(x) > seen else None)(
            gl_bot_replies(fake, 2)))
        t.ok(r and "write access" in r[-1], "GitLab %s maintainer: "
             "refused with a reply" % who, r)

    gitlab_bots(t, fake, d)

    # --- the PR closed: its live task ends
    pr = fixture("github/octokit-webhooks--pull_request.closed.payload.json")
    pr["repository"]["full_name"] = "myorg/checkout"
    pr["number"] = 42
    pr["pull_request"]["number"] = 42
    s, _, _ = d.github("pull_request", pr, str(uuid.uuid4()))
    t.eq(s, 202, "pull_request closed: 202")
    task = wait(lambda: (lambda x: x if x and x.get("status", {}).get(
        "reason") == "PullRequestClosed" else None)(get_task(d,
                                                             "fix-pr-42")))
    t.ok(task and task["status"]["phase"] == "Failed",
         "closed PR: the live task fails with PullRequestClosed")
    # a task that has ended is left as it ended: the PR merged later does
    # not rewrite its outcome (still "closed"; the controller may still
    # write other status fields, so its resourceVersion is no measure)
    pr["pull_request"]["merged"] = True
    key = str(uuid.uuid4())
    s, _, _ = d.github("pull_request", pr, key)
    t.ok(s == 202 and wait(lambda: handled(d, key)),
         "the PR merged after: handled")
    st = (get_task(d, "fix-pr-42") or {}).get("status", {})
    t.ok((st.get("phase"), st.get("reason"), st.get("message")) ==
         ("Failed", "PullRequestClosed", "the pull request was closed"),
         "an ended task is not rewritten by a later close or merge",
         (st.get("phase"), st.get("reason"), st.get("message")))

    # --- rate limits: a secondary limit is waited out
    fake.call("POST", "/_fake/faults", {"status": 403, "count": 1,
                                        "secondary": True, "retry_after": 1,
                                        "match": "/comments/1020/reactions"})
    start = time.time()
    d.github("issue_comment", gh_comment(1020, 43, "alice",
                                         "/diverge status"),
             str(uuid.uuid4()))
    t.ok(wait(lambda: gh_reactions(fake, 43, 1020) == ["eyes"]) and
         time.time() - start >= 1, "a secondary-limit 403 with "
         "Retry-After is waited out, then succeeds")
    # a reset beyond the bound requeues instead of holding a worker; the
    # limit is the token's (GitHub counts per token), so another comment
    # waits for the reset too, then both are served
    fake.call("POST", "/_fake/faults", {"status": 429, "count": 1,
                                        "retry_after": 8,
                                        "match": "/comments/1021/reactions"})
    limited = str(uuid.uuid4())
    start = time.time()
    d.github("issue_comment", gh_comment(1021, 43, "alice",
                                         "/diverge status"), limited)
    row = wait(lambda: d.query("SELECT attempts, next_at FROM inbox WHERE "
                               "key = ? AND next_at > 0",
                               ("github:" + limited,)))
    t.ok(row and row[0][0] == 0 and
         2 <= row[0][1] / 1000.0 - time.time() <= 9,
         "its next attempt is at the Retry-After (8 s), and a rate-limited "
         "attempt is not counted against inbox.max_attempts", row)
    t.ok(d.wait_log("inbox entry will be retried", 10),
         "the rate-limited entry was requeued, not waited on")
    d.github("issue_comment", gh_comment(1022, 43, "alice",
                                         "/diverge status"),
             str(uuid.uuid4()))
    t.ok(wait(lambda: gh_reactions(fake, 43, 1022) == ["eyes"] and
              gh_reactions(fake, 43, 1021) == ["eyes"], 25) and
         time.time() - start >= 7.5, "another comment with the same token "
         "waits for the reset, then both are served",
         time.time() - start)

    # a restart does not forget a rate limit: the daemon keeps it in the
    # state directory and waits it out after the restart instead of sending
    kept = os.path.join(os.path.dirname(d.db()), "ratelimits-github.json")

    def kept_until():
        try:
            with open(kept) as f:
                return max([h["untilMs"] / 1000.0 for h in
                            json.load(f)["holds"]] or [0])
        except (OSError, ValueError, KeyError):
            return 0
    fake.call("POST", "/_fake/faults", {"status": 429, "count": 1,
                                        "retry_after": 12,
                                        "match": "/comments/1024/reactions"})
    start = time.time()
    d.github("issue_comment", gh_comment(1024, 43, "alice",
                                         "/diverge status"),
             str(uuid.uuid4()))
    t.ok(wait(lambda: kept_until() > time.time() + 5),
         "a rate limit met is kept in ratelimits-github.json", kept_until())
    d.stop()
    d.start()
    d.github("issue_comment", gh_comment(1025, 43, "alice",
                                         "/diverge status"),
             str(uuid.uuid4()))
    time.sleep(2)

    def reaction_posts(cid):
        return [r for r in fake.requests() if r["method"] == "POST" and
                r["path"].endswith("/comments/%d/reactions" % cid)]
    until = re.search(r'diverge_scm_ratelimited_until_seconds\{provider='
                      r'"github"\} ([0-9.e+]+)', d.metrics())
    t.ok(time.time() - start < 10 and not reaction_posts(1025) and
         until and float(until.group(1)) > time.time() + 1,
         "after a restart within the limit, the next comment's reaction "
         "is not sent before the reset (the metric shows it)",
         (time.time() - start, reaction_posts(1025),
          until and until.group(1)))
    t.ok(d.wait_log("a rate limit met before the restart still holds"),
         "the restarted daemon says so")
    t.ok(wait(lambda: gh_reactions(fake, 43, 1024) == ["eyes"] and
              gh_reactions(fake, 43, 1025) == ["eyes"], 30) and
         min(r["time"] for r in reaction_posts(1025)) >= start + 11.5,
         "both are served after the reset",
         [r["time"] - start for r in reaction_posts(1025)])

    # SIGHUP re-reads github.token and gitlab.token: the bot then acts with
    # the new ones
    with open(os.path.join(d.tmp, "gh-token"), "w") as f:
        f.write("ghp_rot\n")
    with open(os.path.join(d.tmp, "gl-token"), "w") as f:
        f.write("glpat-rot\n")
    n = sum("reloaded secrets" in l for l in d.log())
    d.send_signal(__import__("signal").SIGHUP)
    t.ok(wait(lambda: sum("reloaded secrets" in l for l in d.log()) > n),
         "SIGHUP: reloaded")
    d.github("issue_comment", gh_comment(1023, 43, "alice",
                                         "/diverge status"),
             str(uuid.uuid4()))

    def reactors():
        pulls = fake.state()["github"]["repos"]["myorg/checkout"]["pulls"]
        return [x["user"] for c in pulls["43"]["comments"]
                if c["id"] == 1023 for x in c["reactions"]]
    t.eq(wait(lambda: reactors()), ["diverge-rot"], "after SIGHUP the "
         "reaction is made with the rotated github.token")
    d.gitlab("Note Hook", gl_note(3003, 2, "pipin", 11, "/diverge status"),
             str(uuid.uuid4()))

    t.eq(wait(lambda: gl_awards(fake, 2, 3003, "user")), ["diverge-rot"],
         "and the GitLab "
         "award with the rotated gitlab.token")
    t.ok(not any("ghp_rot" in l or "ghp_bot" in l or "glpat-" in l
                 for l in d.log()),
         "tokens are never logged")

    t.eq(d.stop(), 0, "clean stop")
    review_comment_apart(t, fake)
    commands_applied_once(t, fake)
    claims_pruned(t, fake)
    outage_waited_out(t, fake)
    identity_learned_later(t, fake)
    raises_turned_off(t, fake)
    twin_repositories(t, fake)
    fake.stop()


def gitlab_bots(t, fake, d):
    """GitLab's webhook does not say who is a bot: access token bots are
    known by their reserved names at the door, and any other author (a
    service account may have any name) is looked up in the Users API,
    once per author while cached; a bot's comment runs nothing."""
    s, _, j = d.gitlab("Note Hook", gl_note(3100, 3, "project_5_bot_1a2b3c",
                                            14, "/diverge fix loop"),
                       str(uuid.uuid4()))
    t.eq((s, j.get("ignored")), (200, "comment by a bot"),
         "GitLab project access token bot: ignored at the door")
    key = str(uuid.uuid4())
    s, _, _ = d.gitlab("Note Hook", gl_note(3101, 3, "release-helper", 13,
                                            "/diverge fix make it fast"), key)
    t.eq(s, 202, "a developer with a person's name: accepted at the door")
    t.ok(wait(lambda: handled(d, key, "gitlab")), "... and handled")
    t.ok(get_task(d, "fix-mr-3") is None and
         gl_awards(fake, 3, 3101) == [] and gl_bot_replies(fake, 3) == [],
         "bot: true in the Users API: nothing runs, no award, no reply",
         (gl_awards(fake, 3, 3101), gl_bot_replies(fake, 3)))
    t.ok(any("comment by a bot: ignored" in ln and "author=release-helper"
             in ln for ln in d.log()), "the bot's comment is logged as "
         "ignored")
    key = str(uuid.uuid4())
    d.gitlab("Note Hook", gl_note(3102, 3, "release-helper", 13,
                                  "/diverge help"), key)
    t.ok(wait(lambda: handled(d, key, "gitlab")) and
         gl_bot_replies(fake, 3) == [] and gl_awards(fake, 3, 3102) == [],
         "its /diverge help is ignored too (no reply for bots to answer)")
    t.eq(gl_user_lookups(fake, 13), [200], "one Users API call for both "
         "comments: the answer is cached")
    d.gitlab("Note Hook", gl_note(3103, 3, "pipin", 11,
                                  "/diverge fix make it fast"),
             str(uuid.uuid4()))
    task = wait(lambda: get_task(d, "fix-mr-3"))
    t.ok(task and task["spec"]["objective"] == "make it fast" and
         wait(lambda: gl_awards(fake, 3, 3103) == ["eyes"]),
         "a person's same command on the same MR runs", task)
    t.ok(200 in gl_user_lookups(fake, 11), "... after the Users API said "
         "bot: false")
    # fail closed: the lookup refused (403) refuses the comment
    fake.call("POST", "/_fake/faults", {"provider": "gitlab", "status": 403,
                                        "match": "/users/15"})
    d.gitlab("Note Hook", gl_note(3104, 3, "dana", 15,
                                  "/diverge guide use the cache"),
             str(uuid.uuid4()))
    r = wait(lambda: [b for b in gl_bot_replies(fake, 3)
                      if "could not check the account of @dana" in b])
    t.ok(r and
         wait(lambda: gl_awards(fake, 3, 3104) == ["confused"]) and
         "divergedev.com/guidance" not in get_task(
             d, "fix-mr-3")["metadata"].get("annotations", {}),
         "the Users API refusing the lookup (403): refused with a reply, "
         "nothing run (fail closed)", r)


def twin_repositories(t, fake):
    """Two repositories whose tasks share a namespace, each with a PR 42:
    the second one's task takes another name (fix-pr-42-<its repo's hash>)
    and the first one's task is never touched by the second's comments."""
    d = bot_daemon(fake, CONFIG, {"DIVERGE_SCM_MAX_WAIT_MS": "2000"})

    def fix(cid, repo, objective):
        key = str(uuid.uuid4())
        d.github("issue_comment", gh_comment(cid, 42, "alice",
                                             "/diverge fix " + objective,
                                             repo=repo), key)
        wait(lambda: handled(d, key))

    def tasks():
        s, obj = api(d, "GET", TASKS % NS)
        return {i["metadata"]["name"]: (
            i["spec"].get("objective"),
            i["metadata"].get("annotations", {}).get(
                "divergedev.com/project"))
            for i in (obj or {}).get("items", [])} if s == 200 else {}

    fix(1001, "myorg/checkout", "the first")
    fix(1051, "myorg/twin", "the second")
    got = tasks()
    other = [n for n in got if n.startswith("fix-pr-42-")]
    t.ok(got.get("fix-pr-42") == ("the first", "myorg/checkout") and
         len(other) == 1 and re.fullmatch(r"fix-pr-42-[0-9a-f]{6}",
                                          other[0]) and
         got[other[0]] == ("the second", "myorg/twin"),
         "a PR 42 of another repository in the same namespace: its own "
         "task fix-pr-42-<hash>, the first one's untouched", got)
    fix(1052, "myorg/twin", "the third")
    got2 = tasks()
    t.ok(len(got2) == 2 and got2.get("fix-pr-42") == ("the first",
                                                      "myorg/checkout") and
         other and got2.get(other[0]) == ("the third", "myorg/twin"),
         "its next fix updates its own task, found under that name", got2)
    t.eq(d.stop(), 0, "clean stop")


def review_comment_apart(t, fake):
    """An issue comment and a review comment with the same id are two
    comments (GitHub numbers them apart): both run their commands."""
    d = bot_daemon(fake, CONFIG, {"DIVERGE_SCM_MAX_WAIT_MS": "2000"})
    key = str(uuid.uuid4())
    d.github("issue_comment", gh_comment(1040, 43, "alice",
                                         "/diverge fix tidy up"), key)
    t.ok(wait(lambda: handled(d, key)) and get_task(d, "fix-pr-43"),
         "issue comment 1040: its fix ran")
    key = str(uuid.uuid4())
    s, _, _ = d.github("pull_request_review_comment", gh_review_comment(
        1040, 43, "alice", "/diverge guide mind the tests"), key)
    t.eq(s, 202, "review comment 1040: 202")
    wait(lambda: handled(d, key))
    task = get_task(d, "fix-pr-43") or {}
    t.eq(task.get("metadata", {}).get("annotations", {}).get(
        "divergedev.com/guidance"), "mind the tests",
        "review comment 1040: its guide ran too, not taken for the issue "
        "comment already handled")

    def both():
        return (gh_reactions(fake, 43, 1040),
                gh_reactions(fake, 43, 1040, "review_comments"))
    wait(lambda: both() == (["eyes"], ["eyes"]))
    t.eq(both(), (["eyes"], ["eyes"]), "each got its eyes, the review "
         "comment's through pulls/comments/1040/reactions")
    con = sqlite3.connect(d.db(), timeout=10)
    try:
        keys = sorted(k for (k,) in con.execute(
            "SELECT key FROM scm_comments WHERE key LIKE '%1040'"))
    finally:
        con.close()
    t.eq(keys, ["github|myorg/checkout|0|1040",
                "github|myorg/checkout|0|review:1040"],
         "the issue comment keeps the key it always had (rows stored "
         "before still match), the review comment's is marked")
    t.eq(d.stop(), 0, "clean stop")


def commands_applied_once(t, fake):
    """A command's effect (the task, in the store) and the record that it
    ran (the comment's progress, in the state database) are two writes:
    when the second is lost (a failed write, a crash in between) the
    comment runs again, on its own retry or taken over by another
    delivery, and a budget bump must still be added once."""
    d = bot_daemon(fake, CONFIG, {"DIVERGE_SCM_MAX_WAIT_MS": "2000"})

    def budget():
        """fix-pr-43's USD budget in cents"""
        usd = (get_task(d, "fix-pr-43") or {}).get("spec", {}).get(
            "budgetUSD", "0")
        return int(round(float(usd) * 100))

    def applied():
        return (get_task(d, "fix-pr-43") or {}).get("metadata", {}).get(
            "annotations", {}).get("divergedev.com/applied-commands", "")

    def comment(cid, body):
        key = str(uuid.uuid4())
        d.github("issue_comment", gh_comment(cid, 43, "alice", body), key)
        return key

    key = comment(1060, "/diverge fix keep it short")
    t.ok(wait(lambda: handled(d, key)) and budget() == 250,
         "a task with the budget of agent.yaml ($2.50)")
    # from now on the progress of a comment is never recorded
    con = sqlite3.connect(d.db(), timeout=10)
    con.execute("CREATE TRIGGER progress_lost BEFORE UPDATE OF progress"
                " ON scm_comments BEGIN SELECT RAISE(ABORT, 'disk full');"
                " END")
    con.commit()
    con.close()

    # its own retry (the reaction rate limited) after a failed write
    fake.call("POST", "/_fake/faults", {"status": 429, "count": 1,
                                        "retry_after": 3,
                                        "match": "/comments/1061/reactions"})
    before = budget()
    comment(1061, "/diverge budget +$1")
    t.ok(wait(lambda: gh_reactions(fake, 43, 1061) == ["eyes"], 20) and
         d.wait_log("comment progress not recorded"),
         "budget +$1: ran, its progress not recorded, retried for its "
         "reaction")
    t.eq((budget() - before, "1061#0" in applied().split()), (100, True),
         "the retry does not bump again (+100 cents in all): the task "
         "records the command")
    t.ok(d.wait_log("applied=1061#0"), "... and the retry says so")

    # a crash (kill -9) after the bump, before the comment is finished
    fake.call("POST", "/_fake/faults", {"delay_ms": 6000, "count": 1,
                                        "match": "/comments/1062/reactions"})
    before = budget()
    key = comment(1062, "/diverge budget +$1")
    t.ok(wait(lambda: budget() == before + 100), "budget +$1 applied, then "
         "the daemon is killed while it waits for the reaction")
    d.kill9()
    d.start()
    t.ok(wait(lambda: handled(d, key), 30) and
         d.wait_log("applied=1062#0"), "after the restart the comment "
         "runs again (its own delivery, its claim unfinished)")
    t.eq(budget() - before, 100, "... and the budget is bumped once "
         "(cents)")

    # an abandoned claim taken over by another delivery of the comment
    fake.call("POST", "/_fake/faults", {"status": 429, "count": 1,
                                        "retry_after": 10,
                                        "match": "/comments/1063/reactions"})
    before = budget()
    first = comment(1063, "/diverge budget +$1")
    t.ok(wait(lambda: d.query("SELECT 1 FROM inbox WHERE key = ? AND"
                              " next_at > 0", ("github:" + first,)), 20)
         and budget() == before + 100, "budget +$1 applied, its delivery "
         "waiting for a rate limit's reset (10 s)")
    con = sqlite3.connect(d.db(), timeout=10)
    con.execute("UPDATE scm_comments SET at = at - 11 * 60 * 1000 WHERE"
                " key = 'github|myorg/checkout|0|1063'")
    con.commit()
    con.close()
    comment(1063, "/diverge budget +$1")
    t.ok(wait(lambda: gh_reactions(fake, 43, 1063) == ["eyes"], 20) and
         d.wait_log("applied=1063#0"), "11 minutes on (the claim's age "
         "set back), another delivery takes the comment over and runs it "
         "(once the token's limit ends: both deliveries wait for it)")
    t.eq(budget() - before, 100, "... and the budget is bumped once "
         "(cents)")

    # /diverge fix on a finished task re-runs it with a status write,
    # which cannot record the command in the task: it runs once all the
    # same, even when the task has finished again by the retry
    def run():
        return (get_task(d, "fix-pr-43") or {}).get("status", {}).get(
            "run", 0)

    def finish():
        s, _ = api(d, "PATCH", TASKS % NS + "/fix-pr-43/status",
                   {"status": {"phase": "Completed"}},
                   "application/merge-patch+json")
        return s == 200

    t.ok(finish(), "fix-pr-43 completed")
    fake.call("POST", "/_fake/faults", {"status": 429, "count": 1,
                                        "retry_after": 5,
                                        "match": "/comments/1064/reactions"})
    before = run()
    comment(1064, "/diverge fix shorter still")
    t.ok(wait(lambda: run() == before + 1) and finish(), "fix: the "
         "finished task re-runs (its progress not recorded), and its run "
         "ends before the comment's retry (for its reaction)")
    t.ok(wait(lambda: gh_reactions(fake, 43, 1064) == ["eyes"], 20) and
         d.wait_log("task re-run already"), "the retry finds the run "
         "it made and says so")
    t.eq(run() - before, 1, "... and re-runs the task once (status.run)")

    # a crash (kill -9) after the re-run, the run over by the restart
    fake.call("POST", "/_fake/faults", {"delay_ms": 6000, "count": 1,
                                        "match": "/comments/1065/reactions"})
    finish()
    before = run()
    key = comment(1065, "/diverge fix once more")
    t.ok(wait(lambda: run() == before + 1) and finish(), "fix: re-run, "
         "and over, while the comment waits for its reaction")
    d.kill9()
    d.start()
    t.ok(wait(lambda: handled(d, key), 30) and
         wait(lambda: any("task re-run already" in ln and
                          "run=%d" % (before + 1) in ln for ln in d.log())),
         "after the restart the comment runs again and finds the run it "
         "made")
    t.eq(run() - before, 1, "... and the task is re-run once")

    # a new comment asking again re-runs it again
    before = run()
    key = comment(1066, "/diverge fix and again")
    t.ok(wait(lambda: handled(d, key), 20) and run() == before + 1,
         "a new /diverge fix re-runs the finished task again (run + 1)",
         run() - before)
    t.eq(d.stop(), 0, "clean stop")


def raises_turned_off(t, fake):
    """commands.max_bump_usd: 0 turns USD raises off (it is no "use the
    default"): a USD bump is refused with a reply that says so, and a
    token bump, whose limit is left as it is, is not refused for it."""
    d = bot_daemon(fake, CONFIG + "commands:\n  max_bump_usd: \"0\"\n",
                   {"DIVERGE_SCM_MAX_WAIT_MS": "2000"})
    before = len(gh_bot_replies(fake, 43))
    d.github("issue_comment", gh_comment(1070, 43, "alice",
                                         "/diverge budget $5"),
             str(uuid.uuid4()))
    new = wait(lambda: gh_bot_replies(fake, 43)[before:], 20) or []
    t.ok(any("USD budget raises are turned off here" in b for b in new),
         "max_bump_usd 0: a USD raise is refused, the reply says they are "
         "turned off", new)
    before = len(gh_bot_replies(fake, 43))
    d.github("issue_comment", gh_comment(1071, 43, "alice",
                                         "/diverge budget 2M"),
             str(uuid.uuid4()))
    t.ok(wait(lambda: len(gh_bot_replies(fake, 43)) > before or
              gh_reactions(fake, 43, 1071), 20), "a token raise is handled")
    later = gh_bot_replies(fake, 43)[before:]
    t.ok(not any("turned off" in b for b in later),
         "... and not refused as turned off", later)
    t.eq(d.stop(), 0, "clean stop")


def identity_learned_later(t, fake):
    """GitHub down when the daemon starts: its own identity is learned
    later (SIGHUP, or the minute's retry), and from then on its own
    comments are ignored at the door."""
    fake.call("POST", "/_fake/faults", {"provider": "github", "status": 500,
                                        "count": 1000, "method": "GET",
                                        "match": "/user"})
    d = bot_daemon(fake, CONFIG, {"DIVERGE_SCM_MAX_WAIT_MS": "2000"})
    t.ok(d.wait_log("github identity unknown", 20), "GitHub down at the "
         "start: the bot's identity is unknown")
    fake.call("DELETE", "/_fake/faults")
    d.send_signal(signal.SIGHUP)
    t.ok(d.wait_log('msg="github identity" login=diverge-bot', 20),
         "learned once GitHub is back (SIGHUP)",
         [ln for ln in d.log() if "identity" in ln])
    s, _, j = d.github("issue_comment", gh_comment(
        1005, 43, "diverge-bot", "/diverge fix loop", uid=900),
        str(uuid.uuid4()))
    t.eq((s, j.get("ignored")), (200, "comment by diverge itself"),
         "then its own comment is ignored at the door")
    t.eq(d.stop(), 0, "clean stop")


def outage_waited_out(t, fake):
    """An SCM outage longer than the client's retries and every attempt
    the inbox allows (inbox.max_attempts: 1) is waited out: the comment
    is handled when the API is back, not dead-lettered."""
    d = bot_daemon(fake, CONFIG + "inbox:\n  max_attempts: 1\n",
                   {"DIVERGE_SCM_MAX_WAIT_MS": "2000"})
    fake.call("POST", "/_fake/faults", {"status": 503, "count": 7,
                                        "method": "POST",
                                        "match": "/comments/4101/reactions"})
    key = str(uuid.uuid4())
    d.github("issue_comment", gh_comment(4101, 42, "alice",
                                         "/diverge status"), key)
    t.ok(wait(lambda: gh_reactions(fake, 42, 4101) == ["eyes"], 40),
         "reactions API down (503) beyond the client's retries: the "
         "comment is handled once it is back, not dead-lettered",
         [ln for ln in d.log() if "inbox" in ln][-4:])
    t.eq(sum(r[0] for r in d.query(
        "SELECT COUNT(*) FROM inbox WHERE state = 2")), 0, "no dead letter")
    fake.call("DELETE", "/_fake/faults")
    # the permission API down: nothing runs unchecked, and the command
    # runs once the check can be made (not refused for the outage)
    fake.call("POST", "/_fake/faults", {"status": 503, "count": 7,
                                        "match": "/collaborators/alice"})
    d.github("issue_comment", gh_comment(4102, 42, "alice",
                                         "/diverge fix through an outage"),
             str(uuid.uuid4()))
    t.ok(wait(lambda: get_task(d, "fix-pr-42"), 40), "the permission API "
         "down beyond the client's retries: the command runs once it is "
         "back", [ln for ln in d.log() if "inbox" in ln or "permission"
                  in ln][-4:])
    t.ok(any(r.get("status") == 503 and "/collaborators/alice" in
             r.get("path", "") for r in fake.requests()),
         "... and the check did fail meanwhile")
    fake.call("DELETE", "/_fake/faults")
    # the same for GitLab's Users API (is the author a bot?)
    fake.call("POST", "/_fake/faults", {"provider": "gitlab", "status": 503,
                                        "count": 7, "match": "/users/11"})
    d.gitlab("Note Hook", gl_note(3004, 2, "pipin", 11, "/diverge status"),
             str(uuid.uuid4()))
    t.ok(wait(lambda: gl_awards(fake, 2, 3004) == ["eyes"], 40),
         "the GitLab Users API down beyond the client's retries: the "
         "comment runs once it is back", gl_awards(fake, 2, 3004))
    t.ok(503 in gl_user_lookups(fake, 11), "... and the lookup did fail "
         "meanwhile")
    fake.call("DELETE", "/_fake/faults")
    t.eq(d.stop(), 0, "clean stop")


def claims_pruned(t, fake):
    """scm_comments, the claims that keep a comment from running twice,
    is pruned with the inbox's retention (a claim in progress: 30 days)."""
    d = bot_daemon(fake, CONFIG + "inbox:\n  retention: 2s\n",
                   {"DIVERGE_SCM_MAX_WAIT_MS": "2000"})

    def claims():
        """{comment id: state} (keys end with the comment id)"""
        con = sqlite3.connect(d.db(), timeout=10)
        try:
            return {int(k.rsplit("|", 1)[1]): v for k, v in con.execute(
                "SELECT key, state FROM scm_comments")}
        finally:
            con.close()

    def comment(cid):
        key = str(uuid.uuid4())
        d.github("issue_comment", gh_comment(cid, 42, "alice",
                                             "/diverge status"), key)
        return wait(lambda: handled(d, key))
    t.ok(comment(4001), "retention 2s: a comment is handled")
    t.eq(claims().get(4001), 1, "its claim is recorded, finished")
    now_ms = int(time.time() * 1000)
    con = sqlite3.connect(d.db(), timeout=10)
    con.executemany("INSERT INTO scm_comments (key, delivery, state, at)"
                    " VALUES (?, 'x', 0, ?)",
                    [("github|myorg/checkout|0|4002", now_ms - 10000),
                     ("github|myorg/checkout|0|4003",
                      now_ms - 31 * 86400 * 1000)])
    con.commit()
    con.close()
    t.eq(d.stop(), 0, "stopped")
    time.sleep(2.5)
    d.start()
    t.ok(comment(4004), "after the retention: another comment is handled")
    c = claims()
    t.ok(4001 not in c and c.get(4004) == 1,
         "the finished claim older than the retention is pruned, the new "
         "one kept", c)
    t.ok(4002 in c and 4003 not in c, "a claim in progress "
         "is kept past the retention, and pruned after 30 days", c)
    t.ok(any("comment claims pruned" in ln and "count=2" in ln
             for ln in d.log()), "the prune is logged with its count")
    t.eq(d.stop(), 0, "clean stop")


if __name__ == "__main__":
    run_tests(main)
