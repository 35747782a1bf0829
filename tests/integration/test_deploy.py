"""What deploy/ ships agrees with the daemon it deploys: the systemd unit
(systemd-analyze verify, and its ExecStart arguments parse), the Kubernetes
manifests (their configuration passes diverged --check-config; mounts,
ports, probes, the service account and the meter URL line up with it), the
ClusterRole grants every resource the daemon's resource table names, and
the image's runtime packages provide every library the built diverged
links. The RBAC rules are also enforced on a whole run, in
test_kube_mode.py."""

import os
import re
import shutil
import subprocess
import tempfile
import urllib.parse

from divtest import DIVERGED, TOP_BUILDDIR, TOP_SRCDIR, run_tests

DEPLOY = os.path.join(TOP_SRCDIR, "deploy")
UNIT = os.path.join(TOP_BUILDDIR, "deploy", "systemd", "diverged.service")
SA = "system:serviceaccount:%s:%s"
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}
# in debian:12-slim already, or linked only by sanitizer builds
BASE_PACKAGES = {"libc6", "libgcc-s1"}
SANITIZER_LIBS = ("libasan", "libubsan", "liblsan", "libtsan")


def load_all(path):
    import yaml
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def check_config(t, text, tmp, what):
    """diverged --check-config on text, with every file: secret it names
    made under tmp; returns (exit status, stderr)."""
    secrets = sorted(set(re.findall(r"file:(/[^\"'\]\s]+)", text)))
    for path in secrets:
        local = os.path.join(tmp, path.lstrip("/"))
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with open(local, "w") as f:
            f.write("not-a-real-secret\n")
        text = text.replace("file:" + path, "file:" + local)
    cfg = os.path.join(tmp, what + ".yaml")
    with open(cfg, "w") as f:
        f.write(text)
    p = subprocess.run([DIVERGED, "--config", cfg, "--check-config"],
                       capture_output=True, text=True, timeout=30)
    return p.returncode, p.stderr, secrets


def systemd(t, tmp):
    if not os.path.exists(UNIT):
        t.fail("the unit was made by make check", UNIT)
        return
    with open(UNIT, encoding="utf-8") as f:
        unit = f.read()
    start = re.search(r"^ExecStart=(\S+) (.*)$", unit, re.M)
    t.ok(not re.search(r"@[a-z]+@", unit) and start and start.group(1).startswith("/") and
         start.group(1).endswith("/diverged"),
         "the unit has the installed paths of diverged", start and
         start.group(0))
    if shutil.which("systemd-analyze") is None:
        t.skip("systemd-analyze verify (systemd-analyze is not installed)")
    else:
        # verify checks the binary exists: point it at the one just built
        local = os.path.join(tmp, "diverged.service")
        with open(local, "w") as f:
            f.write(unit.replace(start.group(1), os.path.abspath(DIVERGED)))
        p = subprocess.run(["systemd-analyze", "verify", "--man=no", local],
                           capture_output=True, text=True, timeout=60)
        t.ok(p.returncode == 0 and not p.stderr.strip(),
             "systemd-analyze verify: no error, no warning",
             (p.returncode, p.stderr))
    # the arguments of ExecStart are ones diverged takes
    args = start.group(2).split()
    conf = args[args.index("--config") + 1]
    state = args[args.index("--state-dir") + 1]
    t.ok(conf.endswith("/diverge/diverged.yaml") and
         state == "/var/lib/diverge" and
         "StateDirectory=diverge\n" in unit,
         "configuration in SYSCONFDIR/diverge, state in the StateDirectory",
         (conf, state))
    cfg = os.path.join(tmp, "unit.yaml")
    with open(cfg, "w") as f:
        f.write("log: {level: warn}\n")
    p = subprocess.run([DIVERGED] + [a.replace(conf, cfg).replace(
        state, os.path.join(tmp, "state")) for a in args] +
        ["--check-config"], capture_output=True, text=True, timeout=30)
    t.eq((p.returncode, p.stderr), (0, ""),
         "diverged takes the unit's ExecStart arguments")
    with open(os.path.join(DEPLOY, "systemd", "sysusers.d",
                           "diverge.conf")) as f:
        users = [l.split() for l in f if l.strip() and
                 not l.startswith("#")]
    t.ok(re.search(r"^User=diverge$", unit, re.M) and
         any(u[:2] == ["u", "diverge"] for u in users),
         "the unit's user is the one sysusers.d makes", users)


