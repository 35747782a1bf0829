/*
 * Unit tests of the REST backend's configuration: kubeconfig files
 * (contexts, data and path fields, tokens, relative paths, KUBECONFIG
 * merges, every error with its exact message), the in-cluster service
 * account under a fake root, and the parts of rest.c that need no server:
 * k8s_rest_open's checks, a refused connection, and the watch line parser;
 * then proxy-url against the fake API server and tests/fakes/connect_proxy.py.
 */
#include "config.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <sys/socket.h>
#include <sys/stat.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k8s/k8s.h"
#include "util/util.h"
#include "testutil.h"
#include "storeenv.h"

/* Not in the header: exported for the fuzz target and these tests. */
int k8s_kubeconfig_parse_mem(struct k8s_cluster *out, const char *name,
    const char *text, size_t len, const char *context, char **cause);
int k8s_rest_watch_parse_line(const char *line, size_t len,
    struct k8s_event *out, struct k8s_status *st);

/* ---- helpers ---- */

static char *
data_path(const char *name)
{
	const char *top = getenv("top_srcdir");

	return xasprintf("%s/tests/data/kubeconfig/%s", top ? top : ".",
	    name);
}

/* Load that must work; fails the test with the cause if not. */
static void
load_ok(struct k8s_cluster *c, const char *paths, const char *context)
{
	char *cause = NULL;

	memset(c, 0, sizeof(*c));
	if (k8s_kubeconfig_load(c, paths, context, &cause) != 0)
		fail_msg("unexpected error: %s", cause);
	assert_null(cause);
	assert_non_null(c->server);
	assert_non_null(c->namespace);
}

/* Load a data file that must work. */
static void
load_data_ok(struct k8s_cluster *c, const char *file, const char *context)
{
	char *path = data_path(file);

	load_ok(c, path, context);
	free(path);
}

/*
 * Load that must fail; checks that *out was not written and returns the
 * cause (to free).
 */
static char *
load_err(const char *paths, const char *context)
{
	struct k8s_cluster c, saved;
	char *cause = NULL;

	memset(&c, 0xa5, sizeof(c));
	memcpy(&saved, &c, sizeof(c));
	assert_int_equal(k8s_kubeconfig_load(&c, paths, context, &cause), -1);
	assert_non_null(cause);
	assert_null(strchr(cause, '\n'));
	assert_memory_equal(&c, &saved, sizeof(c));
	return cause;
}

/* realpath() of a file that exists, compared with another path. */
static void
assert_same_file(const char *got, const char *want)
{
	char a[PATH_MAX], b[PATH_MAX];

	assert_non_null(got);
	assert_true(got[0] == '/');
	if (realpath(got, a) == NULL)
		fail_msg("'%s': %s", got, strerror(errno));
	if (realpath(want, b) == NULL)
		fail_msg("'%s': %s", want, strerror(errno));
	assert_string_equal(a, b);
}

static int
ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* fmt with its one "%s" replaced by path. */
static char *
subst(const char *fmt, const char *path)
{
	const char *at = strstr(fmt, "%s");

	assert_non_null(at);
	return xasprintf("%.*s%s%s", (int)(at - fmt), fmt, path, at + 2);
}

static void
write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_int_equal(fputs(text, f) >= 0, 1);
	assert_int_equal(fclose(f), 0);
}

static char *
make_tmpdir(void)
{
	return test_tmpdir("kubeconfig");
}

/* rm -r of the small trees the tests make. */
static void
remove_tree(const char *dir, const char *const *rel)
{
	char *p;
	size_t i;

	for (i = 0; rel[i] != NULL; i++) {
		p = xasprintf("%s/%s", dir, rel[i]);
		if (unlink(p) < 0)
			rmdir(p);
		free(p);
	}
	rmdir(dir);
}

/*
 * Parse a kubeconfig at /etc/kube/config whose cluster c is
 * "{cluster: {CLUSTER}}" and user u "{user: {USER}}".
 */
static int
parse_kc(struct k8s_cluster *c, const char *cluster, const char *user,
    char **cause)
{
	char *text = xasprintf("current-context: m\n"
	    "contexts: [{name: m, context: {cluster: c, user: u}}]\n"
	    "clusters: [{name: c, cluster: {%s}}]\n"
	    "users: [{name: u, user: {%s}}]\n", cluster, user);
	int rc;

	memset(c, 0, sizeof(*c));
	*cause = NULL;
	rc = k8s_kubeconfig_parse_mem(c, "/etc/kube/config", text,
	    strlen(text), NULL, cause);
	free(text);
	return rc;
}

/* Parse a kubeconfig whose user u is "{user: {USER}}". */
static int
parse_user(struct k8s_cluster *c, const char *user, char **cause)
{
	return parse_kc(c, "server: 'https://k.example'", user, cause);
}

/* Parse a kubeconfig whose cluster c is "{cluster: {CLUSTER}}". */
static int
parse_cluster(struct k8s_cluster *c, const char *cluster, char **cause)
{
	return parse_kc(c, cluster, "", cause);
}

/*
 * parse_kc() that must fail (a NULL cluster has just a server): the
 * message is fmt with "%s" the file's path, and quotes no TOPSECRET.
 */
static void
kc_err(const char *cluster, const char *user, const char *fmt)
{
	struct k8s_cluster c, zero;
	char *cause = NULL, *want = subst(fmt, "/etc/kube/config");

	memset(&zero, 0, sizeof(zero));
	assert_int_equal(parse_kc(&c, cluster != NULL ? cluster :
	    "server: 'https://k.example'", user, &cause), -1);
	assert_string_equal(cause, want);
	assert_null(strstr(cause, "TOPSECRET"));
	/* nothing written */
	assert_memory_equal(&c, &zero, sizeof(c));
	free(want);
	free(cause);
}

static int
setup(void **state)
{
	(void)state;
	unsetenv("KUBECONFIG");
	unsetenv("POD_NAMESPACE");
	unsetenv("KUBERNETES_SERVICE_HOST");
	unsetenv("KUBERNETES_SERVICE_PORT");
	return 0;
}

/* ---- kubeconfig: successful loads ---- */

static void
test_current_context(void **state)
{
	struct k8s_cluster c;

	(void)state;
	load_data_ok(&c, "multi.yaml", NULL);
	assert_string_equal(c.server, "https://dev.example.com:6443");
	assert_string_equal(c.namespace, "dev-ns");
	assert_string_equal(c.token, "s3cr3t-dev-token");
	assert_null(c.token_file);
	assert_null(c.ca_file);
	assert_null(c.ca_data);
	assert_int_equal(c.insecure, 0);
	assert_null(c.cert_file);
	assert_null(c.username);
	k8s_cluster_release(&c);

	/* "" means the current context too */
	load_data_ok(&c, "multi.yaml", "");
	assert_string_equal(c.server, "https://dev.example.com:6443");
	k8s_cluster_release(&c);
}

static void
test_context_by_name_paths(void **state)
{
	struct k8s_cluster c;
	char *ca = data_path("certs/ca.crt");
	char *cert = data_path("certs/client.crt");

	(void)state;
	load_data_ok(&c, "multi.yaml", "prod");
	/* trailing slashes of the prefix go */
	assert_string_equal(c.server, "https://prod.example.com:6443/k8s");
	assert_string_equal(c.namespace, "default");
	assert_same_file(c.ca_file, ca);
	assert_same_file(c.cert_file, cert);
	/* absolute paths stay as they are */
	assert_string_equal(c.key_file, "/abs/path/client.key");
	assert_null(c.token);
	assert_null(c.cert_data);
	assert_null(c.key_data);
	k8s_cluster_release(&c);
	free(ca);
	free(cert);
}

static void
test_data_fields(void **state)
{
	struct k8s_cluster c;

	(void)state;
	load_data_ok(&c, "multi.yaml", "data");
	assert_string_equal(c.server, "https://10.0.0.1:6443");
	assert_string_equal(c.namespace, "data-ns");
	assert_null(c.ca_file);
	assert_string_equal(c.ca_data, "-----BEGIN CERTIFICATE-----\n"
	    "MIIBfakeCAdataForTests0123456789\n-----END CERTIFICATE-----\n");
	assert_string_equal(c.cert_data, "-----BEGIN CERTIFICATE-----\n"
	    "MIIBfakeClientCertForTests\n-----END CERTIFICATE-----\n");
	assert_string_equal(c.key_data, "-----BEGIN PRIVATE KEY-----\n"
	    "MIIEfakeClientKeyForTestsSECRETKEY\n-----END PRIVATE KEY-----\n");
	assert_null(c.cert_file);
	assert_null(c.key_file);
	k8s_cluster_release(&c);

	/* line breaks in the base64, as base64(1) wraps it, are skipped */
	load_data_ok(&c, "multi.yaml", "wrapped");
	assert_string_equal(c.ca_data, "-----BEGIN CERTIFICATE-----\n"
	    "MIIBfakeCAdataForTests0123456789\n-----END CERTIFICATE-----\n");
	k8s_cluster_release(&c);
}

static void
test_data_overrides_path(void **state)
{
	struct k8s_cluster c;
	char *cause = NULL;

	(void)state;
	load_data_ok(&c, "multi.yaml", "both-ca");
	assert_null(c.ca_file);
	assert_non_null(c.ca_data);
	/* a context whose user is "": no credentials at all */
	assert_null(c.token);
	assert_null(c.token_file);
	assert_null(c.cert_data);
	k8s_cluster_release(&c);

	/* so do client-certificate-data and client-key-data */
	assert_int_equal(parse_user(&c, "client-certificate: c.pem, "
	    "client-certificate-data: Y2VydA==, client-key: k.pem, "
	    "client-key-data: a2V5", &cause), 0);
	assert_null(c.cert_file);
	assert_null(c.key_file);
	assert_string_equal(c.cert_data, "cert");
	assert_string_equal(c.key_data, "key");
	k8s_cluster_release(&c);
}

static void
test_token_file_relative(void **state)
{
	struct k8s_cluster c;

	(void)state;
	load_data_ok(&c, "multi.yaml", "tokfile");
	assert_null(c.token);
	assert_non_null(c.token_file);
	assert_true(c.token_file[0] == '/');
	assert_true(ends_with(c.token_file,
	    "/tests/data/kubeconfig/secrets/token"));
	k8s_cluster_release(&c);
}

static void
test_basic_auth(void **state)
{
	struct k8s_cluster c;

	(void)state;
	load_data_ok(&c, "multi.yaml", "basic");
	assert_string_equal(c.username, "admin");
	assert_string_equal(c.password, "hunter2");
	assert_null(c.token);
	k8s_cluster_release(&c);
}

static void
test_insecure_server_name(void **state)
{
	struct k8s_cluster c;

	(void)state;
	load_data_ok(&c, "multi.yaml", "lab");
	assert_int_equal(c.insecure, 1);
	assert_string_equal(c.tls_server_name, "kubernetes.default");
	assert_string_equal(c.server, "https://lab.internal:8443");
	assert_null(c.ca_file);
	k8s_cluster_release(&c);
}

/*
 * insecure-skip-tls-verify takes YAML 1.1's booleans, as kubectl reads
 * the file.
 */
static void
test_yaml_booleans(void **state)
{
	static const char *const yes[] = { "true", "True", "TRUE", "yes",
	    "Yes", "YES", "on", "On", "ON", "y", "Y" };
	static const char *const no[] = { "false", "False", "FALSE", "no",
	    "No", "NO", "off", "Off", "OFF", "n", "N" };
	struct k8s_cluster c;
	char *cause = NULL, *f;
	const char *v;
	size_t i;
	int want;

	(void)state;
	for (want = 0; want <= 1; want++) {
		for (i = 0; i < ARRAY_SIZE(yes); i++) {
			v = want ? yes[i] : no[i];
			f = xasprintf("server: 'https://k.example', "
			    "insecure-skip-tls-verify: %s", v);
			if (parse_cluster(&c, f, &cause) != 0)
				fail_msg("'%s': %s", v, cause);
			if (c.insecure != want)
				fail_msg("'%s' read as %d", v, c.insecure);
			k8s_cluster_release(&c);
			free(f);
		}
	}
}

static void
test_namespace_default_bare_server(void **state)
{
	struct k8s_cluster c;

	(void)state;
	/* namespace: "" is the default; a bare host:port gets https:// */
	load_data_ok(&c, "multi.yaml", "bare");
	assert_string_equal(c.namespace, "default");
	assert_string_equal(c.server, "https://bare.example.com:6443");
	k8s_cluster_release(&c);
}

static void
test_merge_first_wins(void **state)
{
	struct k8s_cluster c;
	char *a = data_path("merge-a.yaml"), *b = data_path("merge-b.yaml");
	char *list = xasprintf("%s:%s", a, b);

	(void)state;
	/* current-context from a; cluster "shared" and a-user from a */
	load_ok(&c, list, NULL);
	assert_string_equal(c.server, "https://from-a.example.com");
	assert_string_equal(c.namespace, "team-a");
	assert_string_equal(c.token, "token-from-a");
	k8s_cluster_release(&c);

	/* a context only b defines, resolving names across both files */
	load_ok(&c, list, "b-shared");
	assert_string_equal(c.server, "https://from-a.example.com");
	assert_string_equal(c.token, "token-from-a");
	k8s_cluster_release(&c);
	free(a);
	free(b);
	free(list);
}

