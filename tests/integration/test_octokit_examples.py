"""Every issue_comment, pull_request, pull_request_review_comment and ping
example of the npm package @octokit/webhooks-examples, as it is and with a
/diverge command in the comment, goes through the daemon and is classified
as an independent reading of GitHub's documentation says it should be."""

import json
import os
import re
import uuid

from divtest import (TOP_BUILDDIR, Daemon, GITHUB_CONFIG, npm_install,
                     run_tests)

VERSION = "7.6.1"
EVENTS = ("issue_comment", "pull_request", "pull_request_review_comment",
          "ping")


def install(t):
    prefix = os.path.join(TOP_BUILDDIR, "tests", "node-cache")
    index = os.path.join(prefix, "node_modules", "@octokit",
                         "webhooks-examples", "api.github.com",
                         "index.json")
    if not os.path.exists(index):
        npm_install(t, prefix, ["@octokit/webhooks-examples@" + VERSION])
        if not os.path.exists(index):
            t.skip_all("@octokit/webhooks-examples@%s has no %s"
                       % (VERSION, os.path.relpath(index, prefix)))
    with open(index) as f:
        return json.load(f)


COMMAND = re.compile(r"^ {0,3}/diverge(\s|$)", re.I | re.M)


def expect(event, doc):
    """(status, kind or ignore reason) from the documented semantics."""
    action = doc.get("action")
    if event == "ping":
        return 200, "ping"
    if event == "pull_request":
        if action != "closed":
            return 200, "pull request event other than closed"
        return 202, "merged" if doc["pull_request"].get("merged") else \
            "closed"
    if action != "created":
        return 200, "comment not newly created"
    if event == "issue_comment" and not doc["issue"].get("pull_request"):
        return 200, "comment on an issue, not a pull request"
    user = doc["comment"]["user"]
    if not COMMAND.search(doc["comment"]["body"] or ""):
        return 200, "no /diverge command"
    if user.get("type") == "Bot":
        return 200, "comment by a bot"
    return 202, "comment"


def number_of(event, doc):
    if event == "issue_comment":
        return doc["issue"]["number"]
    if event == "pull_request_review_comment":
        return doc["pull_request"]["number"]
    return doc["number"]


def main(t):
    index = install(t)
    d = Daemon(GITHUB_CONFIG.replace("debug", "info")).start()
    accepted = {}
    total = 0
    for entry in index:
        if entry["name"] not in EVENTS:
            continue
        for i, ex in enumerate(entry["examples"]):
            variants = [("as is", ex)]
            if "comment" in ex:
                v = json.loads(json.dumps(ex))
                v["comment"]["body"] = "thanks!\n/diverge fix the flaky test"
                variants.append(("with a command", v))
            for label, doc in variants:
                total += 1
                key = str(uuid.uuid4())
                want_status, what = expect(entry["name"], doc)
                s, _, j = d.github(entry["name"], doc, key)
                name = "%s example %d (%s, action %s)" % (
                    entry["name"], i, label, doc.get("action", "-"))
                if want_status == 202:
                    ok = s == 202 and j == {"accepted": True,
                                            "delivery": key}
                    accepted["github:" + key] = (entry["name"], doc, what)
                else:
                    ok = s == 200 and j == {"ignored": what}
                t.ok(ok, name + ": %d %s" % (want_status, what), (s, j))
    t.ok(total >= 40, "examples exercised: %d" % total)
    got = d.wait_handled(list(accepted))
    for key, (event, doc, kind) in accepted.items():
        rows = d.query("SELECT kind, repo, number, comment_id, count FROM "
                       "handled_events WHERE key = ?", (key,))
        want = (kind, doc["repository"]["full_name"], number_of(event, doc),
                doc.get("comment", {}).get("id") or 0, 1)
        t.eq(rows[:1], [want], "%s handled with the right fields" % key)
    d.stop()


run_tests(main)
