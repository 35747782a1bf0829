"""Shared helpers for the integration tests: a TAP writer, a running
diverged on an OS-chosen loopback port, signed webhook deliveries and raw
HTTP. Only loopback addresses are ever contacted."""

import atexit
import base64
import hashlib
import hmac
import http.client
import json
import math
import os
import re
import select
import shutil
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

TOP_SRCDIR = os.environ.get("top_srcdir") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
TOP_BUILDDIR = os.environ.get("top_builddir") or TOP_SRCDIR
DIVERGED = os.path.join(TOP_BUILDDIR, "diverged")
DATA = os.path.join(TOP_SRCDIR, "tests", "data")
FAKE_KUBE = os.path.join(TOP_SRCDIR, "tests", "fakes", "kube_apiserver.py")

# Every temporary file and directory of a test program (its own, its
# daemons' and its fakes') goes under one directory, removed when the
# program exits (kept with DIVERGE_KEEP_TMP set): state databases reach
# megabytes each, and a suite run must not leave them behind.
_TMP = tempfile.mkdtemp(prefix="diverge-test-")
tempfile.tempdir = _TMP
os.environ["TMPDIR"] = _TMP


def _remove_tmp(pid=os.getpid()):
    if os.getpid() == pid and not os.environ.get("DIVERGE_KEEP_TMP"):
        shutil.rmtree(_TMP, ignore_errors=True)


atexit.register(_remove_tmp)


class FakeKube:
    """tests/fakes/kube_apiserver.py on a loopback port: HTTPS with a test
    CA, bearer token s3cret (or token). info: server, port, ca_file,
    token. With rbac (a list of YAML files of RBAC objects), that token is the service
    account diverge-system/diverged and may do only what they grant, while
    the test's own requests (request()) use an unrestricted admin token."""

    ADMIN = "admin-s3cret"

    def __init__(self, rbac=None, token="s3cret"):
        argv = [sys.executable, FAKE_KUBE, "--port", "0", "--token", token]
        for path in rbac or []:
            argv += ["--rbac", path]
        if rbac:
            argv += ["--admin-token", self.ADMIN]
        self.own_token = self.ADMIN if rbac else token
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        r, _, _ = select.select([self.proc.stdout], [], [], 20)
        if not r:
            raise RuntimeError("the fake kube-apiserver did not start")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fake kube-apiserver did not start")
        self.info = json.loads(line)

    def request(self, method, path, body=None, ctype="application/json",
                token=None):
        """One API call with the test's token (or token): (status, parsed
        body)."""
        c = http.client.HTTPSConnection(
            "127.0.0.1", self.info["port"], timeout=10,
            context=ssl.create_default_context(cafile=self.info["ca_file"]))
        h = {"Content-Type": ctype, "Accept": "application/json",
             "Authorization": "Bearer " + (token or self.own_token)}
        try:
            c.request(method, path, body=json.dumps(body)
                      if body is not None else None, headers=h)
            r = c.getresponse()
            data = r.read()
            return r.status, json.loads(data) if data else None
        finally:
            c.close()

    def control(self, method, path, body=None):
        """A /_fake control call (faults, delays, requests), body as JSON."""
        c = http.client.HTTPSConnection(
            "127.0.0.1", self.info["port"], timeout=10,
            context=ssl.create_default_context(cafile=self.info["ca_file"]))
        try:
            c.request(method, path, body=json.dumps(body)
                      if body is not None else None)
            r = c.getresponse()
            data = r.read()
            return json.loads(data) if data else None
        finally:
            c.close()

    def stop(self):
        self.proc.stdin.close()     # the fake exits at end of input
        reap(self.proc)

    def kubeconfig(self, path, user, ns="default"):
        """Write a kubeconfig (JSON is YAML) for this server to path: one
        context, namespace ns, whose user is the kubeconfig user given."""
        with open(path, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Config",
                       "current-context": "main",
                       "contexts": [{"name": "main", "context": {
                           "cluster": "fake", "user": "me",
                           "namespace": ns}}],
                       "clusters": [{"name": "fake", "cluster": {
                           "server": self.info["server"],
                           "certificate-authority": self.info["ca_file"]}}],
                       "users": [{"name": "me", "user": user}]}, f)

    def exec_user(self, d, prelude=""):
        """A kubeconfig user whose token comes from an exec credential
        plugin, d.tmp/get-token (written here): the shell lines prelude,
        then an ExecCredential with this server's token."""
        plugin = os.path.join(d.tmp, "get-token")
        with open(plugin, "w") as f:
            f.write("#!/bin/sh\n%sprintf '%%s' '%s'\n" % (prelude, json.dumps({
                "apiVersion": "client.authentication.k8s.io/v1",
                "kind": "ExecCredential",
                "status": {"token": self.info["token"]}})))
        os.chmod(plugin, 0o700)
        return {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                         "command": "./get-token",
                         "interactiveMode": "Never"}}


