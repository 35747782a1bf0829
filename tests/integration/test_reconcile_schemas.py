"""The objects the AgentTask reconciler writes, validated against the
schemas the real API servers use: the agent-sandbox CRDs (v0.5.6, in
tests/data/crds/agent-sandbox/, see its README) for Sandbox and
SandboxClaim, our own CRDs (deploy/crds/) for AgentTask and Environment,
both with the npm package ajv, and Kubernetes' own schemas for Secret and
NetworkPolicy with the npm package kubernetes-models.

CRD schemas are structural: a field the schema does not know is pruned
silently by the API server, so the check here is stricter than ajv's
default: objects with properties and no x-kubernetes-preserve-unknown-fields
get additionalProperties: false (a field that would be pruned fails).

The objects come from tests/unit/test_reconciler run with
RECONCILER_DUMP_DIR (its test_dump case: a running, suspended and completed
Sandbox, a SandboxClaim in warm-pool mode, the token and index Secrets, the
NetworkPolicy, the Environment awake and hibernated, the AgentTask). The
npm packages are installed into $top_builddir/tests/node-cache/
reconcile-schemas; the test skips when node, npm, the install, the unit
test binary or the CRD fixtures are missing."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from divtest import TOP_BUILDDIR, TOP_SRCDIR, Tap, npm_install  # noqa: E402

PACKAGES = ["ajv@8.20.0", "ajv-formats@3.0.1", "js-yaml@4.1.0",
            "kubernetes-models@5.1.0"]

SCRIPT = r"""
import fs from "node:fs";
import path from "node:path";
import yaml from "js-yaml";
import Ajv from "ajv";
import addFormats from "ajv-formats";
import { Secret } from "kubernetes-models/v1";
import { NetworkPolicy } from "kubernetes-models/networking.k8s.io/v1";

const [crdDir, ownCrdDir, dumpDir] = process.argv.slice(2);

/* what the API server would prune becomes an error */
function strict(s) {
  if (s === null || typeof s !== "object")
    return s;
  if (s.properties && s.additionalProperties === undefined &&
      !s["x-kubernetes-preserve-unknown-fields"])
    s.additionalProperties = false;
  for (const k of ["properties", "patternProperties"])
    if (s[k])
      for (const v of Object.values(s[k]))
        strict(v);
  for (const k of ["items", "additionalProperties", "not"])
    if (s[k] && typeof s[k] === "object")
      strict(s[k]);
  for (const k of ["anyOf", "allOf", "oneOf"])
    if (Array.isArray(s[k]))
      s[k].forEach(strict);
  return s;
}

function crd(file, version) {
  const doc = yaml.loadAll(fs.readFileSync(file, "utf8"))
    .find((d) => d && d.kind === "CustomResourceDefinition");
  const v = doc.spec.versions.find((x) => x.name === version);
  return strict(structuredClone(v.schema.openAPIV3Schema));
}

const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);
for (const f of ["int32", "int64", "float", "double", "byte", "quantity"])
  if (!ajv.formats[f])
    ajv.addFormat(f, true);

const validators = {
  Sandbox: ajv.compile(crd(path.join(crdDir,
    "agents.x-k8s.io_sandboxes.yaml"), "v1beta1")),
  SandboxClaim: ajv.compile(crd(path.join(crdDir,
    "extensions.agents.x-k8s.io_sandboxclaims.yaml"), "v1beta1")),
  AgentTask: ajv.compile(crd(path.join(ownCrdDir,
    "divergedev.com_agenttasks.yaml"), "v1alpha1")),
  Environment: ajv.compile(crd(path.join(ownCrdDir,
    "divergedev.com_environments.yaml"), "v1alpha1")),
};

/*
 * What the API server checks of every object's metadata, CRs included
 * (apimachinery ValidateObjectMeta): the schemas above leave metadata
 * alone, and kubernetes-models does not check these rules either.
 */
const SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const QUALIFIED = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;

function subdomain(s) {
  return typeof s === "string" && s.length <= 253 && SUBDOMAIN.test(s);
}

