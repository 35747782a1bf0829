"""repo_allowlist end to end: with a GitHub App one secret signs every
installation's deliveries, so only the repositories the list names may run
agents. A listed repository (matched whatever the case) is accepted and
handled; another one is answered 200 ignored "repository not allowed",
stored nowhere, counted and logged with its delivery id; an entry stored
while the list was wider is finished without any effect; no list lets
every repository in, with a warning at start; SIGHUP swaps the list. The
fake GitHub and GitLab APIs of tests/fakes/scm_fake.py stand behind the
daemon, on 127.0.0.1 (the HOST of the globs)."""

import os
import signal
import subprocess
import sys
import time
import uuid

from divtest import DIVERGED, Daemon, ScmFake, fixture, run_tests, with_comment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_scm_commands import (CONFIG, bot_daemon, get_task,  # noqa
                               gh_comment, wait)

WARNING = ("repo_allowlist is empty: any repository that sends a correctly "
           "signed delivery can run agents; set repo_allowlist")
NOT_ALLOWED = {"ignored": "repository not allowed"}


def pull(number, comments):
    return {"number": number, "title": "t", "user": "alice",
            "head": {"ref": "f%d" % number}, "base": {"ref": "main"},
            "comments": [{"id": c, "user": "alice", "body": "(comment)"}
                         for c in comments]}


def project(pid, path, iid, notes):
    return {"id": pid, "path_with_namespace": path, "default_branch": "main",
            "members": {"pipin": 40},
            "merge_requests": [{"iid": iid, "id": 1000 + iid,
                                "source_branch": "feature",
                                "target_branch": "main", "author": "pipin",
                                "notes": [{"id": n, "author": "pipin",
                                           "body": "(note)"}
                                          for n in notes]}]}


SEED = {
    "github": {
        "user": {"login": "diverge-bot", "id": 900},
        "tokens": {"ghp_bot": "diverge-bot"},
        "users": [{"login": "alice", "id": 1}],
        "repos": [
            {"full_name": "myorg/checkout", "id": 501,
             "default_branch": "main",
             "collaborators": {"alice": "admin", "diverge-bot": "write"},
             "pulls": [pull(42, [1001, 1002])]},
            {"full_name": "other/thing", "id": 502, "default_branch": "main",
             "collaborators": {"alice": "admin", "diverge-bot": "write"},
             "pulls": [pull(5, [2001, 2002, 2003, 2004, 2005])]}]},
    "gitlab": {
        "user": {"username": "diverge-bot", "id": 950},
        "tokens": {"glpat-bot": "diverge-bot"},
        "users": [{"username": "pipin", "id": 11}],
        "projects": [project(5, "gl-group/diaspora", 2, [3001]),
                     project(6, "other/proj", 3, [3002])]},
}

# lower case against the webhook's MyOrg/Checkout; upper case against the
# project gl-group/diaspora: the match ignores case both ways
ALLOW = """repo_allowlist:
  - "127.0.0.1/myorg/*"
  - 127.0.0.1/GL-Group/*
"""


def gl_note(nid, pid, path, iid, body):
    doc = with_comment(fixture(
        "gitlab/gitlab-docs--comment-on-a-merge-request.json"), body)
    doc["project_id"] = doc["project"]["id"] = pid
    doc["project"]["path_with_namespace"] = path
    mr = doc["merge_request"]
    mr["iid"] = iid
    mr["source_project_id"] = mr["target_project_id"] = pid
    doc["object_attributes"]["id"] = nid
    doc["user"].update(username="pipin", id=11)
    return doc


HOSTLESS = "names a host no enabled provider"


def settled_log(d, text):
    """d's log once text is in it and the lines written with it are too:
    diverged says what its configuration lacks just after its start line,
    which is what the start waits for (so an absence is also looked for
    only then)."""
    d.wait_log(text)
    time.sleep(0.2)
    return d.log()


