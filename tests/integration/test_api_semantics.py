"""Kubernetes API semantics of the embedded store served over HTTP
(src/k8s/apiserver.c) that kubectl does not exercise but client-go
does, checked with plain HTTP requests on loopback; no kubectl needed.
The server is the one of test_kubectl.py (diverged --api-listen)."""

import json
import time
import urllib.error
import urllib.parse
import urllib.request

from divtest import run_tests
from test_kubectl import ApiServer

TASKS = "/apis/divergedev.com/v1alpha1/namespaces/sem/agenttasks"


def call(srv, method, path, body=None, ctype="application/json"):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(srv.url + path, method=method, data=data,
                                 headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            text = r.read()
            try:
                return r.status, json.loads(text or b"{}")
            except ValueError:          # a watch stream
                return r.status, {"text": text.decode()}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def task(name):
    return {"apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": name}, "spec": {"objective": "x"}}


def watch_events(srv, query, until, limit_s=20):
    """The events of a watch on TASKS with query (a dict), read until
    until(event) is true or limit_s passes; then closed."""
    url = srv.url + TASKS + "?" + urllib.parse.urlencode(
        dict(query, watch="true"))
    out = []
    end = time.time() + limit_s
    with urllib.request.urlopen(url, timeout=limit_s) as r:
        while time.time() < end:
            line = r.readline()
            if not line:
                break
            ev = json.loads(line)
            out.append(ev)
            if until(ev):
                break
    return out


def initial_end(ev):
    return ev["type"] == "BOOKMARK" and (
        ev["object"]["metadata"].get("annotations") or {}).get(
            "k8s.io/initial-events-end") == "true"


def watch_list(t, srv):
    """sendInitialEvents=true (client-go's WatchListClient, the streaming
    list): one ADDED per object, then a BOOKMARK annotated
    k8s.io/initial-events-end, then the changes; also from an explicit
    resourceVersion (NotOlderThan). Without the bookmark a reflector
    waits for it until its watch times out."""
    for n in ("wl-a", "wl-b"):
        t.eq(call(srv, "POST", TASKS, task(n))[0], 201, "create " + n)
    _, lst = call(srv, "GET", TASKS)
    rv = lst["metadata"]["resourceVersion"]
    for start in ("", rv):
        q = {"sendInitialEvents": "true",
             "resourceVersionMatch": "NotOlderThan",
             "allowWatchBookmarks": "true", "timeoutSeconds": "30"}
        if start:
            q["resourceVersion"] = start
        evs = watch_events(srv, q, initial_end)
        names = sorted(e["object"]["metadata"]["name"] for e in evs
                       if e["type"] == "ADDED")
        t.eq(names, ["wl-a", "wl-b"],
             "sendInitialEvents (resourceVersion %r): an ADDED for each "
             "object" % start)
        t.ok(evs and initial_end(evs[-1]) and int(
            evs[-1]["object"]["metadata"]["resourceVersion"]) >= int(rv),
             "then the initial-events-end BOOKMARK at the list's version",
             evs[-1:] if evs else evs)
    # the apiserver's validation of the watch-list options: 422 Invalid
    for q, what in (
            ({"sendInitialEvents": "true", "allowWatchBookmarks": "true"},
             "without resourceVersionMatch=NotOlderThan"),
            ({"sendInitialEvents": "true",
              "resourceVersionMatch": "NotOlderThan"},
             "without allowWatchBookmarks"),
            ({"resourceVersionMatch": "NotOlderThan",
              "allowWatchBookmarks": "true"},
             "resourceVersionMatch without sendInitialEvents")):
        code, body = call(srv, "GET", TASKS + "?" + urllib.parse.urlencode(
            dict(q, watch="true", timeoutSeconds="1")))
        t.ok(code == 422 and body.get("reason") == "Invalid",
             "a watch %s: 422 Invalid" % what, (code, body))


def list_versions(t, srv):
    """resourceVersion and resourceVersionMatch on a list, as the
    apiserver has them: Exact is the state at exactly that version (one
    this store no longer has is 410 Expired, a relist; never the newest
    state in its place); the combinations ValidateListOptions forbids
    are 422 Invalid."""
    t.eq(call(srv, "POST", TASKS, task("lv-a"))[0], 201, "create lv-a")
    _, lst = call(srv, "GET", TASKS)
    old = lst["metadata"]["resourceVersion"]
    t.eq(call(srv, "POST", TASKS, task("lv-b"))[0], 201, "create lv-b")
    _, lst = call(srv, "GET", TASKS)
    now = lst["metadata"]["resourceVersion"]
    code, body = call(srv, "GET", TASKS + "?resourceVersion=%s&"
                      "resourceVersionMatch=Exact" % now)
    t.ok(code == 200 and body["metadata"]["resourceVersion"] == now,
         "Exact at the newest version: that list", (code, body.get(
             "metadata")))
    code, body = call(srv, "GET", TASKS + "?resourceVersion=%s&"
                      "resourceVersionMatch=Exact" % old)
    t.ok(code == 410 and body.get("reason") == "Expired",
         "Exact at an older version the store cannot give: 410 Expired",
         (code, body.get("metadata"), body.get("message")))
    code, body = call(srv, "GET", TASKS + "?resourceVersion=%s&"
                      "resourceVersionMatch=NotOlderThan" % old)
    t.ok(code == 200 and int(body["metadata"]["resourceVersion"]) >=
         int(old), "NotOlderThan an older version: the newest list",
         (code, body.get("metadata")))
    for q, what in (("resourceVersionMatch=NotOlderThan",
                     "resourceVersionMatch without resourceVersion"),
                    ("resourceVersion=0&resourceVersionMatch=Exact",
                     "Exact with resourceVersion 0"),
                    ("resourceVersion=%s&resourceVersionMatch=Newest" % now,
                     "an unknown resourceVersionMatch")):
        code, body = call(srv, "GET", TASKS + "?" + q)
        t.ok(code == 422 and body.get("reason") == "Invalid",
             "a list with %s: 422 Invalid" % what, (code, body.get(
                 "message")))