function keyOk(k) {
  const i = k.lastIndexOf("/");
  const prefix = i < 0 ? null : k.slice(0, i), name = k.slice(i + 1);
  return (prefix === null || subdomain(prefix)) && name.length <= 63 &&
    QUALIFIED.test(name);
}

function mapErrors(where, labels, annotations) {
  const errs = [];
  for (const [k, v] of Object.entries(labels || {})) {
    if (!keyOk(k))
      errs.push(`${where}.labels key ${JSON.stringify(k)} is not valid`);
    if (typeof v !== "string" || v.length > 63 || !LABEL_VALUE.test(v))
      errs.push(`${where}.labels[${k}] value ` +
        `${JSON.stringify(v)} (${String(v).length}) is not a label value`);
  }
  let size = 0;
  for (const [k, v] of Object.entries(annotations || {})) {
    if (!keyOk(k))
      errs.push(`${where}.annotations key ${JSON.stringify(k)} is not valid`);
    size += Buffer.byteLength(k) + Buffer.byteLength(String(v));
  }
  if (size > 256 * 1024)
    errs.push(`${where}.annotations total ${size} bytes > 256 KiB`);
  return errs;
}

function metaErrors(obj) {
  const md = obj.metadata || {}, errs = [];
  if (!subdomain(md.name))
    errs.push(`metadata.name ${JSON.stringify(md.name)} ` +
      `(${String(md.name).length}) is not a DNS-1123 subdomain`);
  errs.push(...mapErrors("metadata", md.labels, md.annotations));
  const refs = md.ownerReferences || [];
  for (const r of refs)
    for (const f of ["apiVersion", "kind", "name", "uid"])
      if (typeof r[f] !== "string" || r[f] === "")
        errs.push(`metadata.ownerReferences ${f} is missing`);
  if (refs.filter((r) => r.controller === true).length > 1)
    errs.push("metadata.ownerReferences: more than one controller");
  if (obj.kind === "Sandbox") {
    /* what agent-sandbox makes of it: a Pod and PVCs named after it */
    const pt = (obj.spec || {}).podTemplate || {};
    const pm = pt.metadata || {};
    errs.push(...mapErrors("spec.podTemplate.metadata", pm.labels,
      pm.annotations));
    for (const v of (obj.spec || {}).volumeClaimTemplates || []) {
      const n = (v.metadata || {}).name;
      if (!DNS_LABEL.test(n || "") || !subdomain(`${n}-${md.name}`))
        errs.push(`volumeClaimTemplates ${n}: PVC ${n}-${md.name} ` +
          "is not a valid name");
    }
    for (const v of (pt.spec || {}).volumes || [])
      if (v.secret && !subdomain(v.secret.secretName))
        errs.push(`volume ${v.name}: secretName is not a valid name`);
  }
  return errs;
}

function check(obj) {
  const meta = metaErrors(obj);
  return meta.concat(schemaErrors(obj));
}

function schemaErrors(obj) {
  if (obj.kind === "Secret" || obj.kind === "NetworkPolicy") {
    const M = obj.kind === "Secret" ? Secret : NetworkPolicy;
    try {
      new M(obj).validate();
      return [];
    } catch (e) {
      return [String(e.message || e)];
    }
  }
  const v = validators[obj.kind];
  if (!v)
    return ["no schema for kind " + obj.kind];
  if (v(obj))
    return [];
  return v.errors.map((e) => `${e.instancePath || "/"} ${e.message}` +
    (e.params && e.params.additionalProperty ?
      ` (${e.params.additionalProperty})` : ""));
}

