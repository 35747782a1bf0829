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
LEASES = "/apis/coordination.k8s.io/v1/namespaces/ns1/leases"
MERGE = "application/merge-patch+json"
SPEC = {"objective": "fix the build"}       # a valid AgentTask spec
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
    check("/apis lists the five groups", b["kind"] == "APIGroupList" and
          groups == {"divergedev.com", "agents.x-k8s.io",
                     "extensions.agents.x-k8s.io", "networking.k8s.io",
                     "coordination.k8s.io"}, b)
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
               spec={"objective": "hi"}, status={"phase": "Bogus"})
    st, _, b = f.req("POST", AT + "?fieldManager=kubectl&fieldValidation="
                     "Strict", body)
    md = b.get("metadata", {}) if isinstance(b, dict) else {}
    check("create: 201 with server-set metadata", st == 201 and
          re.match(r"^[0-9a-f-]{36}$", md.get("uid", "")) and
          int(md["resourceVersion"]) > rv0 and md["generation"] == 1 and
          md["namespace"] == "ns1" and re.match(
              r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", md["creationTimestamp"]),
          b)
    check("create: status dropped (status subresource), not validated",
          "status" not in b, b)
    st, _, b = f.req("POST", AT, obj("AgentTask", "t1", spec=SPEC))
    check("create existing: 409 AlreadyExists", st == 409 and b == {
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure",
        "message": 'agenttasks.divergedev.com "t1" already exists',
        "reason": "AlreadyExists", "details": {
            "name": "t1", "group": "divergedev.com", "kind": "agenttasks"},
        "code": 409}, b)
    st, _, b = f.req("GET", AT + "/t1")
    check("get", st == 200 and b["spec"] == {"objective": "hi"} and
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
                                     spec={"objective": "g"}))
    check("generateName", st == 201 and re.match(
        r"^gen-[a-z0-9]{5}$", b["metadata"]["name"]), b)
    st, _, b = f.req("POST", AT, obj("AgentTask", "t5", namespace="other",
                                     spec=SPEC))
    check("namespace mismatch: 400", st == 400 and b["reason"] ==
          "BadRequest", b)
    st, _, b = f.req("POST", AT, {"apiVersion": "divergedev.com/v1alpha1",
                                  "kind": "AgentTask", "spec": SPEC})
    check("no name: 422 Invalid with the Kind in details",
          st == 422 and b["reason"] == "Invalid" and
          b["details"]["kind"] == "AgentTask" and b["message"] ==
          'AgentTask.divergedev.com "" is invalid: metadata.name: Required '
          'value: name or generateName is required', b)
    st, _, b = f.req("POST", AT, obj("AgentTask", "Bad_Name", spec=SPEC))
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
    f.req("POST", AT, obj("AgentTask", "t2", labels={"app": "b"}, spec=SPEC))
    f.req("POST", AT.replace("ns1", "ns2"),
          obj("AgentTask", "t3", labels={"app": "a"}, spec=SPEC))
    rv = current_rv(f)
    st, _, b = f.req("GET", AT + "?continue=&timeout=32s&pretty=1")
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
        "spec.objective=hi", key="fieldSelector") == 400)
    b = f.req("GET", AT_ALL + q(labelSelector="app=a"))[2]
    check("all-namespaces list", [(i["metadata"]["namespace"],
                                   i["metadata"]["name"])
                                  for i in b["items"]] ==
          [("ns1", "t1"), ("ns2", "t3")], b)
    check("all-namespaces list with metadata.namespace", sel(
        "metadata.namespace=ns2", AT_ALL, "fieldSelector") == ["t3"])


