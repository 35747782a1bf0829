"""The real kubectl against the embedded store served as a Kubernetes API
(src/k8s/apiserver.c): discovery, OpenAPI-backed apply of the spec's
example, get in table and JSON form, merge, JSON and status patches, edit,
get -w, errors as Status, Secrets, delete. Also checks that the schema the
server publishes is the one of deploy/crds/.

The server is diverged with --api-listen when it has that flag, otherwise
tests/tools/apiserve ($DIVERGE_APISERVE overrides). kubectl is isolated
from the user's configuration (--kubeconfig=/dev/null, its own cache)."""

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

from divtest import DATA, DIVERGED, TOP_BUILDDIR, TOP_SRCDIR, run_tests, wait

EXAMPLE = os.path.join(DATA, "examples", "agenttask.yaml")
CRDS = os.path.join(TOP_SRCDIR, "deploy", "crds")
NAME = "fix-checkout-latency"


class ApiServer:
    """diverged --api-listen, or tests/tools/apiserve, on a free port;
    with tls = (cert, key, token file) it serves HTTPS and wants the
    token."""

    def __init__(self, listen="127.0.0.1:0", tls=None):
        self.tmp = tempfile.mkdtemp(prefix="diverge-api-")
        self.listen = listen
        self.tls = tls
        self.proc = None
        self.port = None
        self.lines = []
        self.how = None

    def _reader(self, stream):
        for raw in iter(stream.readline, b""):
            self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
        stream.close()

    def _spawn(self, cmd, pattern, timeout=15):
        self.lines = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        for s in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._reader, args=(s,),
                             daemon=True).start()
        end = time.time() + timeout
        while time.time() < end:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    self.port = int(m.group(1))
                    return True
            if self.proc.poll() is not None:
                time.sleep(0.1)
                return False
            time.sleep(0.02)
        self.stop()
        return False

    def _diverged(self):
        cmd = [DIVERGED, "--listen", "127.0.0.1:0", "--api-listen",
               self.listen, "--state-dir", os.path.join(self.tmp, "state")]
        cfg = os.path.join(self.tmp, "diverged.yaml")
        # the API's semantics, with nobody else writing the objects:
        # the reconciler would rewrite the status these tests patch
        text = "controller: {enabled: false}\n"
        if self.tls:
            text += ("api:\n  tls_cert: %s\n  tls_key: %s\n"
                     "  token: \"file:%s\"\n" % self.tls)
        with open(cfg, "w") as f:
            f.write(text)
        return cmd + ["--config", cfg]

    def start(self):
        """self, or None when no server program is available; raises
        when one fails to start (its output is in self.lines)."""
        apiserve = os.environ.get("DIVERGE_APISERVE") or os.path.join(
            TOP_BUILDDIR, "tests", "tools", "apiserve")
        if not os.environ.get("DIVERGE_APISERVE") and os.access(
                DIVERGED, os.X_OK):
            if self._spawn(self._diverged(), r'api_port(?:=|":")(\d+)'):
                self.how = "diverged"
                return self
            self.stop()
            if any("api" in l for l in self.lines) and not any(
                    "unrecognized option" in l or "invalid option" in l
                    for l in self.lines):
                raise RuntimeError("diverged did not start:\n" +
                                   "\n".join(self.lines[-20:]))
        if os.access(apiserve, os.X_OK):
            cmd = [apiserve, os.path.join(self.tmp, "store.db"),
                   self.listen]
            if self.tls:
                with open(self.tls[2]) as f:
                    cmd += [self.tls[0], self.tls[1], f.read().strip()]
            if self._spawn(cmd, r"^port=(\d+)$"):
                self.how = "apiserve"
                return self
            raise RuntimeError("apiserve did not start:\n" +
                               "\n".join(self.lines[-20:]))
        return None

    @property
    def url(self):
        return "%s://127.0.0.1:%d" % ("https" if self.tls else "http",
                                      self.port)

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.loads(r.read())

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def load_yaml(path):
    try:
        import yaml
    except ImportError:
        return None
    with open(path) as f:
        return yaml.safe_load(f)