static void
test_merge_second_file_paths(void **state)
{
	struct k8s_cluster c;
	char *a = data_path("merge-a.yaml"), *b = data_path("merge-b.yaml");
	char *list = xasprintf("%s::%s", a, b);

	(void)state;
	/* empty entries are skipped; b's paths resolve against b's dir */
	load_ok(&c, list, "b-ctx");
	assert_string_equal(c.server, "https://b.example.com:6443");
	assert_string_equal(c.namespace, "default");
	assert_true(ends_with(c.ca_file, "/tests/data/kubeconfig/b-ca.crt"));
	assert_true(ends_with(c.token_file,
	    "/tests/data/kubeconfig/b-token"));
	k8s_cluster_release(&c);
	free(a);
	free(b);
	free(list);
}

static void
test_merge_missing_file_skipped(void **state)
{
	struct k8s_cluster c;
	char *b = data_path("merge-b.yaml"), *none;
	char *list = xasprintf("/nonexistent/kubeconfig:%s", b);

	(void)state;
	load_ok(&c, list, NULL);
	/* b's current-context, now that a is absent */
	assert_string_equal(c.server, "https://b.example.com:6443");
	k8s_cluster_release(&c);
	free(list);

	/* and when the first file sets none */
	none = data_path("no-current.yaml");
	list = xasprintf("%s:%s", none, b);
	load_ok(&c, list, NULL);
	assert_string_equal(c.server, "https://b.example.com:6443");
	k8s_cluster_release(&c);
	free(none);
	free(b);
	free(list);
}

static void
test_kubeconfig_env(void **state)
{
	struct k8s_cluster c;
	char *a = data_path("merge-a.yaml"), *b = data_path("merge-b.yaml");
	char *list = xasprintf("%s:%s", b, a);

	(void)state;
	setenv("KUBECONFIG", list, 1);
	/* NULL and "" both mean $KUBECONFIG; b is first this time */
	load_ok(&c, NULL, NULL);
	assert_string_equal(c.server, "https://b.example.com:6443");
	k8s_cluster_release(&c);
	load_ok(&c, "", "a-ctx");
	/* b defines a-ctx too, and b comes first */
	assert_string_equal(c.server, "https://b.example.com:6443");
	k8s_cluster_release(&c);
	unsetenv("KUBECONFIG");
	free(a);
	free(b);
	free(list);
}

static void
test_home_default(void **state)
{
	static const char *const tree[] = { ".kube/config", ".kube", NULL };
	struct k8s_cluster c;
	char *dir = make_tmpdir(), *p, *old = NULL;

	(void)state;
	if (getenv("HOME") != NULL)
		old = xstrdup(getenv("HOME"));
	p = xasprintf("%s/.kube", dir);
	assert_int_equal(mkdir(p, 0700), 0);
	free(p);
	p = xasprintf("%s/.kube/config", dir);
	write_file(p, "current-context: home\n"
	    "contexts: [{name: home, context: {cluster: h}}]\n"
	    "clusters: [{name: h, cluster: {server: 'https://home:1'}}]\n");
	free(p);
	setenv("HOME", dir, 1);
	load_ok(&c, NULL, NULL);
	assert_string_equal(c.server, "https://home:1");
	k8s_cluster_release(&c);
	if (old != NULL)
		setenv("HOME", old, 1);
	else
		unsetenv("HOME");
	free(old);
	remove_tree(dir, tree);
	free(dir);
}

static void
test_relative_paths_tmp(void **state)
{
	static const char *const tree[] = { "sub/config", "sub", NULL };
	struct k8s_cluster c;
	char *dir = make_tmpdir(), *p, *want;

	(void)state;
	p = xasprintf("%s/sub", dir);
	assert_int_equal(mkdir(p, 0700), 0);
	free(p);
	p = xasprintf("%s/sub/config", dir);
	write_file(p, "apiVersion: v1\n"
	    "kind: Config\n"
	    "current-context: t\n"
	    "clusters:\n"
	    "- name: c\n"
	    "  cluster:\n"
	    "    server: https://127.0.0.1:6443\n"
	    "    certificate-authority: pki/ca.pem\n"
	    "users:\n"
	    "- name: u\n"
	    "  user:\n"
	    "    client-certificate: ../client.pem\n"
	    "    client-key: ./client-key.pem\n"
	    "    tokenFile: /var/run/abs-token\n"
	    "contexts:\n"
	    "- name: t\n"
	    "  context: {cluster: c, user: u, namespace: ns1}\n");
	load_ok(&c, p, NULL);
	want = xasprintf("%s/sub/pki/ca.pem", dir);
	assert_string_equal(c.ca_file, want);
	free(want);
	want = xasprintf("%s/sub/../client.pem", dir);
	assert_string_equal(c.cert_file, want);
	free(want);
	want = xasprintf("%s/sub/./client-key.pem", dir);
	assert_string_equal(c.key_file, want);
	free(want);
	assert_string_equal(c.token_file, "/var/run/abs-token");
	assert_string_equal(c.namespace, "ns1");
	k8s_cluster_release(&c);
	free(p);
	remove_tree(dir, tree);
	free(dir);
}

/*
 * Paths in a kubeconfig named without a directory, with "./" or in "/"
 * resolve to clean absolute paths, from a working directory of "/" too.
 */
static void
test_relative_kubeconfig_name(void **state)
{
	static const char text[] =
	    "current-context: m\n"
	    "contexts: [{name: m, context: {cluster: c, user: u}}]\n"
	    "clusters: [{name: c, cluster: {server: 'https://k.example'}}]\n"
	    "users: [{name: u, user: {tokenFile: t}}]\n";
	static const struct {
		const char *name, *cwd;	/* cwd NULL: the test's */
		const char *want;	/* relative: to the test's cwd */
	} cases[] = {
		{ "/config", NULL, "/t" },
		{ "config", NULL, "t" },
		{ "./kube/config", NULL, "kube/t" },
		{ ".//./kube/config", NULL, "kube/t" },
		{ "etc/kube/config", "/", "/etc/kube/t" },
	};
	struct k8s_cluster c;
	char cwd[PATH_MAX], *cause, *want;
	size_t i;
	int rc;

	(void)state;
	assert_non_null(getcwd(cwd, sizeof(cwd)));
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		if (cases[i].cwd != NULL)
			assert_int_equal(chdir(cases[i].cwd), 0);
		memset(&c, 0, sizeof(c));
		cause = NULL;
		rc = k8s_kubeconfig_parse_mem(&c, cases[i].name, text,
		    strlen(text), NULL, &cause);
		/* back before an assertion can end the test */
		assert_int_equal(chdir(cwd), 0);
		if (rc != 0)
			fail_msg("'%s': %s", cases[i].name, cause);
		want = cases[i].want[0] == '/' ? xstrdup(cases[i].want) :
		    xasprintf("%s/%s", cwd, cases[i].want);
		assert_string_equal(c.token_file, want);
		free(want);
		k8s_cluster_release(&c);
	}
}

static void
test_parse_mem(void **state)
{
	static const char text[] =
	    "current-context: m\n"
	    "contexts: [{name: m, context: {cluster: c, user: u}}]\n"
	    "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:8081/',"
	    " insecure-skip-tls-verify: false}}]\n"
	    "users: [{name: u, user: {token: ~, tokenFile: t}}]\n";
	struct k8s_cluster c;
	char *cause = NULL;

	(void)state;
	memset(&c, 0, sizeof(c));
	assert_int_equal(k8s_kubeconfig_parse_mem(&c, "/etc/kube/mem.yaml",
	    text, strlen(text), NULL, &cause), 0);
	assert_string_equal(c.server, "http://127.0.0.1:8081");
	assert_int_equal(c.insecure, 0);
	assert_null(c.token);
	assert_string_equal(c.token_file, "/etc/kube/t");
	k8s_cluster_release(&c);

	/* an empty document is an empty config */
	assert_int_equal(k8s_kubeconfig_parse_mem(&c, "/e.yaml", "", 0,
	    NULL, &cause), -1);
	assert_string_equal(cause, "no current-context in '/e.yaml' and no "
	    "--context given");
	free(cause);
}

/*
 * proxy-url is kept as written when it is an http, https or socks5 URL
 * (any case) with a host, credentials included; empty or null is none.
 * A bad one is a load error naming the cluster and the file, never
 * quoting the URL (it may carry a password).
 */
static void
test_proxy_url(void **state)
{
	static const char *const good[] = {
	    "http://127.0.0.1:3128", "https://proxy.example",
	    "socks5://u:p%40ss@[::1]:1080", "HTTP://Proxy.Example:8080/",
	};
	static const struct {
		const char *url, *why;
	} bad[] = {
		{ "'ftp://u:TOPSECRET@p.example'",
		  "scheme 'ftp' is not http, https or socks5" },
		{ "'socks4://p.example:1080'",
		  "scheme 'socks4' is not http, https or socks5" },
		{ "'u:TOPSECRET@p.example:3128'",
		  "has no scheme: http://, https:// or socks5:// is required" },
		{ "'u/TOPSECRET?://p.example'",
		  "scheme is not http, https or socks5" },
		{ "'http://'", "has no host" },
		{ "'socks5://:1080'", "has no host" },
		{ "'https:///TOPSECRET'", "has no host" },
		{ "'http://p.example:99999'", "is not a valid URL" },
		{ "'http://TOPSECRET host'", "is not a valid URL" },
		{ "[http://p.example]", "is not a string" },
	};
	struct k8s_cluster c;
	char *cause = NULL, *f, *want;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(good); i++) {
		f = xasprintf("server: 'https://k.example', proxy-url: '%s'",
		    good[i]);
		if (parse_cluster(&c, f, &cause) != 0)
			fail_msg("'%s': %s", good[i], cause);
		assert_string_equal(c.proxy_url, good[i]);
		k8s_cluster_release(&c);
		assert_null(c.proxy_url);
		free(f);
	}
	assert_int_equal(parse_cluster(&c, "server: 'https://k.example', "
	    "proxy-url: ''", &cause), 0);
	assert_null(c.proxy_url);
	k8s_cluster_release(&c);
	assert_int_equal(parse_cluster(&c, "server: 'https://k.example', "
	    "proxy-url: ~", &cause), 0);
	assert_null(c.proxy_url);
	k8s_cluster_release(&c);

	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		f = xasprintf("server: 'https://k.example', proxy-url: %s",
		    bad[i].url);
		want = xasprintf("cluster 'c' in '%%s': 'proxy-url' %s",
		    bad[i].why);
		kc_err(f, "", want);
		free(want);
		free(f);
	}
}

/*
 * An exec credential plugin (EKS's, from a data file): its command,
 * arguments and environment are kept for the REST client; a command
 * with a '/' is taken from the kubeconfig's directory, a bare name from
 * PATH. One that needs a terminal, has no command, an unknown
 * apiVersion, or comes with a token is refused, saying why.
 */
static void
test_exec_plugin(void **state)
{
	static const struct {
		const char *user, *err;
	} bad[] = {
		{ "exec: {apiVersion: client.authentication.k8s.io/v1, command: "
		  "kubelogin, interactiveMode: Always}",
		  "'exec.interactiveMode' must be Never or IfAvailable: "
		  "diverged runs the plugin with no terminal" },
		{ "exec: {apiVersion: client.authentication.k8s.io/v1, command: "
		  "kubelogin}",
		  "'exec.interactiveMode' must be Never or IfAvailable (required "
		  "with v1): diverged runs the plugin with no terminal" },
		{ "exec: {apiVersion: client.authentication.k8s.io/v1beta1}",
		  "'exec.command' is required" },
		{ "exec: {apiVersion: client.authentication.k8s.io/v1alpha1, "
		  "command: x}",
		  "'exec.apiVersion' must be client.authentication.k8s.io/v1 or "
		  "client.authentication.k8s.io/v1beta1, not "
		  "'client.authentication.k8s.io/v1alpha1'" },
		{ "token: TOPSECRET, exec: {apiVersion: "
		  "client.authentication.k8s.io/v1beta1, command: x}",
		  "an exec plugin and a token or username/password may be set, "
		  "but not both" },
		{ "exec: {apiVersion: client.authentication.k8s.io/v1beta1, "
		  "command: x, args: {a: b}}",
		  "'exec' must be a mapping, its 'args' and 'env' lists" },
		{ "exec: {apiVersion: client.authentication.k8s.io/v1beta1, "
		  "command: x, env: [{value: v}]}",
		  "'exec.env' items need a name (no '=') and a value" },
	};
	struct k8s_cluster c;
	char *cause = NULL, *want;
	size_t i;

	(void)state;
	load_data_ok(&c, "exec.yaml", NULL);
	assert_null(c.token);
	assert_non_null(c.exec_argv);
	assert_string_equal(c.exec_argv[0], "aws");
	assert_string_equal(c.exec_argv[1], "eks");
	assert_string_equal(c.exec_argv[4], "prod");
	assert_null(c.exec_argv[5]);
	assert_string_equal(c.exec_api_version,
	    "client.authentication.k8s.io/v1beta1");
	k8s_cluster_release(&c);

	assert_int_equal(parse_user(&c, "exec: {apiVersion: "
	    "client.authentication.k8s.io/v1, command: bin/get-token, "
	    "interactiveMode: Never, provideClusterInfo: true, installHint: "
	    "'apt install get-token', env: [{name: REGION, value: eu}]}",
	    &cause), 0);
	assert_string_equal(c.exec_argv[0], "/etc/kube/bin/get-token");
	assert_null(c.exec_argv[1]);
	assert_string_equal(c.exec_env[0], "REGION=eu");
	assert_null(c.exec_env[1]);
	assert_int_equal(c.exec_cluster_info, 1);
	assert_string_equal(c.exec_hint, "apt install get-token");
	k8s_cluster_release(&c);
	assert_int_equal(parse_user(&c, "exec: {apiVersion: "
	    "client.authentication.k8s.io/v1beta1, command: "
	    "/usr/local/bin/get-token}", &cause), 0);
	assert_string_equal(c.exec_argv[0], "/usr/local/bin/get-token");
	k8s_cluster_release(&c);

	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		want = xasprintf("user 'u' in '%%s': %s", bad[i].err);
		kc_err(NULL, bad[i].user, want);
		free(want);
	}
}

