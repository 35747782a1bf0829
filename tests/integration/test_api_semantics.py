"""Kubernetes API semantics of the embedded store served over HTTP
(src/k8s/apiserver.c) that kubectl does not exercise but client-go
does, checked with plain HTTP requests on loopback; no kubectl needed.
The server is the one of test_kubectl.py (diverged --api-listen)."""

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

from divtest import run_tests
from test_kubectl import ApiServer

TASKS = "/apis/divergedev.com/v1alpha1/namespaces/sem/agenttasks"
SECRETS = "/api/v1/namespaces/sem/secrets"
SANDBOXES = "/apis/agents.x-k8s.io/v1beta1/namespaces/sem/sandboxes"

# The Accept headers of client-go's metadata client (metadata.go), which
# controller-runtime's metadata client and informers use: Get, Patch and
# Watch ask for PartialObjectMetadata, List for the List; protobuf first.
META_GET = ("application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;"
            "g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;"
            "g=meta.k8s.io;v=v1,application/json")
META_LIST = META_GET.replace("PartialObjectMetadata",
                             "PartialObjectMetadataList")
META_WATCH = META_GET


def call(srv, method, path, body=None, ctype="application/json",
         accept=None):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": ctype}
    if accept is not None:
        headers["Accept"] = accept
    req = urllib.request.Request(srv.url + path, method=method, data=data,
                                 headers=headers)
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


def watch_events(srv, query, until, limit_s=20, accept=None, then=None):
    """The events of a watch on TASKS with query (a dict), read until
    until(event) is true or limit_s passes; then closed. then(), when
    given, runs once the stream is open (to make the change to see)."""
    url = srv.url + TASKS + "?" + urllib.parse.urlencode(
        dict(query, watch="true"))
    req = urllib.request.Request(
        url, headers={"Accept": accept} if accept is not None else {})
    out = []
    end = time.time() + limit_s
    with urllib.request.urlopen(req, timeout=limit_s) as r:
        if then is not None:
            then()
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


def is_partial(obj, av="meta.k8s.io/v1"):
    """obj is a PartialObjectMetadata: kind, apiVersion, metadata only."""
    return (isinstance(obj, dict) and obj.get("kind") ==
            "PartialObjectMetadata" and obj.get("apiVersion") == av and
            sorted(obj) == ["apiVersion", "kind", "metadata"])


