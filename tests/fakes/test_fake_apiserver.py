#!/usr/bin/env python3
"""TAP self-test for tests/fakes/kube_apiserver.py.

Starts the fake (TLS + token, and a plain-http instance with a tiny watch
history), talks to it with http.client verifying the generated CA, prints
"ok N - name" / "not ok N - name" and "1..N", and exits 1 on any failure.
"""

import http.client
import json
import os
import re
import select
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "kube_apiserver.py")
TOKEN = "s3cret-token"
AT = "/apis/divergedev.com/v1alpha1/namespaces/ns1/agenttasks"
AT_ALL = "/apis/divergedev.com/v1alpha1/agenttasks"
SB = "/apis/agents.x-k8s.io/v1beta1/namespaces/ns1/sandboxes"
SC = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/ns1/sandboxclaims"
NP = "/apis/networking.k8s.io/v1/namespaces/ns1/networkpolicies"
SEC = "/api/v1/namespaces/ns1/secrets"
MERGE = "application/merge-patch+json"
JSONP = "application/json-patch+json"

RESULTS = []


def check(name, cond, diag=None):
    n = len(RESULTS) + 1
    RESULTS.append(bool(cond))
    print(f"{'ok' if cond else 'not ok'} {n} - {name}", flush=True)
    if not cond and diag is not None:
        for line in str(diag).splitlines()[:30]:
            print(f"#   {line}", flush=True)