/* The plugin of test_exec_rest: its answers follow files beside it. */
static const char plugin_sh[] =
    "#!/bin/sh\n"
    "d=$(dirname \"$0\")\n"
    "echo x >> \"$d/runs\"\n"
    "printf '%s' \"$KUBERNETES_EXEC_INFO\" > \"$d/info\"\n"
    "cred='{\"apiVersion\":\"client.authentication.k8s.io/v1\","
    "\"kind\":\"ExecCredential\",\"status\":'\n"
    "case $(cat \"$d/mode\") in\n"
    "good) printf '%s{\"token\":\"contract-token\","
    "\"expirationTimestamp\":\"%s\"}}' \"$cred\" \"$(cat \"$d/exp\")\" ;;\n"
    "wrong) printf '%s{\"token\":\"wrong-token\"}}' \"$cred\" ;;\n"
    "*) echo 'no credentials for you' >&2; exit 3 ;;\n"
    "esac\n";

/* The plugin's runs so far (lines of its "runs" file). */
static int
plugin_runs(const char *dir)
{
	char *p = xasprintf("%s/runs", dir), line[16];
	FILE *f = fopen(p, "r");
	int n = 0;

	while (f != NULL && fgets(line, sizeof(line), f) != NULL)
		n++;
	if (f != NULL)
		fclose(f);
	free(p);
	return n;
}

/* Tell the plugin what to answer next: mode, and an expiry from now. */
static void
plugin_answer(const char *dir, const char *mode, int64_t expires_in)
{
	char ts[32], *p = xasprintf("%s/mode", dir);

	write_file(p, mode);
	free(p);
	time_rfc3339(now_unix() + expires_in, ts);
	p = xasprintf("%s/exp", dir);
	write_file(p, ts);
	free(p);
}

/*
 * Start the fake API server and point c at it, with plugin_sh (in dir)
 * for its credentials instead of a token; -1 when the fake cannot run.
 */
static int
exec_fake(struct storeenv *env, struct k8s_cluster *c, const char *dir)
{
	memset(env, 0, sizeof(*env));
	if (storeenv_start_fake(env, 100, c) < 0)
		return -1;
	free(c->token);
	c->token = NULL;
	c->exec_argv = xcalloc(2, sizeof(char *));
	c->exec_argv[0] = xasprintf("%s/plugin", dir);
	write_file(c->exec_argv[0], plugin_sh);
	assert_int_equal(chmod(c->exec_argv[0], 0700), 0);
	c->exec_api_version = xstrdup("client.authentication.k8s.io/v1");
	return 0;
}

/* One GET through api: its result (a missing Secret: ENOTFOUND). */
static int
get_one(struct k8s_api *api)
{
	struct k8s_status st = { 0 };
	json_t *obj = NULL;
	int rc = k8s_get(api, &K8S_SECRET, "default", "nope", &obj, &st);

	json_decref(obj);
	k8s_status_release(&st);
	return rc;
}

/* Two GETs through api, each answered want; then the plugin's runs. */
static int
two_gets(struct k8s_api *api, int want, const char *dir)
{
	assert_int_equal(get_one(api), want);
	assert_int_equal(get_one(api), want);
	return plugin_runs(dir);
}

/*
 * The plugin of test_exec_child: the environment and the signals ignored
 * that it got, then a token.
 */
static const char child_sh[] =
    "#!/bin/sh\n"
    "d=$(dirname \"$0\")\n"
    "tr '\\0' '\\n' < /proc/$$/environ > \"$d/env\"\n"
    "grep '^SigIgn:' /proc/$$/status > \"$d/sig\"\n"
    "ls -l /proc/$$/fd > \"$d/fds\"\n"
    "printf '{\"apiVersion\":\"client.authentication.k8s.io/v1\","
    "\"kind\":\"ExecCredential\",\"status\":{\"token\":\"t\"}}'\n";

/* The lines of dir/name that start with prefix, as one string. */
static char *
lines_with(const char *dir, const char *name, const char *prefix)
{
	char *p = xasprintf("%s/%s", dir, name), line[512];
	FILE *f = fopen(p, "r");
	struct buf b;

	assert_non_null(f);
	buf_init(&b, 1 << 20);
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, prefix, strlen(prefix)) == 0)
			(void)buf_addstr(&b, line);
	fclose(f);
	free(p);
	(void)buf_add(&b, "", 1);
	return buf_detach(&b, NULL);
}

/*
 * What the plugin gets from the daemon's process: a variable of the
 * kubeconfig's exec.env replaces the process's (as kubectl gives it; Go
 * and Python plugins take the first of two entries of a name); and,
 * though diverged ignores SIGPIPE and blocks SIGTERM, SIGINT and SIGHUP
 * in every thread, the plugin starts with none of them ignored (the
 * shell clears its mask itself, so only SigIgn is seen here); and it
 * gets none of the daemon's descriptors (a socket opened without
 * close-on-exec, as a library may, here, and a copy of it at a high
 * number). A command without a '/' is looked for in PATH; one found
 * nowhere is an error that names it. mode: k8s_exec_test_fork.
 */
static void
exec_child(int mode)
{
	struct k8s_cluster c;
	char *dir = make_tmpdir(), *script, *cause = NULL, *tok = NULL, *s;
	char *path, *oldpath;
	int64_t exp;
	sigset_t set, old;
	void (*oldpipe)(int);
	int sk, high;
	json_t *info, *cl;
	/* /proc's SigIgn bits of the daemon's signals */
	unsigned long long mask = 1ULL << (SIGHUP - 1) | 1ULL << (SIGINT - 1) |
	    1ULL << (SIGPIPE - 1) | 1ULL << (SIGTERM - 1);

	memset(&c, 0, sizeof(c));
	script = xasprintf("%s/plugin", dir);
	write_file(script, child_sh);
	assert_int_equal(chmod(script, 0700), 0);
	c.exec_argv = xcalloc(2, sizeof(char *));
	c.exec_argv[0] = script;
	c.exec_env = xcalloc(2, sizeof(char *));
	c.exec_env[0] = xstrdup("DIVERGE_T_REGION=eu");
	c.exec_api_version = xstrdup("client.authentication.k8s.io/v1");
	c.exec_cluster_info = 1;
	c.server = xstrdup("https://10.0.0.1:6443");
	c.insecure = 1;
	c.tls_server_name = xstrdup("api.internal");
	c.ca_data = xstrdup("PEM");
	setenv("DIVERGE_T_REGION", "us", 1);
	setenv("KUBERNETES_EXEC_INFO", "{\"stale\":true}", 1);
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, &old);
	oldpipe = signal(SIGPIPE, SIG_IGN);
	sk = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(sk >= 0);
	high = dup2(sk, 1000);
	assert_int_equal(high, 1000);
	k8s_exec_test_fork = mode;

	assert_int_equal(k8s_exec_credential(&c, 5000, &tok, &exp, &cause),
	    0);
	assert_string_equal(tok, "t");
	s = lines_with(dir, "env", "DIVERGE_T_REGION=");
	assert_string_equal(s, "DIVERGE_T_REGION=eu\n");
	free(s);
	/* one KUBERNETES_EXEC_INFO, ours, the process's dropped */
	s = lines_with(dir, "env", "KUBERNETES_EXEC_INFO=");
	assert_non_null(strchr(s, '\n'));
	assert_string_equal(strchr(s, '\n'), "\n");
	info = json_loads(s + strlen("KUBERNETES_EXEC_INFO="), 0, NULL);
	assert_non_null(info);
	cl = json_object_get(json_object_get(info, "spec"), "cluster");
	assert_string_equal(json_string_value(json_object_get(cl, "server")),
	    "https://10.0.0.1:6443");
	assert_true(json_is_true(json_object_get(cl,
	    "insecure-skip-tls-verify")));
	assert_string_equal(json_string_value(json_object_get(cl,
	    "tls-server-name")), "api.internal");
	/* base64 of "PEM" */
	assert_string_equal(json_string_value(json_object_get(cl,
	    "certificate-authority-data")), "UEVN");
	json_decref(info);
	free(s);
	s = lines_with(dir, "sig", "SigIgn:");
	assert_int_equal(strtoull(s + 7, NULL, 16) & mask, 0);
	free(s);
	s = lines_with(dir, "fds", "l");
	assert_non_null(strstr(s, "/dev/null"));	/* stdin: read */
	if (strstr(s, "socket:") != NULL)
		fprintf(stderr, "# the plugin's descriptors:\n%s", s);
	assert_null(strstr(s, "socket:"));
	free(s);

	/* found in PATH, or not found: no child left either way */
	oldpath = xstrdup(getenv("PATH") != NULL ? getenv("PATH") : "");
	path = xasprintf("%s:%s", dir, oldpath);
	setenv("PATH", path, 1);
	c.exec_argv[0] = xstrdup("plugin");
	free(tok);
	tok = NULL;
	assert_int_equal(k8s_exec_credential(&c, 5000, &tok, &exp, &cause),
	    0);
	assert_string_equal(tok, "t");
	free(tok);
	tok = NULL;
	free(c.exec_argv[0]);
	c.exec_argv[0] = xstrdup("diverge-no-such-plugin");
	assert_int_equal(k8s_exec_credential(&c, 5000, &tok, &exp, &cause),
	    -1);
	assert_string_equal(cause, "k8s: exec plugin "
	    "'diverge-no-such-plugin': No such file or directory");
	assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
	free(cause);
	free(c.exec_argv[0]);
	c.exec_argv[0] = script;
	setenv("PATH", oldpath, 1);
	free(oldpath);
	free(path);

	k8s_exec_test_fork = 0;
	close(high);
	close(sk);
	signal(SIGPIPE, oldpipe);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	unsetenv("DIVERGE_T_REGION");
	unsetenv("KUBERNETES_EXEC_INFO");
	free(tok);
	k8s_cluster_release(&c);
	remove_tree(dir, (const char *const[]){ "plugin", "env", "sig",
	    "fds", NULL });
	free(dir);
}

/* posix_spawnp, with posix_spawn_file_actions_addclosefrom_np (glibc 2.34) */
static void
test_exec_child(void **state)
{
	(void)state;
	exec_child(0);
}

/*
 * The same without posix_spawn_file_actions_addclosefrom_np: fork, close,
 * exec; with close_range, and without (a kernel before 5.9).
 */
static void
test_exec_child_fork(void **state)
{
	(void)state;
	exec_child(1);
	exec_child(2);
}

/* diverge_kube_exec_plugin_runs_total{result} as metrics show it. */
static double
exec_runs(const char *result)
{
	struct buf m;
	char *want, *p;
	double v = 0;

	buf_init(&m, 1 << 20);
	assert_int_equal(metrics_render(&m), 0);
	want = xasprintf("\ndiverge_kube_exec_plugin_runs_total{result=\"%s\"} ",
	    result);
	p = m.data != NULL ? strstr(m.data, want) : NULL;
	if (p != NULL)
		v = strtod(p + strlen(want), NULL);
	free(want);
	buf_release(&m);
	return v;
}

/*
 * A cluster whose token comes from the exec plugin dir/plugin (v1); the
 * plugin's path, which c owns.
 */
