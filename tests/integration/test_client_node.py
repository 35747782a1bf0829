"""The npm package @kubernetes/client-node (1.4.0, which runs on Node 20)
against the embedded store served as a Kubernetes API: CustomObjectsApi
create, get, merge and JSON patches, errors; a list, then a Watch and an
informer (ListWatch) that see what this side creates, patches and deletes
over plain HTTP meanwhile.

The package is installed with npm into $top_builddir/tests/node-cache/
client-node (the test skips when node, npm or the install is missing)."""

import json
import os
import queue
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request

from divtest import TOP_BUILDDIR, npm_install, run_tests
from test_kubectl import ApiServer

VERSION = "1.4.0"
GV = "/apis/divergedev.com/v1alpha1"
NS = "client-node"

SCRIPT = r"""
import * as k8s from '@kubernetes/client-node';
import * as readline from 'node:readline';

const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const kc = new k8s.KubeConfig();
kc.loadFromOptions({
  clusters: [{name: 'd', server: process.env.API_SERVER,
              skipTLSVerify: true}],
  users: [{name: 'u'}],
  contexts: [{name: 'c', cluster: 'd', user: 'u'}],
  currentContext: 'c',
});
const api = kc.makeApiClient(k8s.CustomObjectsApi);
const base = {group: 'divergedev.com', version: 'v1alpha1',
              namespace: process.env.NS, plural: 'agenttasks'};
const merge = k8s.setHeaderOptions('Content-Type',
                                   k8s.PatchStrategy.MergePatch);
const task = (name) => ({apiVersion: 'divergedev.com/v1alpha1',
  kind: 'AgentTask', metadata: {name},
  spec: {objective: 'from client-node', maxIterations: 1}});
const summary = (o) => ({name: o.metadata.name,
  rv: o.metadata.resourceVersion, generation: o.metadata.generation,
  maxIterations: o.spec && o.spec.maxIterations,
  phase: o.status && o.status.phase});

async function crud() {
  const c = await api.createNamespacedCustomObject(
      {...base, body: task('t-client')});
  out({ev: 'created', ...summary(c)});
  try {
    await api.createNamespacedCustomObject({...base, body: task('t-client')});
    out({ev: 'duplicate', code: 0});
  } catch (e) {
    out({ev: 'duplicate', code: e.code,
         reason: JSON.parse(e.body).reason});
  }
  const m = await api.patchNamespacedCustomObject(
      {...base, name: 't-client', body: {spec: {maxIterations: 2}}}, merge);
  out({ev: 'merge-patched', ...summary(m)});
  const j = await api.patchNamespacedCustomObject({...base, name: 't-client',
      body: [{op: 'replace', path: '/spec/maxIterations', value: 3}]});
  out({ev: 'json-patched', ...summary(j)});
  const s = await api.patchNamespacedCustomObjectStatus({...base,
      name: 't-client', body: {status: {phase: 'Pending'}}}, merge);
  out({ev: 'status-patched', ...summary(s)});
  const g = await api.getNamespacedCustomObject({...base, name: 't-client'});
  out({ev: 'got', ...summary(g)});
  try {
    await api.getNamespacedCustomObject({...base, name: 'nope'});
    out({ev: 'missing', code: 0});
  } catch (e) {
    out({ev: 'missing', code: e.code, reason: JSON.parse(e.body).reason,
         message: JSON.parse(e.body).message});
  }
  await api.deleteNamespacedCustomObject({...base, name: 't-client'});
  out({ev: 'deleted'});
}

async function main() {
  await crud();
  const list = await api.listNamespacedCustomObject(base);
  out({ev: 'list', kind: list.kind, rv: list.metadata.resourceVersion,
       names: list.items.map((o) => o.metadata.name)});

  const path = `/apis/divergedev.com/v1alpha1/namespaces/${process.env.NS}` +
      '/agenttasks';
  const watch = new k8s.Watch(kc);
  const ctl = await watch.watch(path,
      {resourceVersion: list.metadata.resourceVersion},
      (type, obj) => out({ev: 'watch', type, ...summary(obj)}),
      (err) => out({ev: 'watch-done', err: err ? String(err) : null}));

  const informer = k8s.makeInformer(kc, path,
      () => api.listNamespacedCustomObject(base));
  for (const verb of ['add', 'update', 'delete'])
    informer.on(verb, (obj) => out({ev: 'informer', type: verb,
                                    ...summary(obj)}));
  informer.on('error', (err) => out({ev: 'informer-error',
                                     err: String(err)}));
  await informer.start();
  out({ev: 'ready'});

  const rl = readline.createInterface({input: process.stdin});
  for await (const line of rl)
    if (line.trim() === 'quit')
      break;
  ctl.abort();
  await informer.stop();
  out({ev: 'bye'});
  process.exit(0);
}

main().catch((e) => {
  out({ev: 'fatal', err: String(e && e.stack || e),
       body: e && e.body ? String(e.body) : null});
  process.exit(1);
});
"""