class Kubectl:
    def __init__(self, exe, server, kubeconfig=None):
        self.exe = exe
        self.server = server
        self.kubeconfig = kubeconfig
        self.home = os.path.join(server.tmp, "home")
        os.makedirs(self.home, exist_ok=True)
        self.env = dict(os.environ)
        self.env.pop("KUBECONFIG", None)
        self.env["HOME"] = self.home

    def argv(self, args, request_timeout="20s"):
        where = ["--kubeconfig", self.kubeconfig] if self.kubeconfig else \
            ["--server", self.server.url, "--kubeconfig", os.devnull]
        return [self.exe] + where + [
            "--cache-dir", os.path.join(self.home, "cache"),
            "--request-timeout", request_timeout] + list(args)

    def run(self, *args, stdin=None, env=None, timeout=60):
        e = dict(self.env)
        if env:
            e.update(env)
        p = subprocess.run(self.argv(args), input=stdin, capture_output=True,
                           text=True, env=e, timeout=timeout)
        return p.returncode, p.stdout, p.stderr

    def json(self, *args):
        rc, out, err = self.run(*(list(args) + ["-o", "json"]))
        if rc != 0:
            raise RuntimeError("kubectl %s: %s" % (" ".join(args), err))
        return json.loads(out)

    def background(self, *args):
        """Start kubectl; returns (proc, lines) filled by a thread. Its
        request timeout is 10 minutes, not 20 s: for a watch it is the
        watch's timeoutSeconds, and the server would end the watch (and
        kubectl get -w with it) while a loaded machine runs the steps
        the watch must see."""
        p = subprocess.Popen(self.argv(args, "10m"), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True,
                             env=self.env)
        lines = []

        def read():
            for line in p.stdout:
                lines.append(line.rstrip("\n"))
        threading.Thread(target=read, daemon=True).start()
        return p, lines


def table(out):
    """kubectl's table output as (header, rows) of split columns."""
    lines = [l for l in out.splitlines() if l.strip()]
    if not lines:
        return [], []
    return lines[0].split(), [l.split() for l in lines[1:]]


def discovery(t, k, srv):
    rc, out, err = k.run("version")
    t.ok(rc == 0 and "Server Version: v1.32" in out and
         "WARNING" not in err, "kubectl version sees the server",
         out + err)
    rc, out, err = k.run("api-resources")
    rows = [l.split() for l in out.splitlines()]
    t.ok(rc == 0 and ["agenttasks", "at", "divergedev.com/v1alpha1",
                      "true", "AgentTask"] in rows,
         "api-resources lists agenttasks with short name at", out + err)
    t.ok(["environments", "env", "divergedev.com/v1alpha1", "true",
          "Environment"] in rows and
         any(r[:1] == ["secrets"] for r in rows) and
         any(r[:1] == ["sandboxes"] for r in rows) and
         any(r[:1] == ["sandboxclaims"] for r in rows) and
         any(r[:1] == ["networkpolicies"] for r in rows),
         "api-resources lists every stored kind", out)
    doc = srv.get("/apis")
    t.eq(sorted(g["name"] for g in doc["groups"]),
         ["agents.x-k8s.io", "divergedev.com", "extensions.agents.x-k8s.io",
          "networking.k8s.io"], "/apis lists the four groups")