class Fake:
    def __init__(self, *args):
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, FAKE, "--port", "0", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)
        r, _, _ = select.select([self.proc.stdout], [], [], 15)
        if not r:
            raise RuntimeError("the fake did not start within 15 s")
        line = self.proc.stdout.readline()
        self.info = json.loads(line)
        self.port = self.info["port"]
        self.tls = self.info["server"].startswith("https://")
        self.ctx = None
        if self.tls:
            self.ctx = ssl.create_default_context(cafile=self.info["ca_file"])

    def conn(self, timeout=10):
        if self.tls:
            return http.client.HTTPSConnection(
                "127.0.0.1", self.port, context=self.ctx, timeout=timeout)
        return http.client.HTTPConnection("127.0.0.1", self.port,
                                          timeout=timeout)

    def req(self, method, path, body=None, ctype="application/json",
            token=TOKEN, headers=None):
        c = self.conn()
        h = dict(headers or {})
        if token is not None:
            h["Authorization"] = "Bearer " + token
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else json.dumps(body)
            h["Content-Type"] = ctype
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
        c.close()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw.decode("utf-8", "replace")
        return r.status, r, parsed

    def watch(self, path, timeout=10, token=TOKEN):
        c = self.conn(timeout)
        h = {"Authorization": "Bearer " + token} if token else {}
        c.request("GET", path, headers=h)
        return Watch(c, c.getresponse())

    def stderr(self):
        self.err.seek(0)
        return self.err.read().decode("utf-8", "replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Watch:
    def __init__(self, conn, resp):
        self.conn, self.resp = conn, resp
        self.status = resp.status
        self.ctype = resp.getheader("Content-Type")

    def next(self):
        """The next event as a dict, or None at the end of the stream."""
        line = self.resp.readline()
        if not line:
            return None
        assert line.endswith(b"\n"), line
        return json.loads(line)

    def take(self, n):
        return [self.next() for _ in range(n)]

    def close(self):
        self.conn.close()


def obj(kind, name, api="divergedev.com/v1alpha1", **kw):
    o = {"apiVersion": api, "kind": kind, "metadata": {"name": name}}
    for k, v in kw.items():
        if k in ("labels", "annotations", "finalizers", "ownerReferences",
                 "generateName", "namespace"):
            o["metadata"][k] = v
        else:
            o[k] = v
    return o


def names(lst):
    return [i["metadata"]["name"] for i in lst["items"]]


def owner_ref(o):
    return {"apiVersion": o["apiVersion"], "kind": o["kind"],
            "name": o["metadata"]["name"], "uid": o["metadata"]["uid"]}


def q(**kw):
    return "?" + urllib.parse.urlencode(kw)


def current_rv(f):
    return int(f.req("GET", AT)[2]["metadata"]["resourceVersion"])


# ---------------------------------------------------------------------------


def t_auth(f):
    st, _, b = f.req("GET", "/version", token=None)
    check("no token: 401 with the Unauthorized Status", st == 401 and b == {
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": "Unauthorized",
        "reason": "Unauthorized", "code": 401}, b)
    st, _, _ = f.req("GET", AT, token="wrong")
    check("wrong token: 401", st == 401)
    st, _, _ = f.req("GET", "/healthz", token=None)
    check("/healthz needs the token too", st == 401)
    st, _, b = f.req("GET", "/version")
    check("/version with the token", st == 200 and b["minor"] == "32", b)
    st, _, b = f.req("GET", "/version", headers={
        "Authorization": "bearer " + TOKEN}, token=None)
    check("the Bearer scheme is case-insensitive", st == 200, b)
    st, _, b = f.req("GET", "/_fake/state", token=None)
    check("control endpoints need no token", st == 200, b)


def t_discovery(f):
    _, _, b = f.req("GET", "/api")
    check("/api lists v1", b["kind"] == "APIVersions" and b["versions"] ==
          ["v1"], b)
    _, _, b = f.req("GET", "/apis")
    groups = {g["name"] for g in b["groups"]}
    check("/apis lists the four groups", b["kind"] == "APIGroupList" and
          groups == {"divergedev.com", "agents.x-k8s.io",
                     "extensions.agents.x-k8s.io", "networking.k8s.io"}, b)
    _, _, b = f.req("GET", "/apis/divergedev.com/v1alpha1")
    rn = {r["name"] for r in b["resources"]}
    check("divergedev.com resources incl. status", {
        "agenttasks", "agenttasks/status", "environments",
        "environments/status"} <= rn, rn)
    _, _, b = f.req("GET", "/api/v1")
    rn = {r["name"] for r in b["resources"]}
    check("/api/v1 has secrets without status", "secrets" in rn and
          "secrets/status" not in rn, rn)
    _, _, b = f.req("GET", "/apis/networking.k8s.io/v1")
    rn = {r["name"] for r in b["resources"]}
    check("networkpolicies without status", rn == {"networkpolicies"}, rn)
    _, _, b = f.req("GET", "/apis/extensions.agents.x-k8s.io/v1beta1")
    rn = {r["name"] for r in b["resources"]}
    check("sandboxclaims with status", rn == {"sandboxclaims",
                                              "sandboxclaims/status"}, rn)
    st, _, b = f.req("GET", "/api/v1/namespaces/whatever")
    check("stub Namespace", st == 200 and b["kind"] == "Namespace" and
          b["metadata"]["name"] == "whatever", b)
    st, _, b = f.req("GET", "/apis/nope.example.com/v1")
    check("unknown path: 404 NotFound Status", st == 404 and
          b["reason"] == "NotFound" and b["message"] ==
          "the server could not find the requested resource", b)
    st, _, b = f.req("POST", "/version", body={})
    check("POST /version: 405", st == 405 and
          b["reason"] == "MethodNotAllowed", b)


def t_create(f):
    rv0 = current_rv(f)
    body = obj("AgentTask", "t1", labels={"app": "a", "tier": "x"},
               spec={"prompt": "hi"}, status={"phase": "Bogus"})
    st, _, b = f.req("POST", AT + "?fieldManager=kubectl&fieldValidation="
                     "Strict", body)
    md = b.get("metadata", {}) if isinstance(b, dict) else {}
    check("create: 201 with server-set metadata", st == 201 and
          re.match(r"^[0-9a-f-]{36}$", md.get("uid", "")) and
          int(md["resourceVersion"]) > rv0 and md["generation"] == 1 and
          md["namespace"] == "ns1" and re.match(
              r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", md["creationTimestamp"]),
          b)
    check("create: status dropped (status subresource)", "status" not in b,
          b)
    st, _, b = f.req("POST", AT, obj("AgentTask", "t1", spec={}))
    check("create existing: 409 AlreadyExists", st == 409 and b == {
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure",
        "message": 'agenttasks.divergedev.com "t1" already exists',
        "reason": "AlreadyExists", "details": {
            "name": "t1", "group": "divergedev.com", "kind": "agenttasks"},
        "code": 409}, b)
    st, _, b = f.req("GET", AT + "/t1")
    check("get", st == 200 and b["spec"] == {"prompt": "hi"} and
          b["kind"] == "AgentTask" and b["apiVersion"] ==
          "divergedev.com/v1alpha1", b)
    st, _, b = f.req("GET", AT + "/t9")
    check("get missing: 404 NotFound with plural details.kind",
          st == 404 and b == {
              "kind": "Status", "apiVersion": "v1", "metadata": {},
              "status": "Failure",
              "message": 'agenttasks.divergedev.com "t9" not found',
              "reason": "NotFound", "details": {
                  "name": "t9", "group": "divergedev.com",
                  "kind": "agenttasks"}, "code": 404}, b)
    st, _, b = f.req("POST", AT, obj("AgentTask", "", generateName="gen-",
                                     spec={"prompt": "g"}))
    check("generateName", st == 201 and re.match(
        r"^gen-[a-z0-9]{5}$", b["metadata"]["name"]), b)
    st, _, b = f.req("POST", AT, obj("AgentTask", "t5", namespace="other"))
    check("namespace mismatch: 400", st == 400 and b["reason"] ==
          "BadRequest", b)
    st, _, b = f.req("POST", AT, {"apiVersion": "divergedev.com/v1alpha1",
                                  "kind": "AgentTask", "spec": {}})
    check("no name: 422 Invalid with the Kind in details",
          st == 422 and b["reason"] == "Invalid" and
          b["details"]["kind"] == "AgentTask" and b["message"] ==
          'AgentTask.divergedev.com "" is invalid: metadata.name: Required '
          'value: name or generateName is required', b)
    st, _, b = f.req("POST", AT, obj("AgentTask", "Bad_Name"))
    check("invalid name: 422", st == 422 and
          b["details"]["causes"][0]["field"] == "metadata.name", b)
    st, _, b = f.req("POST", AT, b"{not json")
    check("bad JSON: 400 BadRequest", st == 400 and
          b["reason"] == "BadRequest", b)
    st, _, b = f.req("POST", AT, obj("Environment", "x"))
    check("wrong kind in the body: 400", st == 400, b)
    st, _, b = f.req("POST", AT, b"k8s\x00",
                     "application/vnd.kubernetes.protobuf")
    check("protobuf body: 415 UnsupportedMediaType", st == 415 and
          b["reason"] == "UnsupportedMediaType", b)


def t_list(f):
    f.req("POST", AT, obj("AgentTask", "t2", labels={"app": "b"}))
    f.req("POST", AT.replace("ns1", "ns2"),
          obj("AgentTask", "t3", labels={"app": "a"}))
    rv = current_rv(f)
    st, _, b = f.req("GET", AT + "?limit=1&continue=&timeout=32s&pretty=1")
    check("list: kind, apiVersion, metadata, all items",
          st == 200 and b["kind"] == "AgentTaskList" and
          b["apiVersion"] == "divergedev.com/v1alpha1" and
          b["metadata"] == {"resourceVersion": str(rv), "continue": ""} and
          len(b["items"]) == 3 and all(
              i["kind"] == "AgentTask" and "apiVersion" in i
              for i in b["items"]), b)
    gen = [n for n in names(b) if n.startswith("gen-")][0]

    def sel(s, path=AT, key="labelSelector"):
        st, _, b = f.req("GET", path + q(**{key: s}))
        return names(b) if st == 200 else st

    check("labelSelector =", sel("app=a") == ["t1"])
    check("labelSelector ==", sel("app==b") == ["t2"])
    check("labelSelector != matches objects without the key",
          sel("app!=a") == [gen, "t2"], sel("app!=a"))
    check("labelSelector exists / !exists", sel("tier") == ["t1"] and
          sel("!tier") == [gen, "t2"])
    check("labelSelector in / notin", sel("app in (a, b)") == ["t1", "t2"]
          and sel("app notin (a)") == [gen, "t2"])
    check("labelSelector AND", sel("app=a,tier=x") == ["t1"] and
          sel("app=a,tier=y") == [])
    check("labelSelector parse errors: 400", sel("app=a b") == 400 and
          sel("app in (a") == 400 and sel("a=b=c") == 400 and
          sel("app=a,") == 400)
    check("fieldSelector metadata.name", sel(
        "metadata.name=t2", key="fieldSelector") == ["t2"] and sel(
        "metadata.name!=t2", key="fieldSelector") == [gen, "t1"])
    check("fieldSelector unsupported field: 400", sel(
        "spec.prompt=hi", key="fieldSelector") == 400)
    b = f.req("GET", AT_ALL + q(labelSelector="app=a"))[2]
    check("all-namespaces list", [(i["metadata"]["namespace"],
                                   i["metadata"]["name"])
                                  for i in b["items"]] ==
          [("ns1", "t1"), ("ns2", "t3")], b)
    check("all-namespaces list with metadata.namespace", sel(
        "metadata.namespace=ns2", AT_ALL, "fieldSelector") == ["t3"])


def t_put(f):
    cur = f.req("GET", AT + "/t1")[2]
    body = json.loads(json.dumps(cur))
    del body["metadata"]["resourceVersion"]
    st, _, b = f.req("PUT", AT + "/t1", body)
    check("PUT without resourceVersion: 422", st == 422 and b == {
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure",
        "message": 'agenttasks.divergedev.com "t1" is invalid: '
                   'metadata.resourceVersion: Invalid value: 0x0: must be '
                   'specified for an update',
        "reason": "Invalid", "details": {
            "name": "t1", "group": "divergedev.com", "kind": "agenttasks",
            "causes": [{"reason": "FieldValueInvalid",
                        "message": "Invalid value: 0x0: must be specified "
                                   "for an update",
                        "field": "metadata.resourceVersion"}]},
        "code": 422}, b)
    body["metadata"]["resourceVersion"] = str(
        int(cur["metadata"]["resourceVersion"]) + 100000)
    st, _, b = f.req("PUT", AT + "/t1", body)
    check("PUT with a stale resourceVersion: 409 Conflict", st == 409 and b == {
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure",
        "message": 'Operation cannot be fulfilled on agenttasks.divergedev.com'
                   ' "t1": the object has been modified; please apply your '
                   'changes to the latest version and try again',
        "reason": "Conflict", "details": {
            "name": "t1", "group": "divergedev.com", "kind": "agenttasks"},
        "code": 409}, b)
    body = json.loads(json.dumps(cur))
    body["spec"]["prompt"] = "changed"
    body["status"] = {"phase": "Hacked"}
    body["metadata"]["uid"] = "not-the-uid"
    body["metadata"]["generation"] = 42
    st, _, b = f.req("PUT", AT + "/t1", body)
    check("PUT: spec change bumps generation, status and uid are ignored",
          st == 200 and b["spec"]["prompt"] == "changed" and
          b["metadata"]["generation"] == 2 and "status" not in b and
          b["metadata"]["uid"] == cur["metadata"]["uid"] and
          int(b["metadata"]["resourceVersion"]) >
          int(cur["metadata"]["resourceVersion"]), b)
    st, _, b2 = f.req("PUT", AT + "/t1", b)
    check("PUT of the same object is a no-op (same resourceVersion)",
          st == 200 and b2["metadata"]["resourceVersion"] ==
          b["metadata"]["resourceVersion"], b2)
    nb = obj("AgentTask", "zz", spec={})
    nb["metadata"]["resourceVersion"] = "5"
    st, _, b = f.req("PUT", AT + "/zz", nb)
    check("PUT to a missing name: 404", st == 404 and
          b["reason"] == "NotFound", b)
    st, _, b = f.req("PUT", AT + "/t1", obj("AgentTask", "t2"))
    check("PUT with another name in the body: 400", st == 400, b)


def t_status(f):
    cur = f.req("GET", AT + "/t1")[2]
    body = json.loads(json.dumps(cur))
    body["status"] = {"phase": "Running"}
    body["spec"]["prompt"] = "ignored"
    body["metadata"]["labels"]["ignored"] = "yes"
    st, _, b = f.req("PUT", AT + "/t1/status", body)
    check("PUT /status: only .status changes, generation kept",
          st == 200 and b["status"] == {"phase": "Running"} and
          b["spec"] == cur["spec"] and "ignored" not in
          b["metadata"]["labels"] and b["metadata"]["generation"] ==
          cur["metadata"]["generation"], b)
    st, _, b = f.req("PATCH", AT + "/t1/status?fieldManager=kubectl-patch",
                     {"status": {"phase": "Done"}, "spec": {"x": 1}}, MERGE)
    check("PATCH /status (merge)", st == 200 and b["status"]["phase"] ==
          "Done" and "x" not in b["spec"] and b["metadata"]["generation"] ==
          cur["metadata"]["generation"], b)
    st, _, b = f.req("GET", AT + "/t1/status")
    check("GET /status", st == 200 and b["status"]["phase"] == "Done", b)
    st, _, b = f.req("PUT", AT + "/t1/status", {"metadata": {
        "name": "t1"}, "status": {}})
    check("PUT /status without resourceVersion: 422", st == 422, b)
    st, _, b = f.req("GET", SEC + "/x/status")
    check("no status subresource on secrets: 404", st == 404, b)


def t_merge_patch(f):
    cur = f.req("GET", AT + "/t1")[2]
    st, _, b = f.req("PATCH", AT + "/t1", {
        "spec": {"prompt": "p2", "extra": {"a": 1}},
        "metadata": {"labels": {"new": "1"}}, "status": {"phase": "X"}},
        MERGE)
    check("merge patch: spec change bumps generation, status ignored",
          st == 200 and b["spec"] == {"prompt": "p2", "extra": {"a": 1}} and
          b["metadata"]["labels"]["new"] == "1" and
          b["metadata"]["generation"] == cur["metadata"]["generation"] + 1
          and b["status"] == cur["status"], b)
    st, _, b = f.req("PATCH", AT + "/t1", {"spec": {"extra": None}}, MERGE)
    check("merge patch: null deletes", st == 200 and
          "extra" not in b["spec"], b)
    gen = b["metadata"]["generation"]
    st, _, b = f.req("PATCH", AT + "/t1", {"metadata": {"annotations": {
        "k": "v"}}}, MERGE + "; charset=utf-8")
    check("merge patch of metadata only: generation kept", st == 200 and
          b["metadata"]["generation"] == gen, b)
    st, _, b = f.req("PATCH", AT + "/t1", {"metadata": {
        "resourceVersion": "2"}, "spec": {"prompt": "no"}}, MERGE)
    check("merge patch with a stale resourceVersion: 409 Conflict",
          st == 409 and b["reason"] == "Conflict", b)
    rv = f.req("GET", AT + "/t1")[2]["metadata"]["resourceVersion"]
    st, _, b = f.req("PATCH", AT + "/t1", {"metadata": {
        "resourceVersion": rv}, "spec": {"prompt": "p3"}}, MERGE)
    check("merge patch with the current resourceVersion", st == 200 and
          b["spec"]["prompt"] == "p3", b)
    st, _, b = f.req("PATCH", AT + "/nope", {"spec": {}}, MERGE)
    check("patch of a missing object: 404", st == 404, b)


def t_json_patch(f):
    ops = [{"op": "add", "path": "/spec/list", "value": [1, 2]},
           {"op": "add", "path": "/spec/list/-", "value": 3},
           {"op": "add", "path": "/spec/list/0", "value": 0},
           {"op": "replace", "path": "/spec/prompt", "value": "jp"},
           {"op": "copy", "from": "/spec/prompt", "path": "/spec/c"},
           {"op": "move", "from": "/spec/c", "path": "/spec/m"},
           {"op": "remove", "path": "/spec/list/1"},
           {"op": "add", "path": "/metadata/labels/a~1b", "value": "s"},
           {"op": "test", "path": "/spec/m", "value": "jp"}]
    st, _, b = f.req("PATCH", AT + "/t1", ops, JSONP)
    check("json patch: add/remove/replace/move/copy/test", st == 200 and
          b["spec"] == {"prompt": "jp", "list": [0, 2, 3], "m": "jp"} and
          b["metadata"]["labels"]["a/b"] == "s", b)
    st, _, b = f.req("PATCH", AT + "/t1", [
        {"op": "test", "path": "/spec/prompt", "value": "other"},
        {"op": "replace", "path": "/spec/prompt", "value": "no"}], JSONP)
    check("json patch: failed test: 422, nothing changed", st == 422 and
          f.req("GET", AT + "/t1")[2]["spec"]["prompt"] == "jp", b)
    st, _, b = f.req("PATCH", AT + "/t1", [
        {"op": "remove", "path": "/spec/nothing"}], JSONP)
    check("json patch: remove of a missing path: 422", st == 422, b)
    rv = f.req("GET", AT + "/t1")[2]["metadata"]["resourceVersion"]
    st, _, b = f.req("PATCH", AT + "/t1", [
        {"op": "replace", "path": "/metadata/resourceVersion",
         "value": "1"}], JSONP)
    check("json patch setting a stale resourceVersion: 409", st == 409, b)
    st, _, b = f.req("PATCH", AT + "/t1", {"spec": {}},
                     "application/strategic-merge-patch+json")
    check("strategic merge patch: 415 with the apiserver message",
          st == 415 and b == {
              "kind": "Status", "apiVersion": "v1", "metadata": {},
              "status": "Failure",
              "message": "the body of the request was in an unknown format "
                         "- accepted media types include: "
                         "application/json-patch+json, "
                         "application/merge-patch+json, "
                         "application/apply-patch+yaml",
              "reason": "UnsupportedMediaType", "code": 415}, b)
    st, _, b = f.req("PATCH", AT + "/t1", "spec: {}",
                     "application/apply-patch+yaml")
    check("apply patch: 415", st == 415, b)
    check("rejected patches left the object alone",
          f.req("GET", AT + "/t1")[2]["metadata"]["resourceVersion"] == rv)


def t_builtins(f):
    st, _, b = f.req("POST", SEC, obj("Secret", "s1", api="v1",
                                      stringData={"a": "b"},
                                      data={"c": "ZA=="}))
    check("secret: stringData folded into data, type defaulted",
          st == 201 and b["data"] == {"c": "ZA==", "a": "Yg=="} and
          "stringData" not in b and b["type"] == "Opaque" and
          "generation" not in b["metadata"], b)
    st, _, b = f.req("POST", SEC, obj("Secret", "s2", api="v1",
                                      data={"c": "not base64!"}))
    check("secret: bad base64: 400", st == 400, b)
    st, _, b = f.req("PATCH", SEC + "/s1", {"data": {"e": "Zg=="}},
                     "application/strategic-merge-patch+json")
    check("secret: strategic merge patch accepted (built-in kind)",
          st == 200 and b["data"]["e"] == "Zg==", b)
    st, _, b = f.req("GET", "/api/v1/secrets")
    check("secret: all-namespaces list at /api/v1/secrets", st == 200 and
          b["kind"] == "SecretList" and names(b) == ["s1"], b)
    st, _, b = f.req("POST", NP, obj(
        "NetworkPolicy", "np0", api="networking.k8s.io/v1",
        spec={"podSelector": {}, "egress": [{"ports": [{"port": 53}]}]},
        status={"kept": True}))
    check("networkpolicy: status kept, policyTypes/protocol defaulted",
          st == 201 and b["status"] == {"kept": True} and
          b["spec"]["policyTypes"] == ["Ingress", "Egress"] and
          b["spec"]["egress"][0]["ports"][0]["protocol"] == "TCP" and
          b["metadata"]["generation"] == 1, b)
    st, _, b = f.req("DELETE", SEC + "/s1")
    check("secret: DELETE answers Status Success", st == 200 and
          b["kind"] == "Status" and b["status"] == "Success" and
          b["details"]["kind"] == "secrets", b)


def t_delete(f):
    owner = f.req("POST", AT, obj("AgentTask", "owner", spec={}))[2]
    sb = f.req("POST", SB, obj("Sandbox", "sb", api="agents.x-k8s.io/v1beta1",
                               ownerReferences=[owner_ref(owner)],
                               spec={}))[2]
    f.req("POST", SC, obj("SandboxClaim", "sc",
                          api="extensions.agents.x-k8s.io/v1beta1",
                          ownerReferences=[owner_ref(sb)], spec={}))
    f.req("POST", NP, obj("NetworkPolicy", "np",
                          api="networking.k8s.io/v1",
                          ownerReferences=[owner_ref(owner)], spec={}))
    rv = current_rv(f)
    w = f.watch(SB + q(watch="true", resourceVersion=rv, timeoutSeconds=5))
    st, _, b = f.req("DELETE", AT + "/owner",
                     {"propagationPolicy": "Background"})
    check("DELETE: 200 with the deleted object", st == 200 and
          b["metadata"]["name"] == "owner" and b["kind"] == "AgentTask", b)
    gone = [f.req("GET", p)[0] for p in (AT + "/owner", SB + "/sb",
                                         SC + "/sc", NP + "/np")]
    check("cascade: dependents deleted recursively", gone == [404] * 4, gone)
    ev = w.next()
    w.close()
    check("cascade: DELETED event for the dependent", ev and
          ev["type"] == "DELETED" and ev["object"]["metadata"]["name"] ==
          "sb" and int(ev["object"]["metadata"]["resourceVersion"]) > rv, ev)
    st, _, b = f.req("DELETE", AT + "/owner")
    check("DELETE of a missing object: 404", st == 404 and
          b["reason"] == "NotFound", b)
    o2 = f.req("POST", AT, obj("AgentTask", "owner2", spec={}))[2]
    f.req("POST", SB, obj("Sandbox", "sb2", api="agents.x-k8s.io/v1beta1",
                          ownerReferences=[owner_ref(o2)], spec={}))
    f.req("DELETE", AT + "/owner2?propagationPolicy=Orphan")
    st, _, b = f.req("GET", SB + "/sb2")
    check("Orphan: the dependent stays, without the ownerReference",
          st == 200 and "ownerReferences" not in b["metadata"], b)
    st, _, b = f.req("DELETE", SB + "/sb2", {"preconditions": {
        "uid": "00000000-0000-0000-0000-000000000000"}})
    check("DELETE with a failing uid precondition: 409", st == 409, b)
    f.req("DELETE", SB + "/sb2")
    f.req("POST", AT, obj("AgentTask", "fin", finalizers=["x.io/keep"],
                          spec={}))
    st, _, b = f.req("DELETE", AT + "/fin")
    still = f.req("GET", AT + "/fin")
    check("finalizers: DELETE only sets deletionTimestamp", st == 200 and
          "deletionTimestamp" in b["metadata"] and still[0] == 200 and
          still[2]["metadata"]["generation"] == 2, b)
    st, _, b = f.req("PATCH", AT + "/fin", {"metadata": {
        "finalizers": None}}, MERGE)
    check("finalizers: removing the last one deletes the object",
          st == 200 and f.req("GET", AT + "/fin")[0] == 404, b)


def t_watch(f):
    w = f.watch(AT + q(watch="true", labelSelector="app", timeoutSeconds=5))
    evs = w.take(2)
    check("watch from unset RV: 200, application/json, chunked",
          w.status == 200 and w.ctype == "application/json" and
          w.resp.getheader("Transfer-Encoding") == "chunked")
    check("watch from unset RV: synthetic ADDED for current matches",
          [(e["type"], e["object"]["metadata"]["name"]) for e in evs] ==
          [("ADDED", "t1"), ("ADDED", "t2")] and all(
              e["object"]["kind"] == "AgentTask" for e in evs), evs)
    f.req("POST", AT, obj("AgentTask", "t4", labels={"app": "c"}))
    ev = w.next()
    w.close()
    check("watch: live ADDED", ev["type"] == "ADDED" and
          ev["object"]["metadata"]["name"] == "t4", ev)

    w = f.watch(AT + q(watch="1", resourceVersion="0", timeoutSeconds=5,
                       fieldSelector="metadata.name=t2"))
    ev = w.next()
    w.close()
    check("watch from RV 0 with fieldSelector (kubectl get NAME -w)",
          ev["type"] == "ADDED" and ev["object"]["metadata"]["name"] == "t2",
          ev)

    rv = current_rv(f)
    f.req("PATCH", AT + "/t2", {"spec": {"n": 1}}, MERGE)
    f.req("PATCH", AT.replace("ns1", "ns2") + "/t3", {"spec": {"n": 1}},
          MERGE)
    w = f.watch(AT + q(watch="true", resourceVersion=rv, timeoutSeconds=5))
    ev = w.next()
    check("watch from RV: replays only later changes",
          ev["type"] == "MODIFIED" and ev["object"]["metadata"]["name"] ==
          "t2" and int(ev["object"]["metadata"]["resourceVersion"]) > rv, ev)
    f.req("DELETE", AT + "/t4")
    ev = w.next()
    w.close()
    check("watch: live DELETED with a new RV", ev["type"] == "DELETED" and
          ev["object"]["metadata"]["name"] == "t4", ev)

    rv = current_rv(f)
    w = f.watch(AT + q(watch="true", resourceVersion=rv,
                       labelSelector="app=b", timeoutSeconds=5))
    f.req("PATCH", AT + "/t2", {"metadata": {"labels": {"app": "z"}}}, MERGE)
    f.req("PATCH", AT + "/t2", {"metadata": {"labels": {"app": "b"}}}, MERGE)
    evs = w.take(2)
    w.close()
    check("watch with labelSelector: leaving/entering gives DELETED/ADDED",
          [e["type"] for e in evs] == ["DELETED", "ADDED"] and
          evs[0]["object"]["metadata"]["labels"]["app"] == "b", evs)

    old = current_rv(f)
    f.req("PATCH", AT + "/t1", {"spec": {"again": True}}, MERGE)
    st, _, b = f.req("POST", "/_fake/compact", token=None)
    now = int(b["resourceVersion"])
    w = f.watch(AT + q(watch="true", resourceVersion=old))
    evs = [w.next(), w.next()]
    w.close()
    check("watch from a compacted RV: 200, one ERROR 410 event, then EOF",
          w.status == 200 and evs[1] is None and evs[0] == {
              "type": "ERROR", "object": {
                  "kind": "Status", "apiVersion": "v1", "metadata": {},
                  "status": "Failure",
                  "message": f"too old resource version: {old} ({now})",
                  "reason": "Expired", "code": 410}}, evs)
    t0 = time.monotonic()
    w = f.watch(AT + q(watch="true", resourceVersion=now, timeoutSeconds=1))
    ev = w.next()
    dt = time.monotonic() - t0
    w.close()
    check("timeoutSeconds=1: clean end of stream after ~1 s", ev is None
          and 0.8 <= dt < 3, (ev, dt))

    t0 = time.monotonic()
    w = f.watch(AT + q(watch="true", resourceVersion=now,
                       allowWatchBookmarks="true", timeoutSeconds=4))
    ev = w.next()
    dt = time.monotonic() - t0
    w.close()
    check("allowWatchBookmarks: BOOKMARK after 1 s of idleness",
          ev == {"type": "BOOKMARK", "object": {
              "kind": "AgentTask", "apiVersion": "divergedev.com/v1alpha1",
              "metadata": {"resourceVersion": str(now)}}} and
          0.8 <= dt < 2.5, (ev, dt))

    w = f.watch(SB + q(watch="true", timeoutSeconds=2))
    f.req("PATCH", AT + "/t1", {"spec": {"other": True}}, MERGE)
    ev = w.next()
    w.close()
    check("events of another kind do not reach the watcher", ev is None, ev)

    w = f.watch(AT + "/t1?watch=true&timeoutSeconds=2")
    ev = w.next()
    w.close()
    check("watch on an object path", ev and ev["type"] == "ADDED" and
          ev["object"]["metadata"]["name"] == "t1", ev)
    st, _, b = f.req("GET", AT + "?watch=true&labelSelector=a%20b")
    check("watch with a bad selector: 400 before streaming", st == 400, b)

    def watchers_settle():
        deadline = time.monotonic() + 4
        while True:
            n = f.req("GET", "/_fake/state", token=None)[2]["watchers"]
            if n == 0 or time.monotonic() > deadline:
                return n
            time.sleep(0.2)

    n0 = watchers_settle()
    w = f.watch(AT_ALL + "?watch=true")
    w.next()
    n1 = f.req("GET", "/_fake/state", token=None)[2]["watchers"]
    w.close()
    n2 = watchers_settle()
    check("a watch whose client went away is dropped",
          (n0, n1, n2) == (0, 1, 0), (n0, n1, n2))


def t_faults(f):
    f.req("DELETE", "/_fake/requests", token=None)
    st, _, b = f.req("POST", "/_fake/faults", {
        "status": 503, "count": 2, "retry_after": 1, "match": "/agenttasks"},
        token=None)
    check("POST /_fake/faults", st == 200, b)
    r1 = f.req("GET", AT)
    rv = f.req("GET", "/version")
    r2 = f.req("GET", AT + "/t1")
    r3 = f.req("GET", AT + "/t1")
    check("fault: the next 2 matching requests get 503 with Retry-After",
          r1[0] == 503 and r2[0] == 503 and
          r1[1].getheader("Retry-After") == "1" and
          r1[2]["reason"] == "ServiceUnavailable" and
          r1[2]["details"] == {"retryAfterSeconds": 1} and rv[0] == 200 and
          r3[0] == 200, [r1[2], r2[2], rv[0], r3[0]])
    f.req("POST", "/_fake/faults", {"status": 429, "count": 1,
                                    "method": "POST"}, token=None)
    a = f.req("GET", AT)[0]
    b = f.req("POST", AT, obj("AgentTask", "t429"))
    c = f.req("POST", AT, obj("AgentTask", "t429"))[0]
    check("fault restricted to a method: 429 TooManyRequests",
          a == 200 and b[0] == 429 and b[2]["reason"] == "TooManyRequests"
          and c == 201, (a, b[2], c))
    f.req("POST", "/_fake/faults", {"status": 500, "count": 1,
                                    "match": "watch=true"}, token=None)
    st, _, b = f.req("GET", AT + "?watch=true")
    check("fault on a watch: 500 InternalError Status", st == 500 and
          b["reason"] == "InternalError", b)
    f.req("POST", "/_fake/delay", {"ms": 400, "count": 1}, token=None)
    t0 = time.monotonic()
    f.req("GET", "/version")
    d1 = time.monotonic() - t0
    t0 = time.monotonic()
    f.req("GET", "/version")
    d2 = time.monotonic() - t0
    check("delay: only the next response is delayed", d1 >= 0.4 and
          d2 < 0.4, (d1, d2))
    _, _, reqs = f.req("GET", "/_fake/requests", token=None)
    first = reqs[0] if reqs else {}
    check("request log", len(reqs) == 10 and first["method"] == "GET" and
          first["path"] == AT and first["authorization_present"] is True and
          reqs[5]["content_type"] == "application/json" and
          reqs[7]["query"] == "watch=true", reqs)
    f.req("DELETE", "/_fake/requests", token=None)
    f.req("GET", AT, token=None)
    _, _, reqs = f.req("GET", "/_fake/requests", token=None)
    check("request log cleared; unauthenticated requests recorded",
          len(reqs) == 1 and reqs[0]["authorization_present"] is False, reqs)


def t_plain(g):
    check("plain-http instance: http:// server URL",
          g.info["server"] == f"http://127.0.0.1:{g.port}" and
          g.info["token"] == "", g.info)
    st, _, _ = g.req("GET", "/version", token=None)
    check("plain-http without --token: no auth required", st == 200)
    path = SB.replace("ns1", "p")
    for i in range(4):
        g.req("POST", path, obj("Sandbox", f"s{i}",
                                api="agents.x-k8s.io/v1beta1", spec={}),
              token=None)
    w = g.watch(path + "?watch=true&resourceVersion=1", token=None)
    ev = w.next()
    w.close()
    check("--history 2: a watch from RV 1 expires", ev["type"] == "ERROR"
          and ev["object"]["code"] == 410 and ev["object"]["message"] ==
          "too old resource version: 1 (2)", ev)
    w = g.watch(path + "?watch=true&resourceVersion=2&timeoutSeconds=1",
                token=None)
    evs = [w.next(), w.next(), w.next()]
    w.close()
    check("--history 2: a watch from RV 2 replays the last two events",
          [e and e["object"]["metadata"]["name"] for e in evs] ==
          ["s2", "s3", None], evs)


def run(name, fn, *args):
    try:
        fn(*args)
    except Exception:
        check(f"{name} raised no exception", False, traceback.format_exc())


def main():
    start = time.monotonic()
    f = g = None
    d = tempfile.mkdtemp(prefix="fake-kube-test-")
    try:
        f = Fake("--token", TOKEN, "--dir", d)
        check("started: prints port, ca_file, server, token",
              f.info["server"] == f"https://127.0.0.1:{f.port}" and
              f.info["token"] == TOKEN and f.info["ca_file"] ==
              os.path.join(d, "ca.crt") and all(os.path.exists(
                  os.path.join(d, n)) for n in ("ca.crt", "server.crt",
                                                "server.key")), f.info)
        for name, fn in [("auth", t_auth), ("discovery", t_discovery),
                         ("create", t_create), ("list", t_list),
                         ("put", t_put), ("status", t_status),
                         ("merge patch", t_merge_patch),
                         ("json patch", t_json_patch),
                         ("builtins", t_builtins), ("delete", t_delete),
                         ("watch", t_watch), ("faults", t_faults)]:
            run(name, fn, f)
        g = Fake("--plain-http", "--history", "2")
        run("plain", t_plain, g)
        g.proc.send_signal(signal.SIGTERM)
        try:
            g.proc.wait(5)
            gone = True
        except subprocess.TimeoutExpired:
            gone = False
        check("SIGTERM: exits, removes its own temp dir", gone and
              not os.path.exists(g.info["dir"]), g.info)
        f.proc.stdin.close()
        try:
            f.proc.wait(5)
            gone = True
        except subprocess.TimeoutExpired:
            gone = False
        check("stdin EOF: exits, leaves --dir alone", gone and
              os.path.exists(os.path.join(d, "ca.crt")))
    except Exception:
        check("setup raised no exception", False, traceback.format_exc())
    finally:
        for p in (f, g):
            if p is not None:
                p.stop()
        if f is not None and not all(RESULTS):
            print("# fake stderr (last lines):")
            for line in f.stderr().splitlines()[-40:]:
                print("#   " + line)
        shutil.rmtree(d, ignore_errors=True)
    print(f"1..{len(RESULTS)}")
    print(f"# {time.monotonic() - start:.1f} s")
    return 0 if RESULTS and all(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
