"""README.md and the reference pages say what the code does, checked by
machine where that is cheap: every YAML block of README.md and
doc/config.md, and the EXAMPLE of diverged.yaml(5), passes diverged
--check-config; doc/config.md and diverged.yaml(5) have exactly the keys
of config.c's field tables, with the range and default the code gives
them, and every key README.md and bench/README.md quote is one; the
metric table of README.md names exactly the metrics a running daemon
(both providers, with API tokens, against the fake SCM APIs) exports,
with their types and the labels of their samples (the diverge_kube_* of
a daemon on a cluster: test_kube_metrics.py); the options of diverged
--help are those of the README's and diverged(8)'s synopses; the diverge
commands the README shows are in diverge --help."""

import os
import re
import subprocess
import tempfile

from divtest import (DIVERGED, TOP_BUILDDIR, TOP_SRCDIR, ScmFake,
                     meter, run_tests, scm_daemon)

DIVERGE = os.path.join(TOP_BUILDDIR, "diverge")


def read(*rel):
    with open(os.path.join(TOP_SRCDIR, *rel), encoding="utf-8") as f:
        return f.read()


def yaml_blocks(markdown):
    """(first line, text) of each ```yaml block."""
    out = []
    lines = markdown.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```yaml":
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            out.append((start + 1, "\n".join(lines[start:j]) + "\n"))
            i = j
        i += 1
    return out


def man_example(roff):
    """The .EX block of the EXAMPLE section of a man page, unescaped."""
    m = re.search(r"^\.SH EXAMPLE\n\.EX\n(.*?)^\.EE", roff, re.M | re.S)
    if not m:
        return None
    return m.group(1).replace("\\-", "-").replace("\\e", "\\")


def check_config(text, tmp, name):
    """diverged --check-config on text, with the files its file: secrets
    name made under tmp and its env: secrets set: (status, stderr)."""
    env = dict(os.environ)
    for path in sorted(set(re.findall(r"file:(/[^\"'\]\s,}]+)", text))):
        local = os.path.join(tmp, name + ".d", path.lstrip("/"))
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with open(local, "w") as f:
            f.write("not-a-real-secret\n")
        text = text.replace("file:" + path, "file:" + local)
    for var in re.findall(r"env:([A-Za-z_][A-Za-z0-9_]*)", text):
        env[var] = "not-a-real-secret"
    cfg = os.path.join(tmp, name + ".yaml")
    with open(cfg, "w") as f:
        f.write(text)
    p = subprocess.run([DIVERGED, "--config", cfg, "--check-config"],
                       capture_output=True, text=True, timeout=30, env=env)
    return p.returncode, p.stderr


def configs(t, tmp):
    blocks = [("README.md", line, text)
              for line, text in yaml_blocks(read("README.md"))]
    blocks += [("doc/config.md", line, text)
               for line, text in yaml_blocks(read("doc", "config.md"))]
    t.ok(len(blocks) >= 3, "README.md and doc/config.md have YAML blocks",
         len(blocks))
    for i, (where, line, text) in enumerate(blocks):
        rc, err = check_config(text, tmp, "block%d" % i)
        t.ok(rc == 0, "%s:%d passes diverged --check-config" % (where, line),
             err)
    ex = man_example(read("doc", "diverged.yaml.5"))
    t.ok(ex is not None, "diverged.yaml(5) has an EXAMPLE")
    if ex is not None:
        rc, err = check_config(ex, tmp, "man5")
        t.ok(rc == 0, "the EXAMPLE of diverged.yaml(5) passes "
             "diverged --check-config", err)


def readme_metrics():
    """{name: type} of the metric table of README.md."""
    text = read("README.md")
    section = text.split("### Metrics", 1)[1].split("\n### ", 1)[0]
    return dict(re.findall(r"^\| `(diverge_[a-z_]+)` \| (\w+) \|", section,
                           re.M))


def readme_metric_labels():
    """{name: the words in backquotes of its labels column}."""
    text = read("README.md")
    section = text.split("### Metrics", 1)[1].split("\n### ", 1)[0]
    return {n: set(re.findall(r"`([a-z_]+)`", rest)) for n, rest in
            re.findall(r"^\| `(diverge_[a-z_]+)` \| \w+ \|(.*)$", section,
                       re.M)}


def exported_labels(text):
    """{family: label names} of the samples of a /metrics text, le aside."""
    out = {}
    for name, labels in re.findall(r"^(diverge_[a-z_]+)\{([^}]*)\}", text,
                                   re.M):
        name = re.sub(r"_(bucket|sum|count)$", "", name)
        out.setdefault(name, set()).update(
            n for n in re.findall(r"([a-z_]+)=\"", labels) if n != "le")
    return out


def metrics(t):
    # a daemon on a cluster's are checked by test_kube_metrics.py
    documented = {n: k for n, k in readme_metrics().items()
                  if not n.startswith("diverge_kube_")}
    t.ok(len(documented) >= 20, "README.md has a metric table",
         documented)
    fake = ScmFake()
    try:
        d = scm_daemon(fake)
        d.start()
        # samples of the labelled families: a route, a delivery, a refusal
        d.request("GET", "/healthz")
        d.github("ping", {"zen": "x"}, "readme-1")
        meter(d, None, {})
        text = d.metrics()
        d.stop()
    finally:
        fake.stop()
    exported = dict(re.findall(r"^# TYPE (diverge_[a-z_]+) (\w+)$", text,
                               re.M))
    t.eq(sorted(set(documented) - set(exported)), [],
         "every metric of the README's table is exported")
    t.eq(sorted(set(exported) - set(documented)), [],
         "every exported metric is in the README's table")
    t.eq(sorted(n for n in documented if n in exported and
                documented[n] != exported[n]), [],
         "the README gives each metric its exported type")
    names = readme_metric_labels()
    t.eq(sorted("%s{%s}" % (n, ",".join(sorted(ls - names.get(n, set()))))
                for n, ls in exported_labels(text).items()
                if ls - names.get(n, set())), [],
         "the README names every label of the exported samples")


CONSTS = {"KIB": 1024, "MIB": 1024 ** 2, "GIB": 1024 ** 3, "USD": 10 ** 6,
          "DAY": 86400}


def c_value(expr):
    """The value of a constant C expression of config.c: digits, INT64_C,
    KIB/MIB/GIB/USD/DAY, * and +."""
    expr = re.sub(r"INT64_C\((\d+)\)", r"\1", expr)
    expr = re.sub(r"[A-Z]+", lambda m: str(CONSTS[m.group(0)]), expr)
    if not re.fullmatch(r"[\d\s*+()]+", expr):
        raise ValueError(expr)
    return eval(expr)  # digits and operators only


def config_fields():
    """{key: (parser, member, lo, hi)} of the field tables of config.c,
    keys as the reference pages write them (repos[].match)."""
    src = read("src", "config", "config.c")
    tables = {}
    for m in re.finditer(r"static const struct field (\w+)\[\] = \{(.*?)"
                         r"\n\};", src, re.S):
        rows = []
        for e in re.finditer(
                r"\b(F|FS|FR|FIELD|MAP)\((?:struct \w+,\s*)?\"(\w+)\",\s*"
                r"(\w+)(?:,\s*([\w.]+))?((?:[^()]|\([^()]*\))*)\)",
                m.group(2)):
            kind, key, fn, member, rest = e.groups()
            lo = hi = None
            args = [a.strip() for a in rest.split(",") if a.strip()]
            if kind == "FR":
                lo, hi = args[0], args[1]
            elif kind == "FIELD":
                lo, hi = args[0], args[1]
            rows.append((kind, key, fn, member, lo, hi))
        tables[m.group(1)] = rows
    out = {}

    def walk(table, prefix):
        for kind, key, fn, member, lo, hi in tables[table]:
            if kind == "MAP":
                walk(fn, prefix + key + ".")
            elif fn == "p_repos":
                walk("repo_fields", prefix + key + "[].")
            else:
                out[prefix + key] = (fn, member, lo, hi)
    walk("root_fields", "")
    return out


def config_md_keys():
    """{key: type column} of the tables of doc/config.md."""
    rows = re.findall(r"^\| `([a-zA-Z_.\[\]]+)` \| ([^|]*) \|",
                      read("doc", "config.md"), re.M)
    # the top level's mapping and sequence rows stand for their tables
    return {re.sub(r"^(\w+)\[\]$", r"\1", k): v.strip()
            for k, v in rows if v.strip() not in ("mapping", "sequence")}


def man5_keys():
    """{key: parenthesis} of the .TP tags of diverged.yaml(5)."""
    roff = read("doc", "diverged.yaml.5").replace("\\-", "-")
    out = {}
    for tag in re.findall(r"^\.TP\n\.BR? (.*)$", roff, re.M):
        words = [a or b for a, b in re.findall(r"\"([^\"]*)\"|(\S+)", tag)]
        head, _, paren = "".join(words).partition(" (")
        if not re.fullmatch(r"[a-z][a-zA-Z_.\[\], ]*", head):
            continue
        for key in re.findall(r"[a-zA-Z_.\[\]]+", head):
            out[re.sub(r"^(\w+)\[\]$", r"\1", key)] = paren.rstrip(")")
    return out


def duration(s):
    if re.fullmatch(r"\d+", s):
        return int(s)
    total = 0
    for n, u in re.findall(r"(\d+)([dhms])", s):
        total += int(n) * {"d": 86400, "h": 3600, "m": 60, "s": 1}[u]
    return total


def duration_ms(s):
    """A duration that may have milliseconds (p_duration_ms), in ms."""
    if re.fullmatch(r"\d+", s):
        return int(s) * 1000
    total = 0
    for n, u in re.findall(r"(\d+)(ms|[dhms])", s):
        total += int(n) * {"d": 86400000, "h": 3600000, "m": 60000,
                           "s": 1000, "ms": 1}[u]
    return total


def size(s):
    m = re.fullmatch(r"(\d+)(B|KiB|MiB|GiB)?", s)
    return int(m.group(1)) * {None: 1, "B": 1, "KiB": 1024,
                              "MiB": 1024 ** 2, "GiB": 1024 ** 3}[m.group(2)]


def doc_number(fn, s):
    s = s.strip().strip("`")
    s = re.sub(r"10\^(\d+)", lambda m: str(10 ** int(m.group(1))), s)
    if fn == "p_duration":
        return duration(s)
    if fn == "p_duration_ms":
        return duration_ms(s)
    if fn == "p_size":
        return size(s)
    if fn == "p_usd":
        return round(float(s) * 10 ** 6)
    return int(s)