def crd_schemas(t, srv):
    """The served OpenAPI schema is the CRD's openAPIV3Schema."""
    index = srv.get("/openapi/v3")
    ref = index["paths"]["apis/divergedev.com/v1alpha1"]["serverRelativeURL"]
    doc = srv.get(ref)
    patches = [op["patch"] for op in doc["paths"].values() if "patch" in op]
    t.ok(patches and all(
        list(p["requestBody"]["content"]) == ["application/merge-patch+json"]
        and any(q["name"] == "fieldValidation" for q in p["parameters"])
        for p in patches), "openapi v3: patch ops take merge patches and "
        "fieldValidation")
    for fname, kind in (("divergedev.com_agenttasks.yaml", "AgentTask"),
                        ("divergedev.com_environments.yaml", "Environment")):
        crd = load_yaml(os.path.join(CRDS, fname))
        if crd is None:
            t.skip("CRD %s matches the served schema (no pyyaml)" % kind)
            continue
        v = crd["spec"]["versions"][0]
        served = dict(doc["components"]["schemas"][
            "com.divergedev.v1alpha1." + kind])
        gvk = served.pop("x-kubernetes-group-version-kind")
        t.ok(served == v["schema"]["openAPIV3Schema"] and gvk == [
            {"group": "divergedev.com", "version": "v1alpha1",
             "kind": kind}],
             "deploy/crds/%s is the schema the server publishes" % fname)
        t.ok(crd["apiVersion"] == "apiextensions.k8s.io/v1" and
             v["subresources"] == {"status": {}} and
             crd["spec"]["names"]["categories"] == ["diverge"],
             "CRD %s: v1, status subresource, category" % kind)
    crd = load_yaml(os.path.join(CRDS, "divergedev.com_agenttasks.yaml"))
    if crd is not None:
        cols = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        t.eq([(c["name"], c["jsonPath"]) for c in cols],
             [("Phase", ".status.phase"), ("Cost", ".status.costUSD"),
              ("Tokens", ".status.tokensConsumed"),
              ("Iteration", ".status.iteration"),
              ("Age", ".metadata.creationTimestamp")],
             "AgentTask printer columns")
        t.eq(crd["spec"]["names"]["shortNames"], ["at"], "short name at")


def apply_and_get(t, k):
    rc, out, err = k.run("apply", "-f", EXAMPLE)
    t.ok(rc == 0 and "agenttask.divergedev.com/%s created" % NAME in out,
         "apply the spec's example unchanged (validation on)", out + err)
    rc, out, err = k.run("apply", "-f", EXAMPLE)
    t.ok(rc == 0 and "%s unchanged" % NAME in out, "apply again: unchanged",
         out + err)

    rc, out, err = k.run("get", "at")
    head, rows = table(out)
    t.ok(rc == 0 and head[:1] == ["NAME"] and "AGE" in head and
         any(r[0] == NAME for r in rows), "get at: a table with NAME and "
         "AGE", out + err)
    t.eq(head, ["NAME", "PHASE", "COST", "TOKENS", "ITERATION", "AGE"],
         "get at: the CRD's printer columns")
    rc, out, err = k.run("get", "agenttasks.divergedev.com", "-A")
    head, rows = table(out)
    t.ok(rc == 0 and head[:2] == ["NAMESPACE", "NAME"] and
         any(r[:2] == ["default", NAME] for r in rows),
         "get -A adds the namespace column", out + err)
    rc, out, err = k.run("get", "diverge")
    t.ok(rc == 0 and "agenttask.divergedev.com/" + NAME in out,
         "get diverge (the category) includes the task", out + err)

    obj = k.json("get", "at", NAME)
    want = load_yaml(EXAMPLE)
    if want is not None:
        t.eq(obj.get("spec"), want["spec"], "get -o json: spec as applied")
    else:
        t.ok(obj["spec"]["objective"].startswith("Diagnose and fix N+1"),
             "get -o json: spec as applied")
    md = obj["metadata"]
    t.ok(obj["apiVersion"] == "divergedev.com/v1alpha1" and
         obj["kind"] == "AgentTask" and md.get("namespace") == "default" and
         re.match(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                  r"[0-9a-f]{12}$", md.get("uid", "")) and
         md.get("resourceVersion") and md.get("generation") == 1 and
         re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$",
                  md.get("creationTimestamp", "")),
         "metadata: uid, resourceVersion, generation 1, "
         "creationTimestamp", json.dumps(md, indent=1))
    t.ok("kubectl.kubernetes.io/last-applied-configuration" in
         md.get("annotations", {}) and
         md["annotations"].get("divergedev.com/preview-port") == "8080",
         "annotations kept, with kubectl's last-applied")

    rc, out, err = k.run("get", "at", "nope")
    t.ok(rc != 0 and "NotFound" in err and
         'agenttasks.divergedev.com "nope" not found' in err,
         "get a missing name: NotFound", err)
    rc, out, err = k.run("get", "at", "nope", "-n", "team-x")
    t.ok(rc != 0 and 'agenttasks.divergedev.com "nope" not found' in err,
         "namespaces exist implicitly (NotFound names the object)", err)
    rc, out, err = k.run("get", "at", "-n", "team-x")
    t.ok(rc == 0 and "No resources found in team-x namespace" in err,
         "an empty namespace lists nothing", out + err)


