/*
 * Where the REST backend finds its API server: a kubeconfig file (or a
 * KUBECONFIG list of them, merged as client-go does) or the in-cluster
 * service account (reference/k8s-api-subset.md section 6).
 *
 * Each file is loaded whole with libyaml's document API; the few paths
 * that matter (clusters[].cluster, users[].user, contexts[].context,
 * current-context) are then looked up in the node trees, never walked
 * recursively, so aliases and deep nesting cannot make the lookups loop.
 * Named entries are searched file by file: the first file defining a name
 * wins. Secrets (tokens, passwords, key data) never appear in messages,
 * and every copy of them made here is wiped before it is freed.
 */
#include "config.h"

#include <sys/stat.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <yaml.h>

#include "k8s/k8s.h"
#include "util/util.h"

#define MAX_FILE	(4 * 1024 * 1024)	/* bytes of one kubeconfig */
#define MAX_SMALL	(64 * 1024)		/* token, namespace files */
#define MAX_FILES	64			/* entries of a KUBECONFIG */
#define SA_ROOT		"/var/run/secrets/kubernetes.io/serviceaccount"

/* One loaded kubeconfig file. */
struct kc_file {
	char *path;		/* as given, for messages */
	char *dir;		/* absolute directory, for relative paths */
	yaml_document_t doc;
	int loaded;
};

/* The merged view of one or more files. */
struct kc {
	struct kc_file files[MAX_FILES];
	size_t nfiles;
	struct buf names;	/* the files read, ':'-joined */
};

/* A named entry (cluster, user or context) found in one file. */
struct kc_entry {
	const char *what;	/* "cluster", "user", "context" */
	const char *name;
	struct kc_file *file;
	yaml_node_t *body;	/* the mapping, or NULL when empty */
};

int k8s_kubeconfig_parse_mem(struct k8s_cluster *out, const char *name,
    const char *text, size_t len, const char *context, char **cause);