def config_defaults():
    """{member: C expression} of config_defaults()."""
    src = read("src", "config", "config.c")
    body = src.split("\nconfig_defaults(struct config *c)\n{", 1)[1]
    body = body.split("\n}", 1)[0]
    return dict(re.findall(r"c->([\w.]+) = (.*);", body))


def config_keys(t):
    fields = config_fields()
    t.ok(len(fields) >= 60, "config.c has field tables", len(fields))
    md = config_md_keys()
    man = man5_keys()
    t.eq(sorted(set(fields) - set(md)), [],
         "doc/config.md has every key config.c accepts")
    t.eq(sorted(set(md) - set(fields)), [],
         "every key of doc/config.md is one config.c accepts")
    t.eq(sorted(set(fields) - set(man)), [],
         "diverged.yaml(5) has every key config.c accepts")
    t.eq(sorted(set(man) - set(fields)), [],
         "every key of diverged.yaml(5) is one config.c accepts")
    # the range of each bounded key, in both pages
    wrong = []
    for key, (fn, member, lo, hi) in sorted(fields.items()):
        if lo is None or fn not in ("p_int", "p_duration",
                                    "p_duration_ms", "p_size", "p_usd"):
            continue
        want = (c_value(lo), c_value(hi))
        for page, text in (("config.md", md.get(key, "")),
                           ("diverged.yaml.5", man.get(key, ""))):
            m = re.search(r"([\w^.]+) to ([\w^.]+)", text)
            got = ((doc_number(fn, m.group(1)), doc_number(fn, m.group(2)))
                   if m else None)
            if got != want:
                wrong.append("%s %s: %s, code %s" % (page, key, text, want))
    t.eq(wrong, [], "the reference pages give each key its range")
    # the default of each number, boolean and string key, in both pages
    defaults = config_defaults()
    md_text = read("doc", "config.md")
    wrong = []
    for key, (fn, member, lo, hi) in sorted(fields.items()):
        if "[]" in key:
            continue    # a repos rule's fields: required, no default
        if fn in ("p_int", "p_duration", "p_duration_ms", "p_size",
                  "p_usd", "p_bool"):
            expr = defaults.get(member, "0")
            want = c_value(expr)
        elif member in defaults and defaults[member].startswith("xstrdup"):
            want = re.match(r"xstrdup\(\"(.*)\"\)",
                            defaults[member]).group(1)
        else:
            continue
        row = re.search(r"^\| `%s` \| [^|]* \| ([^|]*) \|" % re.escape(key),
                        md_text, re.M)
        md_default = row.group(1).strip() if row else ""
        m = re.search(r"default (\S+?)\)?$", man.get(key, ""))
        man_default = m.group(1) if m else ""
        for page, got in (("config.md", md_default),
                          ("diverged.yaml.5", man_default)):
            got = got.strip("`")
            if fn == "p_bool":
                ok = got == ("true" if want else "false")
            elif isinstance(want, str):
                ok = got == want or (want == "" and
                                     got in ('""', '\\(dq\\(dq'))
            else:
                try:
                    ok = doc_number(fn, got) == want
                except (ValueError, AttributeError, KeyError):
                    ok = False
            if not ok:
                wrong.append("%s %s: %r, code %r" % (page, key, got, want))
    t.eq(wrong, [], "the reference pages give each key its default")
    # the keys README.md and bench/README.md quote are keys, or mappings
    known = set(fields)
    for key in fields:
        parts = key.split(".")
        known.update(".".join(parts[:i]) for i in range(1, len(parts)))
    sections = "|".join(sorted({k.split(".")[0].rstrip("[]")
                                for k in fields if "." in k}))
    quoted = set()
    for rel in (("README.md",), ("bench", "README.md")):
        quoted.update(re.findall(r"`((?:%s)(?:\[\])?\.[a-zA-Z_.\[\]]*"
                                 r"[a-zA-Z_\]])[`: ]" % sections,
                                 read(*rel)))
    t.eq(sorted(k for k in quoted - known
                if not re.search(r"\.(com|io|org)$", k)), [],
         "every key README.md and bench/README.md quote is in config.c")


