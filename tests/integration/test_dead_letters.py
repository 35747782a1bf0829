"""Dead letters and their recovery, end to end: a comment whose handling
fails for good (the bot's token may not read the PR: a 403, not retried)
is dead-lettered, counted by diverge_inbox_dead_letters and logged; the
provider's redelivery of it (GitHub's "Redeliver", GitLab's "Resend
request": the same delivery id), once the cause is fixed, makes it pending
again and its commands run, once however many redeliveries come. A
requeue is on disk when it is answered: it survives kill -9."""

import re
import threading
import uuid

from divtest import ScmFake, run_tests
from test_scm_commands import (CONFIG, bot_daemon, get_task, gh_comment,
                               gh_reactions, gl_awards, gl_note, handled,
                               seed, wait)


def metric(d, name):
    """The value of the metric line name (with its labels), or None."""
    m = re.search("^%s ([0-9.e+]+)$" % re.escape(name), d.metrics(), re.M)
    return float(m.group(1)) if m else None


def dead_letters(d):
    return metric(d, "diverge_inbox_dead_letters")


def requeued(d, provider):
    return metric(d, 'diverge_webhook_deliveries_total{provider="%s",'
                  'outcome="requeued",reason="requeued"}' % provider) or 0


def entry(d, key):
    """(state, attempts) of the inbox entry key, or None."""
    rows = d.query("SELECT state, attempts FROM inbox WHERE key = ?",
                   (key,))
    return rows[0] if rows else None


def dead_logs(d, key):
    return [ln for ln in d.log() if 'msg="inbox entry dead-lettered"' in ln
            and "delivery=%s " % key in ln]


