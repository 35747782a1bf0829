"""The metrics of diverged's calls to a Kubernetes API server, against the
fake kube-apiserver of tests/fakes: diverge_kube_requests_total counts
every request by verb, resource and code exactly as the server answered
them (the fake's own request log is the reference), retries included; a
409 Conflict and 429s injected into the reconciler's writes and the watches
show there; diverge_kube_watch_restarts_total counts the watches the
server closed (closed), refused (throttled) and expired (gone);
diverge_kube_request_duration_seconds times each request; the series
whose labels are known up front (each verb's duration, each watched
resource's restart reasons, the exec plugin's results) are there at 0
before their first event; diverge_kube_exec_plugin_runs_total counts the
runs of a kubeconfig's exec credential plugin by result; the README
documents exactly these families."""

import os
import re
import shutil
import sys
import time

from divtest import Daemon, FakeKube, prom_check, run_tests, wait

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_readme import readme_metrics  # noqa: E402

NS = "default"
TASKS = "/apis/divergedev.com/v1alpha1/namespaces/%s/agenttasks" % NS
RBAC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                    "deploy", "kubernetes", "rbac.yaml")
SA = "system:serviceaccount:diverge-system:diverged"
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch",
         "DELETE": "delete"}
ALL_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete")
REASONS = ("closed", "timeout", "error", "throttled", "gone")

CONFIG = """log: {{level: info}}
kubernetes: {{mode: kubeconfig, kubeconfig: "{tmp}/kc"}}
controller: {{namespace: diverge-system}}
"""


def served(entry):
    """(verb, resource, code) of one request of the fake's log, as
    diverged labels it; resource is the plural (/status for the
    subresource)."""
    parts = entry["path"].strip("/").split("/")
    # /api/v1/... or /apis/GROUP/VERSION/...
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if rest[:1] == ["namespaces"]:
        rest = rest[2:]
    resource = rest[0] if rest else entry["path"]
    if len(rest) >= 3:
        resource += "/" + rest[2]
    if entry["method"] == "GET":
        if "watch=true" in entry["query"]:
            verb = "watch"
        else:
            verb = "get" if len(rest) >= 2 else "list"
    else:
        verb = VERBS.get(entry["method"], entry["method"])
    code = entry["code"]
    return verb, resource, "error" if code == "closed" else str(code)


def fake_counts(fake):
    """{(verb, resource, code): n} of the daemon's requests the fake has
    answered; None while one is unanswered."""
    out = {}
    for r in fake.control("GET", "/_fake/requests"):
        if r.get("user") != SA:
            continue
        if r.get("code") is None:
            return None
        k = served(r)
        out[k] = out.get(k, 0) + 1
    return out


def series(text, name):
    """{label tuple: value} of one family (labels in their order)."""
    out = {}
    for labels, v in re.findall(r"^%s\{([^}]*)\} (\S+)$" % name, text,
                                re.M):
        key = tuple(re.findall(r'="([^"]*)"', labels))
        out[key] = float(v)
    return out


def settled(d, fake):
    """The daemon's counts and the fake's when they stay the same across
    a read of the metrics: (metrics text, fake counts)."""
    def once():
        before = fake_counts(fake)
        text = d.metrics()
        after = fake_counts(fake)
        if before is None or before != after:
            return None
        mine = {k: int(v) for k, v in series(
            text, "diverge_kube_requests_total").items()}
        return (text, before) if mine == before else None
    got = wait(once, timeout=20)
    if got:
        return got
    return d.metrics(), fake_counts(fake)


def watchers(fake):
    return fake.control("GET", "/_fake/state").get("watchers")


def stable_watchers(fake):
    """The number of open watches once it stops changing."""
    last = [None, 0]

    def f():
        n = watchers(fake)
        if n and n == last[0]:
            last[1] += 1
        else:
            last[0], last[1] = n, 0
        return n if last[1] >= 20 else None
    return wait(f, timeout=20)


def restarts(text, reason):
    return sum(v for k, v in series(
        text, "diverge_kube_watch_restarts_total").items() if k[1] == reason)


