"""Leader election (kubernetes.leader_election) against the fake
kube-apiserver of tests/fakes: of two diverged processes on one cluster
exactly one holds the Lease (diverge_leader 1, the Lease's holderIdentity
names it) and only it reconciles (its diverge_reconciles_total counts the
task; the standby has no reconciler at all); kill -9 of the leader hands
the Lease to the standby within lease_duration and its retries, which
reconciles the next task; SIGTERM of a leader releases the Lease and the
standby takes over at its next try; a leader whose renewals fail for
renew_deadline exits 1; an API server that refuses the Lease (RBAC) leaves
the process a ready standby that says why and reconciles nothing; the
configuration errors give FILE:LINE and exit 2. The takeover times are
printed as TAP comments."""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

from divtest import DIVERGED, Daemon, FakeKube, run_tests, wait

NS = "default"
TASKS = "/apis/divergedev.com/v1alpha1/namespaces/%s/agenttasks" % NS
LEASE = ("/apis/coordination.k8s.io/v1/namespaces/diverge-system/leases/"
         "diverged")
RBAC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                    "deploy", "kubernetes", "rbac.yaml")
LEASE_S, RENEW_S, RETRY_S = 2.0, 1.5, 0.25

CONFIG = """log: {{level: info}}
kubernetes:
  mode: kubeconfig
  kubeconfig: "{tmp}/kc"
  leader_election:
    enabled: true
    lease_duration: 2s
    renew_deadline: 1500ms
    retry_period: 250ms
controller: {{namespace: diverge-system}}
"""


def daemon(fake):
    d = Daemon(CONFIG)
    with open(os.path.join(d.tmp, "kc"), "w") as f:
        json.dump({"apiVersion": "v1", "kind": "Config",
                   "current-context": "main",
                   "contexts": [{"name": "main", "context": {
                       "cluster": "fake", "user": "me", "namespace": NS}}],
                   "clusters": [{"name": "fake", "cluster": {
                       "server": fake.info["server"],
                       "certificate-authority": fake.info["ca_file"]}}],
                   "users": [{"name": "me", "user": {
                       "token": fake.info["token"]}}]}, f)
    return d


def gauge(d, name):
    """The value of an unlabelled sample of d's metrics, None if absent."""
    try:
        text = d.metrics()
    except OSError:
        return None
    m = re.search(r"^%s (\S+)$" % name, text, re.M)
    return float(m.group(1)) if m else None


def reconciles(d):
    """d's reconciles so far (every result), None without a reconciler."""
    text = d.metrics()
    if "# TYPE diverge_reconciles_total" not in text:
        return None
    return sum(float(v) for v in re.findall(
        r"^diverge_reconciles_total\{[^}]*\} (\S+)$", text, re.M))


def identity(d, what="acquired"):
    for line in d.log():
        if "leader election: " + what in line:
            m = re.search(r"identity=(\S+)", line)
            if m:
                return m.group(1)
    return None