def daemon(fake, allow="", env=None, state_dir=None):
    """diverged against the fake with test_scm_commands' configuration
    (its repos rule sends myorg/* to team-a), the YAML allow (no braces)
    after it, and the state directory state_dir, if given."""
    def prepare(d):
        if state_dir is not None:
            d.state_dir = state_dir
    return bot_daemon(fake, CONFIG + allow, env, prepare)


def reactions(fake, repo, number, cid):
    pulls = fake.state()["github"]["repos"][repo]["pulls"]
    return [r["content"] for c in pulls[str(number)]["comments"]
            if c["id"] == cid for r in c["reactions"]]


def awards(fake, pid, iid, nid):
    mrs = fake.state()["gitlab"]["projects"][str(pid)]["merge_requests"]
    return [a["name"] for n in mrs[str(iid)]["notes"] if n["id"] == nid
            for a in n["award_emoji"]]


def task(d, name):
    """The AgentTask name, in team-a for myorg/checkout's PR 42, else in
    the default namespace; None when there is none."""
    return get_task(d, name, "team-a" if name == "fix-pr-42" else "default")


def stored(d, provider, key):
    return d.count("inbox", "key = '%s:%s'" % (provider, key))


def counted(d, provider):
    """diverge_webhook_deliveries_total of provider's deliveries from a
    repository not allowed."""
    name = ('diverge_webhook_deliveries_total{provider="%s",outcome='
            '"ignored",reason="repository not allowed"} ' % provider)
    for line in d.metrics().splitlines():
        if line.startswith(name):
            return int(float(line[len(name):]))
    return 0


def did():
    return str(uuid.uuid4())


def at_the_door(t, fake):
    d = daemon(fake, ALLOW)
    t.ok(not any(WARNING in ln for ln in settled_log(d, "diverged started")),
         "a list: no warning at start")

    key = did()
    s, _, j = d.github("issue_comment", gh_comment(
        1001, 42, "alice", "/diverge fix make checkout fast",
        "MyOrg/Checkout"), key)
    t.eq(s, 202, "MyOrg/Checkout against 127.0.0.1/myorg/*: 202")
    t.ok(wait(lambda: task(d, "fix-pr-42")), "... and handled: its task "
         "fix-pr-42 is created")
    t.ok(wait(lambda: reactions(fake, "myorg/checkout", 42, 1001) ==
              ["eyes"]), "... and the comment gets eyes")

    key = did()
    doc = gh_comment(2001, 5, "alice", "/diverge fix spend it all",
                     "other/thing")
    s, _, j = d.github("issue_comment", doc, key)
    t.eq((s, j), (200, NOT_ALLOWED), "other/thing: 200 ignored, repository "
         "not allowed")
    t.eq(stored(d, "github", key), 0, "... nothing stored in the inbox")
    s, _, j = d.github("issue_comment", doc, key)
    t.eq((s, j), (200, NOT_ALLOWED), "... the same delivery again: ignored "
         "again, not a duplicate (it was never stored)")
    line = [ln for ln in d.log() if "webhook ignored" in ln and
            "delivery=" + key in ln]
    t.ok(line and "repo=other/thing" in line[0] and
         "repository not allowed" in line[0], "... one log line with the "
         "delivery id and the repository", line)
    closed = fixture("github/octokit-webhooks--pull_request.closed."
                     "payload.json")
    closed["repository"]["full_name"] = "other/thing"
    s, _, j = d.github("pull_request", closed, did())
    t.eq((s, j), (200, NOT_ALLOWED), "other/thing's PR closed: ignored too")
    s, _, j = d.github("ping", fixture(
        "github/octokit-webhooks--ping.payload.json"), did())
    t.eq((s, j), (200, {"ignored": "ping"}), "a ping is answered as before")

    key = did()
    s, _, _ = d.gitlab("Note Hook", gl_note(3001, 5, "gl-group/diaspora", 2,
                                            "/diverge fix the MR"), key)
    t.eq(s, 202, "GitLab gl-group/diaspora against 127.0.0.1/GL-Group/*: "
         "202")
    t.ok(wait(lambda: task(d, "fix-mr-2")) and
         wait(lambda: awards(fake, 5, 2, 3001) == ["eyes"]),
         "... handled: task fix-mr-2 and the eyes award")
    key = did()
    s, _, j = d.gitlab("Note Hook", gl_note(3002, 6, "other/proj", 3,
                                            "/diverge fix it"), key)
    t.eq((s, j), (200, NOT_ALLOWED), "GitLab other/proj: 200 ignored")
    t.eq(stored(d, "gitlab", key), 0, "... nothing stored")

    t.eq((counted(d, "github"), counted(d, "gitlab")), (3, 1),
         "counted as outcome=ignored, reason=repository not allowed")
    time.sleep(0.5)
    t.eq((task(d, "fix-pr-5"), task(d, "fix-mr-3"),
          reactions(fake, "other/thing", 5, 2001),
          awards(fake, 6, 3, 3002)), (None, None, [], []),
         "nothing ran for the repositories not allowed")
    return d