def t_chunks(f):
    """limit and continue: pages of one snapshot, tokens that expire."""
    pg = SEC.replace("ns1", "pg")
    for i in range(7):
        f.req("POST", pg, obj("Secret", f"s{i}", api="v1",
                              labels={"n": str(i)}))
    st, _, b = f.req("GET", pg)
    check("chunks: without limit, everything and an empty continue",
          st == 200 and len(b["items"]) == 7 and
          b["metadata"]["continue"] == "" and
          "remainingItemCount" not in b["metadata"], b)
    rv = b["metadata"]["resourceVersion"]
    st, _, p1 = f.req("GET", pg + q(limit=3))
    tok1 = p1["metadata"].get("continue", "")
    check("chunks: limit=3 gives the first 3, a continue token and "
          "remainingItemCount 4", st == 200 and names(p1) ==
          ["s0", "s1", "s2"] and tok1 != "" and
          p1["metadata"]["resourceVersion"] == rv and
          p1["metadata"].get("remainingItemCount") == 4, p1)
    old5 = f.req("GET", pg + "/s5")[2]
    # changes after the first page: none of them is in this list
    f.req("POST", pg, obj("Secret", "s00", api="v1"))
    f.req("POST", pg, obj("Secret", "s9", api="v1"))
    f.req("DELETE", pg + "/s4")
    f.req("PATCH", pg + "/s5", {"metadata": {"labels": {"x": "y"}}},
          MERGE)
    st, _, p2 = f.req("GET", pg + q(limit=3, **{"continue": tok1}))
    tok2 = p2["metadata"].get("continue", "") if st == 200 else ""
    check("chunks: the next page is the first page's snapshot (its "
          "resourceVersion, s4 still there, s5 unmodified, nothing new)",
          st == 200 and names(p2) == ["s3", "s4", "s5"] and
          p2["items"][2] == old5 and tok2 not in ("", tok1) and
          p2["metadata"]["resourceVersion"] == rv and
          p2["metadata"].get("remainingItemCount") == 1, p2)
    st, _, p3 = f.req("GET", pg + q(limit=3, **{"continue": tok2}))
    check("chunks: the last page has no continue, no remainingItemCount",
          st == 200 and names(p3) == ["s6"] and
          p3["metadata"]["continue"] == "" and
          "remainingItemCount" not in p3["metadata"] and
          p3["metadata"]["resourceVersion"] == rv, p3)
    st, _, b = f.req("GET", pg + q(limit=3))
    check("chunks: a new list sees the changes", st == 200 and names(b) ==
          ["s0", "s00", "s1"] and int(b["metadata"]["resourceVersion"]) >
          int(rv), b)
    st, _, b = f.req("GET", pg + q(limit=3, **{"continue": tok1}))
    check("chunks: a token can be used again", st == 200 and
          names(b) == ["s3", "s4", "s5"], b)
    st, _, b = f.req("GET", pg + q(limit=3, resourceVersion="0",
                                   **{"continue": tok1}))
    check("chunks: resourceVersion 0 with continue is ignored", st == 200
          and names(b) == ["s3", "s4", "s5"], b)
    st, _, b = f.req("GET", pg + q(limit=3, resourceVersion=rv,
                                   **{"continue": tok1}))
    check("chunks: another resourceVersion with continue: 400",
          st == 400 and b["message"] == "specifying resource version is "
          "not allowed when using continue", b)
    bad = {
        "other selectors": pg + q(limit=3, labelSelector="n",
                                  **{"continue": tok1}),
        "another namespace": SEC.replace("ns1", "pg2") + q(
            limit=3, **{"continue": tok1}),
        "all namespaces": "/api/v1/secrets" + q(limit=3,
                                                **{"continue": tok1}),
        "not a token": pg + q(limit=3, **{"continue": "garbage!"}),
        "a token never issued": pg + q(limit=3, **{"continue": tok1[:-4]}),
    }
    for what, path in bad.items():
        st, _, b = f.req("GET", path)
        check(f"chunks: continue with {what}: 400 BadRequest", st == 400
              and b["reason"] == "BadRequest" and
              b["message"].startswith("invalid continue token"), (st, b))
    st, _, b = f.req("GET", pg + q(limit="x"))
    check("chunks: limit not an integer: 400", st == 400, b)
    st, _, b = f.req("GET", pg + q(limit=2, labelSelector="n"))
    check("chunks: with a selector, no remainingItemCount", st == 200 and
          names(b) == ["s0", "s1"] and b["metadata"]["continue"] and
          "remainingItemCount" not in b["metadata"], b)
    expired = {"kind": "Status", "apiVersion": "v1", "metadata": {},
               "status": "Failure", "message": "The provided continue "
               "parameter is too old to display a consistent list result. "
               "You can start a new list without the continue parameter.",
               "reason": "Expired", "code": 410}
    st, _, r = f.req("POST", "/_fake/expire_continue", {"count": 1},
                     token=None)
    check("chunks: /_fake/expire_continue takes a rule", st == 200 and
          r["expiries"][0]["count"] == 1, r)
    st, _, b = f.req("GET", pg + q(limit=3, **{"continue": tok2}))
    check("chunks: an expired token: 410 Expired", st == 410 and
          b == expired, b)
    st, _, b = f.req("GET", pg + q(limit=3, **{"continue": tok1}))
    check("chunks: its list's other tokens are expired too", st == 410 and
          b == expired, b)
    st, _, b = f.req("GET", pg + q(limit=3))
    tok = b["metadata"]["continue"]
    f.req("POST", "/_fake/compact", token=None)
    st, _, b = f.req("GET", pg + q(limit=3, **{"continue": tok}))
    check("chunks: /_fake/compact expires every token", st == 410 and
          b == expired and f.req("GET", "/_fake/state", token=None)[2][
              "continues"] == 0, b)
    f.req("DELETE", pg)                 # the later tests count Secrets


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
    body["spec"]["objective"] = "changed"
    body["status"] = {"phase": "Hacked"}
    body["metadata"]["uid"] = "not-the-uid"
    body["metadata"]["generation"] = 42
    st, _, b = f.req("PUT", AT + "/t1", body)
    check("PUT: spec change bumps generation, status and uid are ignored",
          st == 200 and b["spec"]["objective"] == "changed" and
          b["metadata"]["generation"] == 2 and "status" not in b and
          b["metadata"]["uid"] == cur["metadata"]["uid"] and
          int(b["metadata"]["resourceVersion"]) >
          int(cur["metadata"]["resourceVersion"]), b)
    st, _, b2 = f.req("PUT", AT + "/t1", b)
    check("PUT of the same object is a no-op (same resourceVersion)",
          st == 200 and b2["metadata"]["resourceVersion"] ==
          b["metadata"]["resourceVersion"], b2)
    nb = obj("AgentTask", "zz", spec=SPEC)
    nb["metadata"]["resourceVersion"] = "5"
    st, _, b = f.req("PUT", AT + "/zz", nb)
    check("PUT to a missing name: 404", st == 404 and
          b["reason"] == "NotFound", b)
    st, _, b = f.req("PUT", AT + "/t1", obj("AgentTask", "t2"))
    check("PUT with another name in the body: 400", st == 400, b)


def t_status(f):
    cur = f.req("GET", AT + "/t1")[2]
    body = json.loads(json.dumps(cur))
    body["status"] = {"phase": "Active"}
    body["spec"]["objective"] = "ignored"
    body["metadata"]["labels"]["ignored"] = "yes"
    st, _, b = f.req("PUT", AT + "/t1/status", body)
    check("PUT /status: only .status changes, generation kept",
          st == 200 and b["status"] == {"phase": "Active"} and
          b["spec"] == cur["spec"] and "ignored" not in
          b["metadata"]["labels"] and b["metadata"]["generation"] ==
          cur["metadata"]["generation"], b)
    st, _, b = f.req("PATCH", AT + "/t1/status?fieldManager=kubectl-patch",
                     {"status": {"phase": "Completed"},
                      "spec": {"objective": "x"}}, MERGE)
    check("PATCH /status (merge)", st == 200 and b["status"]["phase"] ==
          "Completed" and b["spec"] == cur["spec"] and
          b["metadata"]["generation"] ==
          cur["metadata"]["generation"], b)
    st, _, b = f.req("GET", AT + "/t1/status")
    check("GET /status", st == 200 and b["status"]["phase"] == "Completed",
          b)
    st, _, b = f.req("PUT", AT + "/t1/status", {"metadata": {
        "name": "t1"}, "status": {}})
    check("PUT /status without resourceVersion: 422", st == 422, b)
    st, _, b = f.req("GET", SEC + "/x/status")
    check("no status subresource on secrets: 404", st == 404, b)