def patches(t, k, watch_lines):
    gen = k.json("get", "at", NAME)["metadata"]["generation"]
    rc, out, err = k.run("patch", "agenttask", NAME, "--type=merge", "-p",
                         '{"spec":{"suspended":true}}')
    obj = k.json("get", "at", NAME)
    t.ok(rc == 0 and "patched" in out and obj["spec"]["suspended"] is True
         and obj["metadata"]["generation"] == gen + 1,
         "patch --type=merge spec.suspended true (generation +1)",
         out + err)
    rc, out, err = k.run("patch", "agenttask", NAME, "--type=merge", "-p",
                         '{\n"spec": {\n"suspended": false,\n'
                         '"budgetUSD": "10.00",\n"maxIterations": 12\n}\n}')
    obj = k.json("get", "at", NAME)
    t.ok(rc == 0 and obj["spec"]["suspended"] is False and
         obj["spec"]["budgetUSD"] == "10.00" and
         obj["spec"]["maxIterations"] == 12 and
         obj["metadata"]["generation"] == gen + 2,
         "patch spec.suspended false with a new budget, as the spec shows",
         out + err)
    rc, out, err = k.run("patch", "at", NAME, "-p",
                         '{"spec":{"suspended":true}}')
    t.ok(rc != 0 and "strategic-merge-patch+json is not supported" in err
         and "merge-patch+json" in err,
         "patch without --type: 415 names the accepted types", err)

    rc, out, err = k.run("patch", "at", NAME, "--subresource=status",
                         "--type=merge", "-p", json.dumps({"status": {
                             "phase": "Active", "costUSD": "0.022500",
                             "tokensConsumed": 1234, "iteration": 2}}))
    obj = k.json("get", "at", NAME)
    t.ok(rc == 0 and obj.get("status", {}).get("phase") == "Active" and
         obj["metadata"]["generation"] == gen + 2,
         "patch --subresource=status: status set, generation unchanged",
         out + err + json.dumps(obj.get("status")))
    rc, out, err = k.run("patch", "at", NAME, "--type=merge", "-p",
                         '{"status":{"phase":"Failed"}}')
    obj = k.json("get", "at", NAME)
    t.ok(rc == 0 and obj["status"]["phase"] == "Active",
         "a patch of the main resource ignores status", out + err)
    rc, out, err = k.run("get", "at", NAME)
    head, rows = table(out)
    t.ok(rows and rows[0][:5] == [NAME, "Active", "0.022500", "1234", "2"],
         "get at shows phase, cost, tokens and iteration", out + err)
    t.ok(wait(lambda: any(l.split()[:3] == ["MODIFIED", NAME, "Active"]
                              for l in watch_lines)),
         "get -w saw the status change as MODIFIED",
         "\n".join(watch_lines))

    rc, out, err = k.run("patch", "at", NAME, "--type=json", "-p",
                         '[{"op":"replace","path":"/spec/maxIterations",'
                         '"value":13},{"op":"add","path":"/metadata/labels",'
                         '"value":{"team":"checkout"}}]')
    obj = k.json("get", "at", NAME)
    t.ok(rc == 0 and obj["spec"]["maxIterations"] == 13 and
         obj["metadata"]["labels"] == {"team": "checkout"},
         "patch --type=json (RFC 6902)", out + err)
    rc, out, err = k.run("patch", "at", NAME, "--type=json", "-p",
                         '[{"op":"test","path":"/spec/maxIterations",'
                         '"value":1}]')
    t.ok(rc != 0 and "is invalid" in err and "testing value" in err,
         "a failing json patch test: 422 Invalid", err)
    rc, out, err = k.run("get", "at", "-l", "team=checkout", "-o", "name")
    rc2, out2, err2 = k.run("get", "at", "-l", "team!=checkout", "-o",
                            "name")
    t.ok(rc == 0 and out.strip() == "agenttask.divergedev.com/" + NAME and
         rc2 == 0 and out2.strip() == "", "label selectors", out + err +
         out2 + err2)

    editor = os.path.join(k.home, "editor.sh")
    with open(editor, "w") as f:
        f.write("#!/bin/sh\nsed -i 's/maxIterations: 13/maxIterations: 14/'"
                " \"$1\"\n")
    os.chmod(editor, 0o755)
    rc, out, err = k.run("edit", "at", NAME, env={"EDITOR": editor,
                                                  "KUBE_EDITOR": editor})
    obj = k.json("get", "at", NAME)
    t.ok(rc == 0 and "edited" in out and obj["spec"]["maxIterations"] == 14,
         "edit (EDITOR is a sed script)", out + err)

    stale = k.json("get", "at", NAME)
    k.run("patch", "at", NAME, "--type=merge", "-p",
          '{"metadata":{"annotations":{"touched":"yes"}}}')
    stale["spec"]["maxIterations"] = 99
    rc, out, err = k.run("replace", "-f", "-", stdin=json.dumps(stale))
    t.ok(rc != 0 and "Conflict" in err and "the object has been modified"
         in err, "replace with a stale resourceVersion: Conflict", err)


