"""The command-line client, diverge(1), end to end.

- token inspect on tokens minted here (the standard construction, V2);
- usage errors and --help of every command; the API down;
- every task command against a running diverged (its embedded store's
  API), task init and the .diverge/agent.yaml defaults of task create.
  These checks hold whether or not diverged runs a reconciler that
  changes the tasks meanwhile;
- the outputs of list, status and logs compared with golden files
  (tests/data/cli/), budgets taken from a token's caveats, unknown tasks,
  bad amounts, and concurrent bumps against meter-like status writes
  (nothing lost): on stores whose task status only the test writes, the
  embedded store served by tests/tools/apiserve (the same store and
  apiserver code as diverged, without its reconciler), then through a
  kubeconfig on the fake kube-apiserver (tests/fakes/kube_apiserver.py,
  TLS and a bearer token) with the same golden files; task logs through
  pods/log.

Ages are made reproducible with DIVERGE_NOW (the CLI's clock); the times
the test writes into task status are relative to the task's creation.
Absolute timestamps in the outputs are replaced by <TIME> before a
comparison. UPDATE_GOLDEN=1 rewrites the golden files from the embedded
run.
"""

import base64
import calendar
import hashlib
import hmac
import http.client
import http.server
import json
import os
import pty
import re
import select
import shutil
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import time

from divtest import (DATA, TOP_BUILDDIR, TOP_SRCDIR, Daemon, FakeKube,
                     reap, run_tests)

DIVERGE = os.path.join(TOP_BUILDDIR, "diverge")
APISERVE = os.path.join(TOP_BUILDDIR, "tests", "tools", "apiserve")
GOLDEN = os.path.join(DATA, "cli")
AGENT_EXAMPLE = os.path.join(GOLDEN, "agent.yaml")
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
TASKS = "/apis/divergedev.com/v1alpha1/namespaces/%s/agenttasks"
# diverge runs here unless a test says otherwise: outside any git
# repository, so that no .diverge/agent.yaml or origin of the tree the
# test runs in (a clone, a distcheck) leaks into the tasks it creates
NOWHERE = tempfile.mkdtemp(prefix="diverge-cli-cwd-")


def run(args, stdin=None, env=None, cwd=None, timeout=60):
    """Run diverge; (exit status, stdout, stderr) as text."""
    if cwd is None:
        cwd = NOWHERE
    e = dict(os.environ)
    for k in ("NO_COLOR", "DIVERGE_SERVER", "DIVERGE_NOW", "KUBECONFIG"):
        e.pop(k, None)
    if env:
        e.update(env)
    p = subprocess.run([DIVERGE] + list(args), input=stdin,
                       capture_output=True, text=True, env=e, cwd=cwd,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def normalize(text):
    return re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "<TIME>", text)