def kubernetes(t, tmp):
    rbac = load_all(os.path.join(DEPLOY, "kubernetes", "rbac.yaml"))
    app = load_all(os.path.join(DEPLOY, "kubernetes", "diverged.yaml"))
    nsdoc = load_all(os.path.join(DEPLOY, "kubernetes", "namespace.yaml"))
    by = {(d["kind"], d["metadata"]["name"]): d for d in rbac + app}
    cm = by[("ConfigMap", "diverged-config")]
    sts = by[("StatefulSet", "diverged")]
    svc = by[("Service", "diverged")]
    ns = nsdoc[0]["metadata"]["name"]
    t.ok(all(d["metadata"].get("namespace") == ns for d in app +
             [by[("ServiceAccount", "diverged")]]),
         "every namespaced object is in the namespace of namespace.yaml", ns)

    import yaml
    text = cm["data"]["diverged.yaml"]
    cfg = yaml.safe_load(text)
    rc, err, secrets = check_config(t, text, tmp, "configmap")
    t.eq((rc, err), (0, ""), "the ConfigMap's diverged.yaml passes "
         "diverged --check-config")

    pod = sts["spec"]["template"]["spec"]
    c = pod["containers"][0]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    conf = c["args"][c["args"].index("--config") + 1]
    t.ok(mounts["config"]["mountPath"] == conf and
         mounts["config"]["subPath"] in cm["data"] and
         vols["config"]["configMap"]["name"] == "diverged-config",
         "--config is the ConfigMap's file", (conf, mounts["config"]))
    sdir = mounts["secrets"]["mountPath"]
    t.ok(secrets and all(os.path.dirname(s) == sdir for s in secrets),
         "every file: secret of the configuration is in the Secret's mount",
         (sdir, secrets))
    mode = vols["secrets"]["secret"].get("defaultMode", 0o644)
    t.ok(mode & 0o040 and pod["securityContext"].get("fsGroup") and
         not mode & 0o004,
         "the Secret's files: readable by the pod's group, not by others",
         oct(mode))
    t.ok(mounts["state"]["mountPath"] == cfg["state_dir"] and
         any(v["metadata"]["name"] == "state"
             for v in sts["spec"]["volumeClaimTemplates"]),
         "state_dir is on the StatefulSet's volume claim",
         (cfg["state_dir"], mounts["state"]))
    port = int(cfg["listen"].rsplit(":", 1)[1])
    cport = {p["name"]: p["containerPort"] for p in c["ports"]}
    t.ok(cport.get("http") == port and
         svc["spec"]["ports"][0]["targetPort"] == "http",
         "the container and Service ports are the configured listen port",
         (cfg["listen"], cport, svc["spec"]["ports"]))
    t.ok(c["readinessProbe"]["httpGet"]["path"] == "/readyz" and
         c["livenessProbe"]["httpGet"]["path"] == "/healthz",
         "probes: /readyz and /healthz")
    url = urllib.parse.urlsplit(cfg["meter"]["public_url"])
    t.ok(url.hostname == "%s.%s.svc" % (svc["metadata"]["name"], ns) and
         url.port == svc["spec"]["ports"][0]["port"],
         "meter.public_url is the Service", cfg["meter"]["public_url"])
    t.ok(sts["spec"]["replicas"] == 1 and sts["spec"]["selector"][
        "matchLabels"].items() <= sts["spec"]["template"]["metadata"][
        "labels"].items() and svc["spec"]["selector"].items() <=
        sts["spec"]["template"]["metadata"]["labels"].items(),
         "one replica; the selectors select its pod")
    grace = pod["terminationGracePeriodSeconds"]
    t.ok(grace > 30, "the grace period outlasts shutdown_timeout (30s)",
         grace)
    sc = c["securityContext"]
    t.ok(pod["securityContext"]["runAsNonRoot"] and
         sc["readOnlyRootFilesystem"] and
         not sc["allowPrivilegeEscalation"] and
         sc["capabilities"]["drop"] == ["ALL"],
         "non-root, read-only root, no privilege escalation, no "
         "capabilities")

    # the service account and what it is bound to
    user = SA % (ns, pod["serviceAccountName"])
    t.eq(cfg["controller"]["namespace"], ns,
         "controller.namespace (the root key Secret) is the namespace")
    binding = by[("ClusterRoleBinding", "diverged")]
    t.ok(any(SA % (s.get("namespace"), s["name"]) == user
             for s in binding["subjects"] if s["kind"] == "ServiceAccount")
         and binding["roleRef"]["name"] == "diverged",
         "the pod's service account is bound to the diverged ClusterRole",
         user)
    rules = by[("ClusterRole", "diverged")]["rules"]
    with open(os.path.join(TOP_SRCDIR, "src", "k8s", "common.c")) as f:
        table = re.findall(r'const struct k8s_resource K8S_\w+ = \{\s*'
                           r'"([^"]*)", "[^"]*", "([^"]*)"', f.read())
    missing = []
    for group, plural in table:
        if plural == "leases":
            continue        # a Role, below
        granted = set()
        for r in rules:
            if group in r["apiGroups"] and plural in r["resources"]:
                granted |= set(r["verbs"])
        if not VERBS <= granted:
            missing.append((group, plural, sorted(VERBS - granted)))
    t.ok(len(table) >= 6 and not missing,
         "the ClusterRole grants every resource of the daemon's table "
         "(src/k8s/common.c) its verbs", missing or table)
    t.ok(any("divergedev.com" in r["apiGroups"] and
             "agenttasks/status" in r["resources"] and "update" in r["verbs"]
             for r in rules), "and agenttasks/status, where the meter and "
         "the reconciler write")

    # leader election: on, and its Lease's Role in its namespace
    le = cfg["kubernetes"].get("leader_election") or {}
    lease_ns = le.get("namespace", cfg["controller"]["namespace"])
    lease_name = le.get("lease_name", "diverged")
    t.ok(le.get("enabled") is True, "the ConfigMap turns leader election "
         "on", le)
    granted = set()
    for b in rbac:
        if b["kind"] != "RoleBinding" or \
                b["metadata"].get("namespace") != lease_ns or not any(
                    SA % (s.get("namespace", lease_ns), s["name"]) == user
                    for s in b["subjects"] if s["kind"] == "ServiceAccount"):
            continue
        role = by.get((b["roleRef"]["kind"], b["roleRef"]["name"]))
        for r in (role or {}).get("rules", []):
            if "coordination.k8s.io" in r["apiGroups"] and \
                    "leases" in r["resources"] and \
                    lease_name in r.get("resourceNames", [lease_name]):
                granted |= set(r["verbs"])
    t.ok({"get", "create", "update"} <= granted,
         "a Role bound to the service account grants get, create and "
         "update on the Lease %s/%s, which leader election calls" %
         (lease_ns, lease_name), sorted(granted))