def when_logged(d, text, timeout):
    """The time.monotonic() at which text was first seen in d's log."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(text in l for l in d.log()):
            return time.monotonic()
        time.sleep(0.01)
    return None


def holder(fake):
    s, lease = fake.request("GET", LEASE)
    return (lease or {}).get("spec", {}).get("holderIdentity") if s == 200 \
        else None


def create_task(fake, name):
    return fake.request("POST", TASKS, {
        "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
        "metadata": {"name": name},
        "spec": {"objective": "elect a leader", "repository": {
            "url": "https://github.com/myorg/checkout"}}})[0]


def phase(fake, name):
    s, task = fake.request("GET", TASKS + "/" + name)
    return (task or {}).get("status", {}).get("phase") if s == 200 else None


def two(t, fake):
    a, b = daemon(fake), daemon(fake)
    a.start(wait=False)
    b.start(wait=False)
    a.wait_started()
    b.wait_started()
    try:
        both = wait(lambda: (lambda g: g if sorted(g) == [0.0, 1.0] else
                             None)([gauge(a, "diverge_leader"),
                                    gauge(b, "diverge_leader")]),
                    timeout=10)
        t.ok(both, "of two processes exactly one leads (diverge_leader 1 "
             "and 0)", [gauge(a, "diverge_leader"),
                        gauge(b, "diverge_leader")])
        leader, standby = (a, b) if gauge(a, "diverge_leader") == 1 else \
            (b, a)
        lid = identity(leader)
        t.ok(lid and holder(fake) == lid and identity(standby) is None,
             "the Lease's holderIdentity is the leader's identity, as it "
             "logged", (lid, holder(fake)))
        # its first try may have lost the race to create the Lease: it
        # names the holder at its next one, a retry period later
        t.ok(wait(lambda: any("leader election: standby" in l and
                              "holder=" + str(lid) in l
                              for l in standby.log()), timeout=5),
             "the standby says who holds the Lease", standby.log()[-5:])
        s, _, ready = standby.json("GET", "/readyz")
        t.ok(s == 200, "the standby is ready (it serves webhooks and the "
             "meter)", ready)

        t.eq(create_task(fake, "le1"), 201, "a task created on the cluster")
        t.ok(wait(lambda: phase(fake, "le1"), timeout=15),
             "the task is reconciled", phase(fake, "le1"))
        time.sleep(3 * RETRY_S)
        t.ok((reconciles(leader) or 0) >= 1 and reconciles(standby) is
             None, "by the leader only: the standby has no reconciler",
             (reconciles(leader), reconciles(standby)))

        # kill -9 of the leader: its Lease expires, the standby takes it
        killed = time.monotonic()
        leader.kill9()
        got = when_logged(standby, "leader election: acquired",
                          LEASE_S + 2.2 * RETRY_S + 3)
        took = got - killed if got else None
        print("# kill -9: the standby acquired the Lease %.2f s later "
              "(lease_duration %.1f s, retry_period %.2f s)" %
              (took or -1, LEASE_S, RETRY_S))
        t.ok(took is not None and took >= LEASE_S - 0.5 and
             took <= LEASE_S + 2.2 * RETRY_S + 1.0,
             "kill -9 of the leader: the standby leads after about "
             "lease_duration (%.2f s)" % (took or -1))
        t.ok(wait(lambda: gauge(standby, "diverge_leader") == 1, 5) and
             holder(fake) == identity(standby),
             "its diverge_leader is 1, the Lease names it",
             (holder(fake), identity(standby)))
        t.eq(create_task(fake, "le2"), 201, "another task")
        t.ok(wait(lambda: phase(fake, "le2"), timeout=15) and
             wait(lambda: (reconciles(standby) or 0) >= 1, 10),
             "the new leader reconciles it", (phase(fake, "le2"),
                                               reconciles(standby)))
        denied = [(r["method"], r["path"]) for r in fake.control(
            "GET", "/_fake/requests") if r.get("forbidden")]
        t.eq(denied, [], "deploy/kubernetes/rbac.yaml allows every call "
             "(the Lease's Role among them)")

        # SIGTERM of a leader: released, the standby takes over at once
        third = daemon(fake)
        third.start()
        t.ok(wait(lambda: any("leader election: standby" in l
                              for l in third.log()), 10) and
             gauge(third, "diverge_leader") == 0,
             "a third process starts as a standby")
        stopped = time.monotonic()
        standby.send_signal(signal.SIGTERM)
        got = when_logged(third, "leader election: acquired", LEASE_S + 5)
        took = got - stopped if got else None
        rc = standby.proc.wait(20)
        print("# SIGTERM: the standby acquired the Lease %.2f s later "
              "(retry_period %.2f s)" % (took or -1, RETRY_S))
        t.ok(any("leader election: released" in l for l in standby.log())
             and rc == 0, "SIGTERM: the leader releases the Lease and "
             "exits 0", (rc, standby.log()[-5:]))
        t.ok(took is not None and took < LEASE_S,
             "the standby takes over at its next try, before "
             "lease_duration (%.2f s)" % (took or -1))

        # the leader's renewals refused for renew_deadline: it exits 1
        fake.control("POST", "/_fake/faults", {
            "status": 403, "count": 10000, "match": "/leases/diverged"})
        try:
            rc = third.proc.wait(10)
        except subprocess.TimeoutExpired:
            rc = None
        t.ok(rc == 1 and any("leader election: lost" in l
                             for l in third.log()),
             "renewals refused for renew_deadline: 'leader election: "
             "lost', exit 1", (rc, third.log()[-6:]))
        for line in third.log():
            if "leader election lost" in line:
                print("# the lost leader: " + line)
        fake.control("DELETE", "/_fake/faults")
    finally:
        for d in (a, b):
            if d.proc.poll() is None:
                d.stop()
        Daemon.kill_all()


def refused(t, tmp):
    """An API server whose RBAC grants no lease: a standby that says why."""
    import yaml
    with open(RBAC) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    kept = [d for d in docs if not any(
        "coordination.k8s.io" in (r.get("apiGroups") or [])
        for r in d.get("rules") or [])]
    path = os.path.join(tmp, "rbac-no-leases.yaml")
    with open(path, "w") as f:
        yaml.safe_dump_all(kept, f)
    fake = FakeKube(rbac=[path])
    d = daemon(fake)
    try:
        d.start()
        t.ok(d.wait_log("leader election: cannot acquire or renew the "
                        "lease", 10) and any(
                            "403" in l or "forbidden" in l
                            for l in d.log() if "cannot acquire" in l),
             "the Lease refused (403): the process says why",
             [l for l in d.log() if "leader election" in l])
        t.eq(create_task(fake, "le3"), 201, "a task created")
        time.sleep(2)
        t.ok(phase(fake, "le3") is None and reconciles(d) is None and
             gauge(d, "diverge_leader") == 0,
             "a standby: it does not reconcile, diverge_leader 0",
             (phase(fake, "le3"), reconciles(d)))
        s, _, _ = d.json("GET", "/readyz")
        t.eq(s, 200, "and is ready")
        n = sum(1 for l in d.log() if "cannot acquire" in l)
        t.ok(n == 1, "the same refusal said once, not every retry", n)
        t.eq(d.stop(), 0, "SIGTERM of a standby: exit 0")
    finally:
        Daemon.kill_all()
        fake.stop()


def config_errors(t, tmp):
    cases = [
        ("embedded", "kubernetes:\n  mode: embedded\n  leader_election:\n"
         "    enabled: true\n", ":4: 'kubernetes.leader_election.enabled' "
         "is true but 'kubernetes.mode' is embedded"),
        ("ordering", "kubernetes:\n  mode: in-cluster\n  leader_election:\n"
         "    enabled: true\n    lease_duration: 5s\n"
         "    renew_deadline: 6s\n", ":6: 'kubernetes.leader_election."
         "lease_duration' (5s) must be longer than"),
    ]
    for name, text, want in cases:
        path = os.path.join(tmp, name + ".yaml")
        with open(path, "w") as f:
            f.write(text)
        for extra in ([], ["--check-config"]):
            p = subprocess.run([DIVERGED, "--config", path] + extra,
                               capture_output=True, text=True, timeout=30)
            t.ok(p.returncode == 2 and p.stderr.startswith(
                "config: " + path + want),
                 "%s%s: exit 2, config: FILE:LINE: what" %
                 (name, " (--check-config)" if extra else ""),
                 (p.returncode, p.stderr))


def main(t):
    if shutil.which("openssl") is None:
        t.skip_all("the fake kube-apiserver needs openssl for its CA")
    try:
        import yaml  # noqa: F401
    except ImportError:
        t.skip_all("PyYAML is not installed (python3-yaml)")
    tmp = tempfile.mkdtemp(prefix="diverge-leader-")
    config_errors(t, tmp)
    # the daemons' token is held to the RBAC we ship (its Lease Role)
    fake = FakeKube(rbac=[RBAC])
    try:
        two(t, fake)
    finally:
        fake.stop()
    refused(t, tmp)


run_tests(main)