def errors(t, k, tmp):
    rc, out, err = k.run("create", "-f", EXAMPLE)
    t.ok(rc != 0 and "AlreadyExists" in err and
         'agenttasks.divergedev.com "%s" already exists' % NAME in err,
         "create a duplicate: AlreadyExists", err)

    bad = os.path.join(tmp, "unknown.json")
    with open(bad, "w") as f:
        json.dump({"apiVersion": "divergedev.com/v1alpha1",
                   "kind": "AgentTask", "metadata": {"name": "t-unknown"},
                   "spec": {"objective": "x", "speed": "fast"}}, f)
    rc, out, err = k.run("apply", "-f", bad)
    t.ok(rc != 0 and "BadRequest" in err and
         'unknown field "spec.speed"' in err,
         "apply with an unknown field: strict validation refuses it", err)
    rc, out, err = k.run("apply", "-f", bad, "--validate=warn")
    obj = k.json("get", "at", "t-unknown") if rc == 0 else {}
    t.ok(rc == 0 and 'unknown field "spec.speed"' in err and
         obj["spec"] == {"objective": "x"},
         "--validate=warn: a warning, and the field is dropped", out + err)
    k.run("delete", "at", "t-unknown", "--wait=false")

    invalid = os.path.join(tmp, "invalid.json")
    with open(invalid, "w") as f:
        json.dump({"apiVersion": "divergedev.com/v1alpha1",
                   "kind": "AgentTask", "metadata": {"name": "t-invalid"},
                   "spec": {"draftPR": True}}, f)
    rc, out, err = k.run("apply", "-f", invalid)
    t.ok(rc != 0 and 'AgentTask "t-invalid" is invalid' in err and
         "spec.objective: Required value" in err,
         "a task without spec.objective: Invalid", err)


def secrets(t, k):
    key = os.urandom(32).hex()
    rc, out, err = k.run("create", "secret", "generic",
                         "diverge-macaroon-root-key", "-n", "diverge-system",
                         "--from-literal=root-key=" + key)
    t.ok(rc == 0 and "secret/diverge-macaroon-root-key created" in out,
         "kubectl create secret generic (a protobuf body)", out + err)
    obj = k.json("get", "secret", "diverge-macaroon-root-key", "-n",
                  "diverge-system")
    t.ok(base64.b64decode(obj["data"]["root-key"]).decode() == key and
         obj.get("type") == "Opaque", "get secret: the data as created",
         json.dumps(obj))
    rc, out, err = k.run("get", "secrets", "-n", "diverge-system")
    head, rows = table(out)
    t.ok(rc == 0 and head[:3] == ["NAME", "TYPE", "DATA"] and
         rows and rows[0][:3] == ["diverge-macaroon-root-key", "Opaque",
                                  "1"], "get secrets: a table", out + err)
    rc, out, err = k.run("label", "secret", "diverge-macaroon-root-key",
                         "-n", "diverge-system", "role=root-key")
    rc2, out2, err2 = k.run("get", "secrets", "-n", "diverge-system", "-l",
                            "role=root-key", "-o", "name")
    t.ok(rc == 0 and out2.strip() == "secret/diverge-macaroon-root-key",
         "label a secret (a strategic merge patch of a built-in kind)",
         out + err + out2 + err2)
    rc, out, err = k.run("get", "ns")
    t.ok(rc == 0 and "diverge-system" in out and "default" in out,
         "get ns lists the namespaces in use", out + err)