def image(t):
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        docker = f.read()
    stages = docker.split("\nFROM ")
    runtime = stages[-1]
    m = re.search(r"apt-get install -y --no-install-recommends(.*?)&&",
                  runtime, re.S)
    pkgs = set(m.group(1).replace("\\", " ").split()) if m else set()
    if shutil.which("dpkg") is None or shutil.which("readelf") is None:
        t.skip("the image's libraries (needs dpkg and readelf)")
        return
    p = subprocess.run(["readelf", "-d", DIVERGED], capture_output=True,
                       text=True, timeout=30)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]",
                        p.stdout)
    libs = subprocess.run(["ldd", DIVERGED], capture_output=True,
                          text=True, timeout=30).stdout
    where = dict(re.findall(r"^\s*(\S+) => (/\S+)", libs, re.M))
    lacking = []
    for lib in needed:
        if lib.startswith(SANITIZER_LIBS):
            continue
        path = os.path.realpath(where.get(lib, lib))
        q = subprocess.run(["dpkg", "-S", path], capture_output=True,
                           text=True)
        if q.returncode != 0:       # merged /usr: dpkg knows the other name
            q = subprocess.run(["dpkg", "-S", where.get(lib, lib)],
                               capture_output=True, text=True)
        pkg = q.stdout.split(":")[0] if q.returncode == 0 else "?" + lib
        if pkg not in pkgs and pkg not in BASE_PACKAGES:
            lacking.append((lib, pkg))
    t.ok(len(needed) >= 7 and not lacking,
         "the image's runtime packages provide every library diverged "
         "links", lacking or needed)
    t.ok("USER 65532:65532" in runtime and
         'CMD ["--config", "/etc/diverge/diverged.yaml"]' in runtime,
         "the image runs as the pod's uid, with the manifest's config path")


def image_build(t):
    """The build stage installs what configure requires, and the context
    leaves out what a local build made (scripts/check-image builds the
    image itself; the tests cannot)."""
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        build = f.read().split("\nFROM ")[1]     # the first stage
    with open(os.path.join(TOP_SRCDIR, "configure.ac")) as f:
        required = re.findall(r"^DIVERGE_LIB\(\[\w+\], \[[^]]*\], "
                              r"\[([^]]+)\]\)", f.read(), re.M)
    m = re.search(r"RUN \./scripts/install-deps( --build-only)?\s", build)
    p = subprocess.run([os.path.join(TOP_SRCDIR, "scripts", "install-deps"),
                        "--build-only", "--print"], capture_output=True,
                       text=True, timeout=30)
    pkgs = set(p.stdout.split())
    missing = [d for d in required if d not in pkgs]
    t.ok(m is not None and m.group(1) and p.returncode == 0 and
         len(required) >= 8 and not missing,
         "the build stage's install-deps --build-only installs every "
         "library configure requires", missing or required)
    t.ok(not {"clang", "nodejs", "npm", "python3"} & pkgs,
         "and none of the test tools", sorted(pkgs))
    with open(os.path.join(TOP_SRCDIR, ".dockerignore")) as f:
        ignored = set(f.read().split("\n"))
    want = {"**/*.o", "**/*.a", "config.status", "Makefile", "config.h",
            "diverged", "diverge"}
    t.ok(want <= ignored, "the image's context leaves out a local build's "
         "objects, Makefiles and binaries", sorted(want - ignored))


def main(t):
    try:
        import yaml  # noqa: F401
    except ImportError:
        t.skip_all("PyYAML is not installed (python3-yaml)")
    tmp = tempfile.mkdtemp(prefix="diverge-deploy-")
    try:
        systemd(t, tmp)
        kubernetes(t, tmp)
        image(t)
        image_build(t)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


run_tests(main)