def main(t):
    if shutil.which("openssl") is None:
        t.skip_all("the fake kube-apiserver needs openssl for its CA")
    fake = FakeKube(rbac=[RBAC])
    try:
        run(t, fake)
        exec_plugin(t, fake)
    finally:
        fake.stop()


def exec_plugin(t, fake):
    """A kubeconfig whose token comes from an exec credential plugin:
    its runs are counted by result, each result's series there from the
    start; a 401 has it run again, and then it fails."""
    d = Daemon(CONFIG)
    fake.kubeconfig(os.path.join(d.tmp, "kc"), fake.exec_user(
        d, "if [ -e \"$(dirname \"$0\")/broken\" ]; then\n"
        "  echo 'no credentials' >&2; exit 1\nfi\n"), NS)
    d.start()
    stable_watchers(fake)

    def runs():
        return {k[0]: v for k, v in series(
            d.metrics(), "diverge_kube_exec_plugin_runs_total").items()}
    t.eq(runs(), {"ok": 1.0, "error": 0.0, "timeout": 0.0},
         "exec plugin: one run, ok; error and timeout at 0")
    open(os.path.join(d.tmp, "broken"), "w").close()
    fake.control("POST", "/_fake/faults", {"status": 401, "count": 1,
                                           "method": "GET"})
    s, _ = fake.request("POST", TASKS, {
        "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
        "metadata": {"name": "km2"},
        "spec": {"objective": "count the runs", "repository": {
            "url": "https://github.com/myorg/checkout"}}})
    got = wait(lambda: (lambda r: r if r.get("error") else None)(runs()),
               timeout=20)
    t.ok(s == 201 and got and got.get("ok") == 1 and
         got.get("error") >= 1 and got.get("timeout") == 0,
         "exec plugin: run again after a 401, failing: counted as error",
         got)
    t.eq(d.stop(), 0, "exec plugin: SIGTERM: exit 0")