for (const f of fs.readdirSync(dumpDir).sort()) {
  if (!f.endsWith(".json"))
    continue;
  const obj = JSON.parse(fs.readFileSync(path.join(dumpDir, f), "utf8"));
  console.log(JSON.stringify({ file: f, kind: obj.kind,
    errors: check(obj) }));
}
"""


def install(t):
    node = os.environ.get("NODE") or shutil.which("node")
    npm = os.environ.get("NPM") or shutil.which("npm")
    if not node or not npm:
        t.skip_all("node or npm is not installed")
    prefix = os.path.join(TOP_BUILDDIR, "tests", "node-cache",
                          "reconcile-schemas")
    stamp = os.path.join(prefix, "installed.txt")
    want = "\n".join(PACKAGES)
    have = None
    if os.path.exists(stamp):
        with open(stamp) as f:
            have = f.read()
    if have != want:
        npm_install(t, prefix, PACKAGES, timeout=600)
        with open(stamp, "w") as f:
            f.write(want)
    script = os.path.join(prefix, "validate-reconciler-objects.mjs")
    with open(script, "w") as f:
        f.write(SCRIPT)
    return node, script


def main():
    t = Tap()
    binary = os.path.join(TOP_BUILDDIR, "tests", "unit", "test_reconciler")
    crds = os.environ.get("AGENT_SANDBOX_CRDS") or os.path.join(
        TOP_SRCDIR, "tests", "data", "crds", "agent-sandbox")
    own = os.path.join(TOP_SRCDIR, "deploy", "crds")
    if not os.access(binary, os.X_OK):
        t.skip_all("tests/unit/test_reconciler is not built")
    if not os.path.exists(os.path.join(crds,
                                       "agents.x-k8s.io_sandboxes.yaml")):
        t.skip_all("agent-sandbox CRDs not found in %s" % crds)
    node, script = install(t)
    with tempfile.TemporaryDirectory(prefix="diverge-schemas-") as tmp:
        dump = os.path.join(tmp, "objects")
        os.makedirs(dump)
        env = dict(os.environ, RECONCILER_DUMP_DIR=dump,
                   TEST_FILTER="test_dump", CMOCKA_MESSAGE_OUTPUT="TAP")
        p = subprocess.run([binary], env=env, capture_output=True,
                           text=True, timeout=300)
        t.ok(p.returncode == 0, "the reconciler wrote its objects",
             p.stdout + p.stderr)
        files = sorted(os.listdir(dump))
        t.ok(len(files) >= 12, "every shape was dumped", files)

        # the validator itself refuses what the schemas refuse
        with open(os.path.join(dump, "sandbox-running.json")) as f:
            bad = json.load(f)
        bad_dir = os.path.join(tmp, "bad")
        os.makedirs(bad_dir)
        # a v1alpha1 field v1beta1 would prune (no suspension at all)
        bad["spec"]["replicas"] = 0
        with open(os.path.join(bad_dir, "sandbox-pruned.json"), "w") as f:
            json.dump(bad, f)
        del bad["spec"]["replicas"]
        bad["spec"]["operatingMode"] = "Paused"
        with open(os.path.join(bad_dir, "sandbox-enum.json"), "w") as f:
            json.dump(bad, f)
        del bad["spec"]["operatingMode"]
        # a label value the API server refuses (64 characters)
        bad["metadata"]["labels"]["divergedev.com/task"] = "t" * 64
        with open(os.path.join(bad_dir, "sandbox-label.json"), "w") as f:
            json.dump(bad, f)
        with open(os.path.join(dump, "secret-token.json")) as f:
            bads = json.load(f)
        bads["data"]["token"] = 42
        with open(os.path.join(bad_dir, "secret-bad.json"), "w") as f:
            json.dump(bads, f)

        for d, want_ok in ((dump, True), (bad_dir, False)):
            p = subprocess.run([node, script, crds, own, d],
                               capture_output=True, text=True, timeout=120,
                               cwd=os.path.dirname(script))
            if not t.ok(p.returncode == 0, "the validator ran",
                        p.stderr):
                continue
            for line in p.stdout.splitlines():
                r = json.loads(line)
                if want_ok:
                    t.ok(not r["errors"], "%s (%s) is valid" % (
                        r["file"], r["kind"]), "\n".join(r["errors"]))
                else:
                    t.ok(bool(r["errors"]), "%s (%s) is refused" % (
                        r["file"], r["kind"]), "accepted")
    t.done()


if __name__ == "__main__":
    main()