def t_merge_patch(f):
    cur = f.req("GET", AT + "/t1")[2]
    st, _, b = f.req("PATCH", AT + "/t1", {
        "spec": {"objective": "p2", "repository": {"url": "u"}},
        "metadata": {"labels": {"new": "1"}}, "status": {"phase": "X"}},
        MERGE)
    check("merge patch: spec change bumps generation, status ignored",
          st == 200 and b["spec"] == {"objective": "p2",
                                      "repository": {"url": "u"}} and
          b["metadata"]["labels"]["new"] == "1" and
          b["metadata"]["generation"] == cur["metadata"]["generation"] + 1
          and b["status"] == cur["status"], b)
    st, _, b = f.req("PATCH", AT + "/t1", {"spec": {"repository": None}},
                     MERGE)
    check("merge patch: null deletes", st == 200 and
          "repository" not in b["spec"], b)
    gen = b["metadata"]["generation"]
    st, _, b = f.req("PATCH", AT + "/t1", {"metadata": {"annotations": {
        "k": "v"}}}, MERGE + "; charset=utf-8")
    check("merge patch of metadata only: generation kept", st == 200 and
          b["metadata"]["generation"] == gen, b)
    st, _, b = f.req("PATCH", AT + "/t1", {"metadata": {
        "resourceVersion": "2"}, "spec": {"objective": "no"}}, MERGE)
    check("merge patch with a stale resourceVersion: 409 Conflict",
          st == 409 and b["reason"] == "Conflict", b)
    rv = f.req("GET", AT + "/t1")[2]["metadata"]["resourceVersion"]
    st, _, b = f.req("PATCH", AT + "/t1", {"metadata": {
        "resourceVersion": rv}, "spec": {"objective": "p3"}}, MERGE)
    check("merge patch with the current resourceVersion", st == 200 and
          b["spec"]["objective"] == "p3", b)
    st, _, b = f.req("PATCH", AT + "/nope", {"spec": {}}, MERGE)
    check("patch of a missing object: 404", st == 404, b)


def t_json_patch(f):
    ops = [{"op": "add", "path": "/spec/capabilities", "value": ["a", "b"]},
           {"op": "add", "path": "/spec/capabilities/-", "value": "c"},
           {"op": "add", "path": "/spec/capabilities/0", "value": "z"},
           {"op": "replace", "path": "/spec/objective", "value": "jp"},
           {"op": "add", "path": "/spec/repository", "value": {}},
           {"op": "copy", "from": "/spec/objective",
            "path": "/spec/repository/baseBranch"},
           {"op": "move", "from": "/spec/repository/baseBranch",
            "path": "/spec/repository/workingBranch"},
           {"op": "remove", "path": "/spec/capabilities/1"},
           {"op": "add", "path": "/metadata/labels/a~1b", "value": "s"},
           {"op": "test", "path": "/spec/repository/workingBranch",
            "value": "jp"}]
    st, _, b = f.req("PATCH", AT + "/t1", ops, JSONP)
    check("json patch: add/remove/replace/move/copy/test", st == 200 and
          b["spec"] == {"objective": "jp", "capabilities": ["z", "b", "c"],
                        "repository": {"workingBranch": "jp"}} and
          b["metadata"]["labels"]["a/b"] == "s", b)
    st, _, b = f.req("PATCH", AT + "/t1", [
        {"op": "test", "path": "/spec/objective", "value": "other"},
        {"op": "replace", "path": "/spec/objective", "value": "no"}], JSONP)
    check("json patch: failed test: 422, nothing changed", st == 422 and
          f.req("GET", AT + "/t1")[2]["spec"]["objective"] == "jp", b)
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
    cur = f.req("GET", SEC + "/s1")[2]
    del cur["metadata"]["resourceVersion"]
    cur["data"]["c"] = "ZQ=="
    st, _, b = f.req("PUT", SEC + "/s1", cur)
    check("secret: PUT without resourceVersion: unconditional update",
          st == 200 and b["data"]["c"] == "ZQ==", b)
    st, _, b = f.req("DELETE", SEC + "/s1")
    check("secret: DELETE answers Status Success", st == 200 and
          b["kind"] == "Status" and b["status"] == "Success" and
          b["details"]["kind"] == "secrets", b)


def lease(name, holder, **spec):
    spec = dict({"holderIdentity": holder, "leaseDurationSeconds": 15,
                 "acquireTime": "2026-01-01T00:00:00.000000Z",
                 "renewTime": "2026-01-01T00:00:01.123456Z",
                 "leaseTransitions": 0}, **spec)
    return obj("Lease", name, api="coordination.k8s.io/v1", spec=spec)


def t_leases(f):
    """coordination.k8s.io/v1 leases, as leader election uses them."""
    st, _, b = f.req("GET", "/apis/coordination.k8s.io/v1")
    check("lease: discovery lists leases, namespaced", st == 200 and
          [(r["name"], r["namespaced"], r["kind"]) for r in b["resources"]]
          == [("leases", True, "Lease")], b)
    st, _, b = f.req("GET", LEASES + "/le")
    check("lease: get of a missing one: 404 NotFound, its Status",
          st == 404 and b.get("reason") == "NotFound" and
          b.get("message") == 'leases.coordination.k8s.io "le" not found'
          and b.get("details") == {"name": "le", "group":
                                   "coordination.k8s.io", "kind": "leases"},
          b)
    st, _, b = f.req("POST", LEASES, lease("le", "a"))
    check("lease: create: 201, the spec as sent, no generation",
          st == 201 and b["spec"]["holderIdentity"] == "a" and
          b["spec"]["renewTime"] == "2026-01-01T00:00:01.123456Z" and
          b["kind"] == "Lease" and b["apiVersion"] ==
          "coordination.k8s.io/v1" and "generation" not in b["metadata"], b)
    first = b
    st, _, b = f.req("POST", LEASES, lease("le", "b"))
    check("lease: a second create: 409 AlreadyExists", st == 409 and
          b.get("reason") == "AlreadyExists" and b.get("message") ==
          'leases.coordination.k8s.io "le" already exists', b)
    upd = dict(first, spec=dict(first["spec"], holderIdentity="b",
                                leaseTransitions=1))
    st, _, b = f.req("PUT", LEASES + "/le", upd)
    check("lease: update with the current resourceVersion: 200",
          st == 200 and b["spec"]["holderIdentity"] == "b" and
          b["metadata"]["resourceVersion"] !=
          first["metadata"]["resourceVersion"], b)
    st, _, b = f.req("PUT", LEASES + "/le", dict(first, spec=dict(
        first["spec"], holderIdentity="c")))
    check("lease: update with a stale resourceVersion: 409 Conflict, the "
          "apiserver's Status", st == 409 and b.get("reason") == "Conflict"
          and b.get("code") == 409 and b.get("message") ==
          'Operation cannot be fulfilled on leases.coordination.k8s.io '
          '"le": the object has been modified; please apply your changes '
          'to the latest version and try again' and b.get("details") ==
          {"name": "le", "group": "coordination.k8s.io", "kind": "leases"},
          b)
    st, _, b = f.req("POST", LEASES, lease("bad-time", "a",
                                           renewTime="yesterday"))
    check("lease: a renewTime that is no MicroTime: 400", st == 400 and
          b.get("reason") == "BadRequest" and "parsing time" in
          b.get("message", ""), b)
    st, _, b = f.req("POST", LEASES, lease("bad-dur", "a",
                                           leaseDurationSeconds=0))
    check("lease: leaseDurationSeconds 0: 422 Invalid", st == 422 and
          b.get("message") == 'Lease.coordination.k8s.io "bad-dur" is '
          'invalid: spec.leaseDurationSeconds: Invalid value: 0: must be '
          'greater than 0', b)