static char *
exec_cluster(struct k8s_cluster *c, const char *dir)
{
	memset(c, 0, sizeof(*c));
	c->exec_argv = xcalloc(2, sizeof(char *));
	c->exec_argv[0] = xasprintf("%s/plugin", dir);
	c->exec_api_version = xstrdup("client.authentication.k8s.io/v1");
	return c->exec_argv[0];
}

/*
 * A plugin that runs too long is killed at the limit; one that prints
 * more than an ExecCredential can be is refused; each says which, and
 * counts as a timeout or an error.
 */
static void
test_exec_limits(void **state)
{
	static const struct {
		const char *sh, *want, *result;
		int64_t timeout_ms;
	} cases[] = {
		{ "#!/bin/sh\nexec sleep 30\n", "did not finish in time",
		  "timeout", 300 },
		{ "#!/bin/sh\nexec head -c 3000000 /dev/zero\n",
		  "printed too much", "error", 20000 },
		{ "#!/bin/sh\nprintf '{\"kind\":\"ExecCredential\",\"apiVersion\":"
		  "\"client.authentication.k8s.io/v1\",\"status\":{\"token\":"
		  "\"t\"}}'\n", NULL, "ok", 5000 },
	};
	static const char *const results[] = { "ok", "error", "timeout" };
	double before[ARRAY_SIZE(results)];
	size_t k;
	struct k8s_cluster c;
	char *dir = make_tmpdir(), *script, *cause, *tok, *want;
	int64_t exp, t0;
	size_t i;

	(void)state;
	script = exec_cluster(&c, dir);
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		write_file(script, cases[i].sh);
		assert_int_equal(chmod(script, 0700), 0);
		cause = tok = NULL;
		for (k = 0; k < ARRAY_SIZE(results); k++)
			before[k] = exec_runs(results[k]);
		t0 = now_mono_ms();
		assert_int_equal(k8s_exec_credential(&c, cases[i].timeout_ms,
		    &tok, &exp, &cause), cases[i].want != NULL ? -1 : 0);
		assert_true(now_mono_ms() - t0 < 10000);
		for (k = 0; k < ARRAY_SIZE(results); k++)
			assert_true(exec_runs(results[k]) - before[k] ==
			    (strcmp(results[k], cases[i].result) == 0));
		if (cases[i].want == NULL) {
			assert_string_equal(tok, "t");
			free(tok);
			continue;
		}
		want = xasprintf("k8s: exec plugin '%s' %s", script,
		    cases[i].want);
		assert_string_equal(cause, want);
		assert_null(tok);
		free(want);
		free(cause);
	}
	/* killed and reaped: no child of this process is left */
	assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
	k8s_cluster_release(&c);
	remove_tree(dir, (const char *const[]){ "plugin", NULL });
	free(dir);
}

/* The apiVersion of exec_cluster()'s plugin, as JSON. */
#define EXEC_V1 "\"client.authentication.k8s.io/v1\""
/* An ExecCredential of that apiVersion with status (JSON text). */
#define EXEC_CRED(status) "{\"kind\":\"ExecCredential\",\"apiVersion\":" \
	EXEC_V1 ",\"status\":" status "}"

/*
 * What an exec plugin prints is checked before its token is used: another
 * kind or apiVersion, a client certificate, no token, a token with a line
 * break (it would end the Authorization header and start another) and a
 * bad expirationTimestamp are refused, each with its reason. A token that
 * is taken is registered for redaction, so no log line can show it.
 */
static void
test_exec_refused(void **state)
{
	static const struct {
		const char *json, *want;
	} cases[] = {
		{ "{\"kind\":\"Secret\",\"apiVersion\":" EXEC_V1 ",\"status\":"
		  "{\"token\":\"t\"}}", " did not print an ExecCredential of "
		  "client.authentication.k8s.io/v1" },
		{ "{\"kind\":\"ExecCredential\",\"apiVersion\":"
		  "\"client.authentication.k8s.io/v1beta1\",\"status\":"
		  "{\"token\":\"t\"}}", " did not print an ExecCredential of "
		  "client.authentication.k8s.io/v1" },
		{ EXEC_CRED("{\"clientCertificateData\":\"x\","
		  "\"clientKeyData\":\"y\"}"), " gave a client certificate; "
		  "only tokens are supported" },
		{ EXEC_CRED("{\"token\":\"\"}"), " gave no token" },
		{ EXEC_CRED("{\"token\":\"t\\r\\nX-Evil: 1\"}"),
		  " gave no token" },
		{ EXEC_CRED("{\"token\":\"t\\nX-Evil: 1\"}"),
		  " gave no token" },
		{ EXEC_CRED("{\"token\":\"t\",\"expirationTimestamp\":"
		  "\"soon\"}"), ": expirationTimestamp 'soon' is not a time" },
		{ EXEC_CRED("{\"token\":\"exec-token-Qm9vb2sh-7731\","
		  "\"expirationTimestamp\":\"2030-01-02T03:04:05Z\"}"), NULL },
	};
	struct k8s_cluster c;
	char *dir = make_tmpdir(), *script, *sh, *cause, *tok;
	char *want, *shown;
	int64_t exp;
	size_t i;

	(void)state;
	script = exec_cluster(&c, dir);
	redact_secrets_clear();
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		sh = xasprintf("#!/bin/sh\nprintf '%%s' '%s'\n",
		    cases[i].json);
		write_file(script, sh);
		assert_int_equal(chmod(script, 0700), 0);
		cause = tok = NULL;
		exp = -1;
		assert_int_equal(k8s_exec_credential(&c, 5000, &tok, &exp,
		    &cause), cases[i].want != NULL ? -1 : 0);
		if (cases[i].want == NULL) {
			assert_string_equal(tok, "exec-token-Qm9vb2sh-7731");
			assert_int_equal(exp, 1893553445);
			shown = redact("the plugin said "
			    "exec-token-Qm9vb2sh-7731");
			assert_non_null(shown);
			assert_null(strstr(shown, "Qm9vb2sh"));
			free(shown);
			free(tok);
		} else {
			want = xasprintf("k8s: exec plugin '%s'%s", script,
			    cases[i].want);
			if (cause == NULL || strcmp(cause, want) != 0)
				fail_msg("case %zu: %s", i, cause ? cause :
				    "(none)");
			assert_null(tok);
			free(want);
			free(cause);
		}
		free(sh);
	}
	redact_secrets_clear();
	k8s_cluster_release(&c);
	remove_tree(dir, (const char *const[]){ "plugin", NULL });
	free(dir);
}

/*
 * A plugin that exits other than 0 is refused, whatever it printed (a
 * credential included): its status and the first line of its stderr,
 * redacted, say why; a status of 127 (the shell's "not found") adds the
 * kubeconfig's installHint, no other status does.
 */
static void
test_exec_exit(void **state)
{
	static const struct {
		const char *sh, *want;
	} cases[] = {
		{ "#!/bin/sh\nprintf '%s' '" EXEC_CRED("{\"token\":\"t\"}") "'\n"
		  "echo 'refused: Bearer s3cr3tT0kenValue1234567890' >&2\n"
		  "echo 'second line' >&2\nexit 1\n",
		  " exited with status 1: refused: Bearer " },
		{ "#!/bin/sh\necho 'get-token: not found' >&2\nexit 127\n",
		  " exited with status 127: get-token: not found (not found?); "
		  "apt install get-token" },
		{ "#!/bin/sh\necho 'cannot run' >&2\nexit 126\n",
		  " exited with status 126: cannot run" },
	};
	struct k8s_cluster c;
	char *dir = make_tmpdir(), *script, *cause, *tok, *want;
	int64_t exp;
	size_t i;

	(void)state;
	script = exec_cluster(&c, dir);
	c.exec_hint = xstrdup("apt install get-token");
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		write_file(script, cases[i].sh);
		assert_int_equal(chmod(script, 0700), 0);
		cause = tok = NULL;
		assert_int_equal(k8s_exec_credential(&c, 5000, &tok, &exp,
		    &cause), -1);
		assert_null(tok);
		want = xasprintf("k8s: exec plugin '%s'%s", script,
		    cases[i].want);
		if (cause == NULL || strncmp(cause, want, strlen(want)) != 0 ||
		    (i > 0 && strcmp(cause, want) != 0))
			fail_msg("case %zu: %s", i, cause ? cause : "(none)");
		assert_null(strstr(cause, "s3cr3tT0kenValue"));
		assert_null(strstr(cause, "second line"));
		free(want);
		free(cause);
	}
	k8s_cluster_release(&c);
	remove_tree(dir, (const char *const[]){ "plugin", NULL });
	free(dir);
}

/* A watch of Secrets whose request the fake API server answers 401. */
static void
refused_watch(struct storeenv *env, struct k8s_api *api)
{
	struct k8s_list_opts o = { NULL, NULL, NULL };
	struct k8s_status st = { 0 };
	struct k8s_watch *w = NULL;
	struct k8s_event ev;
	int rc;

	json_decref(storeenv_fake(env, "POST", "/_fake/faults",
	    "{\"status\":401,\"count\":1,\"match\":\"watch=true\"}"));
	rc = k8s_watch(api, &K8S_SECRET, "default", &o, &w, &st);
	if (rc == 0) {
		memset(&ev, 0, sizeof(ev));
		rc = k8s_watch_next(w, 5000, &ev, &st);
		if (rc > 0)
			json_decref(ev.object);
	}
	assert_int_equal(rc, K8S_EUNAUTHORIZED);
	k8s_status_release(&st);
	k8s_watch_free(w);
}

/*
 * The REST client against the fake kube-apiserver with an exec plugin
 * for its token: run once, its token kept while it is good; run again
 * when it expires within seconds and after a 401 (a wrong token) to a
 * call or to a watch; a plugin that fails leaves requests without a
 * token (401) and is not run again for every request.
 * KUBERNETES_EXEC_INFO says it is not
 * interactive and, with provideClusterInfo, names the cluster.
 */
static void
test_exec_rest(void **state)
{
	struct storeenv env;
	struct k8s_cluster c;
	struct k8s_api *api = NULL;
	char *dir = make_tmpdir(), *cause = NULL, *info;
	FILE *f;
	char buf[4096];
	size_t n;

	(void)state;
	if (exec_fake(&env, &c, dir) < 0) {
		free(dir);
		skip();
	}
	c.exec_cluster_info = 1;
	plugin_answer(dir, "good", 3600);
	assert_int_equal(k8s_rest_open(&api, &c, NULL, &cause), 0);

	assert_int_equal(two_gets(api, K8S_ENOTFOUND, dir), 1);
	info = xasprintf("%s/info", dir);
	f = fopen(info, "r");
	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	assert_non_null(strstr(buf, "\"kind\":\"ExecCredential\""));
	assert_non_null(strstr(buf, "\"interactive\":false"));
	assert_non_null(strstr(buf, c.server));

	/* a token about to expire: run again before each request */
	k8s_api_free(api);
	plugin_answer(dir, "good", 5);
	assert_int_equal(k8s_rest_open(&api, &c, NULL, &cause), 0);
	assert_int_equal(two_gets(api, K8S_ENOTFOUND, dir), 3);

	/* a token the server refuses: 401, then run again */
	plugin_answer(dir, "wrong", 3600);
	assert_int_equal(get_one(api), K8S_EUNAUTHORIZED);
	assert_int_equal(plugin_runs(dir), 4);
	plugin_answer(dir, "good", 3600);
	assert_int_equal(two_gets(api, K8S_ENOTFOUND, dir), 5);

	/* a watch refused 401: run again before the next request, too */
	refused_watch(&env, api);
	assert_int_equal(two_gets(api, K8S_ENOTFOUND, dir), 6);

	/* a plugin that fails: no token, and not run for every request */
	k8s_api_free(api);
	plugin_answer(dir, "fail", 0);
	assert_int_equal(k8s_rest_open(&api, &c, NULL, &cause), 0);
	assert_int_equal(two_gets(api, K8S_EUNAUTHORIZED, dir), 7);
	k8s_api_free(api);

	/* the cluster's proxy-url goes to the plugin, as client-go's */
	{
		char *tok = NULL;
		int64_t exp;

		plugin_answer(dir, "good", 3600);
		c.proxy_url = xstrdup("socks5://u:p@127.0.0.1:1080");
		assert_int_equal(k8s_exec_credential(&c, 5000, &tok, &exp,
		    &cause), 0);
		free(tok);
		f = fopen(info, "r");
		assert_non_null(f);
		n = fread(buf, 1, sizeof(buf) - 1, f);
		buf[n] = '\0';
		fclose(f);
		assert_non_null(strstr(buf, "\"proxy-url\":"
		    "\"socks5://u:p@127.0.0.1:1080\""));
	}

	/* a command that does not exist: its install hint in the error */
	{
		char *tok = NULL;
		int64_t exp;

		free(c.exec_argv[0]);	/* script */
		c.exec_argv[0] = xstrdup("/nonexistent/get-token");
		c.exec_hint = xstrdup("install get-token");
		assert_int_equal(k8s_exec_credential(&c, 5000, &tok, &exp,
		    &cause), -1);
		assert_string_equal(cause, "k8s: exec plugin "
		    "'/nonexistent/get-token': No such file or directory; "
		    "install get-token");
		free(cause);
	}
	k8s_cluster_release(&c);
	storeenv_close(&env);
	free(info);
	remove_tree(dir, (const char *const[]){ "plugin", "runs", "info",
	    "mode", "exp", NULL });
	free(dir);
}