def delete(t, k, watch_lines):
    rc, out, err = k.run("delete", "at", NAME)
    t.ok(rc == 0 and 'agenttask.divergedev.com "%s" deleted' % NAME in out,
         "delete", out + err)
    rc, out, err = k.run("get", "at", NAME)
    t.ok(rc != 0 and "NotFound" in err, "deleted: gone", err)
    t.ok(wait(lambda: any(l.split()[:2] == ["DELETED", NAME]
                              for l in watch_lines)),
         "get -w saw DELETED", "\n".join(watch_lines))


def cascade(t, k, srv):
    """delete --cascade=orphan keeps the dependents; a plain delete keeps
    a dependent that has another owner (DESIGN section 10)."""
    def create(obj):
        rc, out, err = k.run("create", "-o", "json", "-f", "-",
                             stdin=json.dumps(obj))
        if rc != 0:
            raise RuntimeError("kubectl create: " + err)
        return json.loads(out)

    def env(name):
        return create({"apiVersion": "divergedev.com/v1alpha1",
                       "kind": "Environment", "metadata": {"name": name},
                       "spec": {"branch": "main"}})

    def secret(name, owners):
        return create({"apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": name, "ownerReferences": [{
                "apiVersion": "divergedev.com/v1alpha1",
                "kind": "Environment", "name": o["metadata"]["name"],
                "uid": o["metadata"]["uid"]} for o in owners]},
            "stringData": {"k": "v"}})

    def owners(name):
        rc, out, err = k.run("get", "secret", name, "-o", "json")
        if rc != 0:
            return None
        return [r["name"] for r in
                json.loads(out)["metadata"].get("ownerReferences", [])]

    o3 = env("o3")
    secret("o3-child", [o3])
    rc, out, err = k.run("delete", "environment", "o3", "--cascade=orphan")
    t.ok(rc == 0 and owners("o3-child") == [],
         "delete --cascade=orphan: the dependent stays, without the "
         "ownerReference", out + err + repr(owners("o3-child")))
    o1, o2 = env("o1"), env("o2")
    secret("shared", [o1, o2])
    rc, out, err = k.run("delete", "environment", "o1")
    t.ok(rc == 0 and owners("shared") == ["o2"],
         "delete: a dependent with another owner stays, its reference "
         "to the deleted owner gone", out + err + repr(owners("shared")))
    rc, out, err = k.run("delete", "environment", "o2")
    t.ok(rc == 0 and owners("shared") is None,
         "delete of the last owner deletes the dependent", out + err)
    req = urllib.request.Request(
        srv.url + "/apis/divergedev.com/v1alpha1/namespaces/default/"
        "environments/nope?propagationPolicy=Sideways", method="DELETE")
    try:
        urllib.request.urlopen(req, timeout=10)
        code, body = 200, {}
    except urllib.error.HTTPError as e:
        code, body = e.code, json.loads(e.read())
    t.ok(code == 422 and body.get("reason") == "Invalid" and
         body.get("details", {}).get("causes", [{}])[0].get("field") ==
         "propagationPolicy", "an unknown propagationPolicy: 422",
         json.dumps(body))
    k.run("delete", "secret", "o3-child")