LEASE_RBAC_YAML = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: leader, namespace: ns1}
rules:
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["create"]
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    resourceNames: ["mine"]
    verbs: ["get", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: leader, namespace: ns1}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: leader}
subjects: [{kind: ServiceAccount, name: bot, namespace: sys}]
"""


def t_lease_rbac(d):
    """--rbac holds leases to a Role like the other kinds."""
    path = os.path.join(d, "lease-rbac.yaml")
    with open(path, "w") as fh:
        fh.write(LEASE_RBAC_YAML)
    f = Fake("--token", TOKEN, "--admin-token", "adm", "--rbac", path,
             "--rbac-user", "system:serviceaccount:sys:bot", "--plain-http")
    try:
        a, _, _ = f.req("POST", LEASES, lease("mine", "a"))
        b, _, _ = f.req("GET", LEASES + "/mine")
        c, _, o = f.req("GET", LEASES + "/other")
        check("lease rbac: create and the named lease's get granted, "
              "another's refused", (a, b, c) == (201, 200, 403) and
              o.get("message") == 'leases.coordination.k8s.io "other" is '
              'forbidden: User "system:serviceaccount:sys:bot" cannot get '
              'resource "leases" in API group "coordination.k8s.io" in the '
              'namespace "ns1"', (a, b, c, o))
        a, _, o = f.req("GET", "/apis/coordination.k8s.io/v1/namespaces/"
                        "ns2/leases/mine")
        check("lease rbac: ... in its namespace only", a == 403, o)
    finally:
        f.stop()


def t_delete(f):
    owner = f.req("POST", AT, obj("AgentTask", "owner", spec=SPEC))[2]
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
    o2 = f.req("POST", AT, obj("AgentTask", "owner2", spec=SPEC))[2]
    f.req("POST", SB, obj("Sandbox", "sb2", api="agents.x-k8s.io/v1beta1",
                          ownerReferences=[owner_ref(o2)], spec={}))
    f.req("DELETE", AT + "/owner2?propagationPolicy=Orphan")
    st, _, b = f.req("GET", SB + "/sb2")
    check("Orphan: the dependent stays, without the ownerReference",
          st == 200 and "ownerReferences" not in b["metadata"], b)
    a = f.req("POST", AT, obj("AgentTask", "fg-a", spec=SPEC))[2]
    b2 = f.req("POST", AT, obj("AgentTask", "fg-b", spec=SPEC))[2]
    f.req("POST", SB, obj("Sandbox", "fg-shared",
                          api="agents.x-k8s.io/v1beta1", spec={},
                          ownerReferences=[owner_ref(a), owner_ref(b2)]))
    f.req("PATCH", AT + "/fg-a", {"metadata": {
        "ownerReferences": [owner_ref(b2)]}}, MERGE)
    f.req("PATCH", AT + "/fg-b", {"metadata": {
        "ownerReferences": [owner_ref(a)]}}, MERGE)
    st, _, b = f.req("DELETE", AT + "/fg-b?propagationPolicy=Orphan",
                     {"propagationPolicy": "Foreground"})
    gone = [f.req("GET", AT + "/fg-" + n)[0] for n in "ab"]
    check("Foreground (the body's, not the query's) through an "
          "ownerReference cycle: both owners deleted",
          st == 200 and gone == [404, 404], (st, gone, b))
    st, _, b = f.req("GET", SB + "/fg-shared")
    check("Foreground: a dependent whose owners all go goes too",
          st == 404, b)
    a = f.req("POST", AT, obj("AgentTask", "fg-c", spec=SPEC))[2]
    b2 = f.req("POST", AT, obj("AgentTask", "fg-d", spec=SPEC))[2]
    f.req("POST", SB, obj("Sandbox", "fg-kept", api="agents.x-k8s.io/v1beta1",
                          spec={}, ownerReferences=[owner_ref(a),
                                                    owner_ref(b2)]))
    f.req("DELETE", AT + "/fg-c", {"propagationPolicy": "Foreground"})
    st, _, b = f.req("GET", SB + "/fg-kept")
    check("Foreground: a dependent with another live owner stays",
          st == 200 and [r["name"] for r in
                         b["metadata"]["ownerReferences"]] == ["fg-d"], b)
    f.req("DELETE", AT + "/fg-d?orphanDependents=true")
    st, _, b = f.req("GET", SB + "/fg-kept")
    check("orphanDependents=true in the query: Orphan", st == 200 and
          "ownerReferences" not in b["metadata"], b)
    st, _, b = f.req("DELETE", SB + "/fg-kept", {
        "propagationPolicy": "Orphan", "orphanDependents": True})
    check("DeleteOptions with both orphanDependents and propagationPolicy: "
          "422", st == 422 and b["details"]["causes"][0]["field"] ==
          "propagationPolicy", b)
    f.req("DELETE", SB + "/fg-kept")
    st, _, b = f.req("DELETE", SB + "/sb2", {"preconditions": {
        "uid": "00000000-0000-0000-0000-000000000000"}})
    check("DELETE with a failing uid precondition: 409", st == 409, b)
    f.req("DELETE", SB + "/sb2")
    f.req("POST", AT, obj("AgentTask", "fin", finalizers=["x.io/keep"],
                          spec=SPEC))
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
    f.req("POST", AT, obj("AgentTask", "t4", labels={"app": "c"}, spec=SPEC))
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
    f.req("PATCH", AT + "/t2", {"spec": {"maxIterations": 1}}, MERGE)
    f.req("PATCH", AT.replace("ns1", "ns2") + "/t3",
          {"spec": {"maxIterations": 1}}, MERGE)
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
    f.req("PATCH", AT + "/t1", {"spec": {"suspended": True}}, MERGE)
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
    f.req("PATCH", AT + "/t1", {"spec": {"draftPR": True}}, MERGE)
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

    rv = current_rv(f)
    w = f.watch(AT + q(watch="true", resourceVersion=rv, timeoutSeconds=30))
    f.req("PATCH", AT + "/t1", {"spec": {"maxIterations": 2}}, MERGE)
    ev = w.next()
    st, _, b = f.req("POST", "/_fake/end_watches", {"mode": "close"},
                     token=None)
    end = w.next()
    w.close()
    check("end_watches close: the stream ends cleanly after its events",
          st == 200 and b["watches"] >= 1 and ev["type"] == "MODIFIED" and
          end is None, (st, b, ev, end))
    w = f.watch(AT + q(watch="true", resourceVersion=rv, timeoutSeconds=30))
    w.next()
    f.req("POST", "/_fake/end_watches", {"mode": "cut"}, token=None)
    f.req("PATCH", AT + "/t1", {"spec": {"maxIterations": 3}}, MERGE)
    try:
        half = w.resp.read()
    except http.client.IncompleteRead as e:
        half = e.partial
    w.close()
    check("end_watches cut: half an event line, then the connection drops",
          half.startswith(b'{"type":"MODIFIED"') and b"\n" not in half,
          half)
    for mode, code, reason in (("expire", 410, "Expired"),
                               ("error", 500, "InternalError")):
        w = f.watch(AT + q(watch="true", resourceVersion=current_rv(f),
                           timeoutSeconds=30))
        f.req("POST", "/_fake/end_watches", {"mode": mode}, token=None)
        evs = [w.next(), w.next()]
        w.close()
        check("end_watches %s: one ERROR %d %s event, then EOF"
              % (mode, code, reason),
              evs[1] is None and evs[0]["type"] == "ERROR" and
              evs[0]["object"]["code"] == code and
              evs[0]["object"]["reason"] == reason, evs)
    st, _, b = f.req("POST", "/_fake/end_watches", {"mode": "x"},
                     token=None)
    check("end_watches: an unknown mode is 400", st == 400, b)

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


def unanswered(f, method, path, body=None, ctype=None):
    """Whether a request got its connection closed without an answer."""
    c = f.conn()
    h = {"Authorization": "Bearer " + TOKEN}
    if ctype:
        h["Content-Type"] = ctype
    c.request(method, path, body=body, headers=h)
    try:
        c.getresponse().read()
        return False
    except (http.client.HTTPException, OSError):
        return True
    finally:
        c.close()


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
    b = f.req("POST", AT, obj("AgentTask", "t429", spec=SPEC))
    c = f.req("POST", AT, obj("AgentTask", "t429", spec=SPEC))[0]
    check("fault restricted to a method: 429 TooManyRequests",
          a == 200 and b[0] == 429 and b[2]["reason"] == "TooManyRequests"
          and c == 201, (a, b[2], c))
    check("a 429 says Retry-After: 1 unless told, as a real apiserver's "
          "max-in-flight filter", b[1].getheader("Retry-After") == "1" and
          b[2].get("details") == {"retryAfterSeconds": 1},
          (b[1].getheader("Retry-After"), b[2].get("details")))
    f.req("POST", "/_fake/faults", {"status": 429, "count": 1,
                                    "retry_after": None}, token=None)
    b = f.req("GET", AT)
    check("a 429 with \"retry_after\": null has no Retry-After",
          b[0] == 429 and b[1].getheader("Retry-After") is None and
          "details" not in b[2], (b[0], b[1].getheader("Retry-After"), b[2]))
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
    check("request log", len(reqs) == 11 and first["method"] == "GET" and
          first["path"] == AT and first["authorization_present"] is True and
          reqs[5]["content_type"] == "application/json" and
          reqs[8]["query"] == "watch=true", reqs)
    codes = [r.get("code") for r in reqs]
    check("request log: the status each request was answered",
          codes == [503, 200, 503, 200, 200, 429, 201, 429, 500, 200, 200],
          codes)
    f.req("DELETE", "/_fake/requests", token=None)
    f.req("GET", AT, token=None)
    _, _, reqs = f.req("GET", "/_fake/requests", token=None)
    check("request log cleared; unauthenticated requests recorded",
          len(reqs) == 1 and reqs[0]["authorization_present"] is False and
          reqs[0]["code"] == 401, reqs)

    # a lost answer: the write happens, the client hears 504 or nothing
    f.req("POST", "/_fake/faults", {"status": 504, "after": True,
                                    "method": "POST"}, token=None)
    a = f.req("POST", AT, obj("AgentTask", "tafter", spec=SPEC))
    b = f.req("GET", AT + "/tafter")[0]
    check("fault after: the create happened, the answer is a 504 Status",
          a[0] == 504 and a[2]["reason"] == "Timeout" and b == 200,
          (a[0], a[2], b))
    f.req("POST", "/_fake/faults", {"close": True, "after": True,
                                    "method": "PATCH"}, token=None)
    closed = unanswered(f, "PATCH", AT + "/tafter", json.dumps(
        {"spec": {"objective": "patched"}}), "application/merge-patch+json")
    _, _, got = f.req("GET", AT + "/tafter")
    check("fault close after: the patch happened, the connection closed "
          "without an answer", closed and
          got["spec"]["objective"] == "patched", (closed, got))
    f.req("POST", "/_fake/faults", {"close": True, "method": "DELETE"},
          token=None)
    closed = unanswered(f, "DELETE", AT + "/tafter")
    check("fault close: the connection closed, nothing done",
          closed and f.req("GET", AT + "/tafter")[0] == 200, closed)
    st, _, b = f.req("POST", "/_fake/faults", {"count": 1}, token=None)
    check("a fault needs a status or close", st == 400, b)
    page = {"kind": "AgentTaskList", "apiVersion": "divergedev.com/v1alpha1",
            "metadata": {"resourceVersion": "1", "continue": "again"},
            "items": []}
    f.req("POST", "/_fake/faults", {"status": 200, "body": page,
                                    "match": "continue=again"}, token=None)
    a = f.req("GET", AT + "?limit=500&continue=again")
    b = f.req("GET", AT + "?limit=500&continue=again")[0]
    check("fault body: answered as given, once", a[0] == 200 and
          a[2] == page and b == 400, (a[0], a[2], b))
    line = '{"type":"ADDED","object":{"kind":"AgentTask"}}\n'
    f.req("POST", "/_fake/faults", {"status": 200, "body": line,
                                    "match": "watch=true"}, token=None)
    st, r, got = f.req("GET", AT + "?watch=true")
    check("fault body: a string is sent as it is", st == 200 and
          got == json.loads(line) and
          r.getheader("Content-Length") == str(len(line)), (st, got))


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


def invalid(name, causes, kind="AgentTask"):
    """The 422 Status a real apiserver answers for a CR failing its schema."""
    parts = [f"{f}: {m}" for (_, f, m) in causes]
    text = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    return {"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure",
            "message": f'{kind}.divergedev.com "{name}" is invalid: {text}',
            "reason": "Invalid", "details": {
                "name": name, "group": "divergedev.com", "kind": kind,
                "causes": [{"reason": r, "message": m, "field": f}
                           for (r, f, m) in causes]},
            "code": 422}


def t_schema(f):
    path = AT.replace("ns1", "schema")
    env = "/apis/divergedev.com/v1alpha1/namespaces/schema/environments"
    st, _, b = f.req("GET", "/_fake/state", token=None)
    check("schemas loaded for AgentTask and Environment",
          b.get("schemas") == ["AgentTask", "Environment"], b)

    st, _, b = f.req("POST", path, obj("AgentTask", "v1", spec={
        "maxIterations": 3}))
    check("missing spec.objective: 422 naming spec.objective", st == 422 and
          b == invalid("v1", [("FieldValueRequired", "spec.objective",
                               "Required value")]), b)
    st, _, b = f.req("POST", path, obj("AgentTask", "v1"))
    check("missing spec: 422 spec: Required value", st == 422 and
          b["message"] == 'AgentTask.divergedev.com "v1" is invalid: spec: '
          'Required value', b)
    st, _, b = f.req("POST", path, obj("AgentTask", "v1", spec={
        "objective": "x", "maxIterations": -1}))
    check("maxIterations -1: minimum 0", st == 422 and b == invalid("v1", [(
        "FieldValueInvalid", "spec.maxIterations",
        "Invalid value: -1: spec.maxIterations in body should be greater "
        "than or equal to 0")]), b)
    st, _, b = f.req("POST", path, obj("AgentTask", "v1", spec={
        "objective": "x", "budgetUSD": "five"}))
    check("budgetUSD \"five\" fails the pattern", st == 422 and
          b == invalid("v1", [(
              "FieldValueInvalid", "spec.budgetUSD",
              "Invalid value: \"five\": spec.budgetUSD in body should match "
              "'^[0-9]+(\\.[0-9]{1,6})?$'")]), b)
    st, _, b = f.req("POST", path, obj("AgentTask", "v1", spec={
        "objective": "x", "budgetUSD": "5\n"}))
    check("patterns match like RE2: $ is the very end", st == 422 and
          b["details"]["causes"][0]["field"] == "spec.budgetUSD", b)
    st, _, b = f.req("POST", path, obj("AgentTask", "v1", spec={
        "objective": "x" * 4001, "maxIterations": "string",
        "capabilities": ["a", 7], "sandbox": {"provider": "docker",
                                              "timeoutSeconds": 0}}))
    check("several causes: joined in [...], apiserver wording",
          st == 422 and b == invalid("v1", [
              ("FieldValueTooLong", "spec.objective",
               "Too long: may not be more than 4000 bytes"),
              ("FieldValueTypeInvalid", "spec.maxIterations",
               "Invalid value: \"string\": spec.maxIterations in body must "
               "be of type integer: \"string\""),
              ("FieldValueTypeInvalid", "spec.capabilities[1]",
               "Invalid value: \"integer\": spec.capabilities[1] in body "
               "must be of type string: \"integer\""),
              ("FieldValueNotSupported", "spec.sandbox.provider",
               "Unsupported value: \"docker\": supported values: "
               "\"agent-sandbox\""),
              ("FieldValueInvalid", "spec.sandbox.timeoutSeconds",
               "Invalid value: 0: spec.sandbox.timeoutSeconds in body should "
               "be greater than or equal to 1")]), b)
    st, _, b = f.req("POST", path, obj("AgentTask", "v1", spec={
        "objective": "é" * 4000}))
    check("maxLength counts characters, not bytes", st == 201, b)
    st, _, b = f.req("POST", path, {"apiVersion": "divergedev.com/v1alpha1",
                                    "kind": "AgentTask", "spec": {}})
    check("metadata and schema causes in one 422", st == 422 and
          [c["field"] for c in b["details"]["causes"]] ==
          ["metadata.name", "spec.objective"], b)

    body = obj("AgentTask", "v2", spec={"objective": "x", "foo": 1,
                                        "maxIterations": None,
                                        "repository": {"url": "u", "bar": 2}},
               status={"junk": True})
    st, r, b = f.req("POST", path, body)
    check("unknown fields pruned by default, with Warning headers",
          st == 201 and b["spec"] == {"objective": "x",
                                      "repository": {"url": "u"}} and
          r.msg.get_all("Warning") == [
              '299 - "unknown field \\"spec.foo\\""',
              '299 - "unknown field \\"spec.repository.bar\\""',
              '299 - "unknown field \\"status.junk\\""'],
          (b, r.msg.get_all("Warning")))
    body["metadata"]["name"] = "v3"
    body["metadata"]["bogus"] = "x"
    st, _, b = f.req("POST", path + "?fieldValidation=Strict", body)
    check("fieldValidation=Strict: unknown fields are a 400 BadRequest",
          st == 400 and b == {
              "kind": "Status", "apiVersion": "v1", "metadata": {},
              "status": "Failure",
              "message": 'AgentTask in version "v1alpha1" cannot be handled '
                         'as a AgentTask: strict decoding error: unknown '
                         'field "metadata.bogus", unknown field "spec.foo", '
                         'unknown field "spec.repository.bar", unknown field'
                         ' "status.junk"',
              "reason": "BadRequest", "code": 400} and
          f.req("GET", path + "/v3")[0] == 404, b)
    st, r, b = f.req("POST", path + "?fieldValidation=Ignore", body)
    check("fieldValidation=Ignore: pruned, no warning", st == 201 and
          "bogus" not in b["metadata"] and "foo" not in b["spec"] and
          r.getheader("Warning") is None, b)
    st, _, b = f.req("PATCH", path + "/v2?fieldValidation=Strict",
                     {"spec": {"nope": 1}}, MERGE)
    check("Strict patch: 400 strict decoding error: unknown field", st == 400
          and b["message"] == 'strict decoding error: unknown field '
          '"spec.nope"', b)
    st, _, b = f.req("POST", path + "?fieldValidation=strict",
                     obj("AgentTask", "v4", spec=SPEC))
    check("fieldValidation is case-sensitive: 422 CreateOptions",
          st == 422 and b["message"] ==
          'CreateOptions.meta.k8s.io "" is invalid: fieldValidation: '
          'Unsupported value: "strict": supported values: "", "Ignore", '
          '"Strict", "Warn"' and b["details"]["kind"] == "CreateOptions", b)

    st, _, b = f.req("PATCH", path + "/v2/status", {"status": {
        "phase": "Active", "iteration": 2, "costUSD": "0.125",
        "startedAt": "2026-01-02T03:04:05Z",
        "conditions": [{"type": "Ready", "status": "True"}],
        "notifier": {"commentId": "123"}}}, MERGE)
    check("a valid status patch passes", st == 200 and
          b["status"]["phase"] == "Active" and
          b["status"]["notifier"] == {"commentId": "123"}, b)
    rv = b.get("metadata", {}).get("resourceVersion")
    good = b.get("status")
    st, _, b = f.req("PATCH", path + "/v2/status", {"status": {
        "phase": "Running"}}, MERGE)
    check("an invalid status.phase: 422 Unsupported value", st == 422 and
          b == invalid("v2", [(
              "FieldValueNotSupported", "status.phase",
              "Unsupported value: \"Running\": supported values: "
              "\"Pending\", \"Provisioning\", \"Active\", \"Pausing\", "
              "\"Paused\", \"Completed\", \"Failed\"")]) and
          f.req("GET", path + "/v2")[2]["metadata"]["resourceVersion"] == rv,
          b)
    st, _, b = f.req("PATCH", path + "/v2/status", {"status": {
        "startedAt": "yesterday", "notifier": {"commentId": True},
        "lastMeterRequestIds": ["r"] * 33,
        "conditions": [{"type": "Ready"}]}}, MERGE)
    check("status: date-time, int-or-string, maxItems, required in items",
          st == 422 and [(c["reason"], c["field"])
                         for c in b["details"]["causes"]] == [
              ("FieldValueRequired", "status.conditions[0].status"),
              ("FieldValueTooMany", "status.lastMeterRequestIds"),
              ("FieldValueTypeInvalid", "status.startedAt"),
              ("FieldValueTypeInvalid", "status.notifier.commentId")] and
          b["details"]["causes"][1]["message"] ==
          "Too many: 33: must have at most 32 items", b)
    body = f.req("GET", path + "/v2")[2]
    body["status"]["iteration"] = -5
    st, _, b = f.req("PUT", path + "/v2/status", body)
    check("PUT /status is validated too", st == 422 and
          b["details"]["causes"][0]["field"] == "status.iteration", b)
    body = f.req("GET", path + "/v2")[2]
    body["status"]["phase"] = "Bogus"           # ignored on the main resource
    body["spec"]["budgetTokens"] = 1.5
    st, _, b = f.req("PUT", path + "/v2", body)
    check("PUT: spec validated, status of the body ignored", st == 422 and
          [c["field"] for c in b["details"]["causes"]] ==
          ["spec.budgetTokens"], b)
    st, _, b = f.req("PATCH", path + "/v2", [
        {"op": "replace", "path": "/spec/objective", "value": ""}], JSONP)
    check("json patch result validated: minLength", st == 422 and
          b["details"]["causes"][0]["message"] == "Invalid value: \"\": "
          "spec.objective in body should be at least 1 chars long", b)
    st, _, b = f.req("PATCH", path + "/v2", {"spec": {"maxIterations": 4.0,
                                                      "budgetTokens": 10}},
                     MERGE)
    check("a float with an integral value is an integer", st == 200 and
          b["spec"]["maxIterations"] == 4, b)
    check("rejected status writes left .status alone",
          f.req("GET", path + "/v2")[2].get("status") == good, good)

    st, _, b = f.req("POST", env, obj("Environment", "e1", spec={
        "branch": "b", "port": 70000}))
    check("Environment: spec.port maximum", st == 422 and b == invalid(
        "e1", [("FieldValueInvalid", "spec.port",
                "Invalid value: 70000: spec.port in body should be less than "
                "or equal to 65535")], "Environment"), b)
    st, _, b = f.req("POST", env, obj("Environment", "e1", spec={
        "branch": "b", "port": 8080}))
    st2, _, b2 = f.req("PATCH", env + "/e1/status", {"status": {
        "url": "https://x", "deep": {"anything": [1, "a"]}}}, MERGE)
    check("Environment: preserve-unknown-fields status kept as sent",
          st == 201 and st2 == 200 and b2["status"] == {
              "url": "https://x", "deep": {"anything": [1, "a"]}}, b2)
    st, _, b = f.req("PATCH", env + "/e1/status", {"status": "up"}, MERGE)
    check("Environment: status must still be an object", st == 422 and
          b["details"]["causes"][0]["message"] == "Invalid value: "
          "\"string\": status in body must be of type object: \"string\"", b)


def t_no_schemas():
    g = Fake("--plain-http", "--crd-dir", "/nonexistent/crds")
    try:
        st, _, b = g.req("POST", AT, obj("AgentTask", "x", spec={
            "maxIterations": -1, "whatever": 1}), token=None)
        state = g.req("GET", "/_fake/state", token=None)[2]
        err = g.stderr()
        check("no CRD files: warning on stderr, no validation, no pruning",
              st == 201 and b["spec"]["whatever"] == 1 and
              state["schemas"] == [] and
              "warning: /nonexistent/crds/divergedev.com_agenttasks.yaml not "
              "found; no schema validation for it" in err, (st, b, err))
    finally:
        g.stop()


RBAC_YAML = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: reader}
rules:
  - apiGroups: ["divergedev.com"]
    resources: ["agenttasks"]
    verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole,
          name: reader}
subjects: [{kind: ServiceAccount, name: bot, namespace: sys}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: status-writer, namespace: ns1}
rules:
  - apiGroups: ["divergedev.com"]
    resources: ["agenttasks/status"]
    verbs: ["update"]
  - apiGroups: [""]
    resources: ["secrets"]
    resourceNames: ["only-this"]
    verbs: ["get"]
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["create"]
  - apiGroups: ["divergedev.com"]
    resources: ["agenttasks/finalizers"]
    resourceNames: ["t1"]
    verbs: ["update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: status-writer, namespace: ns1}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role,
          name: status-writer}
subjects: [{kind: ServiceAccount, name: bot, namespace: sys}]
"""