def github_case(t, fake, d):
    # the bot's token may not read PR 43: /diverge fix fails for good
    fake.call("POST", "/_fake/faults", {"provider": "github", "status": 403,
                                        "count": 1000, "method": "GET",
                                        "match": "/pulls/43"})
    key = str(uuid.uuid4())
    ikey = "github:" + key
    doc = gh_comment(1020, 43, "alice", "/diverge fix bring me back")
    s, _, j = d.github("issue_comment", doc, key)
    t.eq((s, j), (202, {"accepted": True, "delivery": key}),
         "the comment is accepted")
    t.ok(wait(lambda: entry(d, ikey) == (2, 1)), "the PR unreadable "
         "(403, not retried): dead-lettered after one attempt",
         entry(d, ikey))
    t.ok(wait(lambda: dead_letters(d) == 1), "diverge_inbox_dead_letters "
         "is 1", dead_letters(d))
    t.ok(wait(lambda: dead_logs(d, ikey)) and all(
        "provider=github" in ln and "attempts=1" in ln and "error=" in ln
        for ln in dead_logs(d, ikey)), "the dead-lettering is logged with "
        "the delivery, provider, attempts and error", dead_logs(d, ikey))

    # a redelivery is authenticated as any other
    s, _, _ = d.github("issue_comment", doc, key, secret="not-the-secret")
    t.eq((s, entry(d, ikey), dead_letters(d)), (401, (2, 1), 1),
         "a redelivery with a bad signature: 401, the entry stays dead")

    # redelivered before the cause is fixed: requeued, and dead again
    s, _, j = d.github("issue_comment", doc, key)
    t.eq((s, j), (200, {"duplicate": True, "delivery": key,
                        "requeued": True}),
         "redelivery of the dead letter: 200 duplicate, with requeued")
    t.ok(wait(lambda: len(dead_logs(d, ikey)) == 2) and
         wait(lambda: entry(d, ikey) == (2, 1)) and
         wait(lambda: dead_letters(d) == 1), "the cause not fixed: it "
         "fails again, dead after one attempt (counted from zero)",
         (entry(d, ikey), dead_letters(d)))
    t.ok(d.wait_log("inbox dead letter requeued") and any(
        "inbox dead letter requeued" in ln and "delivery=%s " % ikey in ln
        and "attempts=1" in ln and "error=" in ln for ln in d.log()),
        "the requeue is logged with the dead letter's attempts and error")
    t.ok(get_task(d, "fix-pr-43") is None, "no task meanwhile")

    # the cause fixed; two redeliveries at once requeue it once
    fake.call("DELETE", "/_fake/faults")
    got = []

    def redeliver():
        s, _, j = d.github("issue_comment", doc, key)
        got.append((s, bool(j.get("requeued")), bool(j.get("duplicate"))))
    threads = [threading.Thread(target=redeliver) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    t.eq(sorted(got), [(200, False, True), (200, True, True)],
         "two redeliveries at once: one requeues it, the other is a "
         "duplicate")
    task = wait(lambda: get_task(d, "fix-pr-43"))
    t.eq((task or {}).get("spec", {}).get("objective"), "bring me back",
         "the requeued comment runs: fix-pr-43 created (its claim, left "
         "by the failed attempt, does not skip it)")
    t.ok(wait(lambda: gh_reactions(fake, 43, 1020) == ["eyes"]),
         "... and acknowledged", gh_reactions(fake, 43, 1020))
    t.ok(wait(lambda: handled(d, key) == 1) and
         wait(lambda: entry(d, ikey) == (1, 1)), "the entry is done, "
         "handled once", entry(d, ikey))
    t.eq(dead_letters(d), 0, "diverge_inbox_dead_letters is back to 0")
    t.ok(not any("comment already handled" in ln and key in ln
                 for ln in d.log()), "the comment was not taken for done")
    t.eq(requeued(d, "github"), 2, "requeues counted: outcome requeued")

    # a done entry's redelivery is a duplicate, as before
    s, _, j = d.github("issue_comment", doc, key)
    t.eq((s, j.get("duplicate"), j.get("requeued")), (200, True, None),
         "redelivery of the done entry: 200 duplicate")
    t.eq(len([r for r in fake.requests() if r["method"] == "POST" and
              "/comments/1020/reactions" in r["path"]]), 1,
         "the comment ran once in all")


def gitlab_kill9(t, fake, d):
    """GitLab resends with the same Idempotency-Key; the requeue is on
    disk before the answer: killed right after it, with no worker running
    (DIVERGE_TEST_HOLD_INBOX), the next run handles it."""
    fake.call("POST", "/_fake/faults", {"provider": "gitlab", "status": 403,
                                        "count": 1000, "method": "GET",
                                        "match": "/merge_requests/2"})
    key = str(uuid.uuid4())
    ikey = "gitlab:" + key
    doc = gl_note(3001, 2, "pipin", 11, "/diverge fix resent")
    s, _, _ = d.gitlab("Note Hook", doc, key)
    t.eq(s, 202, "GitLab note accepted")
    t.ok(wait(lambda: entry(d, ikey) == (2, 1)) and
         wait(lambda: dead_letters(d) == 1), "the MR unreadable (403): "
         "dead-lettered", (entry(d, ikey), dead_letters(d)))
    t.eq(d.stop(), 0, "stopped")
    d.env["DIVERGE_TEST_HOLD_INBOX"] = "1"
    d.start()
    t.eq(dead_letters(d), 1, "the dead letters are counted at the start")
    fake.call("DELETE", "/_fake/faults")
    s, _, j = d.gitlab("Note Hook", doc, key)
    t.eq((s, j), (200, {"duplicate": True, "delivery": key,
                        "requeued": True}),
         "GitLab's resend (the same Idempotency-Key): 200 duplicate, "
         "requeued")
    d.kill9()
    t.eq(entry(d, ikey), (0, 0), "killed right after the answer: the entry "
         "is pending on disk, its attempts from zero")
    del d.env["DIVERGE_TEST_HOLD_INBOX"]
    d.start()
    task = wait(lambda: get_task(d, "fix-mr-2"), 20)
    t.eq((task or {}).get("spec", {}).get("objective"), "resent",
         "after the restart the requeued note runs: fix-mr-2 created")
    t.ok(wait(lambda: gl_awards(fake, 2, 3001) == ["eyes"]),
         "... and acknowledged", gl_awards(fake, 2, 3001))
    t.ok(wait(lambda: entry(d, ikey) == (1, 1)) and
         wait(lambda: dead_letters(d) == 0), "done, no dead letter left",
         (entry(d, ikey), dead_letters(d)))
    s, _, j = d.gitlab("Note Hook", doc, key)
    t.eq((s, j.get("duplicate")), (200, True), "resent again once done: "
         "200 duplicate")


def main(t):
    fake = ScmFake()
    fake.call("POST", "/_fake/seed", seed())
    d = bot_daemon(fake, CONFIG, {"DIVERGE_SCM_MAX_WAIT_MS": "2000"})
    github_case(t, fake, d)
    gitlab_kill9(t, fake, d)
    t.eq(d.stop(), 0, "clean stop")
    fake.stop()


if __name__ == "__main__":
    run_tests(main)