def hostile(t, srv):
    """Requests that must be refused, not take the server down: a JSON
    Patch whose copy ops double the nesting each time (a stack overflow in
    the recursive copy), a watch with an absurd timeoutSeconds."""
    base = srv.url + "/apis/agents.x-k8s.io/v1beta1/namespaces/default/" \
        "sandboxes"

    def call(method, url, body=None, ctype="application/json"):
        data = body if isinstance(body, bytes) else (
            json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(url, method=method, data=data,
                                     headers={"Content-Type": ctype})
        def parsed(raw):
            try:
                return json.loads(raw or b"{}")
            except ValueError:
                return {"text": raw.decode("utf-8", "replace")}
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                return r.status, parsed(r.read())
        except urllib.error.HTTPError as e:
            return e.code, parsed(e.read())

    call("POST", base, {"apiVersion": "agents.x-k8s.io/v1beta1",
                        "kind": "Sandbox", "metadata": {"name": "deep"},
                        "spec": {"podTemplate": {"spec": {"containers": [
                            {"name": "c", "image": "x"}]}}}})
    # 1,000 levels (as text: too deep for Python's own encoder)
    ops = ['{"op":"add","path":"/spec/x","value":%s0%s}' %
           ("[" * 1000, "]" * 1000)]
    for i in range(8):
        ops.append(json.dumps({"op": "copy", "from": "/spec/x",
                               "path": "/spec/x" + "/0" * 999 + "/-"}))
    code, body = call("PATCH", base + "/deep",
                      ("[" + ",".join(ops) + "]").encode(),
                      "application/json-patch+json")
    t.ok(code == 422 and "deeper" in body.get("message", ""),
         "a JSON Patch nesting past the limit: 422, the server stays up",
         (code, body.get("message")))
    code, _ = call("GET", srv.url + "/healthz")
    t.eq(code, 200, "and answers after it")
    # the limit itself: a patched object whose deepest value sits 2,048
    # levels down is taken, one level more is not (a value of 1,040
    # nested arrays at /spec/x, 2 levels down; a copy of it appended
    # j + 1 levels inside it puts its deepest value 3 + j + 1,040 down)
    def status_of(method, url, data=None):
        """The status alone: too deep a reply for Python's parser."""
        req = urllib.request.Request(url, method=method, data=data, headers={
            "Content-Type": "application/json-patch+json"})
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                r.read()
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    for name, j, want in (("edge", 1005, 200), ("edge2", 1006, 422)):
        call("POST", base, {"apiVersion": "agents.x-k8s.io/v1beta1",
                            "kind": "Sandbox", "metadata": {"name": name},
                            "spec": {"podTemplate": {"spec": {
                                "containers": [{"name": "c",
                                                "image": "x"}]}}}})
        ops = ['{"op":"add","path":"/spec/x","value":%s0%s}' %
               ("[" * 1040, "]" * 1040),
               json.dumps({"op": "copy", "from": "/spec/x",
                           "path": "/spec/x" + "/0" * j + "/-"})]
        code = status_of("PATCH", base + "/" + name,
                         ("[" + ",".join(ops) + "]").encode())
        t.eq(code, want, "a patched object %d levels deep: %d" %
             (3 + j + 1040, want))
        status_of("DELETE", base + "/" + name)
    req = urllib.request.Request(
        srv.url + "/api/v1/namespaces/default/secrets?watch=1&"
        "timeoutSeconds=9223372036854775807")
    with urllib.request.urlopen(req, timeout=10) as r:
        t.eq(r.status, 200, "a watch with a huge timeoutSeconds opens")
    code, _ = call("GET", srv.url + "/healthz")
    t.eq(code, 200, "and the server is still up")
    call("DELETE", base + "/deep")


KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: diverge
  cluster: {server: "%s", certificate-authority-data: "%s"}
users:
- name: me
  user: {token: "%s"}
contexts:
- name: diverge
  context: {cluster: diverge, user: me, namespace: default}
current-context: diverge
"""


def tls(t, exe):
    """Off loopback the API needs TLS and a token; with both, kubectl
    works through a kubeconfig like against a cluster."""
    openssl = shutil.which("openssl")
    srv = ApiServer(listen="0.0.0.0:0")
    try:
        try:
            started = srv.start()
        except RuntimeError:
            started = None
        out = "\n".join(srv.lines)
        t.ok(started is None and srv.proc is not None and
             "loopback" in out and "tls_cert" in out,
             "a non-loopback listen address without TLS is refused", out)
    finally:
        srv.cleanup()
    if openssl is None:
        for name in ("TLS with a bearer token", "a wrong token: 401",
                     "no token: 401 Status",
                     "the token after 'bearer' (lower case): 200"):
            t.skip(name + " (openssl not installed)")
        return
    tmp = tempfile.mkdtemp(prefix="diverge-tls-")
    cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
    p = subprocess.run([openssl, "req", "-x509", "-newkey", "ec",
                        "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                        "-keyout", key, "-out", cert, "-days", "2", "-subj",
                        "/CN=127.0.0.1", "-addext",
                        "subjectAltName=IP:127.0.0.1"],
                       capture_output=True, text=True)
    token = os.urandom(16).hex()
    tokfile = os.path.join(tmp, "token")
    with open(tokfile, "w") as f:
        f.write(token + "\n")
    srv = ApiServer(tls=(cert, key, tokfile))
    try:
        if p.returncode != 0 or srv.start() is None:
            t.ok(False, "TLS with a bearer token", p.stderr)
            return
        with open(cert, "rb") as f:
            ca = base64.b64encode(f.read()).decode()
        kc = os.path.join(tmp, "kubeconfig")
        with open(kc, "w") as f:
            f.write(KUBECONFIG % (srv.url, ca, token))
        k = Kubectl(exe, srv, kubeconfig=kc)
        rc, out, err = k.run("apply", "-f", EXAMPLE)
        rc2, out2, err2 = k.run("get", "at", "-o", "name")
        t.ok(rc == 0 and rc2 == 0 and out2.strip() ==
             "agenttask.divergedev.com/" + NAME,
             "TLS with a bearer token: apply and get through a kubeconfig",
             out + err + out2 + err2)
        with open(kc, "w") as f:
            f.write(KUBECONFIG % (srv.url, ca, "wrong-" + token))
        rc, out, err = k.run("get", "at")
        t.ok(rc != 0 and "Unauthorized" in err, "a wrong token: 401", err)
        import ssl
        ctx = ssl.create_default_context(cafile=cert)
        try:
            urllib.request.urlopen(srv.url + "/apis", timeout=10,
                                   context=ctx)
            code, body = 200, {}
        except urllib.error.HTTPError as e:
            code, body = e.code, json.loads(e.read())
        t.ok(code == 401 and body.get("kind") == "Status" and
             body.get("reason") == "Unauthorized",
             "no token: 401 Status", json.dumps(body))
        # the scheme is case-insensitive (RFC 7235), as the apiserver's
        # bearer token authenticator has it
        req = urllib.request.Request(srv.url + "/apis", headers={
            "Authorization": "bearer " + token})
        try:
            with urllib.request.urlopen(req, timeout=10,
                                        context=ctx) as r:
                code = r.status
        except urllib.error.HTTPError as e:
            code = e.code
        t.eq(code, 200, "the token after 'bearer' (lower case): 200")
    finally:
        srv.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def main(t):
    exe = shutil.which("kubectl")
    if exe is None:
        t.skip_all("kubectl not installed")
    srv = ApiServer()
    try:
        if srv.start() is None:
            t.skip_all("neither diverged --api-listen nor "
                       "tests/tools/apiserve is available")
        print("# server: %s on port %d" % (srv.how, srv.port))
        k = Kubectl(exe, srv)
        discovery(t, k, srv)
        crd_schemas(t, srv)
        apply_and_get(t, k)
        watch, lines = k.background("get", "at", "-w",
                                    "--output-watch-events")
        try:
            t.ok(wait(lambda: any(l.split()[:2] == ["ADDED", NAME]
                                      for l in lines)),
                 "get -w starts with the task", "\n".join(lines))
            patches(t, k, lines)
            errors(t, k, srv.tmp)
            secrets(t, k)
            cascade(t, k, srv)
            hostile(t, srv)
            delete(t, k, lines)
        finally:
            watch.terminate()
            watch.wait(10)
        t.eq(srv.stop(), 0, "the server stops cleanly on SIGTERM")
    finally:
        srv.cleanup()
    tls(t, exe)


if __name__ == "__main__":
    run_tests(main)