static void fail(char **cause, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/*
 * Set *cause (when NULL so far) to the formatted message, with control
 * characters replaced so that it stays on one line whatever the names in
 * the file are.
 */
static void
fail(char **cause, const char *fmt, ...)
{
	va_list ap;
	char *msg, *p;

	if (cause == NULL || *cause != NULL)
		return;
	va_start(ap, fmt);
	msg = xvasprintf(fmt, ap);
	va_end(ap);
	for (p = msg; *p != '\0'; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	*cause = msg;
}

static void
free_secret(char *s)
{
	if (s != NULL) {
		secure_wipe(s, strlen(s));
		free(s);
	}
}

/* Wipe and free the fields of a cluster; it is all zero afterwards. */
void
k8s_cluster_release(struct k8s_cluster *c)
{
	if (c == NULL)
		return;
	free(c->server);
	free(c->namespace);
	free(c->ca_file);
	free(c->ca_data);
	free(c->tls_server_name);
	free_secret(c->proxy_url);	/* may hold the proxy's password */
	free(c->cert_file);
	free(c->key_file);
	free_secret(c->cert_data);
	free_secret(c->key_data);
	free_secret(c->token);
	free(c->token_file);
	free_secret(c->username);
	free_secret(c->password);
	k8s_strv_free(c->exec_argv);
	k8s_strv_free(c->exec_env);
	free(c->exec_api_version);
	free(c->exec_hint);
	memset(c, 0, sizeof(*c));
}

void
k8s_strv_free(char **v)
{
	size_t i;

	for (i = 0; v != NULL && v[i] != NULL; i++)
		free(v[i]);
	free(v);
}

char **
k8s_strv_dup(char *const *v)
{
	size_t i, n = 0;
	char **d;

	if (v == NULL)
		return NULL;
	while (v[n] != NULL)
		n++;
	d = xcalloc(n + 1, sizeof(*d));
	for (i = 0; i < n; i++)
		d[i] = xstrdup(v[i]);
	return d;
}

/* Whether s is a DNS host name or an IPv4 address, and nothing more. */
int
k8s_host_name_ok(const char *s)
{
	size_t i, label = 0, n = s != NULL ? strlen(s) : 0;

	if (n == 0 || n > 253)
		return 0;
	for (i = 0; i < n; i++) {
		if (s[i] == '.') {
			/* no empty label, none ending with '-' */
			if (label == 0 || s[i - 1] == '-')
				return 0;
			label = 0;
			continue;
		}
		if (!((s[i] >= 'a' && s[i] <= 'z') ||
		    (s[i] >= 'A' && s[i] <= 'Z') ||
		    (s[i] >= '0' && s[i] <= '9') ||
		    (s[i] == '-' && label > 0)) || ++label > 63)
			return 0;
	}
	return label > 0 && s[n - 1] != '-';
}

/*
 * Read at most max bytes of path into a new NUL-terminated buffer. -1
 * with errno set (EFBIG when the file is larger).
 */
static int
read_file(const char *path, size_t max, char **out, size_t *outlen)
{
	struct buf b;
	char chunk[8192];
	ssize_t n;
	int fd, ret = -1, saved;

	buf_init(&b, max);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	for (;;) {
		n = read(fd, chunk, sizeof(chunk));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			goto out;
		}
		if (n == 0)
			break;
		if (buf_add(&b, chunk, (size_t)n) < 0) {
			errno = EFBIG;
			goto out;
		}
	}
	if (b.data == NULL)
		buf_add(&b, "", 0);
	*outlen = b.len;
	*out = buf_detach(&b, NULL);
	ret = 0;
out:
	saved = errno;
	secure_wipe(chunk, sizeof(chunk));
	if (b.data != NULL)
		secure_wipe(b.data, b.len);
	buf_release(&b);
	close(fd);
	errno = saved;
	return ret;
}

/* ---- YAML nodes ---- */

static yaml_node_t *
get_node(struct kc_file *f, int id)
{
	return yaml_document_get_node(&f->doc, id);
}

static yaml_node_t *
root_node(struct kc_file *f)
{
	if (!f->loaded)
		return NULL;
	return yaml_document_get_root_node(&f->doc);
}

/* A plain null scalar (absent, "", "~", "null") counts as absent. */
static int
is_null(const yaml_node_t *n)
{
	const char *v;
	size_t len;

	if (n == NULL)
		return 1;
	if (n->type != YAML_SCALAR_NODE ||
	    n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
		return 0;
	v = (const char *)n->data.scalar.value;
	len = n->data.scalar.length;
	return len == 0 || (len == 1 && v[0] == '~') ||
	    (len == 4 && (memcmp(v, "null", 4) == 0 ||
	    memcmp(v, "Null", 4) == 0 || memcmp(v, "NULL", 4) == 0));
}

static int
scalar_is(const yaml_node_t *n, const char *s)
{
	size_t len = strlen(s);

	return n != NULL && n->type == YAML_SCALAR_NODE &&
	    n->data.scalar.length == len &&
	    memcmp(n->data.scalar.value, s, len) == 0;
}

/* The value of key in mapping m (first occurrence), or NULL. */
static yaml_node_t *
map_get(struct kc_file *f, const yaml_node_t *m, const char *key)
{
	yaml_node_pair_t *p;

	if (m == NULL || m->type != YAML_MAPPING_NODE)
		return NULL;
	for (p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top;
	    p++)
		if (scalar_is(get_node(f, p->key), key))
			return get_node(f, p->value);
	return NULL;
}

/*
 * String field key of entry e: 1 with *out (owned by the document), 0
 * when absent or null, -1 with *cause when not a string.
 */
static int
entry_str(const struct kc_entry *e, const char *key, const char **out,
    char **cause)
{
	yaml_node_t *n = map_get(e->file, e->body, key);

	if (is_null(n))
		return 0;
	if (n->type != YAML_SCALAR_NODE) {
		fail(cause, "%s '%s' in '%s': '%s' is not a string", e->what,
		    e->name, e->file->path, key);
		return -1;
	}
	if (strlen((const char *)n->data.scalar.value) !=
	    n->data.scalar.length) {
		fail(cause, "%s '%s' in '%s': '%s' contains a NUL byte",
		    e->what, e->name, e->file->path, key);
		return -1;
	}
	*out = (const char *)n->data.scalar.value;
	return 1;
}

/* Copy of a string field, or NULL when absent; -1 on a bad value. */
static int
entry_dup(const struct kc_entry *e, const char *key, char **out,
    char **cause)
{
	const char *v = NULL;
	int r = entry_str(e, key, &v, cause);

	if (r < 0)
		return -1;
	*out = r > 0 && v[0] != '\0' ? xstrdup(v) : NULL;
	return 0;
}

/* dir/rel, without doubling the '/' of the root directory. */
static char *
path_join(const char *dir, const char *rel)
{
	return xasprintf("%s/%s", strcmp(dir, "/") == 0 ? "" : dir, rel);
}

/* A file path field, resolved against the directory of its file. */
static int
entry_path(const struct kc_entry *e, const char *key, char **out,
    char **cause)
{
	const char *v = NULL;
	int r = entry_str(e, key, &v, cause);

	if (r < 0)
		return -1;
	if (r == 0 || v[0] == '\0')
		*out = NULL;
	else if (v[0] == '/')
		*out = xstrdup(v);
	else
		*out = path_join(e->file->dir, v);
	return 0;
}

/* A base64 field (PEM data), decoded; whitespace in it is ignored. */
static int
entry_b64(const struct kc_entry *e, const char *key, char **out,
    char **cause)
{
	const char *v = NULL;
	unsigned char *dec = NULL;
	size_t i, n = 0, declen = 0;
	char *clean;
	int r = entry_str(e, key, &v, cause), ret = -1;

	if (r < 0)
		return -1;
	if (r == 0 || v[0] == '\0') {
		*out = NULL;
		return 0;
	}
	clean = xmalloc(strlen(v) + 1);
	for (i = 0; v[i] != '\0'; i++)
		if (v[i] != ' ' && v[i] != '\t' && v[i] != '\n' &&
		    v[i] != '\r')
			clean[n++] = v[i];
	if (base64_decode(clean, n, &dec, &declen) < 0 || declen == 0 ||
	    strlen((char *)dec) != declen) {
		fail(cause, "%s '%s' in '%s': '%s' is not valid base64",
		    e->what, e->name, e->file->path, key);
		goto out;
	}
	*out = (char *)dec;
	dec = NULL;
	ret = 0;
out:
	secure_wipe(clean, n);
	free(clean);
	if (dec != NULL) {
		secure_wipe(dec, declen);
		free(dec);
	}
	return ret;
}

/* insecure-skip-tls-verify and friends: YAML 1.1 booleans as Go reads. */
static int
entry_bool(const struct kc_entry *e, const char *key, int *out,
    char **cause)
{
	static const char *const yes[] = { "true", "True", "TRUE", "yes",
	    "Yes", "YES", "on", "On", "ON", "y", "Y" };
	static const char *const no[] = { "false", "False", "FALSE", "no",
	    "No", "NO", "off", "Off", "OFF", "n", "N" };
	const char *v = NULL;
	size_t i;
	int r = entry_str(e, key, &v, cause);

	*out = 0;
	if (r <= 0)
		return r;
	for (i = 0; i < ARRAY_SIZE(yes); i++) {
		if (strcmp(v, yes[i]) == 0) {
			*out = 1;
			return 0;
		}
		if (strcmp(v, no[i]) == 0)
			return 0;
	}
	fail(cause, "%s '%s' in '%s': '%s' is not a boolean", e->what,
	    e->name, e->file->path, key);
	return -1;
}

/* ---- files ---- */

/* Wipe the parser's copies of the input (tokens may be in it). */
static void
parser_wipe(yaml_parser_t *p)
{
	if (p->raw_buffer.start != NULL)
		secure_wipe(p->raw_buffer.start,
		    (size_t)(p->raw_buffer.end - p->raw_buffer.start));
	if (p->buffer.start != NULL)
		secure_wipe(p->buffer.start,
		    (size_t)(p->buffer.end - p->buffer.start));
}

/* Wipe every scalar of a document, then delete it. */
static void
doc_wipe(yaml_document_t *d)
{
	yaml_node_t *n;

	for (n = d->nodes.start; n != NULL && n < d->nodes.top; n++)
		if (n->type == YAML_SCALAR_NODE && n->data.scalar.value)
			secure_wipe(n->data.scalar.value,
			    n->data.scalar.length);
	yaml_document_delete(d);
}

/* The absolute directory of path. */
static char *
dir_of(const char *path)
{
	const char *slash = strrchr(path, '/');
	char cwd[PATH_MAX];
	char *dir;

	if (slash == path)
		return xstrdup("/");
	while (path[0] == '.' && path[1] == '/' && slash > path + 1) {
		/* "./a/b" is "a/b" */
		path += 2;
		while (path[0] == '/' && slash > path)
			path++;
	}
	dir = slash != NULL && slash > path ?
	    xstrndup(path, (size_t)(slash - path)) : xstrdup(".");
	if (dir[0] != '/' && getcwd(cwd, sizeof(cwd)) != NULL) {
		char *abs = strcmp(dir, ".") == 0 ? xstrdup(cwd) :
		    path_join(cwd, dir);

		free(dir);
		dir = abs;
	}
	return dir;
}

/* Parse text as file f (f->path set). */
static int
file_parse(struct kc_file *f, const char *text, size_t len, char **cause)
{
	yaml_parser_t p;
	yaml_node_t *root;
	int ret = -1;

	if (!yaml_parser_initialize(&p)) {
		fail(cause, "kubeconfig '%s': out of memory", f->path);
		return -1;
	}
	yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
	if (!yaml_parser_load(&p, &f->doc)) {
		fail(cause, "kubeconfig '%s': line %zu: %s", f->path,
		    (size_t)p.problem_mark.line + 1,
		    p.problem ? p.problem : "invalid YAML");
		goto out;
	}
	f->loaded = 1;
	root = yaml_document_get_root_node(&f->doc);
	if (root != NULL && !is_null(root) &&
	    root->type != YAML_MAPPING_NODE) {
		fail(cause, "kubeconfig '%s': not a mapping", f->path);
		goto out;
	}
	ret = 0;
out:
	parser_wipe(&p);
	yaml_parser_delete(&p);
	return ret;
}

static void
kc_init(struct kc *kc)
{
	memset(kc, 0, sizeof(*kc));
	buf_init(&kc->names, 1024 * 1024);
}

static void
kc_release(struct kc *kc)
{
	size_t i;

	for (i = 0; i < kc->nfiles; i++) {
		if (kc->files[i].loaded)
			doc_wipe(&kc->files[i].doc);
		free(kc->files[i].path);
		free(kc->files[i].dir);
	}
	buf_release(&kc->names);
}

/* Add a file from memory. */
static int
kc_add_mem(struct kc *kc, const char *path, const char *text, size_t len,
    char **cause)
{
	struct kc_file *f;

	if (kc->nfiles == MAX_FILES) {
		fail(cause, "kubeconfig: more than %d files", MAX_FILES);
		return -1;
	}
	f = &kc->files[kc->nfiles++];
	f->path = xstrdup(path);
	f->dir = dir_of(path);
	if (kc->names.len > 0)
		buf_addstr(&kc->names, ":");
	buf_addstr(&kc->names, path);
	return file_parse(f, text, len, cause);
}

/*
 * Add a file from disk. A missing file is skipped (0, nothing added)
 * when skip_missing is set, as client-go does for KUBECONFIG lists.
 */
static int
kc_add_file(struct kc *kc, const char *path, int skip_missing,
    char **cause)
{
	char *text = NULL;
	size_t len = 0;
	int ret = -1;

	if (read_file(path, MAX_FILE, &text, &len) < 0) {
		if (errno == ENOENT && skip_missing)
			return 0;
		if (errno == EFBIG)
			fail(cause, "kubeconfig '%s': larger than %d MiB",
			    path, MAX_FILE / (1024 * 1024));
		else
			fail(cause, "kubeconfig '%s': %s", path,
			    strerror(errno));
		return -1;
	}
	ret = kc_add_mem(kc, path, text, len, cause);
	secure_wipe(text, len);
	free(text);
	return ret;
}

/*
 * Find the entry called name in section (clusters, users, contexts),
 * whose body is under key field. 1 found, 0 not found, -1 on a malformed
 * section.
 */
static int
kc_find(struct kc *kc, const char *section, const char *field,
    const char *what, const char *name, struct kc_entry *e, char **cause)
{
	yaml_node_item_t *it;
	yaml_node_t *seq, *item, *body;
	size_t i;

	for (i = 0; i < kc->nfiles; i++) {
		struct kc_file *f = &kc->files[i];

		seq = map_get(f, root_node(f), section);
		if (is_null(seq))
			continue;
		if (seq->type != YAML_SEQUENCE_NODE) {
			fail(cause, "kubeconfig '%s': '%s' is not a list",
			    f->path, section);
			return -1;
		}
		for (it = seq->data.sequence.items.start;
		    it < seq->data.sequence.items.top; it++) {
			item = get_node(f, *it);
			if (item == NULL || item->type != YAML_MAPPING_NODE) {
				fail(cause, "kubeconfig '%s': an entry of "
				    "'%s' is not a mapping", f->path,
				    section);
				return -1;
			}
			if (!scalar_is(map_get(f, item, "name"), name))
				continue;
			body = map_get(f, item, field);
			if (is_null(body))
				body = NULL;
			else if (body->type != YAML_MAPPING_NODE) {
				fail(cause, "%s '%s' in '%s': '%s' is not a "
				    "mapping", what, name, f->path, field);
				return -1;
			}
			e->what = what;
			e->name = name;
			e->file = f;
			e->body = body;
			return 1;
		}
	}
	return 0;
}

/* current-context of the first file that has one, or NULL. */
static int
kc_current(struct kc *kc, const char **out, char **cause)
{
	yaml_node_t *n;
	size_t i;

	*out = NULL;
	for (i = 0; i < kc->nfiles; i++) {
		struct kc_file *f = &kc->files[i];

		n = map_get(f, root_node(f), "current-context");
		if (is_null(n))
			continue;
		if (n->type != YAML_SCALAR_NODE) {
			fail(cause, "kubeconfig '%s': 'current-context' is "
			    "not a string", f->path);
			return -1;
		}
		*out = (const char *)n->data.scalar.value;
		return 0;
	}
	return 0;
}

/* Normalise the server URL: a scheme is required, http or https. */
static int
check_server(const struct kc_entry *e, char **server, char **cause)
{
	char *s = *server;
	const char *slash, *at;
	size_t len, hostpart;

	if (strstr(s, "://") == NULL) {
		/* client-go assumes https for a bare host:port */
		*server = xasprintf("https://%s", s);
		free(s);
		s = *server;
	}
	hostpart = (size_t)(strstr(s, "://") - s) + 3;
	slash = strchr(s + hostpart, '/');
	at = strchr(s + hostpart, '@');
	if (at != NULL && (slash == NULL || at < slash)) {
		/* userinfo would put a password in messages and logs */
		fail(cause, "cluster '%s' in '%s': server URL must not carry "
		    "credentials", e->name, e->file->path);
		return -1;
	}
	if (strncmp(s, "https://", 8) != 0 && strncmp(s, "http://", 7) != 0) {
		fail(cause, "cluster '%s' in '%s': server '%s' is not an "
		    "http or https URL", e->name, e->file->path, s);
		return -1;
	}
	len = strlen(s);
	while (len > hostpart && s[len - 1] == '/')
		s[--len] = '\0';
	if (len == hostpart || s[hostpart] == '/') {
		fail(cause, "cluster '%s' in '%s': server '%s' has no host",
		    e->name, e->file->path, s);
		return -1;
	}
	return 0;
}

static int
load_cluster(struct kc *kc, const char *name, struct k8s_cluster *c,
    char **cause)
{
	struct kc_entry e;
	char *why = NULL;
	int r;

	r = kc_find(kc, "clusters", "cluster", "cluster", name, &e, cause);
	if (r < 0)
		return -1;
	if (r == 0) {
		fail(cause, "cluster '%s' not found in '%s'", name,
		    kc->names.data);
		return -1;
	}
	if (entry_dup(&e, "server", &c->server, cause) < 0 ||
	    entry_path(&e, "certificate-authority", &c->ca_file, cause) < 0 ||
	    entry_b64(&e, "certificate-authority-data", &c->ca_data,
	    cause) < 0 ||
	    entry_bool(&e, "insecure-skip-tls-verify", &c->insecure,
	    cause) < 0 ||
	    entry_dup(&e, "tls-server-name", &c->tls_server_name, cause) < 0 ||
	    entry_dup(&e, "proxy-url", &c->proxy_url, cause) < 0)
		return -1;
	if (c->server == NULL) {
		fail(cause, "cluster '%s' in '%s' has no server", name,
		    e.file->path);
		return -1;
	}
	if (check_server(&e, &c->server, cause) < 0)
		return -1;
	if (c->tls_server_name != NULL &&
	    !k8s_host_name_ok(c->tls_server_name)) {
		fail(cause, "cluster '%s' in '%s': tls-server-name '%s' is not "
		    "a host name", name, e.file->path, c->tls_server_name);
		return -1;
	}
	if (c->proxy_url != NULL &&
	    k8s_proxy_url_check(c->proxy_url, &why) < 0) {
		/* client-go's check, but the URL is not quoted: a password */
		fail(cause, "cluster '%s' in '%s': 'proxy-url' %s", name,
		    e.file->path, why);
		free(why);
		return -1;
	}
	if (c->insecure && (c->ca_file != NULL || c->ca_data != NULL)) {
		fail(cause, "cluster '%s' in '%s': specifying a root "
		    "certificates file with the insecure flag is not allowed",
		    name, e.file->path);
		return -1;
	}
	if (c->ca_data != NULL) {
		/* the data overrides the file, as in client-go */
		free(c->ca_file);
		c->ca_file = NULL;
	}
	return 0;
}

/* The strings of sequence node seq (a null is none), into v[at...]. */
static int
seq_strings(const struct kc_entry *e, yaml_node_t *seq, const char *key,
    char **v, size_t at, char **cause)
{
	yaml_node_item_t *it;
	yaml_node_t *n;

	if (is_null(seq))
		return 0;
	for (it = seq->data.sequence.items.start;
	    it < seq->data.sequence.items.top; it++) {
		n = get_node(e->file, *it);
		if (n == NULL || n->type != YAML_SCALAR_NODE ||
		    strlen((const char *)n->data.scalar.value) !=
		    n->data.scalar.length) {
			fail(cause, "user '%s' in '%s': 'exec.%s' must be a "
			    "list of strings", e->name, e->file->path, key);
			return -1;
		}
		v[at++] = xstrdup((const char *)n->data.scalar.value);
	}
	return 0;
}

static size_t
seq_len(const yaml_node_t *seq)
{
	return is_null(seq) ? 0 : (size_t)(seq->data.sequence.items.top -
	    seq->data.sequence.items.start);
}

/*
 * users[].user.exec: a client.authentication.k8s.io credential plugin
 * (client-go's ExecConfig), run later by the REST client. A relative
 * command with a '/' is taken from the kubeconfig's directory, as
 * kubectl does; a bare name is looked up in PATH.
 */
static int
load_exec(const struct kc_entry *u, yaml_node_t *node, struct k8s_cluster *c,
    char **cause)
{
	static const char v1[] = "client.authentication.k8s.io/v1";
	struct kc_entry e = { "user", u->name, u->file, node };
	const char *ver = NULL, *cmd = NULL, *mode = NULL, *hint = NULL;
	yaml_node_t *args, *env;
	yaml_node_item_t *it;
	size_t i = 0;

	args = map_get(e.file, node, "args");
	env = map_get(e.file, node, "env");
	if (node->type != YAML_MAPPING_NODE ||
	    (!is_null(args) && args->type != YAML_SEQUENCE_NODE) ||
	    (!is_null(env) && env->type != YAML_SEQUENCE_NODE)) {
		fail(cause, "user '%s' in '%s': 'exec' must be a mapping, its "
		    "'args' and 'env' lists", u->name, u->file->path);
		return -1;
	}
	if (entry_str(&e, "apiVersion", &ver, cause) < 0 ||
	    entry_str(&e, "command", &cmd, cause) < 0 ||
	    entry_str(&e, "interactiveMode", &mode, cause) < 0 ||
	    entry_str(&e, "installHint", &hint, cause) < 0 ||
	    entry_bool(&e, "provideClusterInfo", &c->exec_cluster_info,
	    cause) < 0)
		return -1;
	if (ver == NULL || (strcmp(ver, v1) != 0 &&
	    strcmp(ver, "client.authentication.k8s.io/v1beta1") != 0)) {
		fail(cause, "user '%s' in '%s': 'exec.apiVersion' must be %s "
		    "or client.authentication.k8s.io/v1beta1, not '%s'",
		    u->name, u->file->path, v1, ver != NULL ? ver : "");
		return -1;
	}
	if (cmd == NULL || *cmd == '\0') {
		fail(cause, "user '%s' in '%s': 'exec.command' is required",
		    u->name, u->file->path);
		return -1;
	}
	if (mode == NULL ? strcmp(ver, v1) == 0 : strcmp(mode, "Never") != 0 &&
	    strcmp(mode, "IfAvailable") != 0) {
		fail(cause, "user '%s' in '%s': 'exec.interactiveMode' must be "
		    "Never or IfAvailable%s: diverged runs the plugin with no "
		    "terminal", u->name, u->file->path, mode == NULL ?
		    " (required with v1)" : "");
		return -1;
	}
	c->exec_argv = xcalloc(seq_len(args) + 2, sizeof(char *));
	c->exec_argv[0] = strchr(cmd, '/') != NULL && cmd[0] != '/' ?
	    path_join(e.file->dir, cmd) : xstrdup(cmd);
	if (seq_strings(&e, args, "args", c->exec_argv, 1, cause) < 0)
		return -1;
	c->exec_env = xcalloc(seq_len(env) + 1, sizeof(char *));
	for (it = is_null(env) ? NULL : env->data.sequence.items.start;
	    it != NULL && it < env->data.sequence.items.top; it++) {
		struct kc_entry v = { "user", u->name, u->file,
		    get_node(e.file, *it) };
		const char *name = NULL, *val = NULL;

		if (v.body == NULL || v.body->type != YAML_MAPPING_NODE ||
		    entry_str(&v, "name", &name, cause) < 0 ||
		    entry_str(&v, "value", &val, cause) < 0 ||
		    name == NULL || *name == '\0' || strchr(name, '=')) {
			if (*cause == NULL)
				fail(cause, "user '%s' in '%s': 'exec.env' "
				    "items need a name (no '=') and a value",
				    u->name, u->file->path);
			return -1;
		}
		c->exec_env[i++] = xasprintf("%s=%s", name,
		    val != NULL ? val : "");
	}
	c->exec_api_version = xstrdup(ver);
	c->exec_hint = hint != NULL && *hint != '\0' ? xstrdup(hint) : NULL;
	return 0;
}

static int
load_user(struct kc *kc, const char *name, struct k8s_cluster *c,
    char **cause)
{
	struct kc_entry e;
	int r;

	r = kc_find(kc, "users", "user", "user", name, &e, cause);
	if (r < 0)
		return -1;
	if (r == 0) {
		fail(cause, "user '%s' not found in '%s'", name,
		    kc->names.data);
		return -1;
	}
	if (!is_null(map_get(e.file, e.body, "exec")) &&
	    load_exec(&e, map_get(e.file, e.body, "exec"), c, cause) < 0)
		return -1;
	if (!is_null(map_get(e.file, e.body, "auth-provider"))) {
		fail(cause, "user '%s' in '%s': auth-provider plugins are "
		    "not supported; use a token, tokenFile or client "
		    "certificate", name, e.file->path);
		return -1;
	}
	if (entry_dup(&e, "token", &c->token, cause) < 0 ||
	    entry_path(&e, "tokenFile", &c->token_file, cause) < 0 ||
	    entry_path(&e, "client-certificate", &c->cert_file, cause) < 0 ||
	    entry_b64(&e, "client-certificate-data", &c->cert_data,
	    cause) < 0 ||
	    entry_path(&e, "client-key", &c->key_file, cause) < 0 ||
	    entry_b64(&e, "client-key-data", &c->key_data, cause) < 0 ||
	    entry_dup(&e, "username", &c->username, cause) < 0 ||
	    entry_dup(&e, "password", &c->password, cause) < 0)
		return -1;
	if (c->cert_data != NULL) {
		free(c->cert_file);
		c->cert_file = NULL;
	}
	if (c->key_data != NULL) {
		free(c->key_file);
		c->key_file = NULL;
	}
	if ((c->cert_file || c->cert_data) != (c->key_file || c->key_data)) {
		fail(cause, "user '%s' in '%s': a client certificate needs "
		    "both client-certificate and client-key", name,
		    e.file->path);
		return -1;
	}
	if (c->exec_argv != NULL && (c->token || c->token_file ||
	    c->username || c->password)) {
		fail(cause, "user '%s' in '%s': an exec plugin and a token or "
		    "username/password may be set, but not both", name,
		    e.file->path);
		return -1;
	}
	if ((c->username || c->password) && (c->token || c->token_file)) {
		fail(cause, "user '%s' in '%s': username/password or bearer "
		    "token may be set, but not both", name, e.file->path);
		return -1;
	}
	if (c->password != NULL && c->username == NULL) {
		fail(cause, "user '%s' in '%s': password without username",
		    name, e.file->path);
		return -1;
	}
	return 0;
}

/* Resolve the context over the loaded files into *out. */
static int
kc_resolve(struct kc *kc, struct k8s_cluster *out, const char *context,
    char **cause)
{
	struct k8s_cluster c;
	struct kc_entry e;
	const char *cluster = NULL, *user = NULL, *ns = NULL;
	int r, ret = -1;

	memset(&c, 0, sizeof(c));
	if (context == NULL || context[0] == '\0') {
		if (kc_current(kc, &context, cause) < 0)
			goto out;
		if (context == NULL || context[0] == '\0') {
			fail(cause, "no current-context in '%s' and no "
			    "--context given", kc->names.data);
			goto out;
		}
	}
	r = kc_find(kc, "contexts", "context", "context", context, &e,
	    cause);
	if (r < 0)
		goto out;
	if (r == 0) {
		fail(cause, "context '%s' not found in '%s'", context,
		    kc->names.data);
		goto out;
	}
	if (entry_str(&e, "cluster", &cluster, cause) < 0 ||
	    entry_str(&e, "user", &user, cause) < 0 ||
	    entry_str(&e, "namespace", &ns, cause) < 0)
		goto out;
	if (cluster == NULL || cluster[0] == '\0') {
		fail(cause, "context '%s' in '%s' has no cluster", context,
		    e.file->path);
		goto out;
	}
	if (load_cluster(kc, cluster, &c, cause) < 0)
		goto out;
	if (user != NULL && user[0] != '\0' &&
	    load_user(kc, user, &c, cause) < 0)
		goto out;
	c.namespace = xstrdup(ns != NULL && ns[0] != '\0' ? ns : "default");
	memcpy(out, &c, sizeof(c));
	memset(&c, 0, sizeof(c));	/* now owned by *out */
	ret = 0;
out:
	k8s_cluster_release(&c);
	return ret;
}

/*
 * Parse one kubeconfig held in memory (name is used in messages and for
 * relative paths). Not in the header: the fuzz target calls it.
 */
int
k8s_kubeconfig_parse_mem(struct k8s_cluster *out, const char *name,
    const char *text, size_t len, const char *context, char **cause)
{
	struct kc kc;
	int ret = -1;

	kc_init(&kc);
	if (kc_add_mem(&kc, name, text, len, cause) < 0)
		goto out;
	ret = kc_resolve(&kc, out, context, cause);
out:
	kc_release(&kc);
	return ret;
}

/* Load and merge the kubeconfig files of a KUBECONFIG-style list. */
int
k8s_kubeconfig_load(struct k8s_cluster *out, const char *paths,
    const char *context, char **cause)
{
	struct kc kc;
	char *list = NULL, *p, *next;
	const char *home;
	size_t n = 0;
	int ret = -1, many;

	kc_init(&kc);
	if (paths == NULL || paths[0] == '\0')
		paths = getenv("KUBECONFIG");
	if (paths != NULL && paths[0] != '\0')
		list = xstrdup(paths);
	else {
		home = getenv("HOME");
		if (home == NULL || home[0] == '\0') {
			fail(cause, "kubeconfig: KUBECONFIG and HOME are "
			    "not set");
			goto out;
		}
		list = xasprintf("%s/.kube/config", home);
	}
	many = strchr(list, ':') != NULL;
	for (p = list; p != NULL; p = next) {
		next = strchr(p, ':');
		if (next != NULL)
			*next++ = '\0';
		if (p[0] == '\0')
			continue;
		n++;
		if (kc_add_file(&kc, p, many, cause) < 0)
			goto out;
	}
	if (kc.nfiles == 0) {
		if (n == 0)
			fail(cause, "kubeconfig: empty path list");
		else
			fail(cause, "kubeconfig: none of '%s' exists", paths);
		goto out;
	}
	ret = kc_resolve(&kc, out, context, cause);
out:
	kc_release(&kc);
	free(list);
	return ret;
}

/* ---- in-cluster ---- */

/* Trimmed contents of a small file, or NULL if unreadable or empty. */
static char *
read_trimmed(const char *path)
{
	char *s = NULL;
	size_t len = 0, start = 0;

	if (read_file(path, MAX_SMALL, &s, &len) < 0)
		return NULL;
	while (len > 0 && (s[len - 1] == '\n' || s[len - 1] == '\r' ||
	    s[len - 1] == ' ' || s[len - 1] == '\t'))
		s[--len] = '\0';
	while (start < len && (s[start] == ' ' || s[start] == '\t' ||
	    s[start] == '\n' || s[start] == '\r'))
		start++;
	if (start == len) {
		free(s);
		return NULL;
	}
	if (start > 0)
		memmove(s, s + start, len - start + 1);
	return s;
}

/* The service account's API server, token file, CA and namespace. */
int
k8s_incluster_load(struct k8s_cluster *out, const char *root,
    char **cause)
{
	struct k8s_cluster c;
	const char *host, *port, *ns;
	char *token = NULL, *path = NULL, *end;
	size_t len = 0;
	long pn;
	int ret = -1;

	memset(&c, 0, sizeof(c));
	if (root == NULL || root[0] == '\0')
		root = SA_ROOT;
	host = getenv("KUBERNETES_SERVICE_HOST");
	port = getenv("KUBERNETES_SERVICE_PORT");
	if (host == NULL || host[0] == '\0') {
		fail(cause, "not running in a cluster: "
		    "KUBERNETES_SERVICE_HOST is not set");
		goto out;
	}
	if (port == NULL || port[0] == '\0') {
		fail(cause, "not running in a cluster: "
		    "KUBERNETES_SERVICE_PORT is not set");
		goto out;
	}
	errno = 0;
	pn = strtol(port, &end, 10);
	if (errno != 0 || *end != '\0' || pn < 1 || pn > 65535 ||
	    port[0] < '0' || port[0] > '9') {
		fail(cause, "in-cluster: KUBERNETES_SERVICE_PORT '%s' is not "
		    "a port", port);
		goto out;
	}
	if (strchr(host, ':') != NULL && host[0] != '[')
		c.server = xasprintf("https://[%s]:%ld", host, pn);
	else
		c.server = xasprintf("https://%s:%ld", host, pn);

	c.token_file = xasprintf("%s/token", root);
	if (read_file(c.token_file, MAX_SMALL, &token, &len) < 0) {
		fail(cause, "in-cluster: cannot read token file '%s': %s",
		    c.token_file, errno == EFBIG ? "too large" :
		    strerror(errno));
		goto out;
	}
	path = xasprintf("%s/ca.crt", root);
	if (access(path, R_OK) == 0) {
		c.ca_file = path;
		path = NULL;	/* now owned by c */
	} else
		log_kv(LOG_WARN, "k8s: in-cluster ca.crt not readable, "
		    "using the system roots", "path", path, NULL);

	ns = getenv("POD_NAMESPACE");
	if (ns != NULL && ns[0] != '\0')
		c.namespace = xstrdup(ns);
	else {
		free(path);
		path = xasprintf("%s/namespace", root);
		c.namespace = read_trimmed(path);
		if (c.namespace == NULL)
			c.namespace = xstrdup("default");
	}
	memcpy(out, &c, sizeof(c));
	memset(&c, 0, sizeof(c));	/* now owned by *out */
	ret = 0;
out:
	if (token != NULL) {
		secure_wipe(token, len);
		free(token);
	}
	free(path);
	k8s_cluster_release(&c);
	return ret;
}