def run(t, fake):
    d = Daemon(CONFIG)
    fake.kubeconfig(os.path.join(d.tmp, "kc"),
                    {"token": fake.info["token"]}, NS)
    d.start()
    n = stable_watchers(fake)
    t.ok(n, "the daemon watches the cluster (%s watches)" % n)

    # before any restart, and for verbs not used yet: the series whose
    # labels are known up front are there, at 0
    text = d.metrics()
    watched = {served(r)[1] for r in fake.control("GET", "/_fake/requests")
               if r.get("user") == SA and "watch=true" in r["query"]}
    got = series(text, "diverge_kube_watch_restarts_total")
    want = {(r, why): 0.0 for r in watched for why in REASONS}
    t.ok(watched and got == want, "watch restarts: each watched resource's "
         "reasons at 0 before the first restart (%s)" % sorted(watched),
         (got, want))
    hist = series(text, "diverge_kube_request_duration_seconds_count")
    t.ok(set(k[0] for k in hist) == set(ALL_VERBS) and
         hist.get(("delete",)) == 0,
         "request durations: every verb's series from the start, at 0 "
         "until its first request", hist)
    t.ok(not series(text, "diverge_kube_exec_plugin_runs_total"),
         "no exec plugin runs without an exec plugin", text.count("exec"))

    # the reconciler's first status write (a merge patch guarded by the
    # resourceVersion it read) conflicts, and its first create of a Secret
    # is throttled (API Priority and Fairness: 429, Retry-After: 1) and
    # retried
    fake.control("POST", "/_fake/faults", [
        {"status": 409, "count": 1, "method": "PATCH", "match": "/status"},
        {"status": 429, "count": 1, "method": "POST",
         "match": "/secrets"}])
    s, _ = fake.request("POST", TASKS, {
        "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
        "metadata": {"name": "km1"},
        "spec": {"objective": "count the calls", "repository": {
            "url": "https://github.com/myorg/checkout"}}})
    t.eq(s, 201, "a task created on the cluster")

    def faults_taken():
        return fake.control("GET", "/_fake/faults")["faults"] == []
    t.ok(wait(faults_taken, timeout=30), "the reconciler met the 409 and "
         "the 429", fake.control("GET", "/_fake/faults"))

    text, want = settled(d, fake)
    got = series(text, "diverge_kube_requests_total")
    for code in ("409", "429"):
        mine = {k: v for k, v in got.items() if k[2] == code}
        theirs = {k: float(v) for k, v in want.items() if k[2] == code}
        t.ok(mine and mine == theirs, "code=%s: the daemon counts the %s "
             "answers the server sent, by verb and resource" % (code, code),
             (mine, theirs))
    t.ok(got.get(("create", "secrets", "201")) and
         got.get(("create", "secrets", "429")) == 1,
         "the 429 throttled create counted, and so is its retry",
         {k: v for k, v in got.items() if k[1] == "secrets"})

    # the watches: closed by the server, refused on their way back (429),
    # then expired (410 Gone: watched again from scratch)
    before = d.metrics()
    closed0, throttled0 = restarts(before, "closed"), \
        restarts(before, "throttled")
    fake.control("POST", "/_fake/faults", {
        "status": 429, "count": 2, "method": "GET", "match": "watch=true"})
    ended = fake.control("POST", "/_fake/end_watches",
                         {"mode": "close"})["watches"]
    wait(lambda: fake.control("GET", "/_fake/faults")["faults"] == [] and
         watchers(fake) == n, timeout=30)
    stable_watchers(fake)
    text = d.metrics()
    t.eq((restarts(text, "closed") - closed0,
          restarts(text, "throttled") - throttled0), (ended, 2),
         "watch restarts: each stream the server closed (%d), each "
         "reconnection it throttled (2)" % ended)
    gone0 = restarts(text, "gone")
    expired = fake.control("POST", "/_fake/end_watches",
                           {"mode": "expire"})["watches"]
    wait(lambda: restarts(d.metrics(), "gone") - gone0 >= expired,
         timeout=20)
    stable_watchers(fake)
    t.eq(restarts(d.metrics(), "gone") - gone0, expired,
         "watch restarts: each watch expired (410 Gone) (%d)" % expired)

    text, want = settled(d, fake)
    got = {k: int(v) for k, v in series(
        text, "diverge_kube_requests_total").items()}
    t.ok(got == want and len(got) >= 5, "every request the daemon made, "
         "by verb, resource and code, is counted exactly as the server "
         "logged it (%d requests)" % sum(want.values()),
         (sorted(set(got.items()) ^ set(want.items()))))
    t.ok(sum(v for k, v in got.items() if k[0] == "watch" and
             k[2] == "429") >= 2, "the throttled watches are counted",
         {k: v for k, v in got.items() if k[0] == "watch"})
    t.ok(not [k for k in got if NS in k or "km1" in k[1]],
         "no namespace or name in the labels", sorted(got))

    hist = series(text, "diverge_kube_request_duration_seconds_count")
    per_verb = {}
    for (verb, _, _), v in got.items():
        per_verb[verb] = per_verb.get(verb, 0) + v
    t.eq({k[0]: int(v) for k, v in hist.items() if v}, per_verb,
         "diverge_kube_request_duration_seconds: one sample per request, "
         "by verb")
    t.ok(re.search(r'^diverge_kube_request_duration_seconds_bucket\{verb='
                   r'"get",le="60"\} \d+$', text, re.M),
         "its buckets go up to 60 s")
    types = dict(re.findall(r"^# TYPE (diverge_kube_[a-z_]+) (\w+)$",
                            text, re.M))
    helps = re.findall(r"^# HELP (diverge_kube_[a-z_]+) \S", text, re.M)
    documented = {k: v for k, v in readme_metrics().items()
                  if k.startswith("diverge_kube_")}
    t.ok(types == documented and sorted(helps) == sorted(types),
         "README.md documents exactly the diverge_kube_* families, with "
         "their types and a HELP each", (types, documented, helps))
    t.eq(prom_check(text)[0], [], "its /metrics is valid Prometheus text "
         "(test_metrics_format.py's checks)")
    t.eq(d.stop(), 0, "SIGTERM: exit 0")


if __name__ == "__main__":
    run_tests(main)