class ScmFake:
    """tests/fakes/scm_fake.py (GitHub and GitLab) on a loopback port:
    info is its start-up line (github and gitlab: the api_url values),
    base its address; call() reaches its API and /_fake control."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(TOP_SRCDIR, "tests", "fakes",
                                          "scm_fake.py"), "--port", "0"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL)
        self.info = info = json.loads(self.proc.stdout.readline())
        self.port = info["port"]
        self.base = "http://127.0.0.1:%d" % self.port

    def call(self, method, path, body=None):
        req = urllib.request.Request(
            self.base + path, method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read() or b"null")

    def state(self):
        return self.call("GET", "/_fake/state")

    def requests(self):
        return self.call("GET", "/_fake/requests")

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(10)


def reap(proc, timeout=10):
    """Wait for a child that was asked to stop; kill it if it does not."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


class Tap:
    """Minimal TAP producer; the plan is printed at the end."""

    def __init__(self):
        self.n = 0
        self.failed = 0

    def ok(self, cond, name, detail=None):
        self.n += 1
        if not cond:
            self.failed += 1
            print("not ok %d - %s" % (self.n, name))
            if detail is not None:
                for line in str(detail).splitlines()[:40]:
                    print("# " + line)
        else:
            print("ok %d - %s" % (self.n, name))
        sys.stdout.flush()
        return cond

    def skip(self, name):
        self.n += 1
        print("ok %d - %s # SKIP" % (self.n, name))

    def eq(self, got, want, name):
        return self.ok(got == want, name, "got %r, want %r" % (got, want))

    def skip_all(self, why):
        print("1..0 # SKIP %s" % why)
        sys.exit(0)

    def done(self):
        print("1..%d" % self.n)
        sys.exit(1 if self.failed else 0)


def run_tests(fn):
    """Run fn(tap) and make an exception a failed test, not a crash."""
    tap = Tap()
    try:
        fn(tap)
    except Exception:  # noqa: BLE001 - report anything as a failure
        tap.ok(False, "unexpected exception", traceback.format_exc())
        for d in Daemon.running:
            print("# --- diverged (exit %s), last lines:" %
                  (d.proc.poll() if d.proc else "-"))
            for line in d.log()[-40:]:
                print("#   " + line)
    finally:
        Daemon.kill_all()
    tap.done()