struct slow_get {
	struct k8s_api *api;
	int rc;
};

static void *
slow_get_main(void *arg)
{
	struct slow_get *g = arg;
	struct k8s_status st = { 0 };
	json_t *obj = NULL;

	g->rc = k8s_get(g->api, &K8S_SECRET, "default", "slowone", &obj,
	    &st);
	json_decref(obj);
	k8s_status_release(&st);
	return NULL;
}

/* One GET the fake API server answers 401, as a refused token. */
static void
refused_get(struct storeenv *env, struct k8s_api *api)
{
	struct k8s_status st = { 0 };
	json_t *obj = NULL;

	json_decref(storeenv_fake(env, "POST", "/_fake/faults",
	    "{\"status\":401,\"count\":1,\"match\":\"/refused\"}"));
	assert_int_equal(k8s_get(api, &K8S_SECRET, "default", "refused",
	    &obj, &st), K8S_EUNAUTHORIZED);
	json_decref(obj);
	k8s_status_release(&st);
}

/*
 * A 401 to a request that went out with the plugin's old token, and came
 * back after another 401 had the plugin run again, does not throw the
 * new token away: the plugin is not run a third time.
 */
static void
test_exec_401_in_flight(void **state)
{
	struct storeenv env;
	struct k8s_cluster c;
	struct k8s_api *api = NULL;
	struct slow_get g;
	pthread_t t;
	char *dir = make_tmpdir(), *cause = NULL;
	int i;

	(void)state;
	if (exec_fake(&env, &c, dir) < 0) {
		free(dir);
		skip();
	}
	plugin_answer(dir, "good", 3600);
	assert_int_equal(k8s_rest_open(&api, &c, NULL, &cause), 0);
	assert_int_equal(get_one(api), K8S_ENOTFOUND);
	assert_int_equal(plugin_runs(dir), 1);

	/* a request with the first token, answered 401 a second later */
	json_decref(storeenv_fake(&env, "POST", "/_fake/delay",
	    "{\"ms\":1000,\"count\":1,\"match\":\"/slowone\"}"));
	json_decref(storeenv_fake(&env, "POST", "/_fake/faults",
	    "{\"status\":401,\"count\":1,\"match\":\"/slowone\"}"));
	g.api = api;
	g.rc = 0;
	assert_int_equal(pthread_create(&t, NULL, slow_get_main, &g), 0);
	/* sent (the fake logs a request as it comes, before its delay) */
	for (i = 0; i < 500 && storeenv_fake_count(&env, "GET",
	    "/slowone") == 0; i++)
		sleep_ms(10);
	assert_int_equal(storeenv_fake_count(&env, "GET", "/slowone"), 1);
	/* meanwhile another 401: the plugin runs again, a second token */
	refused_get(&env, api);
	assert_int_equal(get_one(api), K8S_ENOTFOUND);
	assert_int_equal(plugin_runs(dir), 2);
	/* the slow 401 comes back: it went with the first token */
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(g.rc, K8S_EUNAUTHORIZED);
	assert_int_equal(get_one(api), K8S_ENOTFOUND);
	assert_int_equal(get_one(api), K8S_ENOTFOUND);
	assert_int_equal(plugin_runs(dir), 2);

	/* a 401 to the current token still has the plugin run again */
	refused_get(&env, api);
	assert_int_equal(get_one(api), K8S_ENOTFOUND);
	assert_int_equal(plugin_runs(dir), 3);

	k8s_api_free(api);
	k8s_cluster_release(&c);
	storeenv_close(&env);
	remove_tree(dir, (const char *const[]){ "plugin", "runs", "info",
	    "mode", "exp", NULL });
	free(dir);
}

static void
test_release(void **state)
{
	struct k8s_cluster c;

	(void)state;
	memset(&c, 0, sizeof(c));
	k8s_cluster_release(&c);
	k8s_cluster_release(NULL);
	load_data_ok(&c, "multi.yaml", "data");
	k8s_cluster_release(&c);
	assert_null(c.server);
	assert_null(c.key_data);
	assert_null(c.token);
	/* twice is harmless */
	k8s_cluster_release(&c);
}

/* ---- kubeconfig: errors, one per case ---- */

struct err_case {
	const char *name;
	const char *file;	/* under tests/data/kubeconfig */
	const char *context;
	const char *fmt;	/* the message; %s = the file's path */
	const char *secret;	/* must not appear in the message */
};

static const struct err_case error_cases[] = {
	{ "err_missing_file", "no-such-file.yaml", NULL,
	    "kubeconfig '%s': No such file or directory", NULL },
	{ "err_bad_yaml", "bad-yaml.yaml", NULL,
	    "kubeconfig '%s': line 6: did not find expected key", NULL },
	{ "err_not_a_mapping", "not-a-mapping.yaml", NULL,
	    "kubeconfig '%s': not a mapping", NULL },
	{ "err_context_not_found", "multi.yaml", "nope",
	    "context 'nope' not found in '%s'", NULL },
	{ "err_cluster_not_found", "multi.yaml", "missing-cluster",
	    "cluster 'no-such-cluster' not found in '%s'", NULL },
	{ "err_user_not_found", "multi.yaml", "missing-user",
	    "user 'no-such-user' not found in '%s'", NULL },
	{ "err_context_no_cluster", "multi.yaml", "no-cluster",
	    "context 'no-cluster' in '%s' has no cluster", NULL },
	{ "err_no_server", "no-server.yaml", NULL,
	    "cluster 'c1' in '%s' has no server", NULL },
	{ "err_no_current_context", "no-current.yaml", NULL,
	    "no current-context in '%s' and no --context given", NULL },
	{ "err_auth_provider", "auth-provider.yaml", NULL,
	    "user 'gke-user' in '%s': auth-provider plugins are not "
	    "supported; use a token, tokenFile or client certificate", NULL },
	{ "err_ca_and_insecure", "ca-insecure.yaml", NULL,
	    "cluster 'c1' in '%s': specifying a root certificates file with "
	    "the insecure flag is not allowed", NULL },
	{ "err_bad_base64", "bad-base64.yaml", NULL,
	    "user 'u1' in '%s': 'client-certificate-data' is not valid "
	    "base64", "SECRETDATA" },
	{ "err_cert_without_key", "cert-no-key.yaml", NULL,
	    "user 'u1' in '%s': a client certificate needs both "
	    "client-certificate and client-key", NULL },
	{ "err_token_and_basic", "token-and-basic.yaml", NULL,
	    "user 'u1' in '%s': username/password or bearer token may be "
	    "set, but not both", "TOPSECRET" },
	{ "err_token_not_string", "token-not-string.yaml", NULL,
	    "user 'u1' in '%s': 'token' is not a string", "TOPSECRET" },
	{ "err_clusters_not_list", "clusters-not-list.yaml", NULL,
	    "kubeconfig '%s': 'clusters' is not a list", NULL },
	{ "err_entry_not_mapping", "entry-not-mapping.yaml", NULL,
	    "kubeconfig '%s': an entry of 'users' is not a mapping", NULL },
	{ "err_context_not_mapping", "context-not-mapping.yaml", NULL,
	    "context 'c' in '%s': 'context' is not a mapping", NULL },
	{ "err_server_no_host", "no-host.yaml", NULL,
	    "cluster 'c1' in '%s': server 'https://' has no host", NULL },
	{ "err_server_userinfo", "server-userinfo.yaml", NULL,
	    "cluster 'c1' in '%s': server URL must not carry credentials",
	    "TOPSECRET" },
	{ "err_server_name_port", "server-name-port.yaml", NULL,
	    "cluster 'c1' in '%s': tls-server-name 'localhost:19444/' is not "
	    "a host name", "TOPSECRET" },
	{ "err_bad_bool", "bad-bool.yaml", NULL,
	    "cluster 'c1' in '%s': 'insecure-skip-tls-verify' is not a "
	    "boolean", NULL },
	{ "err_proxy_bad_scheme", "proxy-bad-scheme.yaml", NULL,
	    "cluster 'c1' in '%s': 'proxy-url' scheme 'ftp' is not http, "
	    "https or socks5", "TOPSECRET" },
	{ "err_proxy_no_host", "proxy-no-host.yaml", NULL,
	    "cluster 'c1' in '%s': 'proxy-url' has no host", "TOPSECRET" },
	{ "err_proxy_not_string", "proxy-not-string.yaml", NULL,
	    "cluster 'c1' in '%s': 'proxy-url' is not a string", "TOPSECRET" },
	{ "err_proxy_no_scheme", "proxy-no-scheme.yaml", NULL,
	    "cluster 'c1' in '%s': 'proxy-url' has no scheme: http://, "
	    "https:// or socks5:// is required", "TOPSECRET" },
};

static void
test_error_case(void **state)
{
	const struct err_case *ec = *state;
	char *path = data_path(ec->file);
	char *want = subst(ec->fmt, path);
	char *cause = load_err(path, ec->context);

	assert_string_equal(cause, want);
	if (ec->secret != NULL)
		assert_null(strstr(cause, ec->secret));
	free(cause);
	free(want);
	free(path);
}

static void
test_err_no_file_in_list(void **state)
{
	char *cause;

	(void)state;
	cause = load_err("/nonexistent/a:/nonexistent/b", NULL);
	assert_string_equal(cause, "kubeconfig: none of "
	    "'/nonexistent/a:/nonexistent/b' exists");
	free(cause);
}

static void
test_err_not_found_names_all_files(void **state)
{
	char *a = data_path("merge-a.yaml"), *b = data_path("merge-b.yaml");
	char *list = xasprintf("%s:%s", a, b), *want, *cause;

	(void)state;
	cause = load_err(list, "zzz");
	want = xasprintf("context 'zzz' not found in '%s'", list);
	assert_string_equal(cause, want);
	free(cause);
	free(want);
	free(a);
	free(b);
	free(list);
}

/*
 * Fields that contradict each other, or data that cannot be what it
 * claims to be, are refused naming the entry and the file.
 */
static void
test_err_conflicting_fields(void **state)
{
	static const char both[] = "user 'u' in '%s': a client certificate "
	    "needs both client-certificate and client-key";
	static const char exec_and[] = "user 'u' in '%s': an exec plugin and "
	    "a token or username/password may be set, but not both";
	static const struct {
		const char *cluster, *user, *fmt;
	} cases[] = {
		/* data counts as a root certificate too (client-go's HasCA) */
		{ "server: 'https://k.example', insecure-skip-tls-verify: "
		  "true, certificate-authority-data: UEVN", "",
		  "cluster 'c' in '%s': specifying a root certificates file "
		  "with the insecure flag is not allowed" },
		/* a tokenFile is a bearer token (client-go's HasTokenAuth) */
		{ NULL, "tokenFile: /run/token, username: admin, password: "
		  "TOPSECRET", "user 'u' in '%s': username/password or bearer "
		  "token may be set, but not both" },
		{ NULL, "tokenFile: token, exec: {apiVersion: "
		  "client.authentication.k8s.io/v1beta1, command: x}",
		  exec_and },
		{ NULL, "username: admin, password: TOPSECRET, exec: "
		  "{apiVersion: client.authentication.k8s.io/v1beta1, "
		  "command: x}",
		  exec_and },
		{ NULL, "password: TOPSECRET",
		  "user 'u' in '%s': password without username" },
		{ NULL, "client-key: k.pem", both },
		{ NULL, "client-key-data: a2V5", both },
		/* "A\0B": PEM has no NUL, and a C string would end at it */
		{ NULL, "client-certificate: c.pem, client-key-data: QQBC",
		  "user 'u' in '%s': 'client-key-data' is not valid base64" },
		{ NULL, "token: \"TOPSECRET\\0tail\"",
		  "user 'u' in '%s': 'token' contains a NUL byte" },
	};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++)
		kc_err(cases[i].cluster, cases[i].user, cases[i].fmt);
}

/*
 * A kubeconfig of 4 MiB is read, one byte more is refused; so is a
 * KUBECONFIG list of more than 64 files (missing ones do not count).
 */