def long_options(text):
    return set(re.findall(r"(--[a-z][a-z-]+)", text))


def options(t):
    p = subprocess.run([DIVERGED, "--help"], capture_output=True, text=True,
                       timeout=10)
    t.eq(p.returncode, 0, "diverged --help exits 0")
    helped = long_options(p.stdout)
    readme = read("README.md")
    m = re.search(r"^    diverged \[.*?(?=\n\n)", readme, re.M | re.S)
    t.ok(m is not None, "README.md has the synopsis of diverged")
    synopsis = long_options(m.group(0)) if m else set()
    t.eq(sorted(synopsis), sorted(helped),
         "the README's synopsis has the options of diverged --help")
    bullets = readme.split("## Running it", 1)[1].split("```yaml", 1)[0]
    described = long_options(bullets.split("\n*", 1)[1])
    t.eq(sorted(helped - described - {"--help", "--version"}), [],
         "the README describes every option of diverged --help")
    man = read("doc", "diverged.8").replace("\\-", "-")
    syn = man.split(".SH SYNOPSIS", 1)[1].split(".SH", 1)[0]
    t.eq(sorted(long_options(syn)), sorted(helped),
         "diverged(8)'s synopsis has the options of diverged --help")
    opts = man.split(".SH OPTIONS", 1)[1].split(".SH", 1)[0]
    t.eq(sorted(helped - long_options(opts)), [],
         "diverged(8) describes every option of diverged --help")

    p = subprocess.run([DIVERGE, "--help"], capture_output=True, text=True,
                       timeout=10)
    commands = set(re.findall(r"^  (task \w+|token \w+)", p.stdout, re.M))
    shown = set()
    for line in re.findall(r"^    diverge (task|token) (\S+)", readme, re.M):
        for sub in line[1].split("|"):
            shown.add("%s %s" % (line[0], sub))
    t.eq(sorted(shown - commands), [],
         "every diverge command the README shows is in diverge --help")
    t.eq(sorted(commands - shown), [],
         "the README shows every command of diverge --help")


def main(t):
    tmp = tempfile.mkdtemp(prefix="diverge-readme-")
    configs(t, tmp)
    config_keys(t)
    options(t)
    metrics(t)


if __name__ == "__main__":
    run_tests(main)