def metadata_only(t, srv):
    """Accept as=PartialObjectMetadata(List);g=meta.k8s.io;v=v1, what
    controller-runtime's metadata client and informers send: the reply is
    the object's metadata under kind PartialObjectMetadata (apiVersion
    meta.k8s.io/v1), a list is a PartialObjectMetadataList with the
    list's resourceVersion and continue, paged and selected as the full
    list is, and a watch sends each object as its PartialObjectMetadata.
    The full objects (a Secret's data, a task's spec) stay on the server.
    Before, every Accept got the full object under its own kind."""
    for n, team in (("pm-a", "x"), ("pm-b", "x"), ("pm-c", "y"),
                    ("pm-d", "x")):
        body = task(n)
        body["metadata"]["labels"] = {"team": team}
        t.eq(call(srv, "POST", TASKS, body)[0], 201, "create " + n)
    sec = {"apiVersion": "v1", "kind": "Secret",
           "metadata": {"name": "pm-s", "labels": {"team": "x"}},
           "data": {"token": "c2VjcmV0"}}
    t.eq(call(srv, "POST", SECRETS, sec)[0], 201, "create secret pm-s")

    _, full = call(srv, "GET", TASKS + "/pm-a")
    code, body = call(srv, "GET", TASKS + "/pm-a", accept=META_GET)
    t.ok(code == 200 and is_partial(body) and
         body["metadata"] == full["metadata"],
         "GET with client-go's metadata Accept: a PartialObjectMetadata "
         "with the object's whole metadata and nothing else", (code, body))
    _, full = call(srv, "GET", SECRETS + "/pm-s")
    code, body = call(srv, "GET", SECRETS + "/pm-s", accept=META_GET)
    t.ok(code == 200 and is_partial(body) and
         body["metadata"] == full["metadata"],
         "a Secret's metadata comes without its data", (code, body))
    code, body = call(srv, "GET", TASKS + "/pm-a", accept=(
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;"
        "v=v1beta1"))
    t.ok(code == 200 and is_partial(body, "meta.k8s.io/v1beta1"),
         "v=v1beta1: a meta.k8s.io/v1beta1 PartialObjectMetadata",
         (code, body))
    code, body = call(srv, "PATCH", TASKS + "/pm-a", {"metadata": {
        "annotations": {"seen": "1"}}}, "application/merge-patch+json",
        accept=META_GET)
    t.ok(code == 200 and is_partial(body) and
         body["metadata"]["annotations"] == {"seen": "1"},
         "a PATCH from the metadata client is answered with the patched "
         "object's PartialObjectMetadata", (code, body))

    # the list, page by page (limit and continue), with a label selector
    sel = urllib.parse.urlencode({"labelSelector": "team=x"})
    _, full = call(srv, "GET", TASKS + "?" + sel)
    want = sorted(i["metadata"]["name"] for i in full["items"])
    t.eq(want, ["pm-a", "pm-b", "pm-d"], "the full list, team=x")
    names, pages, cont, bad = [], 0, "", []
    while pages < 10:
        q = sel + "&limit=1" + ("&continue=" + urllib.parse.quote(cont)
                                if cont else "")
        code, page = call(srv, "GET", TASKS + "?" + q, accept=META_LIST)
        pages += 1
        if (code != 200 or page.get("kind") != "PartialObjectMetadataList"
                or page.get("apiVersion") != "meta.k8s.io/v1" or
                not all(is_partial(i) for i in page.get("items", []))):
            bad.append((code, page))
            break
        if pages == 1:
            t.ok(page["metadata"].get("resourceVersion") ==
                 full["metadata"]["resourceVersion"] and
                 "continue" in page["metadata"],
                 "the PartialObjectMetadataList carries the list's "
                 "resourceVersion and continue", page["metadata"])
        names += [i["metadata"]["name"] for i in page["items"]]
        cont = page["metadata"].get("continue") or ""
        if not cont:
            break
    t.ok(not bad, "LIST with client-go's metadata Accept: a "
         "PartialObjectMetadataList (meta.k8s.io/v1) of "
         "PartialObjectMetadata items", bad)
    # the store does not apply limit (legal: one page, empty continue);
    # the loop follows continue all the same should it ever page
    t.eq(sorted(names), want, "listed with limit=1 (following continue) "
         "and the label selector: the same objects as the full list")
    code, body = call(srv, "GET", SECRETS + "?" + sel, accept=META_LIST)
    t.ok(code == 200 and [i["metadata"]["name"] for i in body["items"]]
         == ["pm-s"] and all(is_partial(i) for i in body["items"]),
         "a list of Secrets as metadata: no data", (code, body))

    # the watch: client-go sends the PartialObjectMetadata form
    rv = full["metadata"]["resourceVersion"]

    def change():
        call(srv, "PATCH", TASKS + "/pm-b", {"metadata": {"labels": {
            "phase": "w"}}}, "application/merge-patch+json")

    evs = watch_events(srv, {"resourceVersion": rv, "timeoutSeconds": "20",
                             "allowWatchBookmarks": "true"},
                       lambda e: e["type"] == "MODIFIED", accept=META_WATCH,
                       then=change)
    mod = [e for e in evs if e["type"] == "MODIFIED"]
    t.ok(len(mod) == 1 and is_partial(mod[0]["object"]) and
         mod[0]["object"]["metadata"]["name"] == "pm-b" and
         mod[0]["object"]["metadata"]["labels"].get("phase") == "w",
         "WATCH with client-go's metadata Accept: the MODIFIED event's "
         "object is the PartialObjectMetadata", evs)
    evs = watch_events(srv, {"resourceVersion": "0", "timeoutSeconds": "20",
                             "labelSelector": "team=y"},
                       lambda e: e["type"] == "ADDED", accept=META_WATCH)
    t.ok(len(evs) == 1 and is_partial(evs[0]["object"]) and
         evs[0]["object"]["metadata"]["name"] == "pm-c",
         "and so is the synthetic ADDED of a watch from resourceVersion 0",
         evs)
    evs = watch_events(srv, {"sendInitialEvents": "true",
                             "resourceVersionMatch": "NotOlderThan",
                             "allowWatchBookmarks": "true",
                             "labelSelector": "team=y",
                             "timeoutSeconds": "20"},
                       initial_end, accept=META_WATCH)
    t.ok([e["type"] for e in evs] == ["ADDED", "BOOKMARK"] and
         all(is_partial(e["object"]) for e in evs),
         "and the BOOKMARK too: the metadata client decodes nothing but "
         "the meta.k8s.io kinds", evs)