static void
test_err_limits(void **state)
{
	static const char head[] = "current-context: m\n"
	    "contexts: [{name: m, context: {cluster: c}}]\n"
	    "clusters: [{name: c, cluster: {server: 'https://k.example'}}]\n";
	const size_t size = 4 * 1024 * 1024;
	struct k8s_cluster c;
	struct buf list;
	char *dir = make_tmpdir(), *text, *p, *cause, *want;
	size_t i;

	(void)state;
	/* head, then lines of comment */
	text = xmalloc(size + 2);
	memset(text, '#', size);
	memcpy(text, head, strlen(head));
	for (i = strlen(head) + 79; i < size; i += 80)
		text[i] = '\n';
	text[size - 1] = '\n';
	text[size] = '\0';
	p = xasprintf("%s/config", dir);
	write_file(p, text);
	load_ok(&c, p, NULL);
	k8s_cluster_release(&c);
	memcpy(text + size, "\n", 2);
	write_file(p, text);
	free(text);
	cause = load_err(p, NULL);
	want = xasprintf("kubeconfig '%s': larger than 4 MiB", p);
	assert_string_equal(cause, want);
	free(want);
	free(cause);

	/* the config, a missing file, then empty ones */
	write_file(p, head);
	buf_init(&list, 1 << 20);
	buf_addstr(&list, p);
	buf_addstr(&list, ":/nonexistent/kubeconfig");
	free(p);
	for (i = 1; i <= 64; i++) {
		p = xasprintf("%s/%02zu", dir, i);
		write_file(p, "");
		buf_addstr(&list, ":");
		buf_addstr(&list, p);
		free(p);
		if (i == 63) {
			/* 64 files */
			load_ok(&c, list.data, NULL);
			k8s_cluster_release(&c);
		}
	}
	cause = load_err(list.data, NULL);
	assert_string_equal(cause, "kubeconfig: more than 64 files");
	free(cause);
	buf_release(&list);
	for (i = 1; i <= 64; i++) {
		p = xasprintf("%s/%02zu", dir, i);
		unlink(p);
		free(p);
	}
	remove_tree(dir, (const char *const[]){ "config", NULL });
	free(dir);
}

/* ---- in-cluster ---- */

static char *
sa_root(int token, int ca, const char *ns)
{
	char *dir = make_tmpdir(), *p;

	if (token) {
		p = xasprintf("%s/token", dir);
		write_file(p, "eyJhbGciOiJSUzI1NiJ9.sa-token\n");
		free(p);
	}
	if (ca) {
		p = xasprintf("%s/ca.crt", dir);
		write_file(p, "-----BEGIN CERTIFICATE-----\n");
		free(p);
	}
	if (ns != NULL) {
		p = xasprintf("%s/namespace", dir);
		write_file(p, ns);
		free(p);
	}
	return dir;
}

static void
sa_root_remove(char *dir)
{
	static const char *const tree[] = { "token", "ca.crt", "namespace",
	    NULL };

	remove_tree(dir, tree);
	free(dir);
}

static void
test_incluster_ok(void **state)
{
	struct k8s_cluster c;
	/* trimmed on both sides, CRs too, as strings.TrimSpace does */
	char *dir = sa_root(1, 1, "\r\n\tteam-b \r\n");
	char *cause = NULL, *want;

	(void)state;
	setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
	setenv("KUBERNETES_SERVICE_PORT", "443", 1);
	memset(&c, 0, sizeof(c));
	assert_int_equal(k8s_incluster_load(&c, dir, &cause), 0);
	assert_null(cause);
	assert_string_equal(c.server, "https://10.96.0.1:443");
	assert_string_equal(c.namespace, "team-b");
	want = xasprintf("%s/token", dir);
	assert_string_equal(c.token_file, want);
	free(want);
	/* the token is re-read by the client (rotation), not copied */
	assert_null(c.token);
	want = xasprintf("%s/ca.crt", dir);
	assert_string_equal(c.ca_file, want);
	free(want);
	assert_int_equal(c.insecure, 0);
	k8s_cluster_release(&c);
	sa_root_remove(dir);
}

static void
test_incluster_ipv6_pod_namespace(void **state)
{
	struct k8s_cluster c;
	char *dir = sa_root(1, 1, "from-file"), *cause = NULL;

	(void)state;
	setenv("KUBERNETES_SERVICE_HOST", "fd00:10:96::1", 1);
	setenv("KUBERNETES_SERVICE_PORT", "6443", 1);
	setenv("POD_NAMESPACE", "from-env", 1);
	memset(&c, 0, sizeof(c));
	assert_int_equal(k8s_incluster_load(&c, dir, &cause), 0);
	assert_string_equal(c.server, "https://[fd00:10:96::1]:6443");
	assert_string_equal(c.namespace, "from-env");
	k8s_cluster_release(&c);

	/* already in brackets; an empty POD_NAMESPACE is none */
	setenv("KUBERNETES_SERVICE_HOST", "[fd00:10:96::1]", 1);
	setenv("POD_NAMESPACE", "", 1);
	assert_int_equal(k8s_incluster_load(&c, dir, &cause), 0);
	assert_string_equal(c.server, "https://[fd00:10:96::1]:6443");
	assert_string_equal(c.namespace, "from-file");
	k8s_cluster_release(&c);
	unsetenv("POD_NAMESPACE");
	sa_root_remove(dir);
}

static void
test_incluster_defaults(void **state)
{
	struct k8s_cluster c;
	char *dir = sa_root(1, 0, NULL), *cause = NULL;

	(void)state;
	setenv("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc", 1);
	setenv("KUBERNETES_SERVICE_PORT", "443", 1);
	memset(&c, 0, sizeof(c));
	assert_int_equal(k8s_incluster_load(&c, dir, &cause), 0);
	/* no ca.crt: the system roots; no namespace file: default */
	assert_null(c.ca_file);
	assert_string_equal(c.namespace, "default");
	k8s_cluster_release(&c);
	sa_root_remove(dir);
}

static void
test_incluster_errors(void **state)
{
	/* strtol alone would take "+443" and " 443" */
	static const char *const ports[] = { "https", "443/tcp", "+443",
	    " 443", "-443", "0", "65536", "99999999999999999999" };
	struct k8s_cluster c, saved;
	char *dir = sa_root(0, 1, "x"), *cause = NULL, *want;
	size_t i;

	(void)state;
	memset(&c, 0xa5, sizeof(c));
	memcpy(&saved, &c, sizeof(c));

	assert_int_equal(k8s_incluster_load(&c, dir, &cause), -1);
	assert_string_equal(cause, "not running in a cluster: "
	    "KUBERNETES_SERVICE_HOST is not set");
	free(cause);
	cause = NULL;

	setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
	assert_int_equal(k8s_incluster_load(&c, dir, &cause), -1);
	assert_string_equal(cause, "not running in a cluster: "
	    "KUBERNETES_SERVICE_PORT is not set");
	free(cause);
	cause = NULL;

	for (i = 0; i < ARRAY_SIZE(ports); i++) {
		setenv("KUBERNETES_SERVICE_PORT", ports[i], 1);
		assert_int_equal(k8s_incluster_load(&c, dir, &cause), -1);
		want = xasprintf("in-cluster: KUBERNETES_SERVICE_PORT '%s' is "
		    "not a port", ports[i]);
		assert_string_equal(cause, want);
		free(want);
		free(cause);
		cause = NULL;
	}

	setenv("KUBERNETES_SERVICE_PORT", "443", 1);
	assert_int_equal(k8s_incluster_load(&c, dir, &cause), -1);
	want = xasprintf("in-cluster: cannot read token file '%s/token': "
	    "No such file or directory", dir);
	assert_string_equal(cause, want);
	free(want);
	free(cause);
	assert_memory_equal(&c, &saved, sizeof(c));
	sa_root_remove(dir);
}

/* The token file is read up to 64 KiB (client-go reads it whole). */
static void
test_incluster_token_size(void **state)
{
	struct k8s_cluster c;
	char *dir = sa_root(1, 0, NULL), *p = xasprintf("%s/token", dir);
	char *text = xmalloc(64 * 1024 + 2), *cause = NULL, *want;

	(void)state;
	setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
	setenv("KUBERNETES_SERVICE_PORT", "443", 1);
	memset(text, 'a', 64 * 1024);
	text[64 * 1024] = '\0';
	write_file(p, text);
	memset(&c, 0, sizeof(c));
	assert_int_equal(k8s_incluster_load(&c, dir, &cause), 0);
	k8s_cluster_release(&c);
	memcpy(text + 64 * 1024, "a", 2);
	write_file(p, text);
	assert_int_equal(k8s_incluster_load(&c, dir, &cause), -1);
	want = xasprintf("in-cluster: cannot read token file '%s': too large",
	    p);
	assert_string_equal(cause, want);
	free(want);
	free(cause);
	free(text);
	free(p);
	sa_root_remove(dir);
}

/* ---- rest.c without a server ---- */

static void
test_rest_open_errors(void **state)
{
	struct k8s_cluster c;
	struct k8s_api *api = NULL;
	char *cause = NULL;

	(void)state;
	memset(&c, 0, sizeof(c));
	assert_int_equal(k8s_rest_open(&api, &c, NULL, &cause), -1);
	assert_string_equal(cause, "k8s: no API server given");
	free(cause);
	cause = NULL;

	c.server = (char *)"ftp://example.com";
	assert_int_equal(k8s_rest_open(&api, &c, NULL, &cause), -1);
	assert_string_equal(cause, "k8s: API server scheme 'ftp' is not "
	    "http or https");
	free(cause);
	cause = NULL;

	c.server = (char *)"https://admin:pa55word@example.com";
	assert_int_equal(k8s_rest_open(&api, &c, NULL, &cause), -1);
	assert_string_equal(cause, "k8s: the API server URL must not carry "
	    "credentials");
	free(cause);
	cause = NULL;

	/* a CA and insecure: refused, as by the kubeconfig loader */
	c.server = (char *)"https://example.com:6443";
	c.ca_data = (char *)"-----BEGIN CERTIFICATE-----\n";
	c.insecure = 1;
	assert_int_equal(k8s_rest_open(&api, &c, NULL, &cause), -1);
	assert_string_equal(cause, "k8s: specifying a root certificates file "
	    "with the insecure flag is not allowed");
	free(cause);
	cause = NULL;
	c.ca_data = NULL;
	c.insecure = 0;

	c.ca_file = (char *)"/nonexistent/ca.crt";
	assert_int_equal(k8s_rest_open(&api, &c, NULL, &cause), -1);
	assert_string_equal(cause, "k8s: certificate-authority "
	    "'/nonexistent/ca.crt': No such file or directory");
	free(cause);
	assert_null(api);
}

static void
test_rest_refused(void **state)
{
	struct k8s_rest_config cfg = { .connect_timeout_ms = 2000,
	    .timeout_ms = 2000, .max_retries = 1, .max_retry_wait_ms = 10 };
	struct k8s_cluster c;
	struct k8s_status st;
	struct k8s_api *api = NULL;
	struct k8s_watch *w = NULL;
	json_t *obj = NULL;
	char *cause = NULL;
	int ret;

	(void)state;
	memset(&c, 0, sizeof(c));
	memset(&st, 0, sizeof(st));
	/* port 1 on loopback: refused at once */
	c.server = (char *)"http://127.0.0.1:1/prefix/";
	c.token = (char *)"never-sent-over-http";
	assert_int_equal(k8s_rest_open(&api, &c, &cfg, &cause), 0);
	assert_string_equal(api->ops->name, "rest");

	ret = k8s_get(api, &K8S_AGENTTASK, "ns1", "t1", &obj, &st);
	assert_int_equal(ret, K8S_EUNAVAILABLE);
	assert_int_equal(st.err, K8S_EUNAVAILABLE);
	assert_non_null(strstr(st.message, "GET http://127.0.0.1:1/prefix/"
	    "apis/divergedev.com/v1alpha1/namespaces/ns1/agenttasks/t1"));
	assert_null(strstr(st.message, "never-sent"));
	assert_null(obj);
	k8s_status_release(&st);

	/* names are checked before anything is sent */
	ret = k8s_get(api, &K8S_AGENTTASK, "ns1", "..", &obj, &st);
	assert_int_equal(ret, K8S_EBADREQUEST);
	k8s_status_release(&st);

	/* a watch that cannot connect fails at once */
	ret = k8s_watch(api, &K8S_AGENTTASK, NULL, NULL, &w, &st);
	assert_int_equal(ret, K8S_EUNAVAILABLE);
	assert_null(w);
	k8s_status_release(&st);
	k8s_api_free(api);
}

/* A listening socket on loopback that never answers; its port in *port. */
static int
silent_listener(int *port)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);

	assert_true(fd >= 0);
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(fd, 8), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	*port = ntohs(a.sin_port);
	return fd;
}

/* Whether a connection is waiting on the listener (taken and closed). */
static int
connected(int fd)
{
	int c = accept(fd, NULL, NULL);

	if (c < 0)
		return 0;
	close(c);
	return 1;
}

/*
 * tls-server-name names what is verified, never where to connect: one
 * that is not a host name is refused (it would have been pasted into the
 * URL: "localhost:PORT/" sent the token to another listener), and a good
 * one still connects to the server's own host and port.
 */