def install(t):
    node = os.environ.get("NODE") or shutil.which("node")
    npm = os.environ.get("NPM") or shutil.which("npm")
    if not node or not npm:
        t.skip_all("node or npm is not installed")
    prefix = os.path.join(TOP_BUILDDIR, "tests", "node-cache", "client-node")
    pkg = os.path.join(prefix, "node_modules", "@kubernetes", "client-node",
                       "package.json")
    have = None
    if os.path.exists(pkg):
        with open(pkg) as f:
            have = json.load(f).get("version")
    if have != VERSION:
        npm_install(t, prefix, ["@kubernetes/client-node@" + VERSION])
        if not os.path.exists(pkg):
            t.skip_all("npm installed no @kubernetes/client-node@" + VERSION)
    script = os.path.join(prefix, "diverge-watch-test.mjs")
    with open(script, "w") as f:
        f.write(SCRIPT)
    return node, script


def call(srv, method, path, body=None, ctype="application/json"):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(srv.url + path, data=data, method=method,
                                 headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


class Node:
    """The node script; its JSON lines arrive on a queue."""

    def __init__(self, node, script, srv):
        env = dict(os.environ, API_SERVER=srv.url, NS=NS)
        self.proc = subprocess.Popen([node, script], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     env=env,
                                     cwd=os.path.dirname(script))
        self.q = queue.Queue()
        self.seen = []
        self.stderr = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._err, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.q.put(json.loads(line))
            except ValueError:
                self.q.put({"ev": "noise", "line": line})
        self.q.put({"ev": "eof"})

    def _err(self):
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip("\n"))

    def until(self, pred, timeout=20):
        """The first event, seen or to come, that matches pred (None on
        timeout or EOF)."""
        for ev in self.seen:
            if pred(ev):
                return ev
        end = time.time() + timeout
        while time.time() < end:
            try:
                ev = self.q.get(timeout=max(0.05, end - time.time()))
            except queue.Empty:
                break
            self.seen.append(ev)
            if pred(ev):
                return ev
            if ev["ev"] in ("eof", "fatal"):
                break
        return None

    def detail(self):
        return "\n".join([json.dumps(e) for e in self.seen[-30:]] +
                         self.stderr[-10:])

    def quit(self):
        t0 = time.time()
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            print("# client quit in %.1fs" % (time.time() - t0))


def has(n, **want):
    return any(all(e.get(k) == v for k, v in want.items()) for e in n.seen)


def crud(t, n):
    ev = n.until(lambda e: e["ev"] == "created")
    t.ok(ev is not None and ev["generation"] == 1,
         "createNamespacedCustomObject", n.detail())
    ev = n.until(lambda e: e["ev"] == "duplicate")
    t.ok(ev is not None and ev["code"] == 409 and
         ev["reason"] == "AlreadyExists",
         "a duplicate create: ApiException 409 AlreadyExists", n.detail())
    ev = n.until(lambda e: e["ev"] == "merge-patched")
    t.ok(ev is not None and ev["maxIterations"] == 2 and
         ev["generation"] == 2, "patch with PatchStrategy.MergePatch",
         n.detail())
    ev = n.until(lambda e: e["ev"] == "json-patched")
    t.ok(ev is not None and ev["maxIterations"] == 3 and
         ev["generation"] == 3, "patch as a JSON patch (the default)",
         n.detail())
    ev = n.until(lambda e: e["ev"] == "status-patched")
    t.ok(ev is not None and ev["phase"] == "Pending" and
         ev["generation"] == 3, "patchNamespacedCustomObjectStatus",
         n.detail())
    ev = n.until(lambda e: e["ev"] == "got")
    t.ok(ev is not None and ev["maxIterations"] == 3 and
         ev["phase"] == "Pending", "getNamespacedCustomObject", n.detail())
    ev = n.until(lambda e: e["ev"] == "missing")
    t.ok(ev is not None and ev["code"] == 404 and
         ev["reason"] == "NotFound" and
         ev["message"] == 'agenttasks.divergedev.com "nope" not found',
         "a missing object: ApiException 404 with the Status", n.detail())
    ev = n.until(lambda e: e["ev"] == "deleted")
    t.ok(ev is not None, "deleteNamespacedCustomObject", n.detail())