def rfc3339(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def parse_time(s):
    return calendar.timegm(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ"))


def golden(t, name, got, what):
    path = os.path.join(GOLDEN, name)
    if UPDATE:
        with open(path, "w") as f:
            f.write(got)
    try:
        with open(path) as f:
            want = f.read()
    except OSError as e:
        t.ok(False, what, "cannot read %s: %s" % (path, e))
        return
    t.ok(got == want, what, "--- want (%s)\n%s--- got\n%s" % (name, want,
                                                              got))


# ---- macaroons, minted independently of the C code ----

def _field(t, data):
    n = len(data)
    v = b""
    while True:
        b = n & 0x7f
        n >>= 7
        if n:
            v += bytes([b | 0x80])
        else:
            v += bytes([b])
            break
    return bytes([t]) + v + data


def mint(key, ident, location, caveats):
    """A V2 macaroon, base64url without padding."""
    derived = hmac.new(b"macaroons-key-generator", key,
                       hashlib.sha256).digest()
    sig = hmac.new(derived, ident.encode(), hashlib.sha256).digest()
    out = b"\x02"
    if location:
        out += _field(1, location.encode())
    out += _field(2, ident.encode()) + b"\x00"
    for c in caveats:
        sig = hmac.new(sig, c.encode(), hashlib.sha256).digest()
        out += _field(2, c.encode()) + b"\x00"
    out += b"\x00" + _field(6, sig)
    return base64.urlsafe_b64encode(out).decode().rstrip("=")


KEY = bytes(range(32))


def token_inspect(t):
    caveats = ["task_id = fix-pr-42", "namespace = default",
               "max_cost_usd = 5.00", "max_tokens = 1000000",
               "expires = 2026-12-01T00:00:00Z"]
    tok = mint(KEY, "abc123", "http://127.0.0.1:8080", caveats)
    want = ("version: 2\nidentifier: abc123\n"
            "location: http://127.0.0.1:8080\n" +
            "".join("caveat: %s\n" % c for c in caveats))
    rc, out, err = run(["token", "inspect", tok])
    t.ok(rc == 0 and out == want and err == "",
         "token inspect: fields and caveats", (rc, out, err))
    rc, out, err = run(["token", "inspect", "-"], stdin=tok + "\n")
    t.ok(rc == 0 and out == want, "token inspect -: from stdin",
         (rc, out, err))
    # a forged signature is shown all the same: nothing is verified
    raw = bytearray(base64.urlsafe_b64decode(tok + "=" * (-len(tok) % 4)))
    raw[-1] ^= 1
    forged = base64.b64encode(bytes(raw)).decode()
    rc, out, err = run(["token", "inspect", forged])
    t.ok(rc == 0 and out == want,
         "token inspect: not verified (bad signature, std base64 padded)",
         (rc, out, err))
    tok = mint(KEY, "x", "", [])
    rc, out, err = run(["token", "inspect", tok])
    t.eq((rc, out), (0, "version: 2\nidentifier: x\nlocation: (none)\n"),
         "token inspect: no location, no caveat")
    # the fields are escaped for the terminal: C0 controls, DEL and the
    # backslash were, the C1 controls (U+009B is a CSI) went out raw
    tok = mint(KEY, "id\x1b]0;x\x07", "loc\u009b2J\u0085\x7f\u00e9",
               ["task_id = t\\n"])
    rc, out, err = run(["token", "inspect", tok])
    t.eq((rc, out), (0, "version: 2\nidentifier: id\\x1b]0;x\\x07\n"
                     "location: loc\\xc2\\x9b2J\\xc2\\x85\\x7f\u00e9\n"
                     "caveat: task_id = t\\x5cn\n"),
         "token inspect: control characters escaped, C1 ones too")
    for name, bad in (("not base64", "!!!"), ("truncated", tok[:-6]),
                      ("empty", "")):
        rc, out, err = run(["token", "inspect", bad])
        t.ok(rc == 1 and out == "" and
             err.startswith("diverge: malformed token") and
             err.count("\n") == 1,
             "token inspect: malformed token (%s): message, exit 1" % name,
             (rc, out, err))
    rc, out, err = run(["token", "inspect", "-"], stdin="")
    t.ok(rc == 1 and err.startswith("diverge: malformed token"),
         "token inspect -: empty stdin, exit 1", (rc, err))
    rc, out, err = run(["token", "inspect", "-"], stdin="A" * 100000)
    t.ok(rc == 1 and "too large" in err,
         "token inspect -: oversized input refused", (rc, err))
    rc, out, err = run(["token", "inspect"])
    t.ok(rc == 2 and "usage: diverge token inspect" in err,
         "token inspect without a token: usage, exit 2", (rc, err))
    rc, out, err = run(["token", "inspect", "a", "b"])
    t.eq(rc, 2, "token inspect with two tokens: exit 2")
    rc, out, err = run(["token", "inspect", "--help"])
    t.ok(rc == 0 and out.startswith("usage: diverge token inspect") and
         "stdin" in out, "token inspect --help", (rc, out))
    rc, out, err = run(["token", "inspect", "--frob", tok])
    t.eq(rc, 2, "token inspect --frob: exit 2")


# ---- usage, help ----

VERBS = ("init", "create", "list", "status", "logs", "guide", "pause",
         "resume", "budget")


def usage(t):
    rc, out, err = run(["--help"])
    t.ok(rc == 0 and all(("task " + v) in out for v in VERBS) and
         "token inspect" in out, "--help lists every command", out)
    rc, out, _ = run(["--version"])
    t.ok(rc == 0 and out.startswith("diverge "), "--version", out)
    rc, _, err = run([])
    t.ok(rc == 2 and "usage" in err, "no command: usage, exit 2", err)
    for args in (["frobnicate"], ["task"], ["task", "frobnicate"],
                 ["--frobnicate", "task", "list"],
                 ["task", "list", "--frobnicate"],
                 ["task", "list", "-o", "xml"],
                 ["task", "list", "-A", "-n", "x"],
                 ["task", "list", "extra"],
                 ["task", "status"], ["task", "status", "a", "b"],
                 ["task", "guide", "x"], ["task", "guide", "x", "  "],
                 ["task", "pause"], ["task", "logs"],
                 ["task", "budget", "x"],
                 ["task", "create"], ["task", "create", "a", "b"],
                 ["task", "create", ""],
                 ["task", "create", "x", "--name", "Bad_Name"],
                 ["task", "create", "x", "--max-iterations", "-1"],
                 ["task", "create", "x", "--budget"],
                 ["task", "list", "--server", "ftp://x"],
                 ["task", "status", ""], ["task", "status", ".."],
                 ["task", "status", "."], ["task", "logs", "a/b"],
                 ["task", "pause", "50%"], ["task", "guide", "..", "hint"],
                 ["task", "budget", "", "--budget", "1"],
                 ["-n", "..", "task", "list"],
                 ["task", "list", "-n", "."],
                 ["task", "status", "x", "-n", "a/b"],
                 ["-n", "..", "task", "create", "x"]):
        rc, out, err = run(args)
        t.ok(rc == 2 and out == "" and err.startswith("diverge") or
             (rc == 2 and err.startswith("usage")),
             "usage error: diverge %s: exit 2, message on stderr" %
             " ".join(args), (rc, out, err))
    for v in VERBS:
        rc, out, err = run(["task", v, "--help"])
        t.ok(rc == 0 and out.startswith("usage: diverge task " + v) and
             "--help" in out and err == "",
             "task %s --help" % v, (rc, out, err))
    rc, out, _ = run(["task", "--help"])
    t.ok(rc == 0 and all(v in out for v in VERBS), "task --help", out)
    # the usage line names every option of the Options list (task create
    # left out --tool and --draft), and the command list is one column
    # ("token inspect" was one to the right)
    for v in VERBS:
        _, out, _ = run(["task", v, "--help"])
        opts = out.split("\nOptions:\n", 1)[1].split("\n\n", 1)[0]
        line = out.splitlines()[0].split()
        missing = sorted(
            lo for short, lo in re.findall(r"^ +(?:(-\w), )?(--[\w-]+)",
                                           opts, re.M)
            if lo != "--help" and not any(w.strip("[]").startswith(
                (lo, short or lo)) for w in line))
        t.ok(missing == [], "task %s --help: the usage line names every "
             "option" % v, missing)
    _, out, _ = run(["--help"])
    cols = set(len(m.group(1)) for m in re.finditer(
        r"^  (task \w+ +|token \w+ +)\S", out, re.M))
    t.ok(len(cols) == 1, "--help: the commands' descriptions line up", out)


# ---- init and agent.yaml ----

def init_and_agent_yaml(t, server):
    tmp = tempfile.mkdtemp(prefix="diverge-cli-repo-")
    os.mkdir(os.path.join(tmp, ".git"))
    sub = os.path.join(tmp, "src", "deep")
    os.makedirs(sub)
    path = os.path.join(tmp, ".diverge", "agent.yaml")
    rc, out, err = run(["task", "init"], cwd=sub)
    t.ok(rc == 0 and os.path.exists(path) and path in out,
         "task init: writes .diverge/agent.yaml at the repository top",
         (rc, out, err))
    import yaml
    with open(path) as f:
        text = f.read()
    with open(AGENT_EXAMPLE) as f:
        example = yaml.safe_load(f)
    t.ok(yaml.safe_load(text) == example and text.count("\n#") +
         text.count("  #") >= 5,
         "task init: the spec's example, with comments", text)
    with open(path, "a") as f:
        f.write("# mine\n")
    rc, out, err = run(["task", "init"], cwd=tmp)
    with open(path) as f:
        kept = f.read().endswith("# mine\n")
    t.ok(rc == 1 and "already exists" in err and "--force" in err and kept,
         "task init: an existing file is kept without --force", (rc, err))
    rc, out, err = run(["task", "init", "--force"], cwd=tmp)
    with open(path) as f:
        t.ok(rc == 0 and f.read() == text,
             "task init --force: overwritten", (rc, err))

    env = {"DIVERGE_SERVER": server}
    rc, out, err = run(["task", "create", "Use the defaults", "-o",
                        "json"], cwd=sub, env=env)
    spec = json.loads(out)["spec"] if rc == 0 else {}
    name = json.loads(out)["metadata"]["name"] if rc == 0 else ""
    t.ok(rc == 0 and re.match(r"^task-[a-z0-9]{6}$", name) and
         spec.get("capabilities") == example["agent"]["capabilities"] and
         spec.get("allowedTools") == example["agent"]["allowedTools"] and
         spec.get("budgetUSD") == "5.00" and
         spec.get("maxIterations") == 5 and
         spec.get("sandbox") == {"provider": "agent-sandbox",
                                 "timeoutSeconds": 3600} and
         "repository" not in spec,
         "task create: defaults from .diverge/agent.yaml, generated name",
         (rc, out, err))
    with open(os.path.join(tmp, ".git", "config"), "w") as f:
        f.write('[core]\n\tbare = false\n[remote "origin"]\n'
                '\turl = https://github.com/myorg/checkout-service.git\n'
                '\tfetch = +refs/heads/*:refs/remotes/origin/*\n')
    rc, out, err = run(["task", "create", "Flags win", "--name",
                        "flags-win", "--budget", "$7", "--tokens", "500k",
                        "--max-iterations", "0", "--capability", "claude-*",
                        "--base-branch", "develop", "--draft", "-o",
                        "json"], cwd=tmp, env=env)
    spec = json.loads(out)["spec"] if rc == 0 else {}
    t.ok(rc == 0 and spec.get("budgetUSD") == "7.00" and
         spec.get("budgetTokens") == 500000 and
         spec.get("maxIterations") == 0 and
         spec.get("capabilities") == ["claude-*"] and
         spec.get("allowedTools") == example["agent"]["allowedTools"] and
         spec.get("draftPR") is True and
         spec.get("repository") == {
             "url": "https://github.com/myorg/checkout-service.git",
             "baseBranch": "develop", "workingBranch": "agent/flags-win"},
         "task create: flags override the file; the repository is "
         "origin's", (rc, out, err))
    with open(os.path.join(tmp, ".git", "config"), "w") as f:
        f.write('[remote "origin"]\n\turl = https://alice:ghp_x1@'
                'github.com/myorg/checkout-service.git\n')
    rc, out, err = run(["task", "create", "No token", "-o", "json"],
                       cwd=tmp, env=env)
    t.ok(rc == 0 and json.loads(out)["spec"]["repository"]["url"] ==
         "https://github.com/myorg/checkout-service.git" and
         "ghp_x1" not in out + err and "credentials" in err,
         "task create: the origin's credentials are not stored in the "
         "task (a warning says so)", (rc, out, err))
    for given, want in (
            ("https://ghp_x2@github.com/o/r", "https://github.com/o/r"),
            ("https://u:p%40ss@gitlab.example:8443/o/r.git?x=@",
             "https://gitlab.example:8443/o/r.git?x=@"),
            ("ssh://git:pw@github.com/o/r.git", "ssh://git@github.com/o/r.git"),
            ("ssh://git@github.com/o/r.git", "ssh://git@github.com/o/r.git"),
            ("git@github.com:o/r.git", "git@github.com:o/r.git"),
            ("https://github.com/o/r@v1", "https://github.com/o/r@v1")):
        rc, out, err = run(["task", "create", "Repo given", "--repo", given,
                            "-o", "json"], cwd=tmp, env=env)
        url = json.loads(out)["spec"]["repository"]["url"] if rc == 0 else ""
        t.ok(rc == 0 and url == want and
             ("credentials" in err) == (given != want),
             "task create --repo %s: stored as %s" % (given, want),
             (rc, url, err))
    rc, out, err = run(["task", "create", "No repo", "--repo", ""],
                       cwd=tmp, env=env)
    rc2, out2, _ = run(["task", "status", out.strip(), "-o", "json"],
                       env=env)
    t.ok(rc == 0 and rc2 == 0 and
         "repository" not in json.loads(out2)["spec"],
         "task create --repo '': no repository", (rc, err, out2))

    bad = {
        "unknown key": ("version: \"1\"\nagent:\n  budgetUSB: 5\n", ":3:",
                        "unknown key 'agent.budgetUSB'"),
        "bad budget": ("agent:\n  maxIterations: 2\n  budgetUSD: lots\n",
                       ":3:", "budgetUSD"),
        "bad version": ("version: \"2\"\n", ":1:", "version"),
        "bad provider": ("agent:\n  sandbox:\n    provider: docker\n",
                         ":3:", "agent-sandbox"),
        "bad list": ("agent:\n  capabilities: claude\n", ":2:",
                     "list"),
        "duplicate": ("agent:\n  maxIterations: 2\n  maxIterations: 3\n",
                      ":3:", "duplicate"),
        "bad yaml": ("agent:\n  capabilities: [a, b\n", ":", ""),
    }
    for what, (text, line, word) in bad.items():
        with open(path, "w") as f:
            f.write(text)
        rc, out, err = run(["task", "create", "x"], cwd=tmp, env=env)
        t.ok(rc == 2 and err.startswith("diverge: " + path + line) and
             word in err and out == "",
             "task create: agent.yaml %s: FILE:LINE: what, exit 2" % what,
             (rc, err))
    with open(path, "w") as f:
        f.write("")
    rc, out, err = run(["task", "create", "Empty file", "-o", "json"],
                       cwd=tmp, env=env)
    t.ok(rc == 0 and "budgetUSD" not in json.loads(out)["spec"],
         "task create: an empty agent.yaml gives no defaults", err)
    shutil.rmtree(tmp, ignore_errors=True)


# ---- the API, seen from the test ----

class Api:
    """Raw HTTP to the embedded store or the fake kube-apiserver."""

    def __init__(self, host, port, ca=None, token=None):
        self.host, self.port, self.ca, self.token = host, port, ca, token

    def request(self, method, path, body=None, ctype="application/json"):
        if self.ca:
            ctx = ssl.create_default_context(cafile=self.ca)
            c = http.client.HTTPSConnection(self.host, self.port,
                                            context=ctx, timeout=30)
        else:
            c = http.client.HTTPConnection(self.host, self.port,
                                           timeout=30)
        h = {"Content-Type": ctype, "Accept": "application/json"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        try:
            c.request(method, path, body=json.dumps(body) if body
                      is not None else None, headers=h)
            r = c.getresponse()
            data = r.read()
            return r.status, json.loads(data) if data else None
        finally:
            c.close()

    def task(self, name, ns="default"):
        return self.request("GET", TASKS % ns + "/" + name)[1]

    def set_status(self, name, status, ns="default"):
        code, doc = self.request("PATCH", TASKS % ns + "/" + name +
                                 "/status", {"status": status},
                                 "application/merge-patch+json")
        if code != 200:
            raise RuntimeError("status patch: %d %r" % (code, doc))
        return doc

    def secret(self, name, data, ns="default"):
        body = {"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": ns},
                "data": dict((k, base64.b64encode(v.encode()).decode())
                             for k, v in data.items())}
        code, doc = self.request("POST", "/api/v1/namespaces/%s/secrets" %
                                 ns, body)
        if code != 201:
            raise RuntimeError("secret: %d %r" % (code, doc))

    def delete(self, name, ns="default"):
        return self.request("DELETE", TASKS % ns + "/" + name)[0]


class Cli:
    """diverge with the connection options of one backend."""

    def __init__(self, args, env=None):
        self.args = list(args)
        self.env = env or {}

    def __call__(self, *args, env=None, **kw):
        e = dict(self.env)
        if env:
            e.update(env)
        return run(self.args + list(args), env=e, **kw)


def token_for(name, ns, usd=None, tokens=None):
    caveats = ["task_id = " + name, "namespace = " + ns]
    if usd is not None:
        caveats.append("max_cost_usd = " + usd)
    if tokens is not None:
        caveats.append("max_tokens = %d" % tokens)
    caveats.append("expires = 2030-01-01T00:00:00Z")
    return mint(KEY, os.urandom(8).hex(), "http://127.0.0.1:8080", caveats)


def seed(t, cli, api, label):
    """The tasks every backend shows the same way; their creation times."""
    created = {}
    rc, out, err = cli("task", "create",
                       "Diagnose and fix N+1 query in /api/v1/checkout",
                       "--name", "fix-checkout-latency", "--budget", "5.00",
                       "--tokens", "200000", "--max-iterations", "8",
                       "--base-branch", "main", "--repo",
                       "https://github.com/myorg/checkout-service",
                       "--capability", "claude-3-7-sonnet",
                       "--capability", "gemini-2.5-pro")
    t.ok(rc == 0 and out == "fix-checkout-latency\n" and err == "",
         "%s: task create --name prints the name" % label, (rc, out, err))
    rc, out, err = cli("task", "create", "Make the build green",
                       "--name", "paused-task", "--budget", "2",
                       "--max-iterations", "4")
    t.ok(rc == 0, "%s: task create (second task)" % label, err)
    rc, out, err = cli("task", "create", "Budget from the token",
                       "--name", "from-token")
    t.ok(rc == 0, "%s: task create without a budget" % label, err)
    rc, out, err = cli("task", "create", "Elsewhere", "--name", "other",
                       "-n", "team-a", "--budget", "1")
    t.ok(rc == 0, "%s: task create -n team-a" % label, err)
    for n, ns in (("fix-checkout-latency", "default"),
                  ("paused-task", "default"), ("from-token", "default"),
                  ("other", "team-a")):
        created[n] = parse_time(api.task(n, ns)["metadata"]
                                ["creationTimestamp"])
    c = created["fix-checkout-latency"]
    api.set_status("fix-checkout-latency", {
        "phase": "Active", "costUSD": "1.234500", "tokensConsumed": 45000,
        "iteration": 3, "sandboxName": "fix-checkout-latency",
        "previewUrl": "https://preview.example.com/?_diverge_env="
                      "agent-preview-fix-checkout-latency",
        "tokenId": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
        "activeSeconds": 900, "startedAt": rfc3339(c + 60),
        "observedGeneration": 1,
        "conditions": [
            {"type": "Ready", "status": "True",
             "reason": "DependenciesReady", "message": "Pod is Ready",
             "lastTransitionTime": rfc3339(c + 120)},
            {"type": "TokenIssued", "status": "True", "reason": "Minted",
             "message": "token 0f1e2d3c", "lastTransitionTime":
             rfc3339(c + 30)}]})
    rc, out, err = cli("task", "pause", "paused-task")
    t.ok(rc == 0 and "pause requested" in out,
         "%s: task pause" % label, (rc, out, err))
    c = created["paused-task"]
    api.set_status("paused-task", {
        "phase": "Paused", "reason": "BudgetExceeded",
        "message": "budget exceeded", "costUSD": "2.010000",
        "tokensConsumed": 120000, "iteration": 4,
        "sandboxName": "paused-task", "activeSeconds": 3000,
        "startedAt": rfc3339(c + 10),
        "conditions": [
            {"type": "Ready", "status": "False",
             "reason": "SandboxSuspended", "message": "Sandbox suspended",
             "lastTransitionTime": rfc3339(c + 3600)}]})
    api.set_status("other", {"phase": "Completed", "costUSD": "0.5",
                             "tokensConsumed": 9000, "iteration": 2,
                             "completedAt": rfc3339(created["other"] +
                                                    600)},
                   ns="team-a")
    api.secret("from-token-token", {"token": token_for(
        "from-token", "default", "3.00", 500000)})
    return created


def outputs(t, cli, api, created, label):
    """list and status against the golden files."""
    base = max(created.values())
    env = {"DIVERGE_NOW": str(base + 3 * 3600)}
    rc, out, err = cli("task", "list", env=env)
    t.ok(rc == 0 and err == "", "%s: task list" % label, err)
    golden(t, "list.txt", out, "%s: task list matches list.txt" % label)
    rc, out, err = cli("task", "list", "-A", env=env)
    golden(t, "list-all.txt", out,
           "%s: task list -A matches list-all.txt" % label)
    rc, out, err = cli("task", "list", "-n", "team-a", env=env)
    t.ok(rc == 0 and "other" in out and "fix-checkout" not in out,
         "%s: task list -n team-a" % label, out)
    rc, out, err = cli("task", "list", "-n", "empty-ns")
    t.ok(rc == 0 and out == "" and "No tasks found" in err,
         "%s: task list of an empty namespace" % label, (rc, out, err))
    for name, file in (("fix-checkout-latency", "status-active.txt"),
                       ("paused-task", "status-paused.txt"),
                       ("from-token", "status-token.txt")):
        env = {"DIVERGE_NOW": str(created[name] + 2 * 3600)}
        rc, out, err = cli("task", "status", name, env=env)
        t.ok(rc == 0 and err == "", "%s: task status %s" % (label, name),
             err)
        golden(t, file, normalize(out),
               "%s: task status %s matches %s" % (label, name, file))
    rc, out, err = cli("task", "status", "other", "-n", "team-a")
    t.ok(rc == 0 and "Completed" in out and "finished" in out,
         "%s: task status of a completed task" % label, out)

    rc, out, err = cli("task", "list", "-o", "json")
    items = json.loads(out) if rc == 0 else None
    t.ok(rc == 0 and isinstance(items, list) and
         [i["metadata"]["name"] for i in items] ==
         ["fix-checkout-latency", "from-token", "paused-task"] and
         all(i["kind"] == "AgentTask" and
             i["apiVersion"] == "divergedev.com/v1alpha1" for i in items) and
         out == json.dumps(items, indent=2, sort_keys=True,
                           ensure_ascii=False) + "\n",
         "%s: task list -o json: an array of the objects, keys sorted, "
         "2-space indent" % label, out[:2000])
    rc2, out2, _ = cli("task", "list", "-o", "json")
    t.ok(rc2 == 0 and out2 == out, "%s: task list -o json is stable" %
         label)
    import yaml
    rc, outy, err = cli("task", "list", "-o", "yaml")
    t.ok(rc == 0 and yaml.safe_load(outy) == items,
         "%s: task list -o yaml reads back as the JSON" % label,
         outy[:2000])
    rc, out, err = cli("task", "status", "fix-checkout-latency", "-o",
                       "json")
    obj = json.loads(out) if rc == 0 else None
    t.ok(rc == 0 and obj == api.task("fix-checkout-latency"),
         "%s: task status -o json is the object" % label, out[:2000])
    rc, outy, err = cli("task", "status", "fix-checkout-latency", "-o",
                        "yaml")
    t.ok(rc == 0 and yaml.safe_load(outy) == obj,
         "%s: task status -o yaml reads back as the JSON" % label, outy)
    return items


def operations(t, cli, api, label):
    """guide, pause, resume, budget: effects on the object."""
    name = "fix-checkout-latency"
    rc, out, err = cli("task", "guide", name,
                       "  Ensure backward compatibility with API v1 "
                       "clients\n")
    ann = api.task(name)["metadata"].get("annotations", {})
    t.ok(rc == 0 and "guidance set" in out and
         ann.get("divergedev.com/guidance") ==
         "Ensure backward compatibility with API v1 clients",
         "%s: task guide sets the annotation (trimmed)" % label,
         (rc, out, err, ann))
    rc, out, err = cli("task", "guide", name, "x" * 2001)
    t.ok(rc == 2 and "too long" in err, "%s: task guide: hint too long, "
         "exit 2" % label, (rc, err))
    rc, out, err = cli("task", "guide", name, "bad\x1bhint")
    t.ok(rc == 2 and "control" in err,
         "%s: task guide: control character, exit 2" % label, (rc, err))

    rc, out, err = cli("task", "budget", name, "--budget", "+15.00",
                       "--tokens", "2M")
    spec = api.task(name)["spec"]
    t.ok(rc == 0 and spec["budgetUSD"] == "20.00" and
         spec["budgetTokens"] == 2200000 and not spec.get("suspended") and
         "$20.00" in out and "2200000" in out,
         "%s: task budget adds to the spec budgets, suspension unchanged" %
         label, (rc, out, err, spec))
    rc, out, err = cli("task", "pause", name)
    t.ok(rc == 0 and api.task(name)["spec"].get("suspended") is True,
         "%s: task pause sets spec.suspended" % label, (rc, out, err))
    rc, out, err = cli("task", "pause", name)
    t.ok(rc == 0, "%s: task pause again: fine (idempotent)" % label, err)
    rc, out, err = cli("task", "resume", name, "--budget", "1,000",
                       "--tokens", "500k")
    spec = api.task(name)["spec"]
    t.ok(rc == 0 and spec.get("suspended") is False and
         spec["budgetUSD"] == "1020.00" and
         spec["budgetTokens"] == 2700000,
         "%s: task resume --budget 1,000 --tokens 500k: bumps, then "
         "resumes" % label, (rc, out, err, spec))
    rc, out, err = cli("task", "resume", "paused-task")
    spec = api.task("paused-task")["spec"]
    t.ok(rc == 0 and spec.get("suspended") is False and
         spec["budgetUSD"] == "2.00" and "warning" in err and
         "$2.01 of its $2.00" in err,
         "%s: task resume without a bump, over budget: resumed, with a "
         "warning" % label, (rc, out, err))

    # the budget from the token's caveat
    rc, out, err = cli("task", "budget", "from-token", "--budget", "2",
                       "--tokens", "100000")
    spec = api.task("from-token")["spec"]
    t.ok(rc == 0 and spec.get("budgetUSD") == "5.00" and
         spec.get("budgetTokens") == 600000,
         "%s: task budget: bumps the token's caveats into the spec" % label,
         (rc, out, err, spec))
    rc, out, err = cli("task", "create", "Unlimited", "--name", "unlimited")
    api.secret("unlimited-token", {"token": token_for("unlimited",
                                                      "default")})
    rc, out, err = cli("task", "budget", "unlimited", "--budget", "5")
    spec = api.task("unlimited")["spec"]
    t.ok(rc == 1 and "unlimited" in err and "budgetUSD" not in spec,
         "%s: task budget of an unlimited budget: refused, explained" %
         label, (rc, err, spec))
    rc, out, err = cli("task", "create", "No token yet", "--name",
                       "no-token")
    rc, out, err = cli("task", "resume", "no-token", "--tokens", "5")
    spec = api.task("no-token")["spec"]
    t.ok(rc == 1 and "configured default" in err and
         "budgetTokens" not in spec,
         "%s: task resume --tokens without a budget or a token: refused, "
         "nothing written" % label, (rc, err, spec))
    # a token that is another task's does not count
    api.secret("no-token-token", {"token": token_for("someone-else",
                                                     "default", "9.00")})
    rc, out, err = cli("task", "budget", "no-token", "--budget", "1")
    t.ok(rc == 1 and "budgetUSD" not in api.task("no-token")["spec"],
         "%s: a token of another task is not used" % label, (rc, err))

    for args, what in ((["--budget", "-5"], "negative"),
                       (["--budget", "abc"], "not a number"),
                       (["--budget", "1.234"], "3 decimals"),
                       (["--budget", "0"], "zero"),
                       (["--budget", "5000"], "over the maximum"),
                       (["--tokens", "1.5M"], "fractional tokens"),
                       (["--tokens", "-2"], "negative tokens"),
                       (["--tokens", "2G"], "bad suffix")):
        rc, out, err = cli("task", "budget", name, *args)
        t.ok(rc == 2 and err.startswith("diverge: ") and "usage" in err,
             "%s: task budget %s (%s): exit 2" % (label, " ".join(args),
                                                   what), (rc, err))
    for verb, extra in (("status", []), ("logs", []), ("pause", []),
                        ("resume", []), ("guide", ["hint"]),
                        ("budget", ["--budget", "1"])):
        rc, out, err = cli("task", verb, "no-such-task", *extra)
        t.ok(rc == 1 and out == "" and
             err == 'diverge: agenttasks.divergedev.com "no-such-task" '
                    'not found\n',
             "%s: task %s of an unknown task: the Status message, exit 1" %
             (label, verb), (rc, out, err))
    rc, out, err = cli("task", "create", "again", "--name", "paused-task")
    t.ok(rc == 1 and "already exists" in err,
         "%s: task create of an existing name: exit 1" % label, (rc, err))


def concurrency(t, cli, api, label):
    """Parallel bumps and meter-like status writes: none is lost."""
    name = "race"
    cli("task", "create", "Race", "--name", name, "--budget", "1",
        "--tokens", "1000")
    procs = []
    e = dict(os.environ)
    e.update(cli.env)
    for _ in range(8):
        procs.append(subprocess.Popen(
            [DIVERGE] + cli.args + ["task", "budget", name, "--tokens",
                                    "100", "--budget", "0.10"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=e,
            cwd=NOWHERE))

    def meter():
        for i in range(1, 21):
            for _ in range(100):
                cur = api.task(name)
                st = cur.get("status") or {}
                patch = {"metadata": {"resourceVersion":
                                      cur["metadata"]["resourceVersion"]},
                         "status": {"iteration": st.get("iteration", 0) + 1,
                                    "tokensConsumed":
                                    st.get("tokensConsumed", 0) + 10}}
                code, _ = api.request("PATCH", TASKS % "default" + "/" +
                                      name + "/status", patch,
                                      "application/merge-patch+json")
                if code == 200:
                    break
    th = threading.Thread(target=meter)
    th.start()
    rcs = [p.wait(60) for p in procs]
    errs = [p.stderr.read().decode() for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    th.join(60)
    obj = api.task(name)
    t.ok(rcs == [0] * 8 and obj["spec"]["budgetTokens"] == 1800 and
         obj["spec"]["budgetUSD"] == "1.80" and
         obj["status"]["iteration"] == 20 and
         obj["status"]["tokensConsumed"] == 200,
         "%s: 8 concurrent bumps and 20 meter writes: nothing lost" % label,
         (rcs, errs, obj.get("spec"), obj.get("status")))


# ---- logs in embedded mode: the history ----

def read_line(stream, timeout=10):
    end = time.time() + timeout
    buf = b""
    while time.time() < end:
        r, _, _ = select.select([stream], [], [], 0.2)
        if r:
            c = os.read(stream.fileno(), 1)
            if not c:
                break
            if c == b"\n":
                return buf.decode()
            buf += c
    return None


def logs_embedded(t, cli, api):
    name = "history"
    cli("task", "create", "Tell the story", "--name", name, "--budget",
        "5", "--max-iterations", "3")
    cli("task", "guide", name, "Be brief")
    api.set_status(name, {"phase": "Provisioning"})
    api.set_status(name, {"phase": "Active", "iteration": 1,
                          "costUSD": "0.022500", "tokensConsumed": 1500})
    cli("task", "pause", name)
    api.set_status(name, {"phase": "Paused", "reason": "Suspended"})
    cli("task", "resume", name, "--budget", "2.50")
    rc, out, err = cli("task", "logs", name)
    golden(t, "logs.txt", out, "embedded: task logs: the task's history "
           "matches logs.txt")
    t.ok(rc == 0 and err == "", "embedded: task logs exits 0", err)

    e = dict(os.environ)
    e.update(cli.env)
    p = subprocess.Popen([DIVERGE] + cli.args + ["task", "logs", name,
                                                  "-f"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=e, cwd=NOWHERE)
    try:
        first = [read_line(p.stdout) for _ in out.splitlines()]
        t.ok(first == out.splitlines(), "embedded: task logs -f: the "
             "history first", first)
        api.set_status(name, {"phase": "Provisioning", "reason": ""})
        line = read_line(p.stdout)
        t.eq(line, "phase Provisioning", "embedded: task logs -f: a live "
             "change")
        cli("task", "guide", name, "Now faster")
        line = read_line(p.stdout)
        t.eq(line, 'guidance: "Now faster"',
             "embedded: task logs -f: guidance")
        api.delete(name)
        line = read_line(p.stdout)
        rc = p.wait(10)
        t.ok(line == "deleted" and rc == 0,
             "embedded: task logs -f ends with the task", (line, rc))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()


def colour(t, cli):
    """Colour only on a terminal, and not with NO_COLOR."""
    def on_tty(env):
        master, slave = pty.openpty()
        e = dict(os.environ)
        e.update(cli.env)
        e.pop("NO_COLOR", None)
        e.update(env)
        p = subprocess.Popen([DIVERGE] + cli.args + ["task", "list"],
                             stdout=slave, stderr=subprocess.PIPE, env=e,
                             cwd=NOWHERE)
        os.close(slave)
        data = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        p.wait(10)
        p.stderr.close()
        os.close(master)
        return data.decode()
    out = on_tty({})
    t.ok("\x1b[32mActive\x1b[0m" in out and
         "\x1b[33mPaused\x1b[0m" in out,
         "colour: the phase is coloured on a terminal", repr(out))
    out = on_tty({"NO_COLOR": "1"})
    t.ok("Active" in out and "\x1b[" not in out,
         "colour: none with NO_COLOR", repr(out))
    rc, out, _ = cli("task", "list")
    t.ok(rc == 0 and "\x1b[" not in out, "colour: none into a pipe")


def server_down(t):
    cli = Cli(["--server", "http://127.0.0.1:9"])
    for verb, extra in (("list", []), ("status", ["x"]), ("create", ["x"]),
                        ("pause", ["x"]), ("budget", ["x", "--tokens", "1"]),
                        ("logs", ["x"])):
        start = time.time()
        rc, out, err = cli("task", verb, *extra)
        t.ok(rc == 1 and out == "" and err.startswith(
            "diverge: cannot reach the API at http://127.0.0.1:9: ") and
            err.count("\n") == 1 and time.time() - start < 10,
            "API down: task %s: a clear message, exit 1" % verb, (rc, err))
    rc, out, err = run(["task", "list"], env={"DIVERGE_SERVER":
                                              "http://127.0.0.1:9"})
    t.ok(rc == 1 and "http://127.0.0.1:9" in err,
         "DIVERGE_SERVER sets the server", err)


class RefusingServer(http.server.BaseHTTPRequestHandler):
    """An API that refuses everything with a Status whose message carries
    terminal escapes, as an admission webhook's denial may."""
    protocol_version = "HTTP/1.1"
    message = ("denied\x1b]0;pwned\x07 \x1b[2J\u009b31m\x7f\r\n"
               "diverge: forged line")

    def log_message(self, *args):
        pass

    def refuse(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        data = json.dumps({"kind": "Status", "apiVersion": "v1",
                           "status": "Failure", "reason": "Forbidden",
                           "message": self.message, "code": 403}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = refuse


def refused_escapes(t):
    """The message of an API refusal reaches stderr on one line, without
    its escape sequences (it was written there as it came)."""
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), RefusingServer)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cli = Cli(["--server", "http://127.0.0.1:%d" % srv.server_address[1]])
    bad = ("\x1b", "\x07", "\x7f", "\u009b", "\r")
    try:
        for args in (("task", "list"), ("task", "status", "x"),
                     ("task", "pause", "x"), ("task", "create", "o",
                                              "--repo", "")):
            rc, out, err = cli(*args)
            t.ok(rc == 1 and out == "" and err.startswith("diverge: denied")
                 and err.count("\n") == 1 and
                 not any(c in err for c in bad),
                 "API refusal with escapes in its message: diverge %s: "
                 "one clean line on stderr, exit 1" % " ".join(args),
                 (rc, out, err))
    finally:
        srv.shutdown()
        srv.server_close()


def subsequence(lines, want):
    """Whether want appears in lines in order (other lines between)."""
    it = iter(lines)
    return all(any(w == line for line in it) for w in want)


def read_until(stream, want, timeout=15):
    """Read lines until want comes; the lines read, or None."""
    seen = []
    end = time.time() + timeout
    while time.time() < end:
        line = read_line(stream, max(0.1, end - time.time()))
        if line is None:
            break
        seen.append(line)
        if line == want:
            return seen
    return None


def daemon_commands(t, cli, api):
    """Every command on a running diverged. What is checked holds even
    when a reconciler changes the tasks meanwhile."""
    label = "diverged"
    rc, out, err = cli("task", "create", "Fix the flaky test", "--name",
                       "e2e", "--budget", "5.00", "--tokens", "200k",
                       "--max-iterations", "8")
    t.ok(rc == 0 and out == "e2e\n" and err == "",
         "%s: task create --name prints the name" % label, (rc, out, err))
    rc, out, err = cli("task", "create", "Generated name")
    gen = out.strip()
    t.ok(rc == 0 and re.match(r"^task-[a-z0-9]{6}$", gen),
         "%s: task create: a generated task-XXXXXX name" % label,
         (rc, out, err))
    rc, out, err = cli("task", "list")
    t.ok(rc == 0 and out.startswith("NAME ") and
         re.search(r"^e2e +\S+ +\$[0-9.]+/\$5\.00 +\d+/200000 +\d+/8 +"
                   r"\d+s$", out, re.M) and
         re.search("^%s " % gen, out, re.M),
         "%s: task list" % label, (rc, out, err))
    rc, out, err = cli("task", "list", "-o", "json")
    names = [i["metadata"]["name"] for i in json.loads(out)] if rc == 0 \
        else []
    t.ok(rc == 0 and "e2e" in names and gen in names,
         "%s: task list -o json" % label, out[:1000])
    rc, out, err = cli("task", "status", "e2e")
    t.ok(rc == 0 and "Name:          e2e\n" in out and
         "Objective:     Fix the flaky test\n" in out and
         re.search(r"^Spend: +\$[0-9.]+ of \$5\.00", out, re.M) and
         "Next:" in out, "%s: task status" % label, (rc, out, err))
    rc, out, err = cli("task", "guide", "e2e", "Be brief")
    ann = api.task("e2e")["metadata"].get("annotations", {})
    t.ok(rc == 0 and ann.get("divergedev.com/guidance") == "Be brief",
         "%s: task guide" % label, (rc, out, err))
    rc, out, err = cli("task", "budget", "e2e", "--budget", "+2.50",
                       "--tokens", "1M")
    spec = api.task("e2e")["spec"]
    t.ok(rc == 0 and spec["budgetUSD"] == "7.50" and
         spec["budgetTokens"] == 1200000,
         "%s: task budget" % label, (rc, out, err, spec))
    rc, out, err = cli("task", "pause", "e2e")
    t.ok(rc == 0 and api.task("e2e")["spec"].get("suspended") is True,
         "%s: task pause" % label, (rc, out, err))
    rc, out, err = cli("task", "resume", "e2e", "--tokens", "500k")
    spec = api.task("e2e")["spec"]
    t.ok(rc == 0 and spec.get("suspended") is False and
         spec["budgetTokens"] == 1700000,
         "%s: task resume --tokens 500k" % label, (rc, out, err, spec))
    rc, out, err = cli("task", "logs", "e2e")
    lines = out.splitlines()
    t.ok(rc == 0 and lines[:1] == ['created: "Fix the flaky test"; budget '
                                   '$5.00; 200000 tokens; 8 iterations'] and
         subsequence(lines, ['guidance: "Be brief"',
                             "USD budget $5.00 -> $7.50; token budget "
                             "200000 -> 1200000",
                             "pause requested",
                             "resume requested; token budget 1200000 -> "
                             "1700000"]),
         "%s: task logs: the history of the task" % label, (rc, out, err))

    e = dict(os.environ)
    e.update(cli.env)
    p = subprocess.Popen([DIVERGE] + cli.args + ["task", "logs", "e2e",
                                                  "-f"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=e, cwd=NOWHERE)
    try:
        seen = read_until(p.stdout, "resume requested; token budget "
                          "1200000 -> 1700000")
        t.ok(seen is not None, "%s: task logs -f: the history first" %
             label, seen)
        cli("task", "guide", "e2e", "Now faster")
        seen = read_until(p.stdout, 'guidance: "Now faster"')
        t.ok(seen is not None, "%s: task logs -f: a live change" % label,
             seen)
        api.delete("e2e")
        seen = read_until(p.stdout, "deleted")
        rc = p.wait(10)
        t.ok(seen is not None and rc == 0,
             "%s: task logs -f ends with the task" % label, (seen, rc))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()

    for verb, extra in (("status", []), ("logs", []), ("pause", []),
                        ("resume", []), ("guide", ["hint"]),
                        ("budget", ["--budget", "1"])):
        rc, out, err = cli("task", verb, "no-such-task", *extra)
        t.ok(rc == 1 and out == "" and
             err == 'diverge: agenttasks.divergedev.com "no-such-task" '
                    'not found\n',
             "%s: task %s of an unknown task: the Status message, exit 1" %
             (label, verb), (rc, out, err))
    for args in (["--budget", "-5"], ["--budget", "1.234"],
                 ["--tokens", "1.5M"]):
        rc, out, err = cli("task", "budget", gen, *args)
        t.ok(rc == 2 and "usage" in err,
             "%s: task budget %s: exit 2" % (label, " ".join(args)),
             (rc, err))


def terminal_escapes(t, cli, api):
    """What an agent wrote (the /complete message, a condition's message)
    reaches the reader's terminal without its escape sequences: OSC 52
    would set the clipboard, CSI 2J clear the screen, OSC 8 dress a link,
    a C1 CSI (U+009B) too."""
    rc, out, err = cli("task", "create", "Escapes", "--name", "esc", "-n",
                       "solo")
    hostile = ("done\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07 \x1b[2J\x1b[H"
               "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\"
               "\u009b31m red\x7f\ufffe\nnext line")
    api.set_status("esc", {
        "phase": "Failed", "reason": "AgentFailed", "message": hostile,
        "conditions": [{"type": "Ready", "status": "False",
                        "reason": "PodFailed", "message": hostile,
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        ns="solo")
    bad = ("\x1b", "\x07", "\x7f", "\u009b")
    for args in (("task", "status", "esc"), ("task", "list"),
                 ("task", "logs", "esc")):
        rc, out, err = cli(*(args + ("-n", "solo")))
        # (the list shows no message: only that it stays clean)
        t.ok(rc == 0 and ("done" in out or args[1] == "list") and
             not any(c in out + err for c in bad),
             "diverge %s: no escape sequence from the task reaches the "
             "terminal" % " ".join(args), (rc, out, err))
    rc, out, err = cli("task", "status", "esc", "-n", "solo", "-o", "json")
    t.ok(rc == 0 and json.loads(out)["status"]["message"] == hostile,
         "task status -o json keeps the message as it is (JSON-escaped)",
         (rc, out[:500]))
    # DEL, the C1 controls (CSI U+009B) and U+FFFE were written as they
    # came: -o yaml was no YAML (a YAML reader refuses them unescaped)
    # and both let a C1 CSI reach the terminal
    for fmt in ("json", "yaml"):
        rc, out, err = cli("task", "status", "esc", "-n", "solo", "-o", fmt)
        t.ok(rc == 0 and not any(c in out for c in bad + ("\ufffe",)) and
             '"done' in out and "next line" in out,
             "task status -o %s: no raw control character" % fmt,
             (rc, out[:800]))
        if fmt == "yaml":
            import yaml
            try:
                got = yaml.safe_load(out)["status"]["message"]
            except yaml.YAMLError as e:
                got = e
            t.ok(got == hostile, "task status -o yaml: the message reads "
                 "back as it is", (got, out[:800]))


def embedded(t):
    """diverged itself."""
    d = Daemon(config=None).start()
    server = "http://127.0.0.1:%d" % d.api_port
    api = Api("127.0.0.1", d.api_port)
    cli = Cli(["--server", server])
    # the first object of the store: no watch event before it
    rc, out, err = cli("task", "create", "Alone", "--name", "first", "-n",
                       "solo")
    start = time.time()
    rc, out, err = cli("task", "logs", "first", "-n", "solo")
    t.ok(rc == 0 and out.startswith('created: "Alone"\n') and
         time.time() - start < 8,
         "diverged: task logs of the store's first task", (rc, out, err))
    with open("/dev/full", "w") as full:
        p = subprocess.run([DIVERGE, "--server", server, "task", "list",
                            "-n", "solo"], stdout=full,
                           stderr=subprocess.PIPE, text=True, cwd=NOWHERE)
    t.ok(p.returncode == 1 and "cannot write" in p.stderr,
         "a failed write of the output: exit 1", (p.returncode, p.stderr))
    daemon_commands(t, cli, api)
    init_and_agent_yaml(t, server)
    terminal_escapes(t, cli, api)
    refused_escapes(t)
    rc, out, err = run(["--server", server, "task", "list", "-n",
                        "solo"])
    t.ok(rc == 0 and "first" in out,
         "connection options before the command", (rc, out, err))
    d.stop()


class ApiServe:
    """tests/tools/apiserve: the embedded store over HTTP, no daemon."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="diverge-cli-store-")
        self.proc = subprocess.Popen(
            [APISERVE, os.path.join(self.tmp, "store.db"), "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        r, _, _ = select.select([self.proc.stdout], [], [], 20)
        line = self.proc.stdout.readline() if r else ""
        if not line.startswith("port="):
            self.stop()
            raise RuntimeError("apiserve did not start: %r" % line)
        self.port = int(line.strip()[5:])

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        reap(self.proc)
        shutil.rmtree(self.tmp, ignore_errors=True)


def store(t):
    """The embedded store, the task status written by the test only."""
    if not os.access(APISERVE, os.X_OK):
        t.skip("embedded store: goldens (tests/tools/apiserve is not "
               "built)")
        return None
    srv = ApiServe()
    try:
        api = Api("127.0.0.1", srv.port)
        cli = Cli(["--server", "http://127.0.0.1:%d" % srv.port])
        created = seed(t, cli, api, "embedded")
        items = outputs(t, cli, api, created, "embedded")
        colour(t, cli)
        operations(t, cli, api, "embedded")
        concurrency(t, cli, api, "embedded")
        logs_embedded(t, cli, api)
    finally:
        srv.stop()
    return items


# ---- the Kubernetes path: the fake kube-apiserver ----

KUBECONFIG = """apiVersion: v1
kind: Config
current-context: main
contexts:
- name: main
  context: {cluster: fake, user: me, namespace: default}
- name: team-a
  context: {cluster: fake, user: me, namespace: team-a}
- name: intruder
  context: {cluster: fake, user: wrong}
- name: proxied
  context: {cluster: fake-proxied, user: me, namespace: default}
- name: proxy-down
  context: {cluster: fake-proxy-down, user: me, namespace: default}
- name: unverified
  context: {cluster: fake-insecure, user: me, namespace: default}
clusters:
- name: fake
  cluster: {server: "%(server)s", certificate-authority: "%(ca)s"}
- name: fake-insecure
  cluster: {server: "%(server)s", insecure-skip-tls-verify: true}
- name: plain
  cluster: {server: "%(plain)s"}
- name: fake-proxied
  cluster: {server: "%(server)s", certificate-authority: "%(ca)s",
            proxy-url: "%(proxy)s"}
- name: fake-proxy-down
  cluster: {server: "%(server)s", certificate-authority: "%(ca)s",
            proxy-url: "%(dead)s"}
users:
- name: me
  user: {token: "%(token)s"}
- name: wrong
  user: {token: "not-the-token"}
"""


class LogServer(http.server.BaseHTTPRequestHandler):
    """A plain-http API with one task, its Sandbox and its pod's log."""
    protocol_version = "HTTP/1.1"
    seen = []

    def log_message(self, *args):
        pass

    def reply(self, code, doc):
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        LogServer.seen.append(self.path)
        if self.path.startswith(TASKS % "default" + "/runner"):
            self.reply(200, {"apiVersion": "divergedev.com/v1alpha1",
                             "kind": "AgentTask",
                             "metadata": {"name": "runner",
                                          "namespace": "default",
                                          "resourceVersion": "5"},
                             "spec": {"objective": "x"},
                             "status": {"phase": "Active",
                                        "sandboxName": "runner"}})
        elif "/sandboxes/runner" in self.path:
            self.reply(200, {"metadata": {"name": "runner", "annotations": {
                "agents.x-k8s.io/pod-name": "runner-pod"}}})
        elif self.path.startswith("/api/v1/namespaces/default/pods/"
                                  "runner-pod/log"):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for line in (b"cloning\n", b"iteration 1: tests fail\n",
                         b"iteration 2: tests pass\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.reply(404, {"kind": "Status", "apiVersion": "v1",
                             "status": "Failure", "reason": "NotFound",
                             "message": "the server could not find the "
                                        "requested resource",
                             "code": 404})


def kubernetes(t, store_items):
    if shutil.which("openssl") is None:
        t.skip("Kubernetes path (openssl not installed)")
        return
    fake = FakeKube()
    logsrv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), LogServer)
    logsrv.daemon_threads = True
    threading.Thread(target=logsrv.serve_forever, daemon=True).start()
    tmp = tempfile.mkdtemp(prefix="diverge-cli-kube-")
    proxy_log = os.path.join(tmp, "proxy.log")
    proxy = subprocess.Popen(
        [sys.executable, os.path.join(TOP_SRCDIR, "tests", "fakes",
                                      "connect_proxy.py"),
         "--port", "0", "--log", proxy_log], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    dead = socketserver.TCPServer(("127.0.0.1", 0), None)
    dead_url = "http://127.0.0.1:%d" % dead.server_address[1]
    dead.server_close()         # a port that refuses
    try:
        proxy_url = "http://127.0.0.1:%d" % json.loads(
            proxy.stdout.readline())["port"]
        kc = os.path.join(tmp, "kubeconfig")
        with open(kc, "w") as f:
            f.write(KUBECONFIG % {
                "server": fake.info["server"], "ca": fake.info["ca_file"],
                "token": fake.info["token"],
                "plain": "http://127.0.0.1:%d" % logsrv.server_address[1],
                "proxy": proxy_url, "dead": dead_url})
        api = Api("127.0.0.1", fake.info["port"], fake.info["ca_file"],
                  fake.info["token"])
        cli = Cli(["--kubeconfig", kc])
        created = seed(t, cli, api, "kubernetes")
        items = outputs(t, cli, api, created, "kubernetes")
        strip = re.compile(r'"(uid|resourceVersion)": "[^"]*"')
        if store_items is not None:
            t.eq(normalize(strip.sub("", json.dumps(items,
                                                    sort_keys=True))),
                 normalize(strip.sub("", json.dumps(store_items,
                                                    sort_keys=True))),
                 "kubernetes: task list -o json equals the embedded "
                 "store's (but uids, versions, times)")
        operations(t, cli, api, "kubernetes")
        concurrency(t, cli, api, "kubernetes")
        lost_answers(t, cli, api, fake)

        rc, out, err = run(["--kubeconfig", kc, "--context", "team-a",
                            "task", "list"])
        t.ok(rc == 0 and "other" in out and "paused-task" not in out,
             "kubernetes: the context's namespace is the default", out)
        rc, out, err = run(["--kubeconfig", kc, "--context", "team-a",
                            "task", "create", "In team-a", "-o", "json"])
        t.ok(rc == 0 and json.loads(out)["metadata"]["namespace"] ==
             "team-a", "kubernetes: create in the context's namespace",
             err)
        rc, out, err = run(["task", "list", "--context", "intruder"],
                           env={"KUBECONFIG": kc})
        t.ok(rc == 1 and err == "diverge: Unauthorized\n",
             "kubernetes: a wrong token: the 401 Status message, exit 1",
             (rc, err))
        rc, out, err = run(["task", "list", "--context", "nope"],
                           env={"KUBECONFIG": kc})
        t.ok(rc == 1 and "nope" in err, "kubernetes: an unknown context: "
             "exit 1", (rc, err))
        # the cluster's proxy-url, over https_proxy and no_proxy
        rc, out, err = run(["--kubeconfig", kc, "--context", "proxied",
                            "task", "list"],
                           env={"https_proxy": dead_url,
                                "no_proxy": "127.0.0.1"})
        with open(proxy_log) as f:
            tunnels = f.read().splitlines()
        t.ok(rc == 0 and "fix-checkout-latency" in out and
             "CONNECT 127.0.0.1:%d" % fake.info["port"] in tunnels,
             "kubernetes: proxy-url: through the proxy (a CONNECT to the "
             "API server), whatever https_proxy and no_proxy say",
             (rc, err, tunnels))
        fake.control("DELETE", "/_fake/requests")
        rc, out, err = run(["--kubeconfig", kc, "--context", "proxy-down",
                            "task", "list"])
        t.ok(rc == 1 and out == "" and "through the proxy %s" % dead_url
             in err and fake.control("GET", "/_fake/requests") == [],
             "kubernetes: proxy-url refusing: exit 1 naming the proxy, "
             "nothing sent direct", (rc, err))
        rc, out, err = cli("task", "list", "--kubeconfig",
                           os.path.join(tmp, "absent"))
        t.ok(rc == 1 and "absent" in err, "kubernetes: a missing "
             "kubeconfig: exit 1", (rc, err))

        # a CA on the command line turns verification back on (kubectl)
        rc, out, err = run(["--kubeconfig", kc, "--context", "unverified",
                            "task", "list"])
        t.ok(rc == 0 and "fix-checkout-latency" in out,
             "kubernetes: insecure-skip-tls-verify in the kubeconfig",
             (rc, err))
        other_ca = os.path.join(DATA, "kubeconfig", "certs", "ca.crt")
        rc, out, err = run(["--kubeconfig", kc, "--context", "unverified",
                            "--certificate-authority", other_ca, "task",
                            "list"])
        t.ok(rc == 1 and out == "" and "certificate" in err.lower(),
             "kubernetes: --certificate-authority over an insecure "
             "kubeconfig verifies the server again (another CA: refused)",
             (rc, out, err))
        rc, out, err = run(["--kubeconfig", kc, "--context", "unverified",
                            "--certificate-authority", fake.info["ca_file"],
                            "task", "list"])
        t.ok(rc == 0 and "fix-checkout-latency" in out,
             "kubernetes: ... and its own CA: verified, fine", (rc, err))
        rc, out, err = run(["--kubeconfig", kc, "--insecure-skip-tls-verify",
                            "task", "list"])
        t.ok(rc == 0 and "fix-checkout-latency" in out,
             "kubernetes: --insecure-skip-tls-verify drops the "
             "kubeconfig's CA", (rc, err))
        rc, out, err = run(["--kubeconfig", kc, "--insecure-skip-tls-verify",
                            "--certificate-authority", fake.info["ca_file"],
                            "task", "list"])
        t.ok(rc == 2 and "exclude each other" in err,
             "kubernetes: both --certificate-authority and "
             "--insecure-skip-tls-verify: usage error, exit 2", (rc, err))

        # history mode through --server, --token-file and
        # --certificate-authority, after the watch history was forgotten
        tokfile = os.path.join(tmp, "token")
        with open(tokfile, "w") as f:
            f.write(fake.info["token"] + "\n")
        fake.control("POST", "/_fake/compact")
        direct = ["--server", fake.info["server"], "--token-file", tokfile,
                  "--certificate-authority", fake.info["ca_file"]]
        rc, out, err = run(direct + ["task", "logs", "fix-checkout-latency"])
        lines = out.splitlines()
        t.ok(rc == 0 and len(lines) == 3 and lines[0] ==
             '(the older history of "fix-checkout-latency" is no longer '
             'kept)' and lines[1] ==
             'now: "Diagnose and fix N+1 query in /api/v1/checkout"; '
             'budget $1020.00; 2700000 tokens; 8 iterations' and
             lines[2].startswith("phase Active; ") and
             'guidance: "Ensure backward compatibility with API v1 '
             'clients"' in lines[2] and
             lines[2].endswith("iteration 3: $1.2345 spent, 45000 tokens"),
             "--server with --token-file and --certificate-authority; task "
             "logs when the history is gone (410): the state now",
             (rc, out, err))
        e = dict(os.environ)
        p = subprocess.Popen([DIVERGE] + direct + ["task", "logs",
                                                   "fix-checkout-latency",
                                                   "-f"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=e, cwd=NOWHERE)
        try:
            first = [read_line(p.stdout) for _ in range(3)]
            api.set_status("fix-checkout-latency", {"phase": "Failed",
                                                    "reason": "Timeout"})
            line = read_line(p.stdout)
            t.ok(first == lines and line == "phase Failed (Timeout)",
                 "task logs -f after a 410: goes on from now", (first, line))
        finally:
            p.kill()
            p.wait()
            p.stdout.close()
            p.stderr.close()
        rc, out, err = run(["--server", fake.info["server"],
                            "--certificate-authority", fake.info["ca_file"],
                            "task", "list"])
        t.ok(rc == 1 and err == "diverge: Unauthorized\n",
             "--server without a token: 401, exit 1", (rc, err))
        rc, out, err = run(["--server", fake.info["server"], "task",
                            "list"])
        t.ok(rc == 1 and err.startswith("diverge: cannot reach the API at "
                                        + fake.info["server"]) and
             "certificate" in err.lower(),
             "--server https without its CA: the certificate is refused",
             (rc, err))

        # logs: the sandbox pod's, through pods/log
        fake.control("DELETE", "/_fake/requests")
        rc, out, err = cli("task", "logs", "fix-checkout-latency")
        reqs = [r["path"] + ("?" + r["query"] if r["query"] else "")
                for r in fake.control("GET", "/_fake/requests")]
        t.ok(rc == 1 and out == "" and "could not find" in err and
             "/api/v1/namespaces/default/pods/fix-checkout-latency/log"
             in reqs,
             "kubernetes: task logs asks pods/log for the sandbox's pod "
             "(the fake has no pods: its 404, exit 1)", (rc, err, reqs))
        rc, out, err = cli("task", "logs", "from-token")
        t.ok(rc == 1 and "no sandbox yet" in err,
             "kubernetes: task logs of a task without a sandbox: exit 1",
             (rc, err))
        rc, out, err = run(["--kubeconfig", kc, "--server",
                            "http://127.0.0.1:%d" %
                            logsrv.server_address[1], "task", "logs",
                            "runner", "-f"])
        t.ok(rc == 0 and out == "cloning\niteration 1: tests fail\n"
             "iteration 2: tests pass\n" and
             "/api/v1/namespaces/default/pods/runner-pod/log?follow=true"
             in LogServer.seen,
             "kubernetes: task logs -f streams the pod named by the "
             "Sandbox", (rc, out, err, LogServer.seen))
    finally:
        proxy.stdin.close()     # the proxy exits at end of input
        proxy.wait()
        proxy.stdout.close()
        logsrv.shutdown()
        logsrv.server_close()
        fake.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def lost_answers(t, cli, api, fake):
    """A write the API did but whose answer was lost is not done again:
    a bump is made once, a create makes one task."""
    name = "lost-bump"
    rc, out, err = cli("task", "create", "Bump me once", "--name", name,
                       "--budget", "5")
    before = api.task(name)["spec"]["budgetUSD"]
    fake.control("DELETE", "/_fake/requests")
    fake.control("POST", "/_fake/faults", {
        "status": 504, "after": True, "method": "PATCH",
        "match": "/agenttasks/" + name})
    rc, out, err = cli("task", "budget", name, "--budget", "5")
    after = api.task(name)["spec"]["budgetUSD"]
    patches = [r for r in fake.control("GET", "/_fake/requests")
               if r["method"] == "PATCH"]
    t.ok(rc == 1 and "may have been made" in err and len(patches) == 1 and
         float(after) == float(before) + 5,
         "kubernetes: a bump applied but answered 504: not sent again, "
         "made once, exit 1 saying it may have been made",
         (rc, err, before, after, len(patches)))

    def tasks_with(objective):
        s, lst = api.request("GET", TASKS % "default")
        return [i["metadata"]["name"] for i in lst["items"]
                if i["spec"]["objective"] == objective]

    fake.control("POST", "/_fake/faults", {
        "status": 503, "after": True, "method": "POST",
        "match": "/agenttasks"})
    rc, out, err = cli("task", "create", "Lost answer one")
    made = tasks_with("Lost answer one")
    t.ok(rc == 1 and out == "" and "may have been made" in err and
         len(made) == 1,
         "kubernetes: a create done but answered 503: not sent again, one "
         "task, exit 1", (rc, out, err, made))
    fake.control("POST", "/_fake/faults", {
        "status": 503, "retry_after": 1, "after": True, "method": "POST",
        "match": "/agenttasks"})
    rc, out, err = cli("task", "create", "Lost answer two")
    made = tasks_with("Lost answer two")
    t.ok(rc == 1 and out == "" and len(made) == 1 and
         ('task "%s" exists, but this create cannot tell' % made[0]) in err,
         "kubernetes: a create done, answered 503 with Retry-After, sent "
         "again: AlreadyExists is not taken for a name clash (no second "
         "task under a new name), exit 1 naming the task",
         (rc, out, err, made))
    for n in [name] + made + tasks_with("Lost answer one"):
        api.delete(n)


def main(t):
    if not os.access(DIVERGE, os.X_OK):
        t.skip_all("diverge is not built")
    token_inspect(t)
    usage(t)
    server_down(t)
    embedded(t)
    items = store(t)
    kubernetes(t, items)


if __name__ == "__main__":
    try:
        run_tests(main)
    finally:
        shutil.rmtree(NOWHERE, ignore_errors=True)