def t_rbac(d):
    """--rbac: the token is held to RBAC objects, as the RBAC authorizer
    does it; --admin-token is not."""
    path = os.path.join(d, "rbac.yaml")
    with open(path, "w") as fh:
        fh.write(RBAC_YAML)
    f = Fake("--token", TOKEN, "--admin-token", "adm", "--rbac", path,
             "--rbac-user", "system:serviceaccount:sys:bot", "--plain-http")
    try:
        st, _, o = f.req("POST", AT, obj("AgentTask", "t1", spec=SPEC),
                         token="adm")
        check("rbac: the admin token creates", st == 201, o)
        st, _, o = f.req("GET", AT + "/t1")
        check("rbac: a ClusterRoleBinding grants get", st == 200, o)
        st, _, o = f.req("GET", AT_ALL)
        check("rbac: ... and list at the cluster scope", st == 200, o)
        st, _, o = f.req("POST", AT, obj("AgentTask", "t2", spec=SPEC))
        check("rbac: create is not granted: 403 Forbidden, the apiserver's "
              "message", st == 403 and o.get("reason") == "Forbidden" and
              o.get("code") == 403 and o.get("message") ==
              'agenttasks.divergedev.com is forbidden: User "system:'
              'serviceaccount:sys:bot" cannot create resource "agenttasks" '
              'in API group "divergedev.com" in the namespace "ns1"' and
              o.get("details") == {"kind": "agenttasks",
                                   "group": "divergedev.com"}, o)
        st, _, o = f.req("PATCH", AT + "/t1", {"spec": {"suspended": True}},
                         ctype=MERGE)
        check("rbac: patch of the object is not granted", st == 403 and
              'cannot patch resource "agenttasks"' in o.get("message", ""),
              o)
        _, _, cur = f.req("GET", AT + "/t1")
        cur["status"] = {"phase": "Pending"}
        st, _, o = f.req("PUT", AT + "/t1/status", cur)
        check("rbac: a RoleBinding's Role grants agenttasks/status in its "
              "namespace", st == 200, o)
        st, _, o = f.req("PUT", AT + "/t1", cur)
        check("rbac: the subresource's grant is not the object's",
              st == 403 and 'agenttasks.divergedev.com "t1" is forbidden'
              in o.get("message", ""), o)
        f.req("POST", "/apis/divergedev.com/v1alpha1/namespaces/ns2/"
              "agenttasks", obj("AgentTask", "t3", spec=SPEC), token="adm")
        _, _, cur = f.req("GET", "/apis/divergedev.com/v1alpha1/namespaces/"
                          "ns2/agenttasks/t3")
        st, _, o = f.req("PUT", "/apis/divergedev.com/v1alpha1/namespaces/"
                         "ns2/agenttasks/t3/status", cur)
        check("rbac: ... and nowhere else", st == 403 and
              'in the namespace "ns2"' in o.get("message", ""), o)
        for name in ("only-this", "other"):
            f.req("POST", SEC, {"apiVersion": "v1", "kind": "Secret",
                                "metadata": {"name": name}}, token="adm")
        a, _, _ = f.req("GET", SEC + "/only-this")
        b, _, o = f.req("GET", SEC + "/other")
        c, _, _ = f.req("GET", SEC)
        check("rbac: resourceNames limit a rule to the objects named",
              (a, b, c) == (200, 403, 403), (a, b, c, o))
        w = f.watch(AT + "?watch=1")
        check("rbac: watch is its own verb, granted here", w.status == 200)
        w.close()
        st, _, o = f.req("DELETE", AT)
        check("rbac: deletecollection is its own verb", st == 403 and
              "cannot deletecollection" in o.get("message", ""), o)
        st, _, o = f.req("GET", AT + "/t1", token="wrong")
        check("rbac: an unknown token is still 401", st == 401, o)

        def child(name, owner, block):
            ref = {"apiVersion": "divergedev.com/v1alpha1",
                   "kind": "AgentTask", "name": owner, "uid": "u-" + owner}
            if block:
                ref["blockOwnerDeletion"] = True
            return f.req("POST", SEC, {
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "ownerReferences": [ref]}})
        a, _, _ = child("c1", "t1", True)
        b, _, o = child("c2", "t9", True)
        c, _, _ = child("c3", "t9", False)
        check("rbac: blockOwnerDeletion needs update on the owner's "
              "finalizers (OwnerReferencesPermissionEnforcement)",
              (a, b, c) == (201, 403, 201) and o.get("message") ==
              'secrets "c2" is forbidden: cannot set blockOwnerDeletion if '
              "an ownerReference refers to a resource you can't set "
              "finalizers on: , <nil>", (a, b, c, o))
        _, _, log = f.req("GET", "/_fake/requests", token=None)
        denied = [r for r in log if r.get("forbidden")]
        check("rbac: the request log marks who asked and what was refused",
              len(denied) == 8 and all(r["user"] ==
                                       "system:serviceaccount:sys:bot"
                                       for r in denied) and
              any(r["user"] == "admin" for r in log),
              [(r["method"], r["path"], r["user"]) for r in denied])
    finally:
        f.stop()
    bad = os.path.join(d, "bad.yaml")
    with open(bad, "w") as fh:
        fh.write("kind: ClusterRoleBinding\nmetadata: {name: x}\n")
    p = subprocess.run([sys.executable, FAKE, "--port", "0", "--token",
                        TOKEN, "--rbac", bad], capture_output=True,
                       text=True, timeout=30, stdin=subprocess.DEVNULL)
    check("rbac: a binding without a roleRef stops the start, saying so",
          p.returncode == 1 and "--rbac" in p.stderr, p.stderr)


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
                         ("chunks", t_chunks),
                         ("put", t_put), ("status", t_status),
                         ("merge patch", t_merge_patch),
                         ("json patch", t_json_patch),
                         ("builtins", t_builtins), ("leases", t_leases),
                         ("delete", t_delete),
                         ("watch", t_watch), ("faults", t_faults),
                         ("schema", t_schema)]:
            run(name, fn, f)
        run("no schemas", t_no_schemas)
        run("rbac", t_rbac, d)
        run("lease rbac", t_lease_rbac, d)
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