def watch(t, n, srv):
    ev = n.until(lambda e: e["ev"] == "list")
    t.ok(ev is not None and ev["kind"] == "AgentTaskList" and
         ev["names"] == ["t-pre"] and ev["rv"],
         "listNamespacedCustomObject", n.detail())
    ev = n.until(lambda e: e["ev"] == "ready")
    t.ok(ev is not None, "Watch and informer started", n.detail())
    t.ok(has(n, ev="informer", type="add", name="t-pre"),
         "the informer's list adds the existing task", n.detail())

    code, obj = call(srv, "POST", GV + "/namespaces/%s/agenttasks" % NS, {
        "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
        "metadata": {"name": "t-live"}, "spec": {"objective": "watch me"}})
    t.eq(code, 201, "this side creates t-live")
    code, obj = call(srv, "PATCH", GV + "/namespaces/%s/agenttasks/t-live/"
                     "status" % NS, {"status": {"phase": "Active"}},
                     "application/merge-patch+json")
    t.eq(code, 200, "this side patches its status")
    code, obj = call(srv, "PATCH", GV + "/namespaces/%s/agenttasks/t-live"
                     % NS, {"spec": {"suspended": True}},
                     "application/merge-patch+json")
    t.eq(code, 200, "this side patches its spec")
    code, obj = call(srv, "DELETE", GV + "/namespaces/%s/agenttasks/t-live"
                     % NS)
    t.eq(code, 200, "this side deletes it")

    for typ, phase in (("ADDED", None), ("MODIFIED", "Active")):
        n.until(lambda e, ty=typ, ph=phase: e["ev"] == "watch" and
                e["type"] == ty and e["name"] == "t-live" and
                e.get("phase") == ph, 10)
        t.ok(has(n, ev="watch", type=typ, name="t-live", phase=phase),
             "Watch: %s t-live%s" % (typ, " phase " + phase if phase
                                     else ""), n.detail())
    n.until(lambda e: e["ev"] == "watch" and e["type"] == "DELETED", 10)
    t.ok(has(n, ev="watch", type="DELETED", name="t-live"),
         "Watch: DELETED t-live", n.detail())
    t.ok(not has(n, ev="watch", name="t-pre") and
         not has(n, ev="watch", name="t-client"),
         "Watch from the list's resourceVersion: no replay", n.detail())
    n.until(lambda e: e["ev"] == "informer" and e["type"] == "delete" and
            e["name"] == "t-live", 10)
    t.ok(has(n, ev="informer", type="add", name="t-live") and
         has(n, ev="informer", type="update", name="t-live") and
         has(n, ev="informer", type="delete", name="t-live"),
         "informer (ListWatch): add, update, delete", n.detail())
    t.ok(not has(n, ev="informer-error") and not has(n, ev="watch-done"),
         "no watch errors or early ends", n.detail())


def main(t):
    node, script = install(t)
    srv = ApiServer()
    try:
        if srv.start() is None:
            t.skip_all("neither diverged --api-listen nor "
                       "tests/tools/apiserve is available")
        print("# server: %s on port %d" % (srv.how, srv.port))
        code, _ = call(srv, "POST", GV + "/namespaces/%s/agenttasks" % NS, {
            "apiVersion": "divergedev.com/v1alpha1", "kind": "AgentTask",
            "metadata": {"name": "t-pre"}, "spec": {"objective": "listed"}})
        t.eq(code, 201, "a task exists before the client starts")
        n = Node(node, script, srv)
        try:
            crud(t, n)
            watch(t, n, srv)
        finally:
            rc = n.quit()
        n.until(lambda e: e["ev"] == "bye", 5)
        t.ok(rc == 0 and has(n, ev="bye"), "the client stops cleanly",
             n.detail())
        t.eq(srv.stop(), 0, "the server stops cleanly")
    finally:
        srv.cleanup()


if __name__ == "__main__":
    run_tests(main)