def npm_install(t, prefix, packages, timeout=300):
    """npm install packages (name@version) into prefix, or skip the whole
    test with npm's own reason: its error code and what failed (a proxy's
    certificate, no route to the registry, a version that does not
    exist), not a silent "?"."""
    npm = os.environ.get("NPM") or shutil.which("npm")
    if not npm:
        t.skip_all("npm is not installed")
    os.makedirs(prefix, exist_ok=True)
    what = " ".join(packages)
    try:
        p = subprocess.run([npm, "install", "--prefix", prefix, "--no-audit",
                            "--no-fund", "--loglevel=error"] + list(packages),
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        t.skip_all("cannot install %s: npm did not finish in %d s"
                   % (what, timeout))
    if p.returncode != 0:
        t.skip_all("cannot install %s: %s" % (what, npm_error(p)))


def npm_error(p):
    """The reason in a failed npm run's output (npm 9 writes "npm ERR!",
    npm 10 and later "npm error"): its code and the line that says what
    failed, else its last line."""
    lines = [ln.strip() for ln in (p.stderr + "\n" + p.stdout).splitlines()
             if ln.strip()]
    said = [ln.split(" ", 2)[2] for ln in lines
            if ln.startswith(("npm ERR! ", "npm error ")) and
            len(ln.split(" ", 2)) == 3]
    code = next((ln[5:] for ln in said if ln.startswith("code ")), None)
    told = [ln for ln in said if not ln.startswith(
        ("code ", "errno ", "syscall ", "A complete log", "/", "at ", "{",
         "}", "If you are behind"))]
    why = next((ln for ln in told if "reason:" in ln),
               told[0] if told else None)
    out = ": ".join(x for x in (code, why) if x)
    return out or (lines[-1] if lines else "npm exited %d" % p.returncode)


def sign(secret, body):
    if isinstance(secret, str):
        secret = secret.encode()
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def fixture(rel):
    with open(os.path.join(DATA, "webhooks", rel), "rb") as f:
        return json.load(f)


def with_comment(doc, body):
    doc = json.loads(json.dumps(doc))
    if "comment" in doc:
        doc["comment"]["body"] = body
    else:
        doc["object_attributes"]["note"] = body
    return doc


def compact(doc):
    return json.dumps(doc, separators=(",", ":")).encode()


def api_call(port, method, path, body=None, ctype="application/json"):
    """(status, JSON body) of a call to the embedded store API on port."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request(method, path, body=json.dumps(body) if body is not None
                  else None, headers={"Content-Type": ctype})
        r = c.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        c.close()


def wait(pred, timeout=15):
    """pred()'s first true value within timeout seconds, else its last."""
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    return pred()


def api(d, method, path, body=None, ctype="application/json"):
    """api_call on daemon d's embedded store API."""
    return api_call(d.api_port, method, path, body, ctype)


def task_token(d, name, ns="default", timeout=15):
    """(token, task) once the reconciler has issued task name's token
    (status.tokenId and Secret <name>-token); (None, last task read)."""
    task = {}
    end = time.time() + timeout
    while time.time() < end:
        s, task = api(d, "GET", "/apis/divergedev.com/v1alpha1/namespaces/"
                      "%s/agenttasks/%s" % (ns, name))
        if s == 200 and task.get("status", {}).get("tokenId"):
            s, sec = api(d, "GET", "/api/v1/namespaces/%s/secrets/"
                         "%s-token" % (ns, name))
            if s == 200:
                return base64.b64decode(sec["data"]["token"]).decode(), task
        time.sleep(0.05)
    return None, task or {}


def meter(d, token, body, path="/api/v1/agenttask/meter"):
    """POST body to the meter (or path) with token; (status, headers,
    JSON)."""
    h = {"Content-Type": "application/json"}
    if token:
        h["Authorization"] = "Bearer " + token
    return d.json("POST", path, json.dumps(body), h)


# ---- Prometheus text ----

PROM_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
PROM_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
PROM_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


def prom_value(s):
    """A sample value as the format writes it (Go's ParseFloat), or
    None."""
    if s in ("+Inf", "Inf"):
        return math.inf
    if s == "-Inf":
        return -math.inf
    if s == "NaN":
        return math.nan
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", s):
        return None
    return float(s)


def prom_labels(s, errs, where):
    """The label set in s (between the braces), unescaped: [(name,
    value)]; faults go to errs."""
    out = []
    i = 0
    while i < len(s):
        m = re.match(r"\s*([^=\s]*)\s*=\s*\"", s[i:])
        if not m:
            errs.append("%s: a label is not name=\"value\"" % where)
            return out
        name = m.group(1)
        if not PROM_LABEL.match(name) or name.startswith("__"):
            errs.append("%s: bad label name %r" % (where, name))
        i += m.end()
        val = []
        while True:
            if i >= len(s):
                errs.append("%s: label %s: no closing quote" % (where, name))
                return out
            c = s[i]
            if c == "\\":
                nxt = s[i + 1] if i + 1 < len(s) else ""
                if nxt not in ("\\", "\"", "n"):
                    errs.append("%s: label %s: bad escape \\%s"
                                % (where, name, nxt))
                val.append("\n" if nxt == "n" else nxt)
                i += 2
                continue
            if c == "\"":
                i += 1
                break
            if c == "\n":
                errs.append("%s: label %s: a raw newline" % (where, name))
            val.append(c)
            i += 1
        out.append((name, "".join(val)))
        m = re.match(r"\s*(,|$)", s[i:])
        if not m:
            errs.append("%s: label %s: junk after its value" % (where, name))
            return out
        i += m.end()
    return out


def prom_family(sample, types):
    """The family a sample name belongs to, given the TYPEs seen."""
    for suffix in ("_bucket", "_sum", "_count"):
        base = sample[:-len(suffix)]
        if sample.endswith(suffix) and types.get(base) in ("histogram",
                                                            "summary"):
            return base
    return sample


def prom_check(text):
    """The faults of a /metrics text as the Prometheus text format 0.0.4
    has them (test_metrics_format.py): a list of strings, empty when it
    is valid; and its samples {(name, ((label, value), ...)): value}."""
    errs = []
    if text and not text.endswith("\n"):
        errs.append("the last line does not end with a newline")
    types, helps, samples = {}, {}, {}
    seen_samples = set()   # families that had a sample
    done = set()           # families whose block has ended
    current = None
    hist = {}              # (family, labels sans le) -> {...}
    for n, line in enumerate(text.split("\n"), 1):
        where = "line %d" % n
        if line.strip() == "":
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 2 and parts[1] in ("HELP", "TYPE"):
                if len(parts) < 3 or not PROM_NAME.match(parts[2]):
                    errs.append("%s: %s without a valid name" %
                                (where, parts[1]))
                    continue
                fam = parts[2]
                if fam in seen_samples:
                    errs.append("%s: %s %s after its samples" %
                                (where, parts[1], fam))
                if fam in done:
                    errs.append("%s: family %s split in two blocks" %
                                (where, fam))
                if current is not None and current != fam:
                    done.add(current)
                current = fam
                if parts[1] == "HELP":
                    if fam in helps:
                        errs.append("%s: a second HELP for %s" %
                                    (where, fam))
                    helps[fam] = parts[3] if len(parts) > 3 else ""
                    if re.search(r"\\[^\\n]|\\$", helps[fam]):
                        errs.append("%s: HELP %s: bad escape" % (where, fam))
                else:
                    if fam in types:
                        errs.append("%s: a second TYPE for %s" %
                                    (where, fam))
                    t = parts[3] if len(parts) > 3 else ""
                    if t not in PROM_TYPES:
                        errs.append("%s: TYPE %s: unknown type %r" %
                                    (where, fam, t))
                    types[fam] = t
            continue
        m = re.match(r"([^{\s]+)(\{(.*)\})?\s+(\S+)(\s+(-?\d+))?\s*$", line)
        if not m:
            errs.append("%s: not a sample line: %r" % (where, line))
            continue
        name, labels_text, value_text = m.group(1), m.group(3), m.group(4)
        if not PROM_NAME.match(name):
            errs.append("%s: bad metric name %r" % (where, name))
            continue
        labels = prom_labels(labels_text or "", errs, where)
        names = [k for k, _ in labels]
        if len(set(names)) != len(names):
            errs.append("%s: a label twice" % where)
        value = prom_value(value_text)
        if value is None:
            errs.append("%s: %r is not a number" % (where, value_text))
            continue
        fam = prom_family(name, types)
        if fam in done:
            errs.append("%s: family %s split in two blocks" % (where, fam))
        if current is not None and current != fam:
            done.add(current)
        current = fam
        seen_samples.add(fam)
        key = (name, tuple(sorted(labels)))
        if key in samples:
            errs.append("%s: series %s%s twice" % (where, name, labels))
        samples[key] = value
        kind = types.get(fam, "untyped")
        if kind == "counter" and not value >= 0:
            errs.append("%s: counter %s is %s" % (where, name, value_text))
        if kind == "histogram":
            rest = tuple(sorted((k, v) for k, v in labels if k != "le"))
            h = hist.setdefault((fam, rest), {"le": [], "sum": None,
                                              "count": None})
            if name == fam + "_bucket":
                le = dict(labels).get("le")
                bound = prom_value(le) if le is not None else None
                if bound is None:
                    errs.append("%s: %s without a numeric le" %
                                (where, name))
                else:
                    h["le"].append((bound, value, n))
            elif name == fam + "_sum":
                h["sum"] = value
            elif name == fam + "_count":
                h["count"] = value
            else:
                errs.append("%s: %s in histogram %s" % (where, name, fam))
    for (fam, rest), h in hist.items():
        what = "histogram %s%s" % (fam, dict(rest) or "")
        bounds = [b for b, _, _ in h["le"]]
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):
            errs.append("%s: le bounds not strictly ascending" % what)
        counts = [c for _, c, _ in h["le"]]
        if any(b < a for a, b in zip(counts, counts[1:])):
            errs.append("%s: buckets not cumulative: %s" % (what, counts))
        if not bounds or bounds[-1] != math.inf:
            errs.append("%s: no +Inf bucket last" % what)
        elif h["count"] is None or counts[-1] != h["count"]:
            errs.append("%s: +Inf bucket %s, _count %s" %
                        (what, counts[-1], h["count"]))
        if h["sum"] is None:
            errs.append("%s: no _sum" % what)
    return errs, samples


