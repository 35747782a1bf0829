"""The metrics of the embedded store's writer, on a daemon in embedded
mode: after N writes through its Kubernetes-compatible API (creates, an
update, merge patches, a delete of Secrets, which no controller writes
meanwhile), diverge_store_commits_total and
diverge_store_committed_ops_total have counted them, the commit histogram
has one sample per commit, and the watch window holds their events."""

import re

from divtest import Daemon, api, run_tests

SECRETS = "/api/v1/namespaces/sm/secrets"
N = 12


def value(text, name):
    m = re.search(r"^%s (\S+)$" % name, text, re.M)
    return float(m.group(1)) if m else None


def main(t):
    d = Daemon()
    d.start()
    before = d.metrics()
    ops0 = value(before, "diverge_store_committed_ops_total")
    commits0 = value(before, "diverge_store_commits_total")
    writes = []
    for i in range(N - 4):
        writes.append(api(d, "POST", SECRETS, {
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "sm%d" % i},
            "stringData": {"k": "v"}})[0])
    s, cur = api(d, "GET", SECRETS + "/sm0")
    cur["data"] = {"k": "dzI="}
    writes.append(api(d, "PUT", SECRETS + "/sm0", cur)[0])
    for name in ("sm1", "sm2"):
        writes.append(api(d, "PATCH", SECRETS + "/" + name, {
            "metadata": {"labels": {"a": "b"}}},
            ctype="application/merge-patch+json")[0])
    writes.append(api(d, "DELETE", SECRETS + "/sm3")[0])
    t.eq(writes, [201] * (N - 4) + [200] * 4,
         "%d writes through the store's API" % N)
    s, _ = api(d, "PUT", SECRETS + "/sm0", cur)
    t.eq(s, 409, "and one refused (a stale resourceVersion): no write")

    text = d.metrics()
    commits = value(text, "diverge_store_commits_total")
    ops = value(text, "diverge_store_committed_ops_total")
    t.ok(ops0 is not None and ops is not None and ops - ops0 >= N,
         "diverge_store_committed_ops_total counts the %d writes" % N,
         (ops0, ops))
    # a batch of one op or more each; the refused write's wrote nothing
    t.ok(commits0 is not None and commits is not None and
         0 < commits - commits0 <= N + 1,
         "diverge_store_commits_total counts the group commits",
         (commits0, commits))
    count = value(text, "diverge_store_commit_seconds_count")
    inf = re.search(r'^diverge_store_commit_seconds_bucket\{le="\+Inf"\} '
                    r'(\d+)$', text, re.M)
    t.ok(count == commits and inf and float(inf.group(1)) == commits and
         value(text, "diverge_store_commit_seconds_sum") > 0,
         "diverge_store_commit_seconds: one sample per commit",
         (count, commits, inf and inf.group(0)))
    t.ok(re.search(r'^diverge_store_commit_seconds_bucket\{le="0.0001"\} '
                   r'\d+$', text, re.M),
         "its buckets start at 0.1 ms")
    window = value(text, "diverge_store_watch_window_events")
    t.ok(window is not None and window >= N,
         "diverge_store_watch_window_events holds their events", window)
    for name, kind in (("diverge_store_commit_seconds", "histogram"),
                       ("diverge_store_commits_total", "counter"),
                       ("diverge_store_committed_ops_total", "counter"),
                       ("diverge_store_watch_window_events", "gauge")):
        t.ok(re.search(r"^# HELP %s \S" % name, text, re.M) and
             "# TYPE %s %s\n" % (name, kind) in text,
             "%s has its HELP and TYPE %s" % (name, kind))
    t.eq(d.stop(), 0, "SIGTERM: exit 0")


if __name__ == "__main__":
    run_tests(main)