def reload(t, fake, d):
    """SIGHUP with a wider list, then a broken one (kept), then a narrower
    one."""
    def hup(text, expect):
        with open(d.config_file, "a" if text.startswith("  ") else "w") as f:
            f.write(text)
        n = sum(expect in ln for ln in d.log())
        d.send_signal(signal.SIGHUP)
        return wait(lambda: sum(expect in ln for ln in d.log()) > n)

    with open(d.config_file) as f:
        base = f.read()
    t.ok(hup("  - 127.0.0.1/other/thing\n", "reloaded secrets, "
             "repo_allowlist"), "SIGHUP: the list is reloaded")
    t.ok(any("repo_allowlist_entries=3" in ln for ln in d.log()),
         "... and the log says how many entries it has")
    s, _, _ = d.github("issue_comment", gh_comment(
        2002, 5, "alice", "/diverge status", "other/thing"), did())
    t.eq(s, 202, "after SIGHUP other/thing is accepted")
    t.ok(wait(lambda: reactions(fake, "other/thing", 5, 2002) == ["eyes"]),
         "... and handled")

    t.ok(hup("  - \"127.0.0.1/a b\"\n", "reload failed"),
         "SIGHUP with a bad glob: reload failed")
    s, _, _ = d.github("issue_comment", gh_comment(
        2003, 5, "alice", "/diverge status", "other/thing"), did())
    t.eq(s, 202, "... the running list is kept")

    t.ok(hup(base, "reloaded secrets"), "SIGHUP with the list narrowed")
    s, _, j = d.github("issue_comment", gh_comment(
        2004, 5, "alice", "/diverge status", "other/thing"), did())
    t.eq((s, j), (200, NOT_ALLOWED), "... other/thing is refused again")
    t.ok(hup(base.replace(ALLOW, ""), "reloaded secrets") and
         wait(lambda: any(WARNING in ln for ln in d.log())),
         "SIGHUP with no list: the warning is logged")
    s, _, _ = d.github("issue_comment", gh_comment(
        2005, 5, "alice", "/diverge status", "other/thing"), did())
    t.eq(s, 202, "... and every repository is accepted")
    t.eq(d.stop(), 0, "SIGTERM: exit 0")