def dry_run(t, srv):
    """dryRun=All (kubectl --dry-run=server): the write is checked and
    answered as it would be, and nothing is kept: no object, no change,
    no new resourceVersion. kubectl delete sends it in DeleteOptions, in
    the body: that DELETE deleted the object."""
    t.eq(call(srv, "POST", TASKS, task("dr-a"))[0], 201, "create dr-a")
    rv = call(srv, "GET", TASKS)[1]["metadata"]["resourceVersion"]
    code, body = call(srv, "POST", TASKS + "?dryRun=All", task("dr-b"))
    t.ok(code == 201 and body["metadata"]["name"] == "dr-b" and
         "resourceVersion" not in body["metadata"],
         "a dry-run create answers the object, without resourceVersion",
         (code, body))
    t.eq(call(srv, "GET", TASKS + "/dr-b")[0], 404, "and creates nothing")
    bad = task("dr-c")
    bad["spec"] = {}
    t.eq(call(srv, "POST", TASKS + "?dryRun=All", bad)[0], 422,
         "a dry-run create of an invalid object: 422")
    code, body = call(srv, "PATCH", TASKS + "/dr-a?dryRun=All",
                      {"spec": {"objective": "dry"}},
                      "application/merge-patch+json")
    t.ok(code == 200 and body["spec"]["objective"] == "dry" and
         body["metadata"]["generation"] == 2,
         "a dry-run patch answers the patched object", (code, body))
    t.eq(call(srv, "GET", TASKS + "/dr-a")[1]["spec"]["objective"], "x",
         "and changes nothing")
    opts = {"kind": "DeleteOptions", "apiVersion": "v1",
            "propagationPolicy": "Background", "dryRun": ["All"]}
    code, body = call(srv, "DELETE", TASKS + "/dr-a", opts)
    t.ok(code == 200 and body.get("metadata", {}).get("name") == "dr-a",
         "DELETE with dryRun in DeleteOptions answers the object",
         (code, body))
    t.eq(call(srv, "GET", TASKS + "/dr-a")[0], 200, "dr-a is still there")
    call(srv, "DELETE", TASKS, opts)
    t.eq(call(srv, "GET", TASKS + "/dr-a")[0], 200,
         "and after a deletecollection with dryRun in DeleteOptions")
    t.eq(call(srv, "GET", TASKS)[1]["metadata"]["resourceVersion"], rv,
         "no dry run made a new resourceVersion")
    t.eq(call(srv, "POST", TASKS + "?dryRun=Some", task("dr-d"))[0], 400,
         "dryRun other than All: 400")


def immutable_meta(t, srv):
    """ValidateObjectMetaUpdate: metadata.uid cannot change (an update
    naming another object's uid is a 422, not silently applied to this
    one), and no finalizer can be added to an object being deleted."""
    t.eq(call(srv, "POST", TASKS, task("im-a"))[0], 201, "create im-a")
    code, cur = call(srv, "GET", TASKS + "/im-a")
    cur["metadata"]["uid"] = "00000000-0000-4000-8000-000000000000"
    cur["spec"]["objective"] = "changed"
    code, body = call(srv, "PUT", TASKS + "/im-a", cur)
    t.ok(code == 422 and "metadata.uid" in body.get("message", ""),
         "a PUT with another uid: 422 on metadata.uid", (code, body))
    t.eq(call(srv, "GET", TASKS + "/im-a")[1]["spec"]["objective"], "x",
         "and nothing changed")
    fin = task("im-f")
    fin["metadata"]["finalizers"] = ["example.com/hold"]
    t.eq(call(srv, "POST", TASKS, fin)[0], 201, "create im-f")
    t.eq(call(srv, "DELETE", TASKS + "/im-f")[0], 200, "delete im-f")
    code, body = call(srv, "PATCH", TASKS + "/im-f", {"metadata": {
        "finalizers": ["example.com/hold", "example.com/more"]}},
                      "application/merge-patch+json")
    t.ok(code == 422 and "metadata.finalizers" in body.get("message", "")
         and "no new finalizers" in body.get("message", ""),
         "a finalizer added while being deleted: 422", (code, body))
    code, body = call(srv, "PATCH", TASKS + "/im-f", {"metadata": {
        "finalizers": None}}, "application/merge-patch+json")
    t.eq(code, 200, "removing the finalizers is fine")
    t.eq(call(srv, "GET", TASKS + "/im-f")[0], 404, "and ends the deletion")


def main(t):
    srv = ApiServer()
    try:
        if srv.start() is None:
            t.skip_all("diverged --api-listen is not available")
        watch_list(t, srv)
        list_versions(t, srv)
        dry_run(t, srv)
        immutable_meta(t, srv)
        t.eq(srv.stop(), 0, "the server stops cleanly on SIGTERM")
    finally:
        srv.cleanup()


if __name__ == "__main__":
    run_tests(main)