static void
test_rest_tls_server_name(void **state)
{
	static const char *const bad[] = { "localhost:%s/", "localhost:%s",
	    "user@localhost", "localhost/x", "local host", "::1", "[::1]",
	    "-lead.example", "trail-.example", "a..b", "localhost#x" };
	static const char *const good[] = { "localhost", "kubernetes.default",
	    "10.0.0.1", "API.Example.com" };
	struct k8s_rest_config cfg = { .connect_timeout_ms = 1000,
	    .timeout_ms = 1000, .max_retries = -1 };
	struct k8s_cluster c;
	struct k8s_status st = { 0 };
	struct k8s_api *api = NULL;
	char *cause = NULL, *name, *server, *want, port[16];
	int other, srv, other_port, srv_port;
	size_t i;

	(void)state;
	other = silent_listener(&other_port);
	srv = silent_listener(&srv_port);
	server = xasprintf("https://127.0.0.1:%d", srv_port);
	snprintf(port, sizeof(port), "%d", other_port);
	memset(&c, 0, sizeof(c));
	c.server = server;
	c.token = (char *)"sekrit-token";
	c.insecure = 1;
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		name = strchr(bad[i], '%') ? subst(bad[i], port) :
		    xstrdup(bad[i]);
		c.tls_server_name = name;
		if (k8s_rest_open(&api, &c, &cfg, &cause) == 0) {
			/* what the bug did: show where it went */
			(void)k8s_get(api, &K8S_AGENTTASK, "ns1", "t1", NULL,
			    &st);
			k8s_status_release(&st);
			k8s_api_free(api);
			fail_msg("tls-server-name '%s' accepted (the other "
			    "listener %s a connection)", name,
			    connected(other) ? "got" : "did not get");
		}
		want = xasprintf("k8s: tls-server-name '%s' is not a host "
		    "name", name);
		assert_string_equal(cause, want);
		free(want);
		free(cause);
		cause = NULL;
		free(name);
	}
	for (i = 0; i < ARRAY_SIZE(good); i++) {
		c.tls_server_name = (char *)good[i];
		assert_int_equal(k8s_rest_open(&api, &c, &cfg, &cause), 0);
		k8s_api_free(api);
	}
	/* a name that resolves nowhere: still the server's address */
	c.tls_server_name = (char *)"kubernetes.default.svc.invalid";
	assert_int_equal(k8s_rest_open(&api, &c, &cfg, &cause), 0);
	assert_int_not_equal(k8s_get(api, &K8S_AGENTTASK, "ns1", "t1", NULL,
	    &st), 0);
	k8s_status_release(&st);
	k8s_api_free(api);
	assert_true(connected(srv));
	assert_false(connected(other));
	close(other);
	close(srv);
	free(server);
}

/*
 * TLS against the fake API server (its certificate: IP 127.0.0.1 and DNS
 * localhost, from its own CA): the server is verified, the certificate
 * chain and the name both. Another CA, or a tls-server-name that the
 * certificate does not carry, refuses the connection before the token
 * is sent; insecure-skip-tls-verify is the only way around either.
 */
static void
test_rest_tls_verified(void **state)
{
	struct storeenv env;
	struct k8s_cluster c;
	struct k8s_api *api = NULL;
	char *cause = NULL, *ours, *other = data_path("certs/ca.crt");
	int before;

	(void)state;
	memset(&env, 0, sizeof(env));
	if (storeenv_start_fake(&env, 100, &c) < 0) {
		free(other);
		skip();
	}
	ours = c.ca_file;
	/* its own CA, the address it was issued for */
	assert_int_equal(k8s_rest_open(&api, &c, NULL, &cause), 0);
	assert_int_equal(get_one(api), K8S_ENOTFOUND);
	k8s_api_free(api);
	/* the other name it was issued for */
	c.tls_server_name = (char *)"localhost";
	assert_int_equal(k8s_rest_open(&api, &c, NULL, &cause), 0);
	assert_int_equal(get_one(api), K8S_ENOTFOUND);
	k8s_api_free(api);
	before = storeenv_fake_count(&env, "GET", "/secrets/nope");
	/* a name it was not issued for: refused */
	c.tls_server_name = (char *)"kubernetes.default.svc";
	assert_int_equal(k8s_rest_open(&api, &c, NULL, &cause), 0);
	assert_int_not_equal(get_one(api), K8S_ENOTFOUND);
	assert_int_not_equal(get_one(api), 0);
	k8s_api_free(api);
	/* another CA: refused */
	c.tls_server_name = NULL;
	c.ca_file = other;
	assert_int_equal(k8s_rest_open(&api, &c, NULL, &cause), 0);
	assert_int_not_equal(get_one(api), K8S_ENOTFOUND);
	assert_int_not_equal(get_one(api), 0);
	k8s_api_free(api);
	/* neither reached the server's handler */
	assert_int_equal(storeenv_fake_count(&env, "GET", "/secrets/nope"),
	    before);
	/* insecure-skip-tls-verify: the other CA no longer matters */
	c.insecure = 1;
	c.ca_file = NULL;
	assert_int_equal(k8s_rest_open(&api, &c, NULL, &cause), 0);
	assert_int_equal(get_one(api), K8S_ENOTFOUND);
	k8s_api_free(api);
	c.insecure = 0;
	c.ca_file = ours;
	k8s_cluster_release(&c);
	storeenv_close(&env);
	free(other);
}

/* ---- proxy-url against real processes ---- */

/* tests/fakes/connect_proxy.py, running. */
struct proxy_proc {
	pid_t pid;
	FILE *in;		/* closed: it ends */
	int port;
	char *log;		/* the tunnels it was asked for */
};

/*
 * Start the proxy with its log in dir and extra arguments (NULL-ended);
 * -1 when it cannot run.
 */
static int
proxy_start(struct proxy_proc *p, const char *dir, const char *name,
    const char *const *extra)
{
	const char *top = getenv("top_srcdir");
	const char *argv[16];
	char *script = xasprintf("%s/tests/fakes/connect_proxy.py",
	    top ? top : ".");
	char line[256];
	int in[2], outp[2];
	size_t n = 0;
	FILE *f;

	memset(p, 0, sizeof(*p));
	p->log = xasprintf("%s/%s.log", dir, name);
	argv[n++] = "python3";
	argv[n++] = script;
	argv[n++] = "--port";
	argv[n++] = "0";
	argv[n++] = "--log";
	argv[n++] = p->log;
	while (extra != NULL && *extra != NULL && n < ARRAY_SIZE(argv) - 1)
		argv[n++] = *extra++;
	argv[n] = NULL;
	if (access(script, R_OK) != 0 || pipe(in) < 0 || pipe(outp) < 0) {
		free(script);
		return -1;
	}
	p->pid = fork();
	if (p->pid == 0) {
		dup2(in[0], 0);
		dup2(outp[1], 1);
		close(in[1]);
		close(outp[0]);
		execvp("python3", (char *const *)(uintptr_t)argv);
		_exit(127);
	}
	free(script);
	close(in[0]);
	close(outp[1]);
	p->in = fdopen(in[1], "w");
	f = fdopen(outp[0], "r");
	if (f == NULL || fgets(line, sizeof(line), f) == NULL ||
	    sscanf(line, "{\"port\": %d}", &p->port) != 1) {
		if (f != NULL)
			fclose(f);
		return -1;
	}
	fclose(f);
	return 0;
}

static void
proxy_stop(struct proxy_proc *p)
{
	if (p->in != NULL)
		fclose(p->in);
	if (p->pid > 0) {
		kill(p->pid, SIGTERM);
		waitpid(p->pid, NULL, 0);
	}
	free(p->log);
	memset(p, 0, sizeof(*p));
}

/* The proxy's log so far (to free; "" when empty), then emptied. */
static char *
proxy_log_take(struct proxy_proc *p)
{
	char buf[8192];
	FILE *f = fopen(p->log, "r");
	size_t n = 0;

	if (f != NULL) {
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
	}
	buf[n] = '\0';
	f = fopen(p->log, "w");
	if (f != NULL)
		fclose(f);
	return xstrdup(buf);
}

/* A loopback port nothing listens on (bound, then closed). */
static int
closed_port(void)
{
	int port, fd = silent_listener(&port);

	close(fd);
	return port;
}

/* The fake apiserver, and a kubeconfig for it in dir. */
struct proxy_env {
	struct storeenv env;
	struct k8s_cluster fake;	/* server, CA, token */
	char *dir, *kc;
	int fake_port;
};

/* Write dir/kubeconfig for the fake, through proxy (NULL: none). */
static void
proxy_kubeconfig(struct proxy_env *pe, const char *proxy)
{
	char *text, *px = proxy != NULL ?
	    xasprintf("    proxy-url: '%s'\n", proxy) : xstrdup("");

	text = xasprintf("apiVersion: v1\nkind: Config\n"
	    "current-context: fake\n"
	    "clusters:\n- name: fake\n  cluster:\n"
	    "    server: '%s'\n    certificate-authority: '%s'\n%s"
	    "users:\n- name: me\n  user: {token: '%s'}\n"
	    "contexts:\n- name: fake\n  context: {cluster: fake, user: me}\n",
	    pe->fake.server, pe->fake.ca_file, px, pe->fake.token);
	write_file(pe->kc, text);
	free(text);
	free(px);
}

/* Open a REST client from pe's kubeconfig: fresh connections, few retries. */
static struct k8s_api *
proxy_api(struct proxy_env *pe, const char *want_proxy)
{
	struct k8s_rest_config cfg = { .connect_timeout_ms = 3000,
	    .timeout_ms = 5000, .max_retries = 1, .max_retry_wait_ms = 10,
	    .deadline_ms = 10000 };
	struct k8s_cluster c;
	struct k8s_api *api = NULL;
	char *cause = NULL;

	load_ok(&c, pe->kc, NULL);
	if (want_proxy != NULL)
		assert_string_equal(c.proxy_url, want_proxy);
	else
		assert_null(c.proxy_url);
	if (k8s_rest_open(&api, &c, &cfg, &cause) != 0)
		fail_msg("k8s_rest_open: %s", cause);
	k8s_cluster_release(&c);
	return api;
}

/* A get, a list and a watch that sees a create: 0, or the first error. */
static int
get_list_watch(struct k8s_api *api, struct k8s_status *st)
{
	struct k8s_watch *w = NULL;
	struct k8s_event ev;
	json_t *obj = NULL, *sec;
	int rc;

	rc = k8s_get(api, &K8S_SECRET, "default", "nope", &obj, st);
	if (rc != K8S_ENOTFOUND)
		return rc != 0 ? rc : K8S_EINTERNAL;
	k8s_status_release(st);
	rc = k8s_list(api, &K8S_SECRET, "default", NULL, &obj, st);
	json_decref(obj);
	if (rc != 0)
		return rc;
	rc = k8s_watch(api, &K8S_SECRET, "default", NULL, &w, st);
	if (rc != 0)
		return rc;
	sec = json_pack("{s:s,s:s,s:{s:s}}", "apiVersion", "v1", "kind",
	    "Secret", "metadata", "generateName", "px-");
	rc = k8s_create(api, &K8S_SECRET, "default", sec, NULL, st);
	json_decref(sec);
	while (rc == 0) {
		memset(&ev, 0, sizeof(ev));
		rc = k8s_watch_next(w, 5000, &ev, st);
		if (rc != 1)
			break;
		json_decref(ev.object);
		if (ev.type == K8S_ADDED) {
			rc = 0;
			break;
		}
	}
	k8s_watch_free(w);
	return rc == 0 ? 0 : rc < 0 ? rc : K8S_ETIMEOUT;
}

static int
proxy_env_open(struct proxy_env *pe)
{
	memset(pe, 0, sizeof(*pe));
	if (storeenv_start_fake(&pe->env, 100, &pe->fake) < 0)
		return -1;
	pe->fake_port = (int)strtol(strrchr(pe->fake.server, ':') + 1, NULL, 10);
	pe->dir = make_tmpdir();
	pe->kc = xasprintf("%s/kubeconfig", pe->dir);
	return 0;
}

static void
proxy_env_close(struct proxy_env *pe)
{
	k8s_cluster_release(&pe->fake);
	storeenv_close(&pe->env);
	free(pe->kc);
	free(pe->dir);
}

/* Requests the fake has seen since the last call (its log cleared). */
static size_t
fake_requests(struct proxy_env *pe)
{
	json_t *reqs = storeenv_fake(&pe->env, "GET", "/_fake/requests",
	    NULL);
	size_t n = json_array_size(reqs);

	json_decref(reqs);
	json_decref(storeenv_fake(&pe->env, "DELETE", "/_fake/requests",
	    NULL));
	return n;
}

static void
proxy_env_unset(void)
{
	unsetenv("https_proxy");
	unsetenv("HTTPS_PROXY");
	unsetenv("http_proxy");
	unsetenv("all_proxy");
	unsetenv("ALL_PROXY");
	unsetenv("no_proxy");
	unsetenv("NO_PROXY");
}

/*
 * One round through proxy-url url (NULL: none), as the kubeconfig says:
 * a get, a list and a watch from a fresh client (new connections); its
 * result (st filled on error), and in *log (to free) what p logged
 * meanwhile.
 */