def scm_daemon(fake, extra=""):
    """A Daemon (not started) with both providers enabled against the fake
    SCM APIs of fake (a ScmFake), with webhook secrets and API tokens;
    extra: more configuration."""
    d = Daemon("""
github:
  enabled: true
  api_url: %s
  webhook_secrets: ["file:{secret_file}"]
  token: "file:{tmp}/gh-token"
gitlab:
  enabled: true
  api_url: %s
  webhook_tokens: ["file:{gitlab_token_file}"]
  token: "file:{tmp}/gl-token"
""" % (fake.info["github"], fake.info["gitlab"]) + extra)
    for name in ("gh-token", "gl-token"):
        with open(os.path.join(d.tmp, name), "w") as f:
            f.write("not-a-real-token\n")
    return d


class Daemon:
    """A diverged process with its own state dir and config file."""

    running = []

    def __init__(self, config="", env=None, args=None, state_dir=None,
                 secret="test-secret", cwd=None):
        self.tmp = tempfile.mkdtemp(prefix="diverge-it-")
        self.state_dir = state_dir or os.path.join(self.tmp, "state")
        self.secret = secret
        self.secret_file = os.path.join(self.tmp, "github-secret")
        with open(self.secret_file, "w") as f:
            f.write(secret + "\n")
        self.gitlab_token_file = os.path.join(self.tmp, "gitlab-token")
        with open(self.gitlab_token_file, "w") as f:
            f.write("gl-token\n")
        self.config_file = None
        if config is not None:
            self.config_file = os.path.join(self.tmp, "diverged.yaml")
            text = config.format(secret_file=self.secret_file,
                                 gitlab_token_file=self.gitlab_token_file,
                                 tmp=self.tmp)
            with open(self.config_file, "w") as f:
                f.write(text)
        self.env = dict(os.environ)
        if env:
            self.env.update(env)
        self.args = args
        self.cwd = cwd
        self.proc = None
        self.port = None
        self.api_port = None
        self.lines = []
        self.lock = threading.Lock()

    def command(self):
        cmd = [DIVERGED]
        if self.config_file:
            cmd += ["--config", self.config_file]
        if self.args is not None:
            cmd += self.args
        else:
            cmd += ["--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0",
                    "--state-dir", self.state_dir]
        return cmd

    def _reader(self, stream):
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self.lock:
                self.lines.append(line)
        stream.close()

    def start(self, wait=True, timeout=15):
        self.lines = []
        self.port = None
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=self.env,
                                     cwd=self.cwd)
        Daemon.running.append(self)
        for s in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._reader, args=(s,),
                             daemon=True).start()
        if not wait:
            return self
        return self.wait_started(timeout)

    def wait_started(self, timeout=15):
        """Wait for the start line of a process start(wait=False) ran, and
        take its ports."""
        end = time.time() + timeout
        while time.time() < end:
            with self.lock:
                for line in self.lines:
                    if "diverged started" in line:
                        for part in line.split():
                            if part.startswith("port="):
                                self.port = int(part[5:])
                            if part.startswith("api_port="):
                                self.api_port = int(part[9:])
                        if '"port":"' in line:
                            j = json.loads(line)
                            self.port = int(j["port"])
                            self.api_port = int(j.get("api_port", 0))
            if self.port:
                return self
            if self.proc.poll() is not None:
                raise RuntimeError("diverged exited with %d:\n%s" % (
                    self.proc.returncode, "\n".join(self.lines[-20:])))
            time.sleep(0.02)
        raise RuntimeError("diverged did not start:\n" +
                           "\n".join(self.lines[-20:]))

    def log(self):
        with self.lock:
            return list(self.lines)

    def wait_log(self, text, timeout=10):
        end = time.time() + timeout
        while time.time() < end:
            if any(text in l for l in self.log()):
                return True
            time.sleep(0.05)
        return False

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            print("# diverged did not stop within %d s" % timeout)
        if rc != 0 and sig in (signal.SIGTERM, signal.SIGINT):
            self.show_tail("diverged exited %d on a stop" % rc)
        return rc

    def show_tail(self, why, n=60):
        """Print why and the daemon's last n lines (a sanitizer's report
        among them) as TAP comments, so that a failed run says why."""
        time.sleep(0.2)     # let the readers take the last lines
        print("# " + why)
        for line in self.log()[-n:]:
            print("#   " + line)
        sys.stdout.flush()

    def kill9(self):
        self.proc.kill()
        self.proc.wait()

    @classmethod
    def kill_all(cls):
        for d in cls.running:
            if d.proc is not None and d.proc.poll() is None:
                d.proc.kill()
                d.proc.wait()

    # ---- HTTP ----
    def request(self, method, path, body=None, headers=None, timeout=10):
        c = http.client.HTTPConnection("127.0.0.1", self.port,
                                       timeout=timeout)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            data = r.read()
            return r.status, dict((k.lower(), v) for k, v in
                                  r.getheaders()), data
        finally:
            c.close()

    def json(self, method, path, body=None, headers=None):
        status, hdrs, data = self.request(method, path, body, headers)
        try:
            doc = json.loads(data) if data else None
        except ValueError:
            doc = None
        return status, hdrs, doc

    def github(self, event, doc_or_bytes, delivery, secret=None,
               content_type="application/json", extra=None):
        body = doc_or_bytes if isinstance(doc_or_bytes, bytes) else \
            compact(doc_or_bytes)
        h = {"Content-Type": content_type, "X-GitHub-Event": event,
             "X-GitHub-Delivery": delivery,
             "X-Hub-Signature-256": sign(secret or self.secret, body),
             "User-Agent": "GitHub-Hookshot/test"}
        if extra:
            h.update(extra)
        return self.json("POST", "/webhooks/github", body, h)

    def gitlab(self, event, doc, delivery, token="gl-token", extra=None):
        body = doc if isinstance(doc, bytes) else compact(doc)
        h = {"Content-Type": "application/json", "X-Gitlab-Event": event,
             "X-Gitlab-Token": token, "Idempotency-Key": delivery,
             "User-Agent": "GitLab/18.0.0"}
        if token is None:
            del h["X-Gitlab-Token"]
        if delivery is None:    # GitLab before 17.4
            del h["Idempotency-Key"]
        if extra:
            h.update(extra)
        return self.json("POST", "/webhooks/gitlab", body, h)

    def raw(self, data, timeout=5):
        """Send raw bytes, return what comes back (until close/timeout)."""
        s = socket.create_connection(("127.0.0.1", self.port),
                                     timeout=timeout)
        out = b""
        try:
            s.sendall(data)
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except (socket.timeout, ConnectionResetError, BrokenPipeError):
            pass
        finally:
            s.close()
        return out

    # ---- state ----
    def db(self):
        return os.path.join(self.state_dir, "diverge.db")

    def shard_dbs(self):
        """The inbox shards: the state database and inbox-N.db."""
        return [self.db()] + [os.path.join(self.state_dir, "inbox-%d.db" % i)
                              for i in range(1, 4)]

    def query(self, sql, args=()):
        """Run sql on every inbox shard; the rows of all, concatenated."""
        rows = []
        for path in self.shard_dbs():
            if not os.path.exists(path):
                continue
            con = sqlite3.connect(path, timeout=10)
            try:
                rows += con.execute(sql, args).fetchall()
            finally:
                con.close()
        return rows

    def count(self, table, where="1"):
        return sum(r[0] for r in self.query(
            "SELECT COUNT(*) FROM %s WHERE %s" % (table, where)))

    def wait_handled(self, keys, timeout=30):
        keys = set(keys)
        end = time.time() + timeout
        got = {}
        while time.time() < end:
            got = dict(self.query("SELECT key, count FROM handled_events"))
            if keys <= set(got):
                return got
            time.sleep(0.1)
        return got

    def metrics(self):
        status, _, data = self.request("GET", "/metrics")
        return data.decode()


GITHUB_CONFIG = """
log: {{level: debug}}
github:
  enabled: true
  webhook_secrets: ["file:{secret_file}"]
gitlab:
  enabled: true
  webhook_tokens: ["file:{gitlab_token_file}"]
"""