def not_acceptable(t, srv):
    """An Accept header none of whose media ranges this server can write
    (only protobuf, a conversion it does not know) is answered 406
    NotAcceptable with a Status, before anything is read or written; a
    list asked for as PartialObjectMetadata, or an object as the List,
    is a 406 too, as the apiserver has it. Before, these all got 200 and
    the full JSON object (and the create was made)."""
    t.eq(call(srv, "POST", TASKS, task("na-a"))[0], 201, "create na-a")
    for accept, what in (
            ("application/vnd.kubernetes.protobuf", "only protobuf"),
            ("application/json;as=Table;g=meta.k8s.io;v=v2",
             "a Table of an unknown version"),
            ("application/json;as=Foo;g=meta.k8s.io;v=v1,text/html",
             "an unknown conversion, then HTML")):
        for method, path in (("GET", TASKS + "/na-a"), ("GET", TASKS)):
            code, body = call(srv, method, path, accept=accept)
            t.ok(code == 406 and body.get("kind") == "Status" and
                 body.get("reason") == "NotAcceptable" and
                 body.get("code") == 406 and
                 "application/json" in body.get("message", ""),
                 "%s %s with %s: 406 NotAcceptable naming what can be "
                 "served" % (method, "object" if "na-a" in path else
                             "list", what), (code, body))
    code, body = call(srv, "POST", TASKS, task("na-b"),
                      accept="application/vnd.kubernetes.protobuf")
    t.ok(code == 406 and call(srv, "GET", TASKS + "/na-b")[0] == 404,
         "a create that could not be answered is not made", (code, body))
    code, body = call(srv, "GET", TASKS + "?watch=true&timeoutSeconds=1",
                      accept="application/vnd.kubernetes.protobuf")
    t.eq(code, 406, "a watch with only protobuf: 406")
    code, body = call(srv, "GET", TASKS, accept=(
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"))
    t.ok(code == 406 and body.get("reason") == "NotAcceptable",
         "a list asked for as PartialObjectMetadata: 406", (code, body))
    code, body = call(srv, "GET", TASKS + "/na-a", accept=META_LIST)
    t.ok(code == 406 and body.get("reason") == "NotAcceptable",
         "an object asked for as PartialObjectMetadataList first: 406, "
         "not the JSON after it", (code, body))
    code, body = call(srv, "GET", TASKS + "/nope", accept=META_LIST)
    t.eq(code, 404, "but a missing object is still 404")


def preference(t, srv):
    """Accept media ranges are taken by preference: q first, then the
    order given; the first one the server can write wins. kubectl get's
    Table, then the JSON fallback, gives a Table; for a kind with no
    printer columns (Sandbox, a CRD without additionalPrinterColumns)
    its columns are Name and Age."""
    sb = {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
          "metadata": {"name": "pf-s"}, "spec": {"podTemplate": {"spec": {
              "containers": [{"name": "c", "image": "x"}]}}}}
    t.eq(call(srv, "POST", SANDBOXES, sb)[0], 201, "create sandbox pf-s")
    code, body = call(srv, "GET", SANDBOXES, accept=(
        "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,"
        "application/json;q=0.5,"
        "application/json;as=Table;v=v1;g=meta.k8s.io"))
    t.ok(code == 200 and body.get("kind") == "Table" and
         [c["name"] for c in body.get("columnDefinitions", [])] ==
         ["Name", "Age"] and [r["cells"][0] for r in body["rows"]] ==
         ["pf-s"] and is_partial(body["rows"][0].get("object")),
         "protobuf skipped, plain JSON (q=0.5) after the Table: a Table "
         "with Name and Age, rows with PartialObjectMetadata", (code, body))
    code, body = call(srv, "GET", SANDBOXES + "/pf-s", accept=(
        "application/json;as=Table;v=v1;g=meta.k8s.io;q=0.1, "
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"))
    t.ok(code == 200 and is_partial(body),
         "a higher q wins over the order", (code, body))
    code, body = call(srv, "GET", SANDBOXES + "/pf-s",
                      accept="text/html, */*;q=0.8")
    t.ok(code == 200 and body.get("kind") == "Sandbox",
         "*/* is plain JSON", (code, body))


def framing(t, srv):
    """A request whose body length is ambiguous is refused before its
    body, with a Status, not read to the end of the stream (which never
    comes on a kept-alive connection: the client waited for the
    server's timeout)."""
    host, port = srv.url.split("//", 1)[1].rsplit(":", 1)
    body = json.dumps(task("framed")).encode()
    cases = [
        ("Transfer-Encoding: identity", body),
        ("Transfer-Encoding: gzip, chunked", body),
        ("Content-Length: %d\r\nTransfer-Encoding: chunked" % len(body),
         body),
        ("Content-Length: %d\r\nContent-Length: 5" % len(body), body),
    ]
    for hdr, data in cases:
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: "
                   "application/json\r\n%s\r\n\r\n" % (TASKS, hdr))
                  .encode() + data)
        got = b""
        t0 = time.time()
        try:
            while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except socket.timeout:
            pass
        s.close()
        head, _, rest = got.partition(b"\r\n\r\n")
        try:
            status = json.loads(rest or b"{}")
        except ValueError:
            status = {}
        t.ok(head.startswith(b"HTTP/1.1 400") and
             status.get("reason") == "BadRequest" and
             "ambiguous" in status.get("message", "") and
             time.time() - t0 < 4,
             "%s: 400 with a Status at once" % hdr.split("\r\n")[-1], got)
    t.eq(call(srv, "GET", TASKS + "/framed")[0], 404,
         "nothing was created by them")
    local = "127.0.0.1:" + port
    for name, hdrs in (
            ("Content-Length : N", [("Host", local),
                                    ("Content-Length ", str(len(body)))]),
            ("two Hosts", [("Host", local), ("Host", local)]),
            ("no Host", [])):
        code, st = raw_call(srv, "POST", TASKS, hdrs + [
            ("Content-Type", "application/json")], body)
        t.ok(code == 400 and st.get("reason") == "BadRequest",
             "%s: 400 BadRequest" % name, (code, st))
    t.eq(call(srv, "GET", TASKS + "/framed")[0], 404,
         "nothing was created by them either")


def raw_call(srv, method, path, headers, body=b""):
    """(status, Status or object) of one request written by hand, so
    that its Host and Content-Type are exactly those given (or absent)."""
    host, port = srv.url.split("//", 1)[1].rsplit(":", 1)
    head = "%s %s HTTP/1.1\r\n" % (method, path)
    for k, v in headers:
        head += "%s: %s\r\n" % (k, v)
    head += "Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(head.encode() + body)
    got = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    s.close()
    head, _, rest = got.partition(b"\r\n\r\n")
    try:
        return int(head.split()[1]), json.loads(rest or b"{}")
    except (IndexError, ValueError):
        return 0, {"raw": got[:200].decode("utf-8", "replace")}


def simple_posts(t, srv):
    """A create whose body is not declared JSON is refused with 415, as
    kube-apiserver does. The loopback listener has no token, and these
    are the POSTs any web page the operator visits can send to it
    without a CORS preflight (Content-Type text/plain, a form type, or
    none): read as JSON, they created AgentTasks with its prompt."""
    port = srv.url.rsplit(":", 1)[1]
    local = "127.0.0.1:" + port
    for ctype in ("text/plain;charset=UTF-8", "text/plain",
                  "application/x-www-form-urlencoded",
                  "multipart/form-data; boundary=x", None):
        hdrs = [("Host", local)]
        if ctype is not None:
            hdrs.append(("Content-Type", ctype))
        code, body = raw_call(srv, "POST", TASKS, hdrs,
                              json.dumps(task("csrf")).encode())
        t.ok(code == 415 and body.get("reason") == "UnsupportedMediaType",
             "a create with Content-Type %s: 415, not read as JSON" %
             ctype, (code, body))
    t.eq(call(srv, "GET", TASKS + "/csrf")[0], 404,
         "nothing was created by them")
    code, body = raw_call(srv, "POST", TASKS, [
        ("Host", local), ("Content-Type", "Application/JSON; charset=utf-8")],
        json.dumps(task("json-charset")).encode())
    t.eq(code, 201, "application/json with parameters is still read")


def foreign_host(t, srv):
    """Through DNS rebinding (a name of the attacker's resolving to
    127.0.0.1) a web page is same-origin with the loopback listener and
    reads its replies, the Secrets among them, or writes with any
    Content-Type. Without a token, a Host other than localhost or a
    loopback address is refused with 403, as kubectl proxy's default
    --accept-hosts does; kubectl and the REST client send
    127.0.0.1:PORT."""
    port = srv.url.rsplit(":", 1)[1]
    local = "127.0.0.1:" + port
    for host in ("rebind.attacker.example:" + port, "attacker.example",
                 "localhost.attacker.example:" + port, "127.0.0.1.nip.io",
                 "[::1]x", "127.0.0.1:" + port + "@x",
                 # an address, but not a loopback one
                 "10.0.0.1:" + port, "[::ffff:10.0.0.1]:" + port,
                 # localhost is a name, not an IPv6 address
                 "[localhost]:" + port,
                 # a port has five digits at most
                 "127.0.0.1:123456"):
        code, body = raw_call(srv, "GET", SECRETS, [("Host", host)])
        t.ok(code == 403 and body.get("kind") == "Status" and
             body.get("reason") == "Forbidden",
             "Host %s: 403 Status" % host, (code, body))
        code, body = raw_call(srv, "POST", TASKS, [
            ("Host", host), ("Content-Type", "application/json")],
            json.dumps(task("rebound")).encode())
        t.eq(code, 403, "Host %s: a create is refused too" % host)
    t.eq(call(srv, "GET", TASKS + "/rebound")[0], 404,
         "nothing was created through another Host")
    for host in (local, "localhost:" + port, "LocalHost", "127.0.0.1",
                 "[::1]:" + port, "127.0.0.2:" + port,
                 "[::ffff:127.0.0.1]:" + port):
        code, body = raw_call(srv, "GET", SECRETS, [("Host", host)])
        t.ok(code == 200 and body.get("kind") == "SecretList",
             "Host %s: served" % host, (code, body))


def subdomain_names(t, srv):
    """A name must be a DNS-1123 subdomain: dot-separated labels, each
    starting and ending with a letter or digit. kube-apiserver refuses
    a..b, a.-b and a-.b with 422 Invalid; the store took them (201),
    objects a cluster would not accept, named into their children."""
    for name in ("a..b", "a.-b", "a-.b", "x.-", "a.b..c"):
        code, body = call(srv, "POST", TASKS, task(name))
        t.ok(code == 422 and body.get("reason") == "Invalid" and
             body.get("details", {}).get("causes", [{}])[0].get(
                 "field") == "metadata.name",
             "name %s: 422 Invalid" % name, (code, body))
    code, body = call(srv, "POST", TASKS, task("a.b-c.0d"))
    t.eq(code, 201, "a.b-c.0d is a subdomain: created")


def nul_paths(t, srv):
    """libmicrohttpd decodes the path in place, so a %00 cut it short: a
    GET or a DELETE of tasks/keep%00x read or deleted tasks/keep. A
    request target with a %00 is refused with 400 (kube-apiserver finds
    no such name), whatever the method, in the path or the query."""
    local = [("Host", "127.0.0.1:" + srv.url.rsplit(":", 1)[1])]
    t.eq(call(srv, "POST", TASKS, task("keep"))[0], 201, "keep created")
    for method, path in (("GET", TASKS + "/keep%00x"),
                         ("DELETE", TASKS + "/keep%00"),
                         ("PATCH", TASKS + "/keep%00/status"),
                         ("GET", TASKS + "?labelSelector=a%00b"),
                         ("GET", TASKS + "/keep%2500")):
        code, body = raw_call(srv, method, path, local + [
            ("Content-Type", "application/merge-patch+json")],
            b'{"spec":{"objective":"y"}}' if method == "PATCH" else b"")
        if path.endswith("%2500"):
            # an escaped percent sign: the name "keep%00", not found
            t.eq(code, 404, "GET tasks/keep%2500: 404, no NUL in it")
            continue
        t.ok(code == 400 and body.get("reason") == "BadRequest" and
             "NUL" in body.get("message", ""),
             "%s %s: 400 BadRequest" % (method, path.split("/")[-1]),
             (code, body))
    code, body = call(srv, "GET", TASKS + "/keep")
    t.ok(code == 200 and body["spec"]["objective"] == "x",
         "keep is still there, unchanged", (code, body))


def body_checks(t, srv):
    """What the apiserver checks of a create or update body before the
    store sees it: its apiVersion and kind are the resource's, metadata
    is an object, its namespace (when given) is the path's, an update's
    name (when given) is the path's, and a namespaced kind is created in
    a namespace. Each is a 400 (a 405 for the last) that writes
    nothing."""
    base = "/apis/divergedev.com/v1alpha1/agenttasks"
    for what, body in (
            ("apiVersion v1", dict(task("bc-av"), apiVersion="v1")),
            ("kind Secret", dict(task("bc-kind"), kind="Secret")),
            ("metadata a string", dict(task("bc-meta"), metadata="bc-meta")),
            ("metadata.namespace other", dict(task("bc-ns"), metadata={
                "name": "bc-ns", "namespace": "other"}))):
        code, reply = call(srv, "POST", TASKS, body)
        t.ok(code == 400 and reply.get("reason") == "BadRequest",
             "a create with %s: 400 BadRequest" % what, (code, reply))
    code, reply = call(srv, "POST", base, task("bc-nons"))
    t.ok(code == 405 and reply.get("kind") == "Status",
         "a create of a namespaced kind without a namespace: 405",
         (code, reply))
    code, reply = raw_call(srv, "POST", TASKS, [
        ("Host", "127.0.0.1"), ("Content-Type", "application/json")])
    t.ok(code == 400 and "empty" in reply.get("message", ""),
         "a create with an empty body: 400, saying so", (code, reply))
    for ns in ("sem", "other"):
        _, lst = call(srv, "GET", "/apis/divergedev.com/v1alpha1/"
                      "namespaces/%s/agenttasks" % ns)
        t.eq([i["metadata"]["name"] for i in lst.get("items", [])
              if i["metadata"]["name"].startswith("bc-")], [],
             "none of them created anything in %s" % ns)
    t.eq(call(srv, "POST", TASKS, task("bc-put"))[0], 201, "create bc-put")
    _, cur = call(srv, "GET", TASKS + "/bc-put")
    other = json.loads(json.dumps(cur))
    other["metadata"]["name"] = "bc-other"
    other["spec"]["objective"] = "renamed"
    code, reply = call(srv, "PUT", TASKS + "/bc-put", other)
    t.ok(code == 400 and reply.get("reason") == "BadRequest" and
         "bc-other" in reply.get("message", ""),
         "a PUT whose body names another object: 400", (code, reply))
    t.eq(call(srv, "GET", TASKS + "/bc-other")[0], 404,
         "and it made no such object")
    del cur["metadata"]["name"]
    cur["spec"]["objective"] = "updated"
    code, reply = call(srv, "PUT", TASKS + "/bc-put", cur)
    t.ok(code == 200 and reply["metadata"]["name"] == "bc-put" and
         reply["spec"]["objective"] == "updated",
         "a PUT whose body has no name updates the object of the path",
         (code, reply))


def watch_by_name(t, srv):
    """GET .../agenttasks/NAME?watch=true (what kubectl get -w NAME
    asked for before fieldSelector) watches that object alone; watch=1
    is a watch too, as the apiserver parses booleans."""
    for n in ("wn-a", "wn-b"):
        t.eq(call(srv, "POST", TASKS, task(n))[0], 201, "create " + n)
    url = srv.url + TASKS + "/wn-b?watch=true&timeoutSeconds=20"
    names = []
    with urllib.request.urlopen(url, timeout=20) as r:
        for n, obj in (("wn-a", "first"), ("wn-b", "second")):
            call(srv, "PATCH", TASKS + "/" + n, {"spec": {"objective": obj}},
                 "application/merge-patch+json")
        while True:
            line = r.readline()
            if not line:
                break
            ev = json.loads(line)
            names.append((ev["type"], ev["object"]["metadata"]["name"],
                          ev["object"]["spec"]["objective"]))
            if ev["object"]["spec"]["objective"] == "second":
                break
    t.ok(names and names[-1] == ("MODIFIED", "wn-b", "second") and
         all(n[1] == "wn-b" for n in names),
         "a watch on tasks/wn-b sees wn-b's change, not wn-a's", names)
    code, body = call(srv, "GET", TASKS + "?watch=1&timeoutSeconds=1"
                      "&resourceVersion=0")
    text = body.get("text", "")
    t.ok(code == 200 and body.get("kind") is None and
         '"type":"ADDED"' in text.replace(" ", ""),
         "watch=1: a stream of events, not a list", (code, body))


def delete_opts(t, srv):
    """A DELETE's orphanDependents, in the query or in DeleteOptions: true
    orphans the dependents (they stay, without the reference to the
    deleted owner); a value other than true or false is a 400; with a
    propagationPolicy as well, a 422 (the apiserver allows one of the
    two). Neither refusal deletes anything."""
    sec = "/api/v1/namespaces/sem/secrets"

    def owned(owner, name):
        _, o = call(srv, "GET", TASKS + "/" + owner)
        return call(srv, "POST", sec, {
            "apiVersion": "v1", "kind": "Secret", "metadata": {
                "name": name, "ownerReferences": [{
                    "apiVersion": "divergedev.com/v1alpha1",
                    "kind": "AgentTask", "name": owner,
                    "uid": o["metadata"]["uid"]}]},
            "stringData": {"k": "v"}})[0]

    t.eq(call(srv, "POST", TASKS, task("do-owner"))[0], 201,
         "create do-owner")
    t.eq(owned("do-owner", "do-child"), 201, "create do-child, owned by it")
    for query, code, reason in (
            ("orphanDependents=maybe", 400, "BadRequest"),
            ("orphanDependents=true&propagationPolicy=Background", 422,
             "Invalid")):
        c, body = call(srv, "DELETE", TASKS + "/do-owner?" + query)
        t.ok(c == code and body.get("reason") == reason,
             "DELETE ?%s: %d %s" % (query, code, reason), (c, body))
    c, body = call(srv, "DELETE", TASKS + "/do-owner",
                   {"kind": "DeleteOptions", "apiVersion": "v1",
                    "orphanDependents": True,
                    "propagationPolicy": "Foreground"})
    t.ok(c == 422 and body.get("reason") == "Invalid",
         "DeleteOptions with orphanDependents and propagationPolicy: 422",
         (c, body))
    for opts in ({"orphanDependents": "true"}, {"propagationPolicy": 5}):
        c, body = call(srv, "DELETE", TASKS + "/do-owner",
                       dict(opts, kind="DeleteOptions", apiVersion="v1"))
        t.ok(c == 400 and body.get("reason") == "BadRequest",
             "DeleteOptions %s: 400 (the wrong type)" % json.dumps(opts),
             (c, body))
    t.eq(call(srv, "GET", TASKS + "/do-owner")[0], 200,
         "do-owner is still there after the refusals")
    c, body = call(srv, "DELETE", TASKS + "/do-owner?orphanDependents=true")
    t.eq(c, 200, "DELETE ?orphanDependents=true")
    deadline = time.time() + 10
    while True:
        c, child = call(srv, "GET", sec + "/do-child")
        if c != 200 or not child["metadata"].get("ownerReferences") or \
                time.time() > deadline:
            break
        time.sleep(0.1)
    t.ok(c == 200 and not child["metadata"].get("ownerReferences"),
         "the dependent stays, without its ownerReference", (c, child))


def request_limits(t, srv):
    """timeoutSeconds must be a whole number (400 otherwise), and a huge
    one is capped, not wrapped into a deadline already past: such a watch
    stays open. A body declared larger than the 16 MiB limit is refused
    at once, before it is sent. A DELETE's body without a Content-Type
    is read as DeleteOptions, as the apiserver reads it."""
    local = ("Host", "127.0.0.1:" + srv.url.rsplit(":", 1)[1])
    code, body = call(srv, "GET", TASKS + "?watch=true&timeoutSeconds=5x")
    t.ok(code == 400 and "timeoutSeconds" in body.get("message", ""),
         "timeoutSeconds=5x: 400", (code, body))
    host, port = srv.url.split("//", 1)[1].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(("GET %s?watch=true&timeoutSeconds=9223372036854775807 "
               "HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" %
               (TASKS, local[1])).encode())
    got = b""
    s.settimeout(1.5)
    try:
        while b"\r\n\r\n" not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        # no event comes: the stream is open while recv times out (an
        # ended one is closed: Connection: close)
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        still_open = False
    except socket.timeout:
        still_open = True
    s.close()
    t.ok(got.startswith(b"HTTP/1.1 200") and still_open,
         "a watch with timeoutSeconds = 2^63 - 1 stays open",
         got[:200])
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: "
               "application/json\r\nContent-Length: %d\r\n\r\n" %
               (TASKS, local[1], 16 * 1024 * 1024 + 1)).encode())
    try:
        head = s.recv(4096)
    except socket.timeout:
        head = b"(no answer in 5 s)"
    s.close()
    t.ok(head.startswith(b"HTTP/1.1 413"),
         "a body declared past 16 MiB: 413 before it is sent", head[:200])
    t.eq(call(srv, "POST", TASKS, task("rl-a"))[0], 201, "create rl-a")
    code, body = raw_call(srv, "DELETE", TASKS + "/rl-a", [local],
                          b'{"propagationPolicy":"Sideways"}')
    t.ok(code == 422 and body.get("reason") == "Invalid",
         "DeleteOptions without a Content-Type are read: 422 for an "
         "unknown propagationPolicy", (code, body))
    t.eq(call(srv, "GET", TASKS + "/rl-a")[0], 200, "rl-a is still there")


def main(t):
    srv = ApiServer()
    try:
        if srv.start() is None:
            t.skip_all("diverged --api-listen is not available")
        watch_list(t, srv)
        list_versions(t, srv)
        dry_run(t, srv)
        immutable_meta(t, srv)
        metadata_only(t, srv)
        not_acceptable(t, srv)
        preference(t, srv)
        framing(t, srv)
        simple_posts(t, srv)
        foreign_host(t, srv)
        subdomain_names(t, srv)
        nul_paths(t, srv)
        body_checks(t, srv)
        watch_by_name(t, srv)
        delete_opts(t, srv)
        request_limits(t, srv)
        t.eq(srv.stop(), 0, "the server stops cleanly on SIGTERM")
    finally:
        srv.cleanup()


if __name__ == "__main__":
    run_tests(main)