static int
proxy_round(struct proxy_env *pe, const char *url, struct proxy_proc *p,
    char **log, struct k8s_status *st)
{
	struct k8s_api *api;
	int rc;

	proxy_kubeconfig(pe, url);
	api = proxy_api(pe, url);
	rc = get_list_watch(api, st);
	k8s_api_free(api);
	*log = proxy_log_take(p);
	return rc;
}

/*
 * proxy-url against the fake API server (TLS, its own CA) and
 * tests/fakes/connect_proxy.py, real processes on loopback: with it, the
 * get, list and watch go through the proxy (it logs a CONNECT to the
 * server's port), whatever https_proxy and no_proxy say; credentials in
 * it are sent to the proxy, never shown; a proxy that refuses, or whose
 * certificate is not trusted, makes the calls fail saying so, without
 * going direct. socks5 works the same. Without proxy-url, libcurl follows
 * https_proxy and no_proxy as client-go's ProxyFromEnvironment does.
 */
static void
test_rest_proxy(void **state)
{
	struct proxy_env pe;
	struct proxy_proc px, auth, socks, tls;
	struct k8s_status st = { 0 };
	struct k8s_watch *w = NULL;
	struct k8s_api *api;
	char *url, *want, *sock_want, *got, *crt, *key, *dir, env[64];
	int dead = closed_port();

	(void)state;
	if (proxy_env_open(&pe) < 0)
		skip();
	if (proxy_start(&px, pe.dir, "px", NULL) < 0) {
		proxy_env_close(&pe);
		skip();
	}
	want = xasprintf("CONNECT 127.0.0.1:%d\n", pe.fake_port);
	sock_want = xasprintf("SOCKS5 127.0.0.1:%d\n", pe.fake_port);

	/* proxy-url wins over https_proxy (a dead port) and no_proxy */
	snprintf(env, sizeof(env), "http://127.0.0.1:%d", dead);
	setenv("https_proxy", env, 1);
	setenv("HTTPS_PROXY", env, 1);
	setenv("no_proxy", "127.0.0.1,localhost", 1);
	setenv("NO_PROXY", "127.0.0.1,localhost", 1);
	url = xasprintf("http://127.0.0.1:%d", px.port);
	assert_int_equal(proxy_round(&pe, url, &px, &got, &st), 0);
	assert_non_null(strstr(got, want));
	/* the watch had a connection of its own: another CONNECT */
	assert_non_null(strstr(strstr(got, want) + 1, want));
	assert_null(strstr(got, "405"));
	free(got);
	free(url);

	/* a proxy that refuses: the calls fail, saying so, none direct */
	fake_requests(&pe);
	url = xasprintf("http://127.0.0.1:%d", dead);
	assert_int_equal(proxy_round(&pe, url, &px, &got, &st),
	    K8S_EUNAVAILABLE);
	free(got);
	got = xasprintf("(through the proxy http://127.0.0.1:%d)", dead);
	if (strstr(st.message, got) == NULL)
		fail_msg("message: %s", st.message);
	k8s_status_release(&st);
	api = proxy_api(&pe, url);
	assert_int_equal(k8s_watch(api, &K8S_SECRET, "default", NULL, &w,
	    &st), K8S_EUNAVAILABLE);
	assert_null(w);
	assert_non_null(strstr(st.message, "k8s: watch "));
	assert_non_null(strstr(st.message, got));
	k8s_status_release(&st);
	k8s_api_free(api);
	assert_int_equal(fake_requests(&pe), 0);
	free(got);
	free(url);
	proxy_env_unset();

	/* credentials in proxy-url go to the proxy, never into messages */
	if (proxy_start(&auth, pe.dir, "auth", (const char *const[]){
	    "--auth", "pxuser:pw-S3CRET", NULL }) < 0)
		fail_msg("cannot start the proxy again");
	url = xasprintf("http://pxuser:pw-S3CRET@127.0.0.1:%d", auth.port);
	assert_int_equal(proxy_round(&pe, url, &auth, &got, &st), 0);
	assert_non_null(strstr(got, want));
	assert_null(strstr(got, "407"));
	free(got);
	free(url);
	url = xasprintf("http://pxuser:wrong-S3CRET@127.0.0.1:%d", auth.port);
	assert_int_not_equal(proxy_round(&pe, url, &auth, &got, &st), 0);
	assert_non_null(strstr(got, "407 CONNECT"));
	assert_null(strstr(st.message, "S3CRET"));
	assert_non_null(strstr(st.message, "through the proxy http://"
	    "127.0.0.1:"));
	k8s_status_release(&st);
	free(got);
	free(url);
	proxy_stop(&auth);

	/* socks5: the same through a SOCKS5 proxy */
	if (proxy_start(&socks, pe.dir, "socks", (const char *const[]){
	    "--socks5", NULL }) < 0)
		fail_msg("cannot start the SOCKS5 proxy");
	url = xasprintf("socks5://127.0.0.1:%d", socks.port);
	assert_int_equal(proxy_round(&pe, url, &socks, &got, &st), 0);
	assert_non_null(strstr(got, sock_want));
	free(got);
	free(url);
	proxy_stop(&socks);

	/*
	 * An https proxy is verified against the system's CAs, not the
	 * cluster's: one with a certificate of the fake's test CA is
	 * refused, and nothing reaches the server
	 */
	dir = xstrndup(pe.fake.ca_file, (size_t)(strrchr(pe.fake.ca_file,
	    '/') - pe.fake.ca_file));
	crt = xasprintf("%s/server.crt", dir);
	key = xasprintf("%s/server.key", dir);
	if (proxy_start(&tls, pe.dir, "tls", (const char *const[]){
	    "--tls", crt, key, NULL }) < 0)
		fail_msg("cannot start the TLS proxy");
	fake_requests(&pe);
	url = xasprintf("https://127.0.0.1:%d", tls.port);
	assert_int_not_equal(proxy_round(&pe, url, &tls, &got, &st), 0);
	assert_non_null(strstr(st.message, "through the proxy https://"));
	assert_null(strstr(got, "CONNECT"));
	assert_int_equal(fake_requests(&pe), 0);
	k8s_status_release(&st);
	free(got);
	free(url);
	proxy_stop(&tls);
	free(crt);
	free(key);
	free(dir);

	/* no proxy-url: https_proxy is followed, and no_proxy bypasses it */
	snprintf(env, sizeof(env), "http://127.0.0.1:%d", px.port);
	setenv("https_proxy", env, 1);
	assert_int_equal(proxy_round(&pe, NULL, &px, &got, &st), 0);
	assert_non_null(strstr(got, want));
	free(got);
	setenv("no_proxy", "127.0.0.1", 1);
	assert_int_equal(proxy_round(&pe, NULL, &px, &got, &st), 0);
	assert_string_equal(got, "");
	free(got);
	proxy_env_unset();

	free(want);
	free(sock_want);
	proxy_stop(&px);
	proxy_env_close(&pe);
}

static void
test_watch_lines(void **state)
{
	static const char added[] = "{\"type\":\"ADDED\",\"object\":{\"kind\":"
	    "\"AgentTask\",\"metadata\":{\"name\":\"t1\",\"resourceVersion\":"
	    "\"42\"}}}\r\n";
	static const char bookmark[] = "{\"type\":\"BOOKMARK\",\"object\":{"
	    "\"kind\":\"AgentTask\",\"metadata\":{\"resourceVersion\":"
	    "\"77\"}}}";
	static const char gone[] = "{\"type\":\"ERROR\",\"object\":{\"kind\":"
	    "\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":"
	    "\"Failure\",\"message\":\"too old resource version: 5 (100)\","
	    "\"reason\":\"Expired\",\"code\":410}}";
	static const char internal[] = "{\"type\":\"ERROR\",\"object\":{"
	    "\"kind\":\"Status\",\"message\":\"boom\",\"code\":500}}";
	static const char *const bad[] = { "{", "[]", "{\"type\":\"ADDED\"}",
	    "{\"type\":\"WHAT\",\"object\":{}}", "\"x\"",
	    "{\"type\":1,\"object\":{}}", "{\"data\":\"c2VjcmV0\"" };
	struct k8s_event ev;
	struct k8s_status st;
	size_t i;

	(void)state;
	memset(&st, 0, sizeof(st));
	assert_int_equal(k8s_rest_watch_parse_line(added, strlen(added), &ev,
	    &st), 1);
	assert_int_equal(ev.type, K8S_ADDED);
	assert_int_equal(ev.rv, 42);
	assert_string_equal(k8s_meta_str(ev.object, "name"), "t1");
	json_decref(ev.object);

	assert_int_equal(k8s_rest_watch_parse_line(bookmark, strlen(bookmark),
	    &ev, &st), 1);
	assert_int_equal(ev.type, K8S_BOOKMARK);
	assert_int_equal(ev.rv, 77);
	json_decref(ev.object);

	assert_int_equal(k8s_rest_watch_parse_line(" \r", 2, &ev, &st), 0);

	assert_int_equal(k8s_rest_watch_parse_line(gone, strlen(gone), &ev,
	    &st), K8S_EGONE);
	assert_int_equal(st.code, 410);
	assert_string_equal(st.reason, "Expired");
	assert_string_equal(st.message, "too old resource version: 5 (100)");
	k8s_status_release(&st);

	assert_int_equal(k8s_rest_watch_parse_line(internal, strlen(internal),
	    &ev, &st), K8S_EINTERNAL);
	assert_string_equal(st.message, "boom");
	k8s_status_release(&st);

	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		assert_int_equal(k8s_rest_watch_parse_line(bad[i],
		    strlen(bad[i]), &ev, &st), K8S_EINTERNAL);
		assert_null(strstr(st.message, "c2VjcmV0"));
		k8s_status_release(&st);
	}
	/* NULL st is allowed */
	assert_int_equal(k8s_rest_watch_parse_line(gone, strlen(gone), &ev,
	    NULL), K8S_EGONE);
}

int
main(void)
{
	const struct CMUnitTest fixed[] = {
		cmocka_unit_test(test_current_context),
		cmocka_unit_test(test_context_by_name_paths),
		cmocka_unit_test(test_data_fields),
		cmocka_unit_test(test_data_overrides_path),
		cmocka_unit_test(test_token_file_relative),
		cmocka_unit_test(test_basic_auth),
		cmocka_unit_test(test_insecure_server_name),
		cmocka_unit_test(test_yaml_booleans),
		cmocka_unit_test(test_namespace_default_bare_server),
		cmocka_unit_test(test_merge_first_wins),
		cmocka_unit_test(test_merge_second_file_paths),
		cmocka_unit_test(test_merge_missing_file_skipped),
		cmocka_unit_test(test_kubeconfig_env),
		cmocka_unit_test(test_home_default),
		cmocka_unit_test(test_relative_paths_tmp),
		cmocka_unit_test(test_relative_kubeconfig_name),
		cmocka_unit_test(test_parse_mem),
		cmocka_unit_test(test_proxy_url),
		cmocka_unit_test(test_exec_plugin),
		cmocka_unit_test(test_exec_rest),
		cmocka_unit_test(test_exec_401_in_flight),
		cmocka_unit_test(test_exec_limits),
		cmocka_unit_test(test_exec_refused),
		cmocka_unit_test(test_exec_exit),
		cmocka_unit_test(test_exec_child),
		cmocka_unit_test(test_exec_child_fork),
		cmocka_unit_test(test_release),
		cmocka_unit_test(test_err_no_file_in_list),
		cmocka_unit_test(test_err_not_found_names_all_files),
		cmocka_unit_test(test_err_conflicting_fields),
		cmocka_unit_test(test_err_limits),
		cmocka_unit_test(test_incluster_ok),
		cmocka_unit_test(test_incluster_ipv6_pod_namespace),
		cmocka_unit_test(test_incluster_defaults),
		cmocka_unit_test(test_incluster_errors),
		cmocka_unit_test(test_incluster_token_size),
		cmocka_unit_test(test_rest_open_errors),
		cmocka_unit_test(test_rest_refused),
		cmocka_unit_test(test_rest_tls_server_name),
		cmocka_unit_test(test_rest_tls_verified),
		cmocka_unit_test(test_rest_proxy),
		cmocka_unit_test(test_watch_lines),
	};
	size_t nfixed = ARRAY_SIZE(fixed), nerr = ARRAY_SIZE(error_cases);
	struct CMUnitTest *tests;
	size_t i;
	int rc;

	util_json_init();
	log_setup(LOG_ERROR, 0);
	tests = xcalloc(nfixed + nerr, sizeof(*tests));
	memcpy(tests, fixed, sizeof(fixed));
	for (i = 0; i < nerr; i++) {
		tests[nfixed + i].name = error_cases[i].name;
		tests[nfixed + i].test_func = test_error_case;
		tests[nfixed + i].initial_state = (void *)&error_cases[i];
	}
	for (i = 0; i < nfixed + nerr; i++)
		tests[i].setup_func = setup;
	rc = _cmocka_run_group_tests("kubeconfig", tests, nfixed + nerr, NULL,
	    NULL);
	free(tests);
	return rc;
}