def stored_then_narrowed(t, fake):
    """Entries stored with no list (held), then handled by a daemon
    started with one."""
    d = daemon(fake, env={"DIVERGE_TEST_HOLD_INBOX": "1"})
    t.eq(sum(WARNING in ln for ln in settled_log(d, WARNING)), 1,
         "no list with a provider enabled: one warning at start")
    t.ok(any(WARNING in ln and "level=warn" in ln for ln in d.log()),
         "... at level warn")
    out = did()
    s, _, _ = d.github("issue_comment", gh_comment(
        1002, 42, "alice", "/diverge fix held", "myorg/checkout"), did())
    s2, _, _ = d.github("issue_comment", gh_comment(
        2001, 5, "alice", "/diverge fix spend it all", "other/thing"), out)
    t.eq((s, s2), (202, 202), "no list: every repository is accepted")
    d.stop()

    d2 = daemon(fake, ALLOW, state_dir=d.state_dir)
    t.ok(wait(lambda: d2.query("SELECT state FROM inbox WHERE key = ?",
                               ("github:" + out,)) == [(1,)]),
         "stored before the list was narrowed: finished when handled",
         d2.query("SELECT state, last_error FROM inbox"))
    t.ok(wait(lambda: task(d2, "fix-pr-42")),
         "the listed repository's entry runs")
    line = [ln for ln in d2.log() if "repository not allowed" in ln]
    t.ok(line and "delivery=" + out in line[0] and "repo=other/thing" in
         line[0], "... the other one is logged with its delivery id and "
         "repository", line)
    time.sleep(0.5)
    t.eq((task(d2, "fix-pr-5"), reactions(fake, "other/thing", 5, 2001),
          d2.count("handled_events", "key = 'github:%s'" % out)),
         (None, [], 0), "... and has no effect: no task, no reaction, no "
         "record")
    d2.stop()


def others(t, fake):
    d = Daemon("log: {{level: info}}\n").start()
    t.ok(not any(WARNING in ln for ln in settled_log(d, "diverged started")),
         "no provider enabled: no warning")
    d.stop()
    for text, want in (
            ("repo_allowlist: 127.0.0.1/myorg/*\n",
             ":1: 'repo_allowlist': expected a sequence, got "
             "'127.0.0.1/myorg/*'"),
            ("repo_allowlist:\n  - a/*\n  - {{match: b}}\n",
             ":3: 'repo_allowlist[1]': expected a scalar, got a mapping"),
            ("repo_allowlist:\n  - \"\"\n",
             ":2: 'repo_allowlist[0]': expected a pattern like "
             "github.com/org/*, got ''")):
        d = Daemon(text)
        p = subprocess.run([DIVERGED, "--config", d.config_file,
                            "--check-config"], capture_output=True,
                           text=True, timeout=30)
        t.ok(p.returncode == 2 and p.stderr.strip() == "config: " +
             d.config_file + want, "a bad repo_allowlist exits 2: %s" %
             want.split(": ", 1)[1], (p.returncode, p.stderr))


def hostless(t, fake):
    """A pattern whose host part names no enabled provider's host (the
    owner written first) matches nothing: diverged says so at start, for
    repo_allowlist and repos alike, and not for patterns with the host or
    a glob in front."""
    d = daemon(fake, "repo_allowlist: [\"127.0.0.1/myorg/*\", \"myorg/*\","
               " \"*/other/*\"]\n")
    warned = [ln for ln in settled_log(d, HOSTLESS) if HOSTLESS in ln]
    t.ok(len(warned) == 1 and "key=repo_allowlist[1]" in warned[0] and
         "pattern=myorg/*" in warned[0] and "host=myorg" in warned[0] and
         "127.0.0.1" in warned[0],
         "a pattern written without its host is reported, once", warned)
    d.stop()
    d = bot_daemon(fake, CONFIG.replace('"127.0.0.1/MyOrg/*"',
                                        '"MyOrg/*"'), None)
    t.ok(any("key=repos[0]" in ln and HOSTLESS in ln
             for ln in settled_log(d, HOSTLESS)), "and so is a repos rule's",
         d.log()[-5:])
    d.stop()


def main(t):
    fake = ScmFake()
    try:
        fake.call("POST", "/_fake/seed", SEED)
        d = at_the_door(t, fake)
        reload(t, fake, d)
        stored_then_narrowed(t, fake)
        others(t, fake)
        hostless(t, fake)
    finally:
        fake.stop()


run_tests(main)
