/*
 * The GitHub and GitLab REST clients against an in-process libmicrohttpd
 * server that serves canned replies (tests/data/api/, copies of the
 * shared fixtures) in the order the test queues them, and records every
 * request it gets.
 */
#include "config.h"

#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <microhttpd.h>

#include "config/config.h"
#include "scm/client.h"
#include "scm/scm.h"
#include "storeenv.h"
#include "testutil.h"

#define GH_TOKEN	"ghp_TESTtokenSECRETvalue0123456789"
#define GL_TOKEN	"glpat-TESTsecretTOKEN42"
#define INST_TOKEN	"ghs_16C7e42F292c6912E7710c838347Ae178B4a"
#define MAX_WAIT	"5000"

/* ---- the fake server ---- */

struct canned {
	int status;
	char *headers[6];	/* "Name: value" */
	char *body;
	size_t len;
};

struct rec {
	char *method;
	char *path;		/* raw, not unescaped */
	char *query;		/* raw "k=v&k=v" */
	char *auth;
	char *private_token;
	char *accept;
	char *api_version;
	char *user_agent;
	char *content_type;
	char *body;
};

#define MAX_QUEUE	64
#define MAX_RECS	256
/* a status for push(): the connection is closed without a reply */
#define DROP		(-1)

static struct {
	struct MHD_Daemon *d;
	char base[64];
	pthread_mutex_t lock;
	struct canned q[MAX_QUEUE];
	size_t qhead, qtail;
	struct rec recs[MAX_RECS];
	size_t nrecs;
	/* with no reply queued: an endless list, an empty page at a time */
	int pager;
	/* every reply sent this late (a gateway that times out slowly) */
	int64_t delay_ms;
} srv = { .lock = PTHREAD_MUTEX_INITIALIZER };

struct upload {
	struct buf body;
};

static size_t
no_unescape(void *cls, struct MHD_Connection *c, char *uri)
{
	(void)cls;
	(void)c;
	return strlen(uri);
}

static enum MHD_Result
add_arg(void *cls, enum MHD_ValueKind kind, const char *key,
    const char *value)
{
	struct buf *b = cls;

	(void)kind;
	if (b->len > 0)
		buf_addstr(b, "&");
	buf_printf(b, "%s=%s", key, value != NULL ? value : "");
	return MHD_YES;
}

static char *
hdr(struct MHD_Connection *c, const char *name)
{
	const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);

	return v != NULL ? xstrdup(v) : NULL;
}

static enum MHD_Result
handle(void *cls, struct MHD_Connection *c, const char *url,
    const char *method, const char *version, const char *data,
    size_t *size, void **con_cls)
{
	struct upload *up = *con_cls;
	struct MHD_Response *resp;
	struct canned cn;
	struct rec *r;
	struct buf q;
	enum MHD_Result ret;
	int64_t delay;
	size_t i;

	(void)cls;
	(void)version;
	if (up == NULL) {
		up = xcalloc(1, sizeof(*up));
		buf_init(&up->body, 1 << 20);
		*con_cls = up;
		return MHD_YES;
	}
	if (*size > 0) {
		buf_add(&up->body, data, *size);
		*size = 0;
		return MHD_YES;
	}
	buf_init(&q, 1 << 16);
	buf_add(&q, "", 0);
	MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, add_arg, &q);
	pthread_mutex_lock(&srv.lock);
	if (srv.nrecs < MAX_RECS) {
		r = &srv.recs[srv.nrecs++];
		r->method = xstrdup(method);
		r->path = xstrdup(url);
		r->query = buf_detach(&q, NULL);
		r->auth = hdr(c, "Authorization");
		r->private_token = hdr(c, "PRIVATE-TOKEN");
		r->accept = hdr(c, "Accept");
		r->api_version = hdr(c, "X-GitHub-Api-Version");
		r->user_agent = hdr(c, "User-Agent");
		r->content_type = hdr(c, "Content-Type");
		r->body = up->body.data != NULL ? xstrdup(up->body.data) :
		    NULL;
	} else
		buf_release(&q);
	memset(&cn, 0, sizeof(cn));
	if (srv.qhead < srv.qtail)
		cn = srv.q[srv.qhead++ % MAX_QUEUE];
	else if (srv.pager) {
		/* the page asked for (?page=, 1 when none) names the next */
		const char *pg = MHD_lookup_connection_value(c,
		    MHD_GET_ARGUMENT_KIND, "page");

		cn.status = 200;
		cn.body = xstrdup("[]");
		cn.len = 2;
		cn.headers[0] = xasprintf("Link: <%s%s?per_page=100&page=%ld>; "
		    "rel=\"next\"", srv.base, url,
		    (pg != NULL ? atol(pg) : 1) + 1);
	} else {
		cn.status = 599;
		cn.body = xstrdup("{\"message\":\"no reply queued\"}");
		cn.len = strlen(cn.body);
	}
	delay = srv.delay_ms;
	pthread_mutex_unlock(&srv.lock);
	sleep_ms(delay);
	if (cn.status == DROP) {
		/* the request was read: close without a reply */
		free(cn.body);
		for (i = 0; i < ARRAY_SIZE(cn.headers); i++)
			free(cn.headers[i]);
		return MHD_NO;
	}
	resp = MHD_create_response_from_buffer(cn.len, cn.body,
	    MHD_RESPMEM_MUST_FREE);
	for (i = 0; i < ARRAY_SIZE(cn.headers) && cn.headers[i] != NULL;
	    i++) {
		char *colon = strchr(cn.headers[i], ':');

		*colon = '\0';
		MHD_add_response_header(resp, cn.headers[i], colon + 2);
		free(cn.headers[i]);
	}
	ret = MHD_queue_response(c, (unsigned int)cn.status, resp);
	MHD_destroy_response(resp);
	return ret;
}

static void
completed(void *cls, struct MHD_Connection *c, void **con_cls,
    enum MHD_RequestTerminationCode toe)
{
	struct upload *up = *con_cls;

	(void)cls;
	(void)c;
	(void)toe;
	if (up != NULL) {
		buf_release(&up->body);
		free(up);
		*con_cls = NULL;
	}
}

/* s with every "{base}" replaced by the server's URL. */
static char *
subst(const char *s)
{
	struct buf b;
	const char *p;

	buf_init(&b, 1 << 24);
	buf_add(&b, "", 0);
	while ((p = strstr(s, "{base}")) != NULL) {
		buf_add(&b, s, (size_t)(p - s));
		buf_addstr(&b, srv.base);
		s = p + 6;
	}
	buf_addstr(&b, s);
	return buf_detach(&b, NULL);
}

/* Queue a reply: status, body (NULL: empty), then headers, NULL. */
static void
push(int status, const char *body, ...)
{
	struct canned cn;
	const char *h;
	va_list ap;
	size_t n = 0;

	memset(&cn, 0, sizeof(cn));
	cn.status = status;
	cn.body = subst(body != NULL ? body : "");
	cn.len = strlen(cn.body);
	va_start(ap, body);
	while ((h = va_arg(ap, const char *)) != NULL &&
	    n < ARRAY_SIZE(cn.headers))
		cn.headers[n++] = subst(h);
	va_end(ap);
	pthread_mutex_lock(&srv.lock);
	srv.q[srv.qtail++ % MAX_QUEUE] = cn;
	pthread_mutex_unlock(&srv.lock);
}

/* Queue a fixture file of tests/data/api/. */
static void
push_file(int status, const char *rel, const char *h1, const char *h2)
{
	char *path = xasprintf("tests/data/api/%s", rel);
	char *body = test_read_file(path, NULL);

	push(status, body, h1, h2, NULL);
	free(body);
	free(path);
}

static void
rec_free(struct rec *r)
{
	free(r->method);
	free(r->path);
	free(r->query);
	free(r->auth);
	free(r->private_token);
	free(r->accept);
	free(r->api_version);
	free(r->user_agent);
	free(r->content_type);
	free(r->body);
	memset(r, 0, sizeof(*r));
}

/* Forget the requests and any reply left in the queue. */
static void
srv_reset(void)
{
	size_t i, k;

	pthread_mutex_lock(&srv.lock);
	for (i = 0; i < srv.nrecs; i++)
		rec_free(&srv.recs[i]);
	srv.nrecs = 0;
	for (; srv.qhead < srv.qtail; srv.qhead++) {
		free(srv.q[srv.qhead % MAX_QUEUE].body);
		for (k = 0; k < ARRAY_SIZE(srv.q[0].headers); k++)
			free(srv.q[srv.qhead % MAX_QUEUE].headers[k]);
	}
	srv.qhead = srv.qtail = 0;
	srv.pager = 0;
	srv.delay_ms = 0;
	pthread_mutex_unlock(&srv.lock);
}

static size_t
nrecs(void)
{
	size_t n;

	pthread_mutex_lock(&srv.lock);
	n = srv.nrecs;
	pthread_mutex_unlock(&srv.lock);
	return n;
}

static int
srv_start(void **state)
{
	struct sockaddr_in sin;
	const union MHD_DaemonInfo *info;

	(void)state;
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	srv.d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL,
	    NULL, handle, NULL, MHD_OPTION_SOCK_ADDR, &sin,
	    MHD_OPTION_UNESCAPE_CALLBACK, no_unescape, NULL,
	    MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_END);
	if (srv.d == NULL)
		return -1;
	info = MHD_get_daemon_info(srv.d, MHD_DAEMON_INFO_BIND_PORT);
	snprintf(srv.base, sizeof(srv.base), "http://127.0.0.1:%u",
	    (unsigned int)info->port);
	setenv(SCM_MAX_WAIT_ENV, MAX_WAIT, 1);
	setenv("TEST_GH_TOKEN", GH_TOKEN, 1);
	setenv("TEST_GL_TOKEN", GL_TOKEN, 1);
	return 0;
}

static int
srv_stop(void **state)
{
	(void)state;
	srv_reset();
	MHD_stop_daemon(srv.d);
	return 0;
}

/* ---- clients ---- */

enum gh_mode { GH_TOKEN_MODE, GH_APP_MODE };

/* A GitHub client of api_url: github.token, the App, or both. */
static struct scm_client *
github_client_at(const char *api_url, int token, int app)
{
	struct scm_client *c = NULL;
	struct config cfg;
	char *cause = NULL;
	const char *top = getenv("top_srcdir");

	config_defaults(&cfg);
	cfg.github.enabled = 1;
	free(cfg.github.api_url);
	cfg.github.api_url = xstrdup(api_url);
	if (token)
		cfg.github.token = xstrdup("env:TEST_GH_TOKEN");
	if (app) {
		cfg.github.app.id = xstrdup("1");
		cfg.github.app.private_key = xasprintf("file:%s/tests/data/"
		    "api/github/jwt-test-key.pem", top != NULL ? top : ".");
	}
	if (scm_github_new(&c, &cfg, &cause) != 0)
		fail_msg("scm_github_new: %s", cause);
	config_release(&cfg);
	assert_non_null(c);
	return c;
}

static struct scm_client *
github_client(enum gh_mode mode, const char *suffix)
{
	char *url = xasprintf("%s%s", srv.base, suffix);
	struct scm_client *c = github_client_at(url, mode == GH_TOKEN_MODE,
	    mode != GH_TOKEN_MODE);

	free(url);
	return c;
}

static struct scm_client *
gitlab_client(const char *suffix)
{
	struct scm_client *c = NULL;
	struct config cfg;
	char *cause = NULL;

	config_defaults(&cfg);
	cfg.gitlab.enabled = 1;
	free(cfg.gitlab.api_url);
	cfg.gitlab.api_url = xasprintf("%s%s", srv.base, suffix);
	cfg.gitlab.token = xstrdup("env:TEST_GL_TOKEN");
	if (scm_gitlab_new(&c, &cfg, &cause) != 0)
		fail_msg("scm_gitlab_new: %s", cause);
	config_release(&cfg);
	assert_non_null(c);
	return c;
}

static const struct scm_repo gh_repo = { "octocat/Hello-World", 0, 0 };
static const struct scm_repo gl_repo = { "group/project", 5, 0 };

/* ---- cases ---- */

static void
jwt_vector(void **state)
{
	char *pem, *want, *jwt = NULL, *cause = NULL, *dot, *payload;
	unsigned char *dec = NULL;
	size_t len, wlen, dlen;

	(void)state;
	pem = test_read_file("tests/data/api/github/jwt-test-key.pem", &len);
	want = test_read_file("tests/data/api/github/jwt-test-vector.txt",
	    &wlen);
	while (wlen > 0 && want[wlen - 1] == '\n')
		want[--wlen] = '\0';
	assert_int_equal(scm_github_jwt(pem, len, "1", 0, &jwt, &cause), 0);
	assert_string_equal(jwt, want);
	free(jwt);
	/* a client id is a JSON string */
	assert_int_equal(scm_github_jwt(pem, len, "Iv1.abc", 1000, &jwt,
	    &cause), 0);
	dot = strchr(jwt, '.');
	payload = xstrndup(dot + 1, (size_t)(strchr(dot + 1, '.') - dot - 1));
	assert_int_equal(base64_decode(payload, strlen(payload), &dec,
	    &dlen), 0);
	assert_string_equal((char *)dec,
	    "{\"iat\":970,\"exp\":1570,\"iss\":\"Iv1.abc\"}");
	free(dec);
	free(payload);
	free(jwt);
	/* not a key */
	assert_int_equal(scm_github_jwt("nope", 4, "1", 0, &jwt, &cause), -1);
	assert_non_null(strstr(cause, "private key"));
	free(cause);
	free(pem);
	free(want);
}

static void
headers_github(void **state)
{
	struct scm_client *c;
	char *login = NULL, *cause = NULL;
	int64_t id = 0;
	struct rec *r;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "/api/v3/");
	push(200, "{\"login\":\"diverge-bot\",\"id\":42}", NULL);
	assert_int_equal(c->ops->whoami(c, &login, &id, &cause), SCM_OK);
	assert_string_equal(login, "diverge-bot");
	assert_int_equal(id, 42);
	assert_int_equal(nrecs(), 1);
	r = &srv.recs[0];
	assert_string_equal(r->method, "GET");
	assert_string_equal(r->path, "/api/v3/user");
	assert_string_equal(r->accept, "application/vnd.github+json");
	assert_string_equal(r->api_version, "2022-11-28");
	assert_string_equal(r->user_agent, "diverged/" PACKAGE_VERSION);
	assert_string_equal(r->auth, "Bearer " GH_TOKEN);
	assert_null(r->private_token);
	free(login);
	scm_client_free(c);
}

static void
headers_gitlab(void **state)
{
	struct scm_client *c;
	char *login = NULL, *cause = NULL;
	int64_t id = 0;
	struct rec *r;

	(void)state;
	srv_reset();
	/* a self-hosted instance under a sub-path */
	c = gitlab_client("/gitlab/api/v4");
	push_file(200, "gitlab/get-current-user.json", NULL, NULL);
	assert_int_equal(c->ops->whoami(c, &login, &id, &cause), SCM_OK);
	assert_string_equal(login, "john_smith");
	assert_int_equal(id, 1);
	r = &srv.recs[0];
	assert_string_equal(r->path, "/gitlab/api/v4/user");
	assert_string_equal(r->private_token, GL_TOKEN);
	assert_null(r->auth);
	assert_null(r->api_version);
	assert_string_equal(r->user_agent, "diverged/" PACKAGE_VERSION);
	free(login);
	scm_client_free(c);
}

static void
get_pr_github(void **state)
{
	struct scm_client *c;
	struct scm_pr pr;
	char *cause = NULL;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push_file(200, "github/pulls.get.json", NULL, NULL);
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1347, &pr, &cause),
	    SCM_OK);
	assert_string_equal(srv.recs[0].path,
	    "/repos/octocat/Hello-World/pulls/1347");
	assert_string_equal(pr.state, "open");
	assert_int_equal(pr.merged, 0);
	assert_string_equal(pr.head_ref, "new-topic");
	assert_string_equal(pr.base_ref, "master");
	assert_string_equal(pr.head_sha,
	    "6dcb09b5b57875f334f61aebed695e2e4193db5e");
	assert_string_equal(pr.clone_url,
	    "https://github.com/octocat/Hello-World.git");
	assert_string_equal(pr.head_clone_url,
	    "https://github.com/octocat/Hello-World.git");
	assert_int_equal(pr.fork, 0);
	assert_string_equal(pr.author, "octocat");
	assert_string_equal(pr.html_url,
	    "https://github.com/octocat/Hello-World/pull/1347");
	scm_pr_release(&pr);
	scm_client_free(c);
}

static void
get_mr_gitlab(void **state)
{
	struct scm_client *c;
	struct scm_pr pr;
	char *cause = NULL;

	(void)state;
	srv_reset();
	c = gitlab_client("/api/v4");
	push_file(200, "gitlab/get-mr.json", NULL, NULL);
	push_file(200, "gitlab/get-project-5.json", NULL, NULL);
	push_file(200, "gitlab/get-project-6.json", NULL, NULL);
	assert_int_equal(c->ops->get_pr(c, &gl_repo, 7, &pr, &cause), SCM_OK);
	assert_int_equal(nrecs(), 3);
	assert_string_equal(srv.recs[0].path,
	    "/api/v4/projects/5/merge_requests/7");
	assert_string_equal(srv.recs[1].path, "/api/v4/projects/5");
	assert_string_equal(srv.recs[2].path, "/api/v4/projects/6");
	assert_string_equal(pr.state, "opened");
	assert_string_equal(pr.head_ref, "feature/widget");
	assert_string_equal(pr.base_ref, "main");
	assert_int_equal(pr.fork, 1);
	assert_string_equal(pr.clone_url,
	    "https://gitlab.example.com/group/project.git");
	assert_string_equal(pr.head_clone_url,
	    "https://gitlab.example.com/alice/project.git");
	assert_string_equal(pr.author, "alice");
	scm_pr_release(&pr);
	scm_client_free(c);
}

/*
 * GitLab's other shapes: a merged MR of one project (no source or target
 * project id in the reply: the repository's project, not a fork, one
 * project read); a system note is marked so (never a command); a note
 * created without an id is an error; an internal note says so; a
 * membership that expires today gives nothing already.
 */
static void
gitlab_shapes(void **state)
{
	struct scm_client *c;
	struct scm_comment *v = NULL;
	struct scm_pr pr;
	enum scm_permission p;
	char *cause = NULL, *body, today[16], after[16], next[16];
	time_t now = time(NULL), tomorrow = now + 86400;
	struct tm tm;
	size_t n = 0;
	int64_t id = 0;

	(void)state;
	srv_reset();
	c = gitlab_client("/api/v4");
	push(200, "{\"iid\":8,\"state\":\"merged\",\"source_branch\":\"fix\","
	    "\"target_branch\":\"main\",\"sha\":\"abc1234\",\"author\":"
	    "{\"username\":\"bob\"},\"web_url\":\"https://gitlab.example.com/"
	    "group/project/-/merge_requests/8\"}", NULL);
	push_file(200, "gitlab/get-project-5.json", NULL, NULL);
	assert_int_equal(c->ops->get_pr(c, &gl_repo, 8, &pr, &cause), SCM_OK);
	assert_int_equal(nrecs(), 2);
	assert_string_equal(srv.recs[1].path, "/api/v4/projects/5");
	assert_int_equal(pr.merged, 1);
	assert_int_equal(pr.fork, 0);
	assert_string_equal(pr.head_clone_url, pr.clone_url);
	scm_pr_release(&pr);

	push(200, "[{\"id\":9,\"body\":\"added 1 commit\",\"system\":true,"
	    "\"author\":{\"id\":2,\"username\":\"bob\"}}]", "x-next-page: ",
	    "x-page: 1", NULL);
	assert_int_equal(c->ops->list_comments(c, &gl_repo, 8, &v, &n,
	    &cause), SCM_OK);
	assert_int_equal(n, 1);
	assert_int_equal(v[0].system, 1);
	scm_comments_free(v, n);

	push(201, "{\"id\":0,\"body\":\"x\"}", NULL);
	assert_int_equal(c->ops->create_comment(c, &gl_repo, 8, "x", &id,
	    &cause), SCM_EINTERNAL);
	free(cause);
	cause = NULL;
	push(201, "{\"id\":12,\"body\":\"x\",\"internal\":true}", NULL);
	assert_int_equal(c->ops->create_internal_comment(c, &gl_repo, 8, "x",
	    &id, &cause), SCM_OK);
	assert_int_equal(id, 12);
	assert_string_equal(srv.recs[nrecs() - 1].body,
	    "{\"body\":\"x\",\"internal\":true}");

	gmtime_r(&now, &tm);
	strftime(today, sizeof(today), "%Y-%m-%d", &tm);
	gmtime_r(&tomorrow, &tm);
	strftime(next, sizeof(next), "%Y-%m-%d", &tm);
	body = xasprintf("{\"id\":1,\"access_level\":40,\"state\":\"active\","
	    "\"expires_at\":\"%s\"}", today);
	push(200, body, NULL);
	free(body);
	p = 99;
	assert_int_equal(c->ops->permission(c, &gl_repo, "u", 1, &p, &cause),
	    SCM_OK);
	now = time(NULL);
	gmtime_r(&now, &tm);
	strftime(after, sizeof(after), "%Y-%m-%d", &tm);
	/* (a day that ended during the call proves nothing) */
	if (strcmp(today, after) == 0)
		assert_int_equal(p, SCM_PERM_NONE);
	body = xasprintf("{\"id\":1,\"access_level\":40,\"state\":\"active\","
	    "\"expires_at\":\"%s\"}", next);
	push(200, body, NULL);
	free(body);
	assert_int_equal(c->ops->permission(c, &gl_repo, "u", 1, &p, &cause),
	    SCM_OK);
	assert_int_equal(p, SCM_PERM_MAINTAIN);
	scm_client_free(c);
}

static void
pages_github(void **state)
{
	struct scm_client *c;
	struct scm_comment *v = NULL;
	size_t n = 0;
	char *cause = NULL;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push_file(200, "github/issues.list-comments.json",
	    "Link: <{base}/repositories/1/issues/1347/comments?per_page=100"
	    "&page=2>; rel=\"next\", <{base}/repositories/1/issues/1347/"
	    "comments?per_page=100&page=3>; rel=\"last\"", NULL);
	push_file(200, "github/issues.list-comments.json",
	    "Link: <{base}/repositories/1/issues/1347/comments?per_page=100"
	    "&page=1>; rel=\"prev\", <{base}/repositories/1/issues/1347/"
	    "comments?per_page=100&page=3>; rel=\"next\"", NULL);
	push_file(200, "github/issues.list-comments.json",
	    "Link: <{base}/repositories/1/issues/1347/comments?per_page=100"
	    "&page=2>; rel=\"prev\"", NULL);
	assert_int_equal(c->ops->list_comments(c, &gh_repo, 1347, &v, &n,
	    &cause), SCM_OK);
	assert_int_equal(n, 3);
	assert_int_equal(nrecs(), 3);
	assert_string_equal(srv.recs[0].path,
	    "/repos/octocat/Hello-World/issues/1347/comments");
	assert_string_equal(srv.recs[0].query, "per_page=100");
	assert_string_equal(srv.recs[1].query, "per_page=100&page=2");
	assert_string_equal(srv.recs[2].query, "per_page=100&page=3");
	assert_string_equal(srv.recs[2].auth, "Bearer " GH_TOKEN);
	assert_int_equal(v[0].id, 1);
	assert_string_equal(v[0].author, "octocat");
	assert_int_equal(v[0].author_id, 1);
	assert_string_equal(v[0].body, "Me too");
	assert_string_equal(v[2].created_at, "2011-04-14T16:00:49Z");
	scm_comments_free(v, n);

	/* a next link to another host is refused (credentials stay home) */
	srv_reset();
	push_file(200, "github/issues.list-comments.json",
	    "Link: <https://elsewhere.example/x?page=2>; rel=\"next\"", NULL);
	assert_int_equal(c->ops->list_comments(c, &gh_repo, 1, &v, &n,
	    &cause), SCM_EINTERNAL);
	assert_non_null(strstr(cause, "refusing"));
	free(cause);
	cause = NULL;
	/*
	 * nor one whose address only starts like ours: here the same host
	 * with a longer port (a prefix match of "scheme://host:port" would
	 * send the token there)
	 */
	srv_reset();
	push_file(200, "github/issues.list-comments.json",
	    "Link: <{base}0/x?page=2>; rel=\"next\"", NULL);
	assert_int_equal(c->ops->list_comments(c, &gh_repo, 1, &v, &n,
	    &cause), SCM_EINTERNAL);
	assert_non_null(strstr(cause, "refusing"));
	assert_int_equal(nrecs(), 1);
	free(cause);
	scm_client_free(c);
}

static void
pages_gitlab(void **state)
{
	struct scm_client *c;
	struct scm_comment *v = NULL;
	size_t n = 0, i;
	char *cause = NULL, *want;

	(void)state;
	srv_reset();
	c = gitlab_client("/api/v4/");
	push_file(200, "gitlab/list-mr-notes.json", "x-next-page: 2",
	    "x-page: 1");
	push_file(200, "gitlab/list-mr-notes.json", "x-next-page: 3",
	    "x-page: 2");
	push_file(200, "gitlab/list-mr-notes.json", "x-next-page: ",
	    "x-page: 3");
	assert_int_equal(c->ops->list_comments(c, &gl_repo, 2, &v, &n,
	    &cause), SCM_OK);
	assert_int_equal(n, 3);
	assert_int_equal(nrecs(), 3);
	for (i = 0; i < 3; i++) {
		assert_string_equal(srv.recs[i].path,
		    "/api/v4/projects/5/merge_requests/2/notes");
		want = xasprintf("per_page=100&sort=asc&order_by=created_at"
		    "&page=%zu", i + 1);
		assert_string_equal(srv.recs[i].query, want);
		free(want);
	}
	assert_int_equal(v[1].id, 301);
	assert_string_equal(v[1].author, "pipin");
	assert_int_equal(v[1].author_id, 1);
	assert_string_equal(v[1].body, "Comment for MR");
	assert_int_equal(v[1].system, 0);
	scm_comments_free(v, n);
	scm_client_free(c);
}

/*
 * get_comment: one comment or note by id, its author as the API says
 * (GitHub's GET /repos/:o/:r/issues/comments/:id answers the issue
 * comment object, the shape of issues.update-comment.json; GitLab's
 * GET .../merge_requests/:iid/notes/:id get-mr-note.json); a 404 is
 * SCM_ENOTFOUND, a reply without its author SCM_EINTERNAL.
 */
static void
get_comment(void **state)
{
	struct scm_client *gh, *gl;
	struct scm_comment c;
	char *cause = NULL;

	(void)state;
	srv_reset();
	gh = github_client(GH_TOKEN_MODE, "");
	gl = gitlab_client("/api/v4");
	push_file(200, "github/issues.update-comment.json", NULL, NULL);
	assert_int_equal(gh->ops->get_comment(gh, &gh_repo, 42, 1, &c, &cause),
	    SCM_OK);
	assert_int_equal(c.id, 1);
	assert_string_equal(c.author, "octocat");
	assert_int_equal(c.author_id, 1);
	scm_comment_release(&c);
	assert_string_equal(srv.recs[0].method, "GET");
	assert_string_equal(srv.recs[0].path,
	    "/repos/octocat/Hello-World/issues/comments/1");

	push_file(200, "gitlab/get-mr-note.json", NULL, NULL);
	assert_int_equal(gl->ops->get_comment(gl, &gl_repo, 2, 301, &c,
	    &cause), SCM_OK);
	assert_int_equal(c.id, 301);
	assert_string_equal(c.author, "pipin");
	assert_int_equal(c.author_id, 1);
	assert_int_equal(c.system, 0);
	scm_comment_release(&c);
	assert_string_equal(srv.recs[1].method, "GET");
	assert_string_equal(srv.recs[1].path,
	    "/api/v4/projects/5/merge_requests/2/notes/301");

	push(404, "{\"message\":\"Not Found\"}", NULL);
	assert_int_equal(gh->ops->get_comment(gh, &gh_repo, 42, 7, &c, &cause),
	    SCM_ENOTFOUND);
	free(cause);
	cause = NULL;
	push(404, "{\"message\":\"404 Note Not Found\"}", NULL);
	assert_int_equal(gl->ops->get_comment(gl, &gl_repo, 2, 7, &c, &cause),
	    SCM_ENOTFOUND);
	free(cause);
	cause = NULL;
	/* another comment's id, or no author: not an answer */
	push(200, "{\"id\":8,\"user\":{\"login\":\"x\",\"id\":3}}", NULL);
	assert_int_equal(gh->ops->get_comment(gh, &gh_repo, 42, 7, &c, &cause),
	    SCM_EINTERNAL);
	assert_null(c.author);
	free(cause);
	cause = NULL;
	push(200, "{\"id\":7,\"body\":\"b\"}", NULL);
	assert_int_equal(gl->ops->get_comment(gl, &gl_repo, 2, 7, &c, &cause),
	    SCM_EINTERNAL);
	free(cause);
	scm_client_free(gh);
	scm_client_free(gl);
}

/*
 * A note deleted between two pages of offsets: x-total changes and the
 * notes are listed again, so the note that moved back a page is seen.
 */
static void
pages_gitlab_relist(void **state)
{
#define NOTE(id) "[{\"id\":" #id ",\"body\":\"n\",\"system\":false," \
	"\"author\":{\"id\":7,\"username\":\"bot\"}}]"
	static const struct {
		const char *body, *total, *next;
	} pages[] = {
		{ NOTE(1), "x-total: 3", "x-next-page: 2" },
		/* note 1 deleted: 2 is on page 1 now, 3 on page 2 */
		{ NOTE(3), "x-total: 2", "x-next-page: " },
		{ NOTE(2), "x-total: 2", "x-next-page: 2" },
		{ NOTE(3), "x-total: 2", "x-next-page: " },
	};
#undef NOTE
	struct scm_client *c;
	struct scm_comment *v = NULL;
	size_t n = 0, i;
	char *cause = NULL;

	(void)state;
	srv_reset();
	c = gitlab_client("/api/v4");
	for (i = 0; i < ARRAY_SIZE(pages); i++)
		push(200, pages[i].body, pages[i].total, pages[i].next, NULL);
	assert_int_equal(c->ops->list_comments(c, &gl_repo, 2, &v, &n,
	    &cause), SCM_OK);
	assert_int_equal(nrecs(), 4);
	assert_int_equal(n, 2);
	assert_int_equal(v[0].id, 2);
	assert_int_equal(v[1].id, 3);
	assert_non_null(strstr(srv.recs[2].query, "&page=1"));
	scm_comments_free(v, n);
	scm_client_free(c);
}

/*
 * A JSON array of GitHub comments or GitLab notes with ids from,
 * from + 1, ... (n of them).
 */
static char *
items_json(enum scm_provider p, int from, int n)
{
	struct buf b;
	int i;

	buf_init(&b, 1 << 20);
	buf_addstr(&b, "[");
	for (i = 0; i < n; i++) {
		char one[128];

		snprintf(one, sizeof(one), p == SCM_GITHUB ?
		    "%s{\"id\":%d,\"body\":\"c\",\"user\":{\"login\":"
		    "\"bot\",\"id\":7}}" :
		    "%s{\"id\":%d,\"body\":\"n\",\"system\":false,"
		    "\"author\":{\"id\":7,\"username\":\"bot\"}}",
		    i > 0 ? "," : "", from + i);
		buf_addstr(&b, one);
	}
	buf_addstr(&b, "]");
	return buf_detach(&b, NULL);
}

/*
 * The list of comments of PR 2 (GitHub) or notes of MR 2 (GitLab) holds
 * ids 1 to want_items, in order, and took want_reqs requests.
 */
static void
list_check(enum scm_provider p, size_t want_items, size_t want_reqs)
{
	struct scm_client *c = p == SCM_GITHUB ?
	    github_client(GH_TOKEN_MODE, "") : gitlab_client("/api/v4");
	struct scm_comment *v = NULL;
	size_t n = 0, i;
	char *cause = NULL;

	assert_int_equal(c->ops->list_comments(c, p == SCM_GITHUB ? &gh_repo :
	    &gl_repo, 2, &v, &n, &cause), SCM_OK);
	assert_int_equal(n, want_items);
	for (i = 0; i < n; i++)
		assert_int_equal(v[i].id, (int64_t)i + 1);
	assert_int_equal(nrecs(), want_reqs);
	scm_comments_free(v, n);
	scm_client_free(c);
}

/* The list of PR 2 or MR 2 fails after want_reqs requests, saying why. */
static void
list_fails(enum scm_provider p, size_t want_reqs, const char *why)
{
	struct scm_client *c = p == SCM_GITHUB ?
	    github_client(GH_TOKEN_MODE, "") : gitlab_client("/api/v4");
	struct scm_comment *v = NULL;
	size_t n = 0;
	char *cause = NULL;

	assert_int_equal(c->ops->list_comments(c, p == SCM_GITHUB ? &gh_repo :
	    &gl_repo, 2, &v, &n, &cause), SCM_EINTERNAL);
	assert_non_null(strstr(cause, why));
	assert_null(v);
	assert_int_equal(nrecs(), want_reqs);
	free(cause);
	scm_client_free(c);
}

/* Its next page went back to one read already. */
static void
list_stale(enum scm_provider p, size_t want_reqs)
{
	list_fails(p, want_reqs, "goes back to a page read already");
}

/*
 * Pages without their headers: GitLab.com sends no X-Total and
 * X-Total-Pages beyond 10,000 records, and a proxy may strip X-Next-Page
 * (the Link rel="next" left) or every pagination header.
 */
static void
pages_gitlab_stripped(void **state)
{
	char *full = items_json(SCM_GITLAB, 1, 100);
	char *one = items_json(SCM_GITLAB, 101, 1);
	char *over = items_json(SCM_GITLAB, 1, 101);

	(void)state;
	/* no X-Total: X-Next-Page alone leads */
	srv_reset();
	push(200, full, "x-next-page: 2", NULL);
	push(200, one, "x-next-page: ", NULL);
	list_check(SCM_GITLAB, 101, 2);
	/* no X-Next-Page: the Link's rel="next" */
	srv_reset();
	push(200, "[{\"id\":1,\"author\":{\"id\":7}}]", "Link: <{base}/api/v4/"
	    "projects/5/merge_requests/2/notes?order_by=created_at&page=2&"
	    "per_page=100&sort=asc>; rel=\"next\", <{base}/api/v4/projects/5/"
	    "merge_requests/2/notes?page=1&per_page=100>; rel=\"first\"",
	    NULL);
	push(200, "[{\"id\":2,\"author\":{\"id\":7}}]", "Link: <{base}/api/"
	    "v4/projects/5/merge_requests/2/notes?page=1&per_page=100>; "
	    "rel=\"first\"", NULL);
	list_check(SCM_GITLAB, 2, 2);
	assert_non_null(strstr(srv.recs[1].query, "&page=2"));
	/*
	 * A Link or an X-Next-Page that leads back: no loop, and not the
	 * whole list either (a sticky note further on would be posted
	 * twice)
	 */
	srv_reset();
	push(200, "[{\"id\":1,\"author\":{\"id\":7}}]", "Link: <{base}/api/v4/"
	    "projects/5/merge_requests/2/notes?page=1>; rel=\"next\"", NULL);
	list_stale(SCM_GITLAB, 1);
	srv_reset();
	push(200, full, "x-next-page: 2", NULL);
	push(200, full, "x-next-page: 1", NULL);
	list_stale(SCM_GITLAB, 2);
	/*
	 * A page fuller than per_page allows (GitLab gives 100 at most):
	 * refused, or 200 pages could keep millions of notes (an 8 MiB
	 * reply of {} items holds 2.8 million)
	 */
	srv_reset();
	push(200, over, "x-next-page: ", NULL);
	list_fails(SCM_GITLAB, 1, "list notes: a page holds more than 100 "
	    "items");
	/* neither: the next page while one comes back full */
	srv_reset();
	push(200, full, NULL);
	push(200, one, NULL);
	list_check(SCM_GITLAB, 101, 2);
	assert_non_null(strstr(srv.recs[1].query, "&page=2"));
	srv_reset();
	push(200, full, NULL);
	push(200, "[]", NULL);
	list_check(SCM_GITLAB, 100, 2);
	free(full);
	free(one);
	free(over);
}

#define GH_LIST	"/repos/octocat/Hello-World/issues/2/comments"

/* The requests of a GitHub list asked pages 1 to n by ?page=. */
static void
asked_pages(size_t n)
{
	char want[64];
	size_t i;

	assert_int_equal(nrecs(), n);
	assert_string_equal(srv.recs[0].query, "per_page=100");
	for (i = 1; i < n; i++) {
		snprintf(want, sizeof(want), "per_page=100&page=%zu", i + 1);
		assert_string_equal(srv.recs[i].path, GH_LIST);
		assert_string_equal(srv.recs[i].query, want);
	}
}

/*
 * A proxy or API gateway that strips the Link header: a full page (100
 * comments) means ask for the next, by page=, until a short or empty one
 * (GitHub answers [] past the last page). Missing a later page, the
 * notifier would not find its sticky comment there and post a second.
 */
static void
pages_github_stripped(void **state)
{
	char *p1 = items_json(SCM_GITHUB, 1, 100);
	char *p2 = items_json(SCM_GITHUB, 101, 100);
	char *p3 = items_json(SCM_GITHUB, 201, 50);
	char *short2 = items_json(SCM_GITHUB, 101, 50);
	char *over = items_json(SCM_GITHUB, 1, 101);
	char *reset = NULL, *cause = NULL;
	struct scm_client *c;
	struct scm_comment *v = NULL;
	size_t n = 0;
	int64_t t0;

	(void)state;
	/* 250 comments: 100, 100, 50 */
	srv_reset();
	push(200, p1, NULL);
	push(200, p2, NULL);
	push(200, p3, NULL);
	list_check(SCM_GITHUB, 250, 3);
	asked_pages(3);
	/* exactly 100: a full last page, then the empty one ends it */
	srv_reset();
	push(200, p1, NULL);
	push(200, "[]", NULL);
	list_check(SCM_GITHUB, 100, 2);
	asked_pages(2);
	/* a Link without rel="next" tells nothing more than none */
	srv_reset();
	push(200, p1, "Link: <{base}" GH_LIST "?per_page=100&page=1>; "
	    "rel=\"first\"", NULL);
	push(200, short2, NULL);
	list_check(SCM_GITHUB, 150, 2);
	asked_pages(2);
	/*
	 * A Link is followed as written, and its page= counted: the
	 * stripped reply after it goes on with page 3
	 */
	srv_reset();
	push(200, p1, "Link: <{base}/repositories/1/issues/2/comments?"
	    "per_page=100&page=2>; rel=\"next\"", NULL);
	push(200, p2, NULL);
	push(200, p3, NULL);
	list_check(SCM_GITHUB, 250, 3);
	assert_string_equal(srv.recs[1].path, "/repositories/1/issues/2/"
	    "comments");
	assert_string_equal(srv.recs[1].query, "per_page=100&page=2");
	assert_string_equal(srv.recs[2].path, GH_LIST);
	assert_string_equal(srv.recs[2].query, "per_page=100&page=3");
	/* a Link rel="next" that leads back: no loop, an error */
	srv_reset();
	push(200, p1, "Link: <{base}" GH_LIST "?per_page=100&page=1>; "
	    "rel=\"next\"", NULL);
	list_stale(SCM_GITHUB, 1);
	srv_reset();
	push(200, p1, "Link: <{base}" GH_LIST "?per_page=100&after=x>; "
	    "rel=\"next\"", NULL);
	push(200, p2, "Link: <{base}" GH_LIST "?per_page=100&after=x>; "
	    "rel=\"next\"", NULL);
	list_stale(SCM_GITHUB, 2);
	/* a page fuller than per_page allows: refused, as on GitLab */
	srv_reset();
	push(200, over, NULL);
	push(200, "[]", NULL);
	list_fails(SCM_GITHUB, 1, "list comments: a page holds more than 100 "
	    "items");

	/* the page asked for goes through the rate limits as any call */
	srv_reset();
	push(200, p1, NULL);
	push(429, "{\"message\":\"slow down\"}", "Retry-After: 1", NULL);
	push(200, short2, NULL);
	t0 = now_mono_ms();
	list_check(SCM_GITHUB, 150, 3);
	assert_true(now_mono_ms() - t0 >= 950);
	assert_string_equal(srv.recs[2].query, "per_page=100&page=2");
	/* the budget spent by page 1: page 2 is not sent */
	srv_reset();
	reset = xasprintf("x-ratelimit-reset: %" PRId64, now_unix() + 3600);
	push(200, p1, "x-ratelimit-remaining: 0", reset, NULL);
	c = github_client(GH_TOKEN_MODE, "");
	assert_int_equal(c->ops->list_comments(c, &gh_repo, 2, &v, &n,
	    &cause), SCM_ERATELIMITED);
	assert_int_equal(nrecs(), 1);
	assert_non_null(strstr(cause, "rate limited"));
	assert_in_range(scm_ratelimit_reset_ms() - now_unix_ms(),
	    3600 * 1000 - 2000, 3601 * 1000 + 1000);
	free(cause);
	free(reset);
	scm_client_free(c);
	free(p1);
	free(p2);
	free(p3);
	free(short2);
	free(over);
}

static void *
whoami_thread(void *arg)
{
	struct scm_client *c = arg;
	char *login = NULL, *cause = NULL;

	assert_int_equal(scm_client_whoami(c, 0, &login, NULL, &cause),
	    SCM_OK);
	assert_string_equal(login, "diverge-bot");
	free(login);
	return NULL;
}

/*
 * One whoami serves every asker of a client (the daemon and the
 * notifier): two at once send one request (the second waits for the
 * first's answer, here slowed by a 429), the next ones none, until a
 * reload of the secrets or a caller that wants a fresh answer. A
 * failure is not kept.
 */
static void
whoami_shared(void **state)
{
	struct scm_client *c;
	struct config cfg;
	char *login = NULL, *cause = NULL;
	pthread_t th[2];
	int64_t id = 0;
	int i;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push(429, "{\"message\":\"slow down\"}", "Retry-After: 1", NULL);
	push(200, "{\"login\":\"diverge-bot\",\"id\":42}", NULL);
	for (i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&th[i], NULL, whoami_thread, c),
		    0);
	for (i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	assert_int_equal(nrecs(), 2);
	assert_int_equal(scm_client_whoami(c, 0, &login, &id, &cause),
	    SCM_OK);
	assert_string_equal(login, "diverge-bot");
	assert_int_equal(id, 42);
	free(login);
	assert_int_equal(nrecs(), 2);
	/* fresh: asked again */
	push(200, "{\"login\":\"diverge-bot\",\"id\":42}", NULL);
	assert_int_equal(scm_client_whoami(c, 1, &login, &id, &cause),
	    SCM_OK);
	free(login);
	assert_int_equal(nrecs(), 3);
	/* a reload forgets it; a failure is not kept */
	config_defaults(&cfg);
	cfg.github.enabled = 1;
	cfg.github.token = xstrdup("env:TEST_GH_TOKEN");
	assert_int_equal(scm_client_reload(c, &cfg, &cause), 0);
	config_release(&cfg);
	push(404, "{\"message\":\"Not Found\"}", NULL);
	assert_int_equal(scm_client_whoami(c, 0, &login, &id, &cause),
	    SCM_ENOTFOUND);
	free(cause);
	cause = NULL;
	assert_int_equal(nrecs(), 4);
	push(200, "{\"login\":\"diverge-rot\",\"id\":43}", NULL);
	assert_int_equal(scm_client_whoami(c, 0, &login, &id, &cause),
	    SCM_OK);
	assert_string_equal(login, "diverge-rot");
	assert_int_equal(id, 43);
	free(login);
	assert_int_equal(scm_client_whoami(c, 0, &login, &id, &cause),
	    SCM_OK);
	assert_string_equal(login, "diverge-rot");
	free(login);
	assert_int_equal(nrecs(), 5);
	scm_client_free(c);
}

static void
retry_after_429(void **state)
{
	struct scm_client *c;
	char *login = NULL, *cause = NULL;
	int64_t t0, id;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push(429, "{\"message\":\"slow down\"}", "Retry-After: 1", NULL);
	push(200, "{\"login\":\"diverge-bot\",\"id\":42}",
	    "x-ratelimit-remaining: 4999", NULL);
	t0 = now_mono_ms();
	assert_int_equal(c->ops->whoami(c, &login, &id, &cause), SCM_OK);
	assert_true(now_mono_ms() - t0 >= 950);
	assert_int_equal(nrecs(), 2);
	free(login);

	/* GitLab: 429 with Retry-After */
	scm_client_free(c);
	srv_reset();
	c = gitlab_client("/api/v4");
	push(429, "{\"message\":\"Retry later\"}", "Retry-After: 1",
	    "RateLimit-Remaining: 0", NULL);
	push_file(200, "gitlab/get-current-user.json",
	    "RateLimit-Remaining: 1999", NULL);
	t0 = now_mono_ms();
	assert_int_equal(c->ops->whoami(c, &login, &id, &cause), SCM_OK);
	assert_true(now_mono_ms() - t0 >= 950);
	assert_int_equal(nrecs(), 2);
	free(login);
	scm_client_free(c);
}

static void
secondary_limit(void **state)
{
	struct scm_client *c;
	char *cause = NULL;
	int64_t t0;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push(403, "{\"message\":\"You have exceeded a secondary rate limit. "
	    "Please wait a few minutes before you try again.\"}",
	    "Retry-After: 1", NULL);
	push(200, "{}", NULL);
	t0 = now_mono_ms();
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 1, 5, "hi",
	    &cause), SCM_OK);
	assert_true(now_mono_ms() - t0 >= 950);
	assert_int_equal(nrecs(), 2);
	assert_string_equal(srv.recs[1].method, "PATCH");
	assert_string_equal(srv.recs[1].body, "{\"body\":\"hi\"}");

	/* without Retry-After: GitHub says wait a minute: beyond the bound */
	srv_reset();
	push(403, "{\"message\":\"You have exceeded a Secondary Rate Limit\"}",
	    NULL);
	t0 = now_mono_ms();
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 1, 5, "hi",
	    &cause), SCM_ERATELIMITED);
	assert_true(now_mono_ms() - t0 < 900);
	assert_int_equal(nrecs(), 1);
	free(cause);
	scm_client_free(c);
}

static void
ratelimit_beyond_bound(void **state)
{
	struct scm_client *c;
	struct scm_pr pr;
	struct buf m;
	char *cause = NULL, *reset, *remaining;
	int64_t t0;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	reset = xasprintf("x-ratelimit-reset: %" PRId64, now_unix() + 3600);
	push(403, "{\"message\":\"API rate limit exceeded\"}",
	    "x-ratelimit-remaining: 0", reset, NULL);
	t0 = now_mono_ms();
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1, &pr, &cause),
	    SCM_ERATELIMITED);
	assert_true(now_mono_ms() - t0 < 900);
	assert_int_equal(nrecs(), 1);
	assert_non_null(strstr(cause, "rate limit"));
	/* the reset goes to the caller, to retry the work then */
	assert_in_range(scm_ratelimit_reset_ms() - now_unix_ms(),
	    3600 * 1000 - 2000, 3601 * 1000 + 1000);
	free(cause);
	cause = NULL;
	/* the same with a 429 (a new client: the token is limited now) */
	scm_client_free(c);
	c = github_client(GH_TOKEN_MODE, "");
	srv_reset();
	push(429, "{}", "x-ratelimit-remaining: 0", reset, NULL);
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1, &pr, &cause),
	    SCM_ERATELIMITED);
	free(cause);
	cause = NULL;
	free(reset);
	/*
	 * A reset 1e17 s away is clamped to a day like Retry-After, not
	 * multiplied into a signed overflow (an abort under UBSan).
	 */
	scm_client_free(c);
	c = github_client(GH_TOKEN_MODE, "");
	srv_reset();
	push(429, "{}", "x-ratelimit-remaining: 0",
	    "x-ratelimit-reset: 100000000000000000", NULL);
	t0 = now_mono_ms();
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1, &pr, &cause),
	    SCM_ERATELIMITED);
	assert_true(now_mono_ms() - t0 < 900);
	assert_int_equal(nrecs(), 1);
	free(cause);
	cause = NULL;
	scm_client_free(c);

	/* GitLab's RateLimit-Reset */
	srv_reset();
	c = gitlab_client("/api/v4");
	reset = xasprintf("RateLimit-Reset: %" PRId64, now_unix() + 3600);
	push(429, "{\"message\":\"This endpoint has been requested too many "
	    "times. Try again later.\"}", "RateLimit-Remaining: 0", reset,
	    NULL);
	t0 = now_mono_ms();
	assert_int_equal(c->ops->create_comment(c, &gl_repo, 1, "x", NULL,
	    &cause), SCM_ERATELIMITED);
	assert_true(now_mono_ms() - t0 < 900);
	assert_in_range(scm_ratelimit_reset_ms() - now_unix_ms(),
	    3600 * 1000 - 2000, 3601 * 1000 + 1000);
	free(cause);
	free(reset);
	/* Retry-After first; a call that succeeds names no reset */
	scm_client_free(c);
	c = gitlab_client("/api/v4");
	srv_reset();
	push(429, "{}", "Retry-After: 120", "RateLimit-Remaining: 0", NULL);
	assert_int_equal(c->ops->create_comment(c, &gl_repo, 1, "x", NULL,
	    &cause), SCM_ERATELIMITED);
	assert_in_range(scm_ratelimit_reset_ms() - now_unix_ms(),
	    120 * 1000 - 2000, 120 * 1000);
	free(cause);
	scm_client_free(c);
	c = gitlab_client("/api/v4");
	push(201, "{\"id\":7}", NULL);
	assert_int_equal(c->ops->create_comment(c, &gl_repo, 1, "x", NULL,
	    &cause), SCM_OK);
	assert_int_equal(scm_ratelimit_reset_ms(), 0);
	scm_client_free(c);
	/*
	 * The application limiter (notes_create_limit): no Retry-After and
	 * budget left; its window is a clock minute as the RateLimit-Reset
	 * of the API's throttle is: that reset, one request only
	 */
	c = gitlab_client("/api/v4");
	srv_reset();
	reset = xasprintf("RateLimit-Reset: %" PRId64, now_unix() + 40);
	push(429, "{\"message\":{\"error\":\"This endpoint has been "
	    "requested too many times. Try again later.\"}}",
	    "RateLimit-Remaining: 1990", reset, NULL);
	assert_int_equal(c->ops->create_comment(c, &gl_repo, 1, "x", NULL,
	    &cause), SCM_ERATELIMITED);
	assert_int_equal(nrecs(), 1);
	assert_in_range(scm_ratelimit_reset_ms() - now_unix_ms(),
	    38 * 1000, 41 * 1000);
	free(cause);
	free(reset);
	scm_client_free(c);

	/* the gauge and the counter */
	buf_init(&m, 1 << 20);
	assert_int_equal(metrics_render(&m), 0);
	remaining = strstr(m.data,
	    "diverge_scm_ratelimit_remaining{provider=\"github\"} 0");
	assert_non_null(remaining);
	assert_non_null(strstr(m.data, "diverge_scm_requests_total{provider="
	    "\"github\",op=\"get_pr\",code=\"403\"} 1"));
	assert_non_null(strstr(m.data, "# TYPE diverge_scm_requests_total "
	    "counter"));
	buf_release(&m);
}

static char *token_reply(int64_t expires);

/*
 * A comment update meets the limit queued for it, then a reaction with
 * the same credential is not sent: recs requests in all.
 */
static void
limited_twice(struct scm_client *c, const struct scm_repo *repo,
    size_t recs)
{
	char *cause = NULL;

	assert_int_equal(c->ops->update_comment(c, repo, 42, 5, "a", &cause),
	    SCM_ERATELIMITED);
	free(cause);
	cause = NULL;
	assert_int_equal(c->ops->react(c, repo, 42, 11, 0, "eyes", &cause),
	    SCM_ERATELIMITED);
	free(cause);
	assert_int_equal(nrecs(), recs);
}

/*
 * A limit is the credential's: once one call met it, no call with that
 * credential is sent before it resets (they fail fast with the reset),
 * while other credentials (another installation, the other provider) go
 * on.
 */
static void
ratelimit_held(void **state)
{
	struct scm_repo r7 = { "octocat/Hello-World", 0, 7 };
	struct scm_repo r8 = { "octocat/Hello-World", 0, 8 };
	struct scm_client *c, *app, *gl;
	struct scm_pr pr;
	struct buf m;
	char *cause = NULL, *body, *reset;
	int64_t at, t0, now = now_unix();

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	gl = gitlab_client("/api/v4");
	push(403, "{\"message\":\"You have exceeded a secondary rate limit. "
	    "Please wait a few minutes before you try again.\",\"documentation"
	    "_url\":\"https://docs.github.com/free-pro-team@latest/rest/"
	    "overview/rate-limits-for-the-rest-api#about-secondary-rate-"
	    "limits\"}", "Retry-After: 60", "x-ratelimit-remaining: 4990",
	    NULL);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 42, 5, "a",
	    &cause), SCM_ERATELIMITED);
	at = scm_ratelimit_reset_ms();
	assert_in_range(at - now_unix_ms(), 58 * 1000, 60 * 1000);
	free(cause);
	cause = NULL;
	assert_int_equal(nrecs(), 1);
	/* another PR's comment, a reaction: not sent, the same reset */
	t0 = now_mono_ms();
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 46, 6, "b",
	    &cause), SCM_ERATELIMITED);
	assert_int_equal(scm_ratelimit_reset_ms(), at);
	assert_non_null(strstr(cause, "not sent"));
	free(cause);
	cause = NULL;
	assert_int_equal(c->ops->react(c, &gh_repo, 46, 11, 0, "eyes",
	    &cause), SCM_ERATELIMITED);
	assert_int_equal(scm_ratelimit_reset_ms(), at);
	free(cause);
	cause = NULL;
	assert_true(now_mono_ms() - t0 < 500);
	assert_int_equal(nrecs(), 1);
	/* GitLab's token is another credential */
	push(201, "{\"id\":7}", NULL);
	assert_int_equal(gl->ops->create_comment(gl, &gl_repo, 1, "x", NULL,
	    &cause), SCM_OK);
	assert_int_equal(nrecs(), 2);

	/* GitLab: a 429 holds its token, not GitHub's */
	srv_reset();
	push(429, "Retry later\n", "Retry-After: 60", "RateLimit-Remaining: 0",
	    NULL);
	limited_twice(gl, &gl_repo, 1);
	scm_client_free(gl);
	scm_client_free(c);

	/* the last request of the budget: nothing more until its reset */
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	reset = xasprintf("x-ratelimit-reset: %" PRId64, now_unix() + 1);
	push(200, "{}", "x-ratelimit-remaining: 0", reset, NULL);
	free(reset);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 42, 5, "a",
	    &cause), SCM_OK);
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 42, &pr, &cause),
	    SCM_ERATELIMITED);
	free(cause);
	cause = NULL;
	assert_int_equal(nrecs(), 1);
	/* ... then calls go out again */
	sleep_ms(scm_ratelimit_reset_ms() - now_unix_ms() + 10);
	push(200, "{}", "x-ratelimit-remaining: 5000", NULL);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 46, 6, "b",
	    &cause), SCM_OK);
	assert_int_equal(nrecs(), 2);
	scm_client_free(c);

	/* App installations are limited apart */
	srv_reset();
	app = github_client(GH_APP_MODE, "");
	body = token_reply(now + 3600);
	push(201, body, NULL);
	push(429, "{\"message\":\"API rate limit exceeded for installation "
	    "ID 7.\"}", "x-ratelimit-remaining: 0", "Retry-After: 60", NULL);
	limited_twice(app, &r7, 2);
	push(201, body, NULL);
	push(200, "{}", NULL);
	free(body);
	assert_int_equal(app->ops->update_comment(app, &r8, 46, 6, "b",
	    &cause), SCM_OK);
	assert_int_equal(nrecs(), 4);
	assert_string_equal(srv.recs[2].path,
	    "/app/installations/8/access_tokens");
	scm_client_free(app);

	/* the held calls and the end of the limit are metrics */
	buf_init(&m, 1 << 20);
	assert_int_equal(metrics_render(&m), 0);
	assert_non_null(strstr(m.data, "diverge_scm_ratelimit_held_total{"
	    "provider=\"github\"} "));
	assert_non_null(strstr(m.data, "diverge_scm_ratelimited_until_seconds{"
	    "provider=\"gitlab\"} "));
	buf_release(&m);
}

/* Write text to path (the test's kept-holds file). */
static void
put_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_true(fputs(text, f) >= 0);
	assert_int_equal(fclose(f), 0);
}

/* One GitHub call: 1 when it went out, 0 when held (rate limited). */
static int
sent(struct scm_client *c, int64_t *reset_ms)
{
	char *cause = NULL;
	size_t before = nrecs();
	int rc;

	push(200, "{}", NULL);
	rc = c->ops->update_comment(c, &gh_repo, 46, 6, "b", &cause);
	free(cause);
	if (rc == SCM_ERATELIMITED) {
		assert_int_equal(nrecs(), before);
		srv_reset();
		*reset_ms = scm_ratelimit_reset_ms();
		return 0;
	}
	assert_int_equal(rc, SCM_OK);
	assert_int_equal(nrecs(), before + 1);
	return 1;
}

/*
 * A restart of a GitHub client keeping its holds in dir, whose file path
 * says the token is held until until_ms for api (NULL: the file is not
 * JSON): whether a call then goes out (sent()).
 */
static int
restart_kept(const char *dir, const char *path, const char *api,
    int64_t until_ms, int64_t *reset)
{
	struct scm_client *c;
	char *text;
	int r;

	text = api != NULL ? xasprintf("{\"api\":\"%s\",\"holds\":[{"
	    "\"credential\":\"token\",\"untilMs\":%" PRId64 "}]}", api,
	    until_ms) : xstrdup("{\"api\": [1, 2");
	put_file(path, text);
	free(text);
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	scm_client_keep_holds(c, dir);
	r = sent(c, reset);
	scm_client_free(c);
	return r;
}

/* The rate limits met are kept in the state directory across restarts. */
static void
ratelimit_kept(void **state)
{
	char *dir = test_tmpdir("scm-holds"), *path, *other;
	struct scm_client *c, *gl;
	char *cause = NULL;
	int64_t at, reset = 0;
	json_t *doc;

	(void)state;
	path = xasprintf("%s/ratelimits-github.json", dir);
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	scm_client_keep_holds(c, dir);
	push(403, "{\"message\":\"You have exceeded a secondary rate limit. "
	    "Please wait a few minutes before you try again.\"}",
	    "Retry-After: 60", NULL);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 42, 5, "a",
	    &cause), SCM_ERATELIMITED);
	free(cause);
	cause = NULL;
	at = scm_ratelimit_reset_ms();
	/* the file names the credential and the end, never a secret */
	doc = json_load_file(path, 0, NULL);
	assert_non_null(doc);
	assert_string_equal(json_string_value(json_object_get(json_array_get(
	    json_object_get(doc, "holds"), 0), "credential")), "token");
	/* (the hold's end and the caller's are taken a moment apart) */
	assert_in_range(json_integer_value(json_object_get(json_array_get(
	    json_object_get(doc, "holds"), 0), "untilMs")), at - 50, at + 50);
	json_decref(doc);
	scm_client_free(c);

	/* a restart: the same token waits for the same end, sending nothing */
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	scm_client_keep_holds(c, dir);
	assert_int_equal(sent(c, &reset), 0);
	assert_in_range(reset, at - 50, at + 50);
	/* GitLab keeps its own file: its token is not held */
	gl = gitlab_client("/api/v4");
	scm_client_keep_holds(gl, dir);
	push(201, "{\"id\":7}", NULL);
	assert_int_equal(gl->ops->create_comment(gl, &gl_repo, 1, "x", NULL,
	    &cause), SCM_OK);
	scm_client_free(gl);
	scm_client_free(c);

	/* kept for another API URL, ended, or unreadable: not taken up */
	assert_int_equal(restart_kept(dir, path, "https://ghe.example.com/api/"
	    "v3", now_unix_ms() + 60000, &reset), 1);
	doc = json_load_file(path, 0, NULL);
	other = xstrdup(json_string_value(json_object_get(doc, "api")));
	json_decref(doc);
	assert_int_equal(restart_kept(dir, path, other, now_unix_ms() - 1000,
	    &reset), 1);
	assert_int_equal(restart_kept(dir, path, NULL, 0, &reset), 1);
	/* ... and the file is made whole again */
	doc = json_load_file(path, 0, NULL);
	assert_non_null(doc);
	assert_string_equal(json_string_value(json_object_get(doc, "api")),
	    other);
	json_decref(doc);

	/* a far end is cut to what a reply may ask (a day) */
	assert_int_equal(restart_kept(dir, path, other, now_unix_ms() +
	    (int64_t)400 * 86400 * 1000, &reset), 0);
	assert_in_range(reset - now_unix_ms(), 86000 * 1000LL,
	    86400 * 1000LL);
	free(other);
	free(path);
	free(dir);
}

static void
burst_5xx(void **state)
{
	struct scm_client *c;
	struct scm_pr pr;
	char *cause = NULL;
	int64_t id = 0, t0;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push(502, "bad gateway", NULL);
	push(500, "{\"message\":\"Server Error\"}", NULL);
	push_file(200, "github/pulls.get.json", NULL, NULL);
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1347, &pr, &cause),
	    SCM_OK);
	assert_int_equal(nrecs(), 3);
	scm_pr_release(&pr);

	/* creating a comment is not repeated after a 502 (it may exist) */
	srv_reset();
	push(502, "bad gateway", NULL);
	assert_int_equal(c->ops->create_comment(c, &gh_repo, 1, "x", &id,
	    &cause), SCM_EUNAVAILABLE);
	assert_int_equal(nrecs(), 1);
	assert_non_null(strstr(cause, "HTTP 502"));
	free(cause);
	cause = NULL;
	/* but after a 503 it is */
	srv_reset();
	push(503, "", NULL);
	push_file(201, "github/issues.create-comment.json", NULL, NULL);
	assert_int_equal(c->ops->create_comment(c, &gh_repo, 1, "x", &id,
	    &cause), SCM_OK);
	assert_int_equal(id, 1);
	assert_int_equal(nrecs(), 2);
	/* a 503's Retry-After is waited out, not the shorter backoff */
	srv_reset();
	push(503, "{\"message\":\"maintenance\"}", "Retry-After: 1", NULL);
	push_file(200, "github/pulls.get.json", NULL, NULL);
	t0 = now_mono_ms();
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1347, &pr, &cause),
	    SCM_OK);
	assert_true(now_mono_ms() - t0 >= 950);
	assert_int_equal(nrecs(), 2);
	scm_pr_release(&pr);
	scm_client_free(c);
}

/*
 * GitHub's redirects are followed on its host, the token with them (GitHub
 * asks clients to follow); GitLab's are not: libcurl drops Authorization
 * when a redirect leaves the host, but not GitLab's PRIVATE-TOKEN header.
 */
static void
redirects(void **state)
{
	struct scm_client *c;
	struct scm_pr pr;
	char *cause = NULL, *loc;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	loc = xasprintf("Location: %s/repositories/1296269/pulls/1347",
	    srv.base);
	push(307, "", loc, NULL);
	push_file(200, "github/pulls.get.json", NULL, NULL);
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1347, &pr, &cause),
	    SCM_OK);
	assert_int_equal(nrecs(), 2);
	assert_string_equal(srv.recs[1].path,
	    "/repositories/1296269/pulls/1347");
	assert_non_null(srv.recs[1].auth);
	scm_pr_release(&pr);
	scm_client_free(c);
	free(loc);

	srv_reset();
	c = gitlab_client("/api/v4");
	loc = xasprintf("Location: %s/elsewhere", srv.base);
	push(302, "", loc, NULL);
	push_file(200, "gitlab/get-current-user.json", NULL, NULL);
	assert_int_not_equal(c->ops->get_pr(c, &gl_repo, 7, &pr, &cause),
	    SCM_OK);
	assert_int_equal(nrecs(), 1);
	free(cause);
	scm_client_free(c);
	free(loc);
}

/*
 * The API's certificate is verified: against ca_file when set, else the
 * system's CAs. An https server whose CA is not trusted (the fake
 * kube-apiserver of tests/fakes, a test CA) is refused before any request
 * reaches it; given that CA, the same server is reached.
 */
static void
tls_verified(void **state)
{
	struct storeenv env;
	struct k8s_cluster kc;
	struct scm_client *c = NULL;
	struct config cfg;
	char *login = NULL, *cause = NULL;
	int64_t id;
	int pass;

	(void)state;
	memset(&env, 0, sizeof(env));
	if (storeenv_start_fake(&env, 100, &kc) < 0)
		skip();
	for (pass = 0; pass < 2; pass++) {
		config_defaults(&cfg);
		cfg.github.enabled = 1;
		free(cfg.github.api_url);
		cfg.github.api_url = xstrdup(env.fake_server);
		cfg.github.token = xstrdup("env:TEST_GH_TOKEN");
		if (pass == 1)
			cfg.github.ca_file = xstrdup(env.fake_ca);
		if (scm_github_new(&c, &cfg, &cause) != 0)
			fail_msg("scm_github_new: %s", cause);
		config_release(&cfg);
		json_decref(storeenv_fake(&env, "DELETE", "/_fake/requests",
		    NULL));
		/* the fake answers /user as a kube-apiserver does: not OK */
		assert_int_not_equal(c->ops->whoami(c, &login, &id, &cause),
		    SCM_OK);
		free(cause);
		cause = NULL;
		assert_int_equal(storeenv_fake_count(&env, "GET", "/user"),
		    pass == 0 ? 0 : 1);
		scm_client_free(c);
	}
	k8s_cluster_release(&kc);
	storeenv_close(&env);
}

static void
not_found(void **state)
{
	struct scm_client *c;
	struct scm_pr pr;
	char *cause = NULL;
	int64_t t0;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push(404, "{\"message\":\"Not Found\"}", NULL);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 1, 9, "x",
	    &cause), SCM_ENOTFOUND);
	assert_int_equal(nrecs(), 1);
	assert_non_null(strstr(cause, "HTTP 404"));
	free(cause);
	cause = NULL;
	srv_reset();
	push(404, "{\"message\":\"Not Found\"}", NULL);
	assert_int_equal(c->ops->delete_comment(c, &gh_repo, 1, 9, &cause),
	    SCM_ENOTFOUND);
	assert_string_equal(srv.recs[0].method, "DELETE");
	free(cause);
	cause = NULL;

	/* get_pr retries a 404 twice, after 1 s then 2 s */
	srv_reset();
	push(404, "{\"message\":\"Not Found\"}", NULL);
	push(404, "{\"message\":\"Not Found\"}", NULL);
	push(404, "{\"message\":\"Not Found\"}", NULL);
	t0 = now_mono_ms();
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1, &pr, &cause),
	    SCM_ENOTFOUND);
	assert_true(now_mono_ms() - t0 >= 2900);
	assert_int_equal(nrecs(), 3);
	free(cause);
	scm_client_free(c);
}

static void
errors_mapping(void **state)
{
	struct scm_client *c;
	char *login = NULL, *cause = NULL;
	int64_t id;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push(401, "{\"message\":\"Bad credentials\"}", NULL);
	assert_int_equal(c->ops->whoami(c, &login, &id, &cause),
	    SCM_EUNAUTHORIZED);
	assert_non_null(strstr(cause, "HTTP 401"));
	assert_non_null(strstr(cause, "Bad credentials"));
	free(cause);
	cause = NULL;
	push(403, "{\"message\":\"Resource not accessible by integration\"}",
	    "x-ratelimit-remaining: 4000", NULL);
	assert_int_equal(c->ops->react(c, &gh_repo, 1, 2, 0, "eyes", &cause),
	    SCM_EFORBIDDEN);
	free(cause);
	cause = NULL;
	push(422, "{\"message\":\"Validation Failed\"}", NULL);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 1, 2, "x",
	    &cause), SCM_EINVALID);
	free(cause);
	cause = NULL;
	scm_client_free(c);
	c = gitlab_client("/api/v4");
	push(401, "{\"message\":\"401 Unauthorized\"}", NULL);
	assert_int_equal(c->ops->whoami(c, &login, &id, &cause),
	    SCM_EUNAUTHORIZED);
	free(cause);
	scm_client_free(c);
}

static void
permissions(void **state)
{
	static const struct {
		const char *perm, *role;
		enum scm_permission want;
	} gh[] = {
		{ "admin", "admin", SCM_PERM_MAINTAIN },
		{ "write", "maintain", SCM_PERM_MAINTAIN },
		{ "write", "write", SCM_PERM_WRITE },
		{ "write", "custom-role", SCM_PERM_WRITE },
		{ "read", "triage", SCM_PERM_READ },
		{ "read", "read", SCM_PERM_READ },
		{ "none", "none", SCM_PERM_NONE },
	};
	/*
	 * expires_at: an expired membership that members/all still lists
	 * (until GitLab's daily worker removes it) gives nothing
	 */
	static const struct {
		int level;
		const char *expires;	/* JSON */
		enum scm_permission want;
	} gl[] = {
		{ 50, "null", SCM_PERM_MAINTAIN },
		{ 40, "null", SCM_PERM_MAINTAIN },
		{ 30, "null", SCM_PERM_WRITE }, { 20, "null", SCM_PERM_READ },
		{ 10, "null", SCM_PERM_READ }, { 5, "null", SCM_PERM_READ },
		{ 0, "null", SCM_PERM_NONE },
		{ 40, "\"2020-01-31\"", SCM_PERM_NONE },
		{ 40, "\"2012-10-22T14:13:35Z\"", SCM_PERM_NONE },
		{ 40, "\"soon\"", SCM_PERM_NONE },	/* fail closed */
		{ 40, "\"9999-12-31\"", SCM_PERM_MAINTAIN },
	};
	struct scm_client *c;
	enum scm_permission p;
	char *cause = NULL, *body;
	size_t i;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push_file(200, "github/repos.get-collaborator-permission-level.json",
	    NULL, NULL);
	assert_int_equal(c->ops->permission(c, &gh_repo, "octo cat", 0, &p,
	    &cause), SCM_OK);
	assert_int_equal(p, SCM_PERM_MAINTAIN);
	assert_string_equal(srv.recs[0].path,
	    "/repos/octocat/Hello-World/collaborators/octo%20cat/permission");
	for (i = 0; i < ARRAY_SIZE(gh); i++) {
		body = xasprintf("{\"permission\":\"%s\",\"role_name\":\"%s\"}",
		    gh[i].perm, gh[i].role);
		push(200, body, NULL);
		free(body);
		p = 99;
		assert_int_equal(c->ops->permission(c, &gh_repo, "u", 0, &p,
		    &cause), SCM_OK);
		assert_int_equal(p, gh[i].want);
	}
	push(404, "{\"message\":\"Not Found\"}", NULL);
	assert_int_equal(c->ops->permission(c, &gh_repo, "ghost", 0, &p,
	    &cause), SCM_OK);
	assert_int_equal(p, SCM_PERM_NONE);
	scm_client_free(c);

	srv_reset();
	c = gitlab_client("/api/v4");
	push_file(200, "gitlab/get-project-member-all.json", NULL, NULL);
	assert_int_equal(c->ops->permission(c, &gl_repo, "raymond_smith", 1,
	    &p, &cause), SCM_OK);
	assert_int_equal(p, SCM_PERM_WRITE);
	assert_string_equal(srv.recs[0].path,
	    "/api/v4/projects/5/members/all/1");
	for (i = 0; i < ARRAY_SIZE(gl); i++) {
		body = xasprintf("{\"id\":1,\"access_level\":%d,"
		    "\"state\":\"active\",\"expires_at\":%s}", gl[i].level,
		    gl[i].expires);
		push(200, body, NULL);
		free(body);
		p = 99;
		assert_int_equal(c->ops->permission(c, &gl_repo, "u", 1, &p,
		    &cause), SCM_OK);
		assert_int_equal(p, gl[i].want);
	}
	push(200, "{\"id\":1,\"access_level\":50,\"state\":\"blocked\"}",
	    NULL);
	assert_int_equal(c->ops->permission(c, &gl_repo, "u", 1, &p, &cause),
	    SCM_OK);
	assert_int_equal(p, SCM_PERM_NONE);
	/* a membership awaiting approval (user cap) gives nothing yet */
	push(200, "{\"id\":1,\"access_level\":40,\"state\":\"active\","
	    "\"membership_state\":\"awaiting\"}", NULL);
	p = 99;
	assert_int_equal(c->ops->permission(c, &gl_repo, "u", 1, &p, &cause),
	    SCM_OK);
	assert_int_equal(p, SCM_PERM_NONE);
	push(404, "{\"message\":\"404 Not found\"}", NULL);
	assert_int_equal(c->ops->permission(c, &gl_repo, "u", 1, &p, &cause),
	    SCM_OK);
	assert_int_equal(p, SCM_PERM_NONE);
	scm_client_free(c);
}

/* GitLab's GET /users/:id "bot" field; GitHub makes no such call. */
static void
bots(void **state)
{
	struct scm_client *c;
	char *cause = NULL;
	int bot;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	assert_null(c->ops->is_bot);	/* the webhook's user.type says */
	scm_client_free(c);

	c = gitlab_client("/api/v4");
	push(200, "{\"id\":7,\"username\":\"release-helper\","
	    "\"state\":\"active\",\"bot\":true}", NULL);
	bot = 0;
	assert_int_equal(c->ops->is_bot(c, "release-helper", 7, &bot,
	    &cause), SCM_OK);
	assert_int_equal(bot, 1);
	assert_string_equal(srv.recs[0].method, "GET");
	assert_string_equal(srv.recs[0].path, "/api/v4/users/7");
	assert_non_null(srv.recs[0].private_token);
	push(200, "{\"id\":1,\"username\":\"john_smith\",\"bot\":false}",
	    NULL);
	bot = 1;
	assert_int_equal(c->ops->is_bot(c, "john_smith", 1, &bot, &cause),
	    SCM_OK);
	assert_int_equal(bot, 0);
	/* the docs' example predates the field: cannot tell, an error */
	push_file(200, "gitlab/get-user.json", NULL, NULL);
	assert_int_equal(c->ops->is_bot(c, "john_smith", 1, &bot, &cause),
	    SCM_EINTERNAL);
	assert_non_null(strstr(cause, "bot"));
	free(cause);
	cause = NULL;
	push(404, "{\"message\":\"404 User Not Found\"}", NULL);
	assert_int_equal(c->ops->is_bot(c, "ghost", 99, &bot, &cause),
	    SCM_ENOTFOUND);
	free(cause);
	cause = NULL;
	srv_reset();
	assert_int_equal(c->ops->is_bot(c, "nobody", 0, &bot, &cause),
	    SCM_EINVALID);
	assert_int_equal(nrecs(), 0);
	free(cause);
	scm_client_free(c);
}

/* The payload of a JWT in an Authorization header, decoded. */
static json_t *
jwt_payload(const char *auth)
{
	const char *a = strchr(auth, '.'), *b;
	unsigned char *dec = NULL;
	size_t dlen;
	json_t *j;

	assert_non_null(a);
	b = strchr(a + 1, '.');
	assert_non_null(b);
	assert_int_equal(base64_decode(a + 1, (size_t)(b - a - 1), &dec,
	    &dlen), 0);
	j = json_loadb((char *)dec, dlen, 0, NULL);
	free(dec);
	assert_non_null(j);
	return j;
}

static char *
token_reply(int64_t expires)
{
	char when[32], *body, *tmpl, *p;

	time_rfc3339(expires, when);
	tmpl = test_read_file("tests/data/api/github/"
	    "apps.create-installation-access-token.json", NULL);
	/* the fixture's expiry, moved to the one wanted */
	p = strstr(tmpl, "2016-07-11T22:14:10Z");
	assert_non_null(p);
	memcpy(p, when, 20);
	body = tmpl;
	return body;
}

static void
app_tokens(void **state)
{
	struct scm_repo r7 = { "octocat/Hello-World", 0, 7 };
	struct scm_repo r8 = { "octocat/Hello-World", 0, 8 };
	struct scm_repo r0 = { "octocat/Hello-World", 0, 0 };
	struct scm_client *c;
	char *cause = NULL, *body, *login = NULL;
	int64_t id = -1, now = now_unix();
	json_t *j;

	(void)state;
	srv_reset();
	c = github_client(GH_APP_MODE, "");

	/* whoami: GET /app with the JWT */
	push_file(200, "github/apps.get-authenticated.json", NULL, NULL);
	assert_int_equal(c->ops->whoami(c, &login, &id, &cause), SCM_OK);
	assert_string_equal(login, "octoapp[bot]");
	assert_string_equal(srv.recs[0].path, "/app");
	j = jwt_payload(srv.recs[0].auth);
	assert_int_equal(json_integer_value(json_object_get(j, "iss")), 1);
	assert_int_equal(json_integer_value(json_object_get(j, "exp")) -
	    json_integer_value(json_object_get(j, "iat")), 600);
	assert_true(llabs((long long)json_integer_value(json_object_get(j,
	    "iat")) - (now - 30)) <= 2);
	json_decref(j);
	free(login);

	/* one POST for two calls while the token is fresh */
	srv_reset();
	body = token_reply(now + 3600);
	push(201, body, NULL);
	free(body);
	push_file(201, "github/reactions.create-for-issue-comment.json", NULL,
	    NULL);
	push_file(200, "github/reactions.create-for-issue-comment.json", NULL,
	    NULL);
	assert_int_equal(c->ops->react(c, &r7, 1, 11, 0, "eyes", &cause),
	    SCM_OK);
	assert_int_equal(c->ops->react(c, &r7, 1, 12, 1, "eyes", &cause),
	    SCM_OK);
	assert_int_equal(nrecs(), 3);
	assert_string_equal(srv.recs[0].method, "POST");
	assert_string_equal(srv.recs[0].path,
	    "/app/installations/7/access_tokens");
	assert_non_null(strstr(srv.recs[0].auth, "Bearer eyJhbGciOiJSUzI1NiIs"
	    "InR5cCI6IkpXVCJ9."));
	assert_string_equal(srv.recs[1].path,
	    "/repos/octocat/Hello-World/issues/comments/11/reactions");
	assert_string_equal(srv.recs[1].auth, "Bearer " INST_TOKEN);
	assert_null(srv.recs[0].content_type);
	assert_string_equal(srv.recs[1].body, "{\"content\":\"eyes\"}");
	assert_string_equal(srv.recs[1].content_type, "application/json");
	assert_string_equal(srv.recs[2].path,
	    "/repos/octocat/Hello-World/pulls/comments/12/reactions");
	assert_string_equal(srv.recs[2].auth, "Bearer " INST_TOKEN);

	/* a token within 5 minutes of its expiry is replaced */
	srv_reset();
	body = token_reply(now + 240);
	push(201, body, NULL);
	push(200, "{}", NULL);
	push(201, body, NULL);
	push(200, "{}", NULL);
	free(body);
	assert_int_equal(c->ops->update_comment(c, &r8, 1, 3, "a", &cause),
	    SCM_OK);
	assert_int_equal(c->ops->update_comment(c, &r8, 1, 3, "b", &cause),
	    SCM_OK);
	assert_int_equal(nrecs(), 4);
	assert_string_equal(srv.recs[0].path,
	    "/app/installations/8/access_tokens");
	assert_string_equal(srv.recs[2].path,
	    "/app/installations/8/access_tokens");

	/* a 401 with a cached token: minted again once */
	srv_reset();
	push(401, "{\"message\":\"Bad credentials\"}", NULL);
	body = token_reply(now + 3600);
	push(201, body, NULL);
	free(body);
	push(200, "{}", NULL);
	assert_int_equal(c->ops->update_comment(c, &r7, 1, 3, "c", &cause),
	    SCM_OK);
	assert_int_equal(nrecs(), 3);
	assert_string_equal(srv.recs[1].path,
	    "/app/installations/7/access_tokens");

	/* a 401 from a clock an hour behind ours: signed again on its time */
	srv_reset();
	{
		struct scm_repo r21 = { "octocat/Hello-World", 0, 21 };
		char date[80], hd[96];
		time_t t = (time_t)(now - 3600);
		struct tm tm;
		int64_t iat;

		gmtime_r(&t, &tm);
		strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT",
		    &tm);
		snprintf(hd, sizeof(hd), "Date: %s", date);
		push(401, "{\"message\":\"'Issued at' claim ('iat') must be "
		    "an Integer representing a time in the past\"}", hd,
		    NULL);
		body = token_reply(now + 3600);
		push(201, body, NULL);
		free(body);
		push(200, "{}", NULL);
		assert_int_equal(c->ops->update_comment(c, &r21, 1, 3, "s",
		    &cause), SCM_OK);
		assert_int_equal(nrecs(), 3);
		j = jwt_payload(srv.recs[1].auth);
		iat = json_integer_value(json_object_get(j, "iat"));
		assert_true(llabs((long long)(iat - (now - 3600 - 30))) <= 3);
		json_decref(j);
	}

	/* no installation id: looked up with the JWT */
	srv_reset();
	push_file(200, "github/apps.get-repo-installation.json", NULL, NULL);
	body = token_reply(now + 3600);
	push(201, body, NULL);
	free(body);
	push(200, "{}", NULL);
	assert_int_equal(c->ops->update_comment(c, &r0, 1, 3, "d", &cause),
	    SCM_OK);
	assert_int_equal(nrecs(), 3);
	assert_string_equal(srv.recs[0].path,
	    "/repos/octocat/Hello-World/installation");
	assert_string_equal(srv.recs[1].path,
	    "/app/installations/1/access_tokens");
	scm_client_free(c);
}

struct worker {
	struct scm_client *c;
	int ret;
};

static void *
worker_run(void *arg)
{
	static const struct scm_repo r11 = { "octocat/Hello-World", 0, 11 };
	struct worker *w = arg;
	char *cause = NULL;

	w->ret = w->c->ops->update_comment(w->c, &r11, 1, 3, "w", &cause);
	free(cause);
	return NULL;
}

static void
app_tokens_threads(void **state)
{
	struct worker w[4];
	pthread_t t[4];
	struct scm_client *c;
	char *body;
	size_t i, posts = 0;

	(void)state;
	srv_reset();
	c = github_client(GH_APP_MODE, "");
	body = token_reply(now_unix() + 3600);
	push(201, body, NULL);
	free(body);
	for (i = 0; i < ARRAY_SIZE(w); i++)
		push(200, "{}", NULL);
	for (i = 0; i < ARRAY_SIZE(w); i++) {
		w[i].c = c;
		w[i].ret = -100;
		assert_int_equal(pthread_create(&t[i], NULL, worker_run,
		    &w[i]), 0);
	}
	for (i = 0; i < ARRAY_SIZE(w); i++) {
		pthread_join(t[i], NULL);
		assert_int_equal(w[i].ret, SCM_OK);
	}
	assert_int_equal(nrecs(), 5);
	for (i = 0; i < 5; i++)
		if (strcmp(srv.recs[i].method, "POST") == 0)
			posts++;
	assert_int_equal(posts, 1);
	assert_string_equal(srv.recs[0].method, "POST");
	scm_client_free(c);
}

static void
read_file(void **state)
{
	static const char *odd[] = {
		"github/repos.get-content--response-if-content-is-a-directory"
		    ".json",
		"github/repos.get-content--response-if-content-is-a-symlink"
		    ".json",
		"github/repos.get-content--response-if-content-is-a-submodule"
		    ".json",
	};
	struct scm_client *c;
	char *cause = NULL, *data = NULL, *fx, *p, *q;
	size_t len = 0, i;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	/*
	 * The spec's example writes "\\n" (a backslash and an n) between
	 * the base64 lines; GitHub sends newlines ("\n" in JSON).
	 */
	fx = test_read_file("tests/data/api/github/repos.get-content.json",
	    NULL);
	for (p = q = fx; *p != '\0'; p++) {
		if (p[0] == '\\' && p[1] == '\\' && p[2] == 'n') {
			*q++ = '\\';
			p++;
			continue;
		}
		*q++ = *p;
	}
	*q = '\0';
	push(200, fx, NULL);
	free(fx);
	assert_int_equal(c->ops->read_file(c, &gh_repo, "feature/x",
	    "docs/READ ME.md", &data, &len, &cause), SCM_OK);
	assert_int_equal(len, 1001);
	assert_memory_equal(data, "# Yoga Bo", 9);
	assert_string_equal(srv.recs[0].path,
	    "/repos/octocat/Hello-World/contents/docs/READ%20ME.md");
	assert_string_equal(srv.recs[0].query, "ref=feature%2Fx");
	free(data);
	for (i = 0; i < ARRAY_SIZE(odd); i++) {
		push_file(200, odd[i], NULL, NULL);
		assert_int_equal(c->ops->read_file(c, &gh_repo, "main", "x",
		    &data, &len, &cause), SCM_EINVALID);
		free(cause);
		cause = NULL;
	}
	/* paths that could climb out of the contents endpoint */
	srv_reset();
	assert_int_equal(c->ops->read_file(c, &gh_repo, "main",
	    "docs/../../../user", &data, &len, &cause), SCM_EINVALID);
	free(cause);
	assert_int_equal(c->ops->read_file(c, &gh_repo, "main", "/etc/x",
	    &data, &len, &cause), SCM_EINVALID);
	free(cause);
	assert_int_equal(c->ops->read_file(c, &gh_repo, "main", "a//b",
	    &data, &len, &cause), SCM_EINVALID);
	free(cause);
	cause = NULL;
	assert_int_equal(nrecs(), 0);
	/* no ref: the default branch (the contents API without ?ref=) */
	push(404, "{\"message\":\"Not Found\"}", NULL);
	assert_int_equal(c->ops->read_file(c, &gh_repo, NULL, "nope.yaml",
	    &data, &len, &cause), SCM_ENOTFOUND);
	assert_int_equal(nrecs(), 1);
	assert_string_equal(srv.recs[0].query, "");
	free(cause);
	cause = NULL;
	scm_client_free(c);

	srv_reset();
	c = gitlab_client("/api/v4");
	push(200, "raw bytes\n", NULL);
	assert_int_equal(c->ops->read_file(c, &gl_repo, "main",
	    ".diverge/agent.yaml", &data, &len, &cause), SCM_OK);
	assert_int_equal(len, 10);
	assert_memory_equal(data, "raw bytes\n", 10);
	assert_string_equal(srv.recs[0].path, "/api/v4/projects/5/repository/"
	    "files/.diverge%2Fagent.yaml/raw");
	assert_string_equal(srv.recs[0].query, "ref=main");
	free(data);
	push(404, "{\"message\":\"404 File Not Found\"}", NULL);
	assert_int_equal(c->ops->read_file(c, &gl_repo, NULL, "nope",
	    &data, &len, &cause), SCM_ENOTFOUND);
	assert_string_equal(srv.recs[1].query, "");
	free(cause);
	scm_client_free(c);
}

static void
comments_gitlab(void **state)
{
	struct scm_client *c;
	char *cause = NULL;
	int64_t id = 0;

	(void)state;
	srv_reset();
	c = gitlab_client("/api/v4");
	push_file(201, "gitlab/create-mr-note.json", NULL, NULL);
	assert_int_equal(c->ops->create_comment(c, &gl_repo, 2, "hello \"x\"",
	    &id, &cause), SCM_OK);
	assert_int_equal(id, 301);
	assert_string_equal(srv.recs[0].method, "POST");
	assert_string_equal(srv.recs[0].path,
	    "/api/v4/projects/5/merge_requests/2/notes");
	assert_string_equal(srv.recs[0].body, "{\"body\":\"hello \\\"x\\\"\"}");
	push_file(200, "gitlab/update-mr-note.json", NULL, NULL);
	assert_int_equal(c->ops->update_comment(c, &gl_repo, 2, 301, "new",
	    &cause), SCM_OK);
	assert_string_equal(srv.recs[1].method, "PUT");
	assert_string_equal(srv.recs[1].path,
	    "/api/v4/projects/5/merge_requests/2/notes/301");
	push(204, NULL, NULL);
	assert_int_equal(c->ops->delete_comment(c, &gl_repo, 2, 301, &cause),
	    SCM_OK);
	assert_string_equal(srv.recs[2].method, "DELETE");
	push_file(201, "gitlab/award-emoji-on-note.json", NULL, NULL);
	assert_int_equal(c->ops->react(c, &gl_repo, 2, 301, 0, "eyes",
	    &cause), SCM_OK);
	assert_string_equal(srv.recs[3].path,
	    "/api/v4/projects/5/merge_requests/2/notes/301/award_emoji");
	assert_string_equal(srv.recs[3].body, "{\"name\":\"eyes\"}");
	/* a duplicate award: 404 (older GitLab) or 409 */
	push(404, "{\"message\":\"404 Award Emoji Not Found\"}", NULL);
	assert_int_equal(c->ops->react(c, &gl_repo, 2, 301, 0, "eyes",
	    &cause), SCM_OK);
	push(409, "{\"message\":\"has already been taken\"}", NULL);
	assert_int_equal(c->ops->react(c, &gl_repo, 2, 301, 0, "eyes",
	    &cause), SCM_OK);
	/* no project id */
	assert_int_equal(c->ops->create_comment(c, &gh_repo, 2, "x", &id,
	    &cause), SCM_EINVALID);
	free(cause);
	scm_client_free(c);
}

static void
config_errors(void **state)
{
	struct scm_client *c = (struct scm_client *)1;
	struct config cfg;
	char *cause = NULL;

	(void)state;
	config_defaults(&cfg);
	/* disabled providers give NULL */
	assert_int_equal(scm_github_new(&c, &cfg, &cause), 0);
	assert_null(c);
	assert_int_equal(scm_gitlab_new(&c, &cfg, &cause), 0);
	assert_null(c);
	cfg.github.enabled = 1;
	assert_int_equal(scm_github_new(&c, &cfg, &cause), -1);
	assert_non_null(strstr(cause, "github.token"));
	free(cause);
	cfg.github.token = xstrdup("env:TEST_GH_TOKEN");
	free(cfg.github.api_url);
	cfg.github.api_url = xstrdup("ftp://example.com");
	assert_int_equal(scm_github_new(&c, &cfg, &cause), -1);
	free(cause);
	free(cfg.github.token);
	cfg.github.token = xstrdup("env:TEST_UNSET_VARIABLE_X");
	free(cfg.github.api_url);
	cfg.github.api_url = xstrdup("https://ghe.example.com/api/v3");
	assert_int_equal(scm_github_new(&c, &cfg, &cause), -1);
	assert_non_null(strstr(cause, "github.token"));
	free(cause);
	/* a CA bundle must be readable at creation */
	free(cfg.github.token);
	cfg.github.token = xstrdup("env:TEST_GH_TOKEN");
	cfg.github.ca_file = xstrdup("/nonexistent/ca.pem");
	assert_int_equal(scm_github_new(&c, &cfg, &cause), -1);
	assert_non_null(strstr(cause, "ca_file"));
	free(cause);
	free(cfg.github.ca_file);
	cfg.github.ca_file = xasprintf("%s/tests/data/api/github/"
	    "jwt-test-vector.txt", getenv("top_srcdir") != NULL ?
	    getenv("top_srcdir") : ".");
	assert_int_equal(scm_github_new(&c, &cfg, &cause), 0);
	scm_client_free(c);
	/* GitLab needs its token */
	cfg.gitlab.enabled = 1;
	assert_int_equal(scm_gitlab_new(&c, &cfg, &cause), -1);
	assert_non_null(strstr(cause, "gitlab.token"));
	free(cause);
	config_release(&cfg);
	scm_client_free(NULL);
}

/* Run fn with stderr in a file; the file's text. */
static char *
capture_stderr(void (*fn)(char **causes, size_t *n), char **causes,
    size_t *n)
{
	char path[] = "/tmp/test_scm_client.XXXXXX";
	int fd, saved;
	char *text;
	FILE *f;
	struct buf b;
	char chunk[4096];
	size_t k;

	fd = mkstemp(path);
	assert_true(fd >= 0);
	fflush(stderr);
	saved = dup(2);
	dup2(fd, 2);
	fn(causes, n);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	close(fd);
	f = fopen(path, "r");
	buf_init(&b, 1 << 24);
	buf_add(&b, "", 0);
	while ((k = fread(chunk, 1, sizeof(chunk), f)) > 0)
		buf_add(&b, chunk, k);
	fclose(f);
	unlink(path);
	text = buf_detach(&b, NULL);
	return text;
}

static void
noisy_calls(char **causes, size_t *n)
{
	struct scm_repo r9 = { "octocat/Hello-World", 0, 9 };
	struct scm_client *c;
	char *login = NULL, *body;
	int64_t id;

	log_setup(LOG_DEBUG, 0);
	c = github_client(GH_TOKEN_MODE, "");	/* warns: http:// */
	push(429, "{\"message\":\"" GH_TOKEN "\"}", "Retry-After: 1", NULL);
	push(401, "{\"message\":\"Bad credentials\"}", NULL);
	(void)c->ops->whoami(c, &login, &id, &causes[(*n)++]);
	push(403, "{\"message\":\"nope\"}", NULL);
	(void)c->ops->update_comment(c, &gh_repo, 1, 2, "x",
	    &causes[(*n)++]);
	scm_client_free(c);
	c = github_client(GH_APP_MODE, "");
	/* an access_tokens error that echoes the token is never quoted */
	push(422, "{\"message\":\"" INST_TOKEN "\"}", NULL);
	(void)c->ops->react(c, &r9, 1, 2, 0, "eyes", &causes[(*n)++]);
	body = token_reply(now_unix() + 3600);
	push(201, body, NULL);
	free(body);
	push(500, "{\"message\":\"boom\"}", NULL);
	push(401, "{\"message\":\"Bad credentials\"}", NULL);
	push(401, "{\"message\":\"Bad credentials\"}", NULL);
	(void)c->ops->react(c, &r9, 1, 2, 0, "eyes", &causes[(*n)++]);
	scm_client_free(c);
	c = gitlab_client("/api/v4");
	push(503, "{\"message\":\"" GL_TOKEN "\"}", NULL);
	push(401, "{\"message\":\"401 Unauthorized\"}", NULL);
	(void)c->ops->whoami(c, &login, &id, &causes[(*n)++]);
	scm_client_free(c);
	log_setup(LOG_INFO, 0);
}

static void
no_secrets_in_logs(void **state)
{
	static const char *secrets[] = {
		GH_TOKEN, GL_TOKEN, INST_TOKEN, "eyJhbGciOiJSUzI1NiIs",
		"PRIVATE KEY", "MIIEpAIBAAKCAQEA1c7",
	};
	char *causes[16] = { NULL }, *log;
	size_t n = 0, i, k;

	(void)state;
	srv_reset();
	log = capture_stderr(noisy_calls, causes, &n);
	assert_non_null(strstr(log, "retrying request"));
	assert_non_null(strstr(log, "plain http"));
	for (k = 0; k < ARRAY_SIZE(secrets); k++) {
		if (strstr(log, secrets[k]) != NULL)
			fail_msg("secret %zu in the log: %s", k, log);
		for (i = 0; i < n; i++)
			if (causes[i] != NULL &&
			    strstr(causes[i], secrets[k]) != NULL)
				fail_msg("secret %zu in a cause: %s", k,
				    causes[i]);
	}
	for (i = 0; i < n; i++) {
		assert_non_null(causes[i]);
		free(causes[i]);
	}
	free(log);
}

/* ---- retry policy, error replies and the App's edges ---- */

/* The value of the metric sample that starts with prefix, 0 when none. */
static double
metric_value(const char *prefix)
{
	struct buf m;
	const char *p;
	double v = 0;

	buf_init(&m, 1 << 20);
	assert_int_equal(metrics_render(&m), 0);
	p = strstr(m.data, prefix);
	if (p != NULL)
		v = strtod(p + strlen(prefix), NULL);
	buf_release(&m);
	return v;
}

/* A token client of api_url whose calls may wait max_wait ms in all. */
static struct scm_client *
github_client_url(const char *api_url, const char *max_wait)
{
	struct scm_client *c;

	setenv(SCM_MAX_WAIT_ENV, max_wait, 1);
	c = github_client_at(api_url, 1, 0);
	setenv(SCM_MAX_WAIT_ENV, MAX_WAIT, 1);
	return c;
}

#define CREATE_ERRORS	"diverge_scm_requests_total{provider=\"github\"," \
	"op=\"create_comment\",code=\"error\"} "

/*
 * A connection closed without a reply after the request went out (a
 * proxy dropping it): creating a comment is not sent again (the server
 * may have acted on it: a second comment), a GET is. A request that never
 * went out (the connection refused) is sent again even when it creates a
 * comment: here with 300 ms to wait in all, the first backoff (125 to
 * 250 ms) fits and the second (250 to 500 ms more) does not, so two
 * attempts. Each client is new: its first request opens a connection
 * (libcurl itself resends on a kept one that died).
 */
static void
transport_errors(void **state)
{
	struct scm_client *c;
	struct scm_pr pr;
	struct sockaddr_in sin;
	socklen_t slen = sizeof(sin);
	char *cause = NULL, url[64];
	double before;
	int64_t id = 0;
	int fd;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push(DROP, NULL, NULL);
	push_file(201, "github/issues.create-comment.json", NULL, NULL);
	assert_int_equal(c->ops->create_comment(c, &gh_repo, 1, "x", &id,
	    &cause), SCM_EUNAVAILABLE);
	assert_int_equal(nrecs(), 1);
	assert_non_null(strstr(cause, "POST /repos/octocat/Hello-World/issues/"
	    "1/comments"));
	free(cause);
	cause = NULL;
	scm_client_free(c);

	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push(DROP, NULL, NULL);
	push_file(200, "github/pulls.get.json", NULL, NULL);
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1347, &pr, &cause),
	    SCM_OK);
	assert_int_equal(nrecs(), 2);
	scm_pr_release(&pr);
	scm_client_free(c);

	/* refused: a loopback port bound but not listening */
	srv_reset();
	fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &slen), 0);
	snprintf(url, sizeof(url), "http://127.0.0.1:%u",
	    (unsigned int)ntohs(sin.sin_port));
	c = github_client_url(url, "300");
	before = metric_value(CREATE_ERRORS);
	assert_int_equal(c->ops->create_comment(c, &gh_repo, 1, "x", &id,
	    &cause), SCM_EUNAVAILABLE);
	assert_true(metric_value(CREATE_ERRORS) - before == 2);
	free(cause);
	scm_client_free(c);
	close(fd);
}

/*
 * How often a call is sent: five attempts for a 5xx (here with
 * Retry-After: 0, so no wait), its status mapped to SCM_EUNAVAILABLE with
 * the API's message; a 501 (Not Implemented: it will not change) once;
 * eight for rate limits. And the waits of one call add up against the
 * bound (DIVERGE_SCM_MAX_WAIT_MS), not each on its own: with 1100 ms, a
 * backoff (125 to 250 ms) then a Retry-After of 1 s do not fit, while
 * either alone would.
 */
static void
retry_counts(void **state)
{
	struct scm_client *c;
	struct scm_pr pr;
	char *cause = NULL;
	int64_t t0;
	int i;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	for (i = 0; i < 6; i++)
		push(500, "{\"message\":\"Server Error\"}", "Retry-After: 0",
		    NULL);
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1, &pr, &cause),
	    SCM_EUNAVAILABLE);
	assert_int_equal(nrecs(), 5);
	assert_non_null(strstr(cause, "HTTP 500 (server error: 'Server "
	    "Error')"));
	free(cause);
	cause = NULL;

	srv_reset();
	push(501, "{\"message\":\"Not Implemented\"}", NULL);
	push_file(200, "github/pulls.get.json", NULL, NULL);
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1, &pr, &cause),
	    SCM_EUNAVAILABLE);
	assert_int_equal(nrecs(), 1);
	free(cause);
	cause = NULL;

	srv_reset();
	for (i = 0; i < 9; i++)
		push(429, "{\"message\":\"slow down\"}", "Retry-After: 0",
		    NULL);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 1, 5, "x",
	    &cause), SCM_ERATELIMITED);
	assert_int_equal(nrecs(), 8);
	free(cause);
	cause = NULL;
	scm_client_free(c);

	srv_reset();
	c = github_client_url(srv.base, "1100");
	push(503, "{\"message\":\"maintenance\"}", NULL);
	push(503, "{\"message\":\"maintenance\"}", "Retry-After: 1", NULL);
	push_file(200, "github/pulls.get.json", NULL, NULL);
	t0 = now_mono_ms();
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1347, &pr, &cause),
	    SCM_EUNAVAILABLE);
	assert_true(now_mono_ms() - t0 < 900);
	assert_int_equal(nrecs(), 2);
	free(cause);
	scm_client_free(c);
}

/*
 * The time of the attempts counts against the bound too, not only the
 * waits between them: a gateway that answers 502 after 1.5 s (GitHub's
 * and GitLab's do after 10 to 60 s) was asked five times, 9.4 s or more
 * with the backoffs, as long as those waits alone stayed within the 5 s
 * bound. Now a retry goes out only while the call's time so far and its
 * wait fit in the bound: three attempts, about 5.4 s.
 */
static void
retry_slow_replies(void **state)
{
	struct scm_client *c;
	struct scm_pr pr;
	char *cause = NULL;
	int64_t t0, took;
	int i;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	for (i = 0; i < 6; i++)
		push(502, "{\"message\":\"Server Error\"}", NULL);
	srv.delay_ms = 1500;
	t0 = now_mono_ms();
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1, &pr, &cause),
	    SCM_EUNAVAILABLE);
	took = now_mono_ms() - t0;
	assert_in_range(nrecs(), 2, 3);
	/* the bound, one attempt more, and room for a loaded machine */
	assert_true(took < 8500);
	free(cause);
	scm_client_free(c);
	srv_reset();
}

/* A call (rc) limited for a secondary limit's minute, after 1 request. */
static void
minute_limit(int rc, char **cause)
{
	assert_int_equal(rc, SCM_ERATELIMITED);
	assert_int_equal(nrecs(), 1);
	assert_in_range(scm_ratelimit_reset_ms() - now_unix_ms(), 58 * 1000,
	    60 * 1000);
	free(*cause);
	*cause = NULL;
}

/*
 * GitHub's order for a limited reply: Retry-After (seconds or an HTTP
 * date, a day at most), else x-ratelimit-reset when no budget is left
 * (and a second more: the reset is in whole seconds), else a minute for
 * a secondary limit (one that says so, or a 429 with budget left), else
 * a short backoff (a bare 429: a proxy's). A 403 that says none of this
 * is a refusal, as is any GitLab 403 (GitLab limits with 429). Each limit
 * on a new client: a limit holds the token.
 */
static void
ratelimit_waits(void **state)
{
	struct scm_client *c;
	struct scm_pr pr;
	char *cause = NULL, *reset, *login = NULL, date[80], hd[96];
	int64_t r, id;
	time_t t;
	struct tm tm;
	int i;

	(void)state;
	/* a secondary limit with budget left: a minute, not the reset */
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	reset = xasprintf("x-ratelimit-reset: %" PRId64, now_unix() + 3600);
	push(403, "{\"message\":\"You have exceeded a secondary rate limit. "
	    "Please wait a few minutes before you try again.\"}",
	    "x-ratelimit-remaining: 4990", reset, NULL);
	free(reset);
	minute_limit(c->ops->update_comment(c, &gh_repo, 1, 5, "x", &cause),
	    &cause);
	scm_client_free(c);

	/* the primary limit: not before the second after the reset (twice) */
	for (i = 0; i < 2; i++) {
		srv_reset();
		c = github_client(GH_TOKEN_MODE, "");
		r = now_unix() + 3600;
		reset = xasprintf("x-ratelimit-reset: %" PRId64, r);
		push(403, "{\"message\":\"API rate limit exceeded\"}",
		    "x-ratelimit-remaining: 0", reset, NULL);
		free(reset);
		assert_int_equal(c->ops->get_pr(c, &gh_repo, 1, &pr, &cause),
		    SCM_ERATELIMITED);
		assert_in_range(scm_ratelimit_reset_ms(), (r + 1) * 1000,
		    (r + 3) * 1000);
		free(cause);
		cause = NULL;
		scm_client_free(c);
	}

	/* Retry-After as an HTTP date, 100 s ahead */
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	t = (time_t)(now_unix() + 100);
	gmtime_r(&t, &tm);
	strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
	snprintf(hd, sizeof(hd), "Retry-After: %s", date);
	push(429, "{\"message\":\"slow down\"}", hd, NULL);
	push(200, "{}", NULL);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 1, 5, "x",
	    &cause), SCM_ERATELIMITED);
	assert_int_equal(nrecs(), 1);
	assert_in_range(scm_ratelimit_reset_ms() - now_unix_ms(), 98 * 1000,
	    101 * 1000);
	free(cause);
	cause = NULL;
	scm_client_free(c);

	/* a Retry-After of three years: a day */
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push(429, "{\"message\":\"slow down\"}", "Retry-After: 100000000",
	    NULL);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 1, 5, "x",
	    &cause), SCM_ERATELIMITED);
	assert_in_range(scm_ratelimit_reset_ms() - now_unix_ms(),
	    86400 * 1000LL - 2000, 86400 * 1000LL);
	free(cause);
	cause = NULL;
	scm_client_free(c);

	/* a 429 that says nothing: a short backoff, then sent again */
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push(429, "{}", NULL);
	push(200, "{\"login\":\"diverge-bot\",\"id\":42}", NULL);
	assert_int_equal(c->ops->whoami(c, &login, &id, &cause), SCM_OK);
	assert_int_equal(nrecs(), 2);
	free(login);
	login = NULL;

	/*
	 * A GitHub 429 with budget left and no Retry-After is a secondary
	 * limit whatever its message: a minute, as GitHub's docs say, not
	 * its x-ratelimit-reset, which is the primary window's, up to an
	 * hour away (waiting for it held the token an hour)
	 */
	scm_client_free(c);
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	reset = xasprintf("x-ratelimit-reset: %" PRId64, now_unix() + 3600);
	push(429, "{\"message\":\"slow down\"}", "x-ratelimit-remaining: 4990",
	    reset, NULL);
	free(reset);
	push(200, "{\"login\":\"diverge-bot\",\"id\":42}", NULL);
	minute_limit(c->ops->whoami(c, &login, &id, &cause), &cause);
	scm_client_free(c);

	/* a 403 without rate-limit headers: refused, once */
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push(403, "{\"message\":\"Must have admin rights to Repository.\"}",
	    NULL);
	push(200, "{}", NULL);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 1, 5, "x",
	    &cause), SCM_EFORBIDDEN);
	assert_int_equal(nrecs(), 1);
	assert_non_null(strstr(cause, "HTTP 403 (forbidden: 'Must have admin "
	    "rights to Repository.')"));
	free(cause);
	cause = NULL;
	scm_client_free(c);

	/* a GitLab 403 is a refusal, budget or not */
	srv_reset();
	c = gitlab_client("/api/v4");
	push(403, "{\"message\":\"403 Forbidden\"}", "RateLimit-Remaining: 0",
	    NULL);
	push_file(200, "gitlab/update-mr-note.json", NULL, NULL);
	assert_int_equal(c->ops->update_comment(c, &gl_repo, 2, 301, "x",
	    &cause), SCM_EFORBIDDEN);
	assert_int_equal(nrecs(), 1);
	free(cause);
	scm_client_free(c);
}

/*
 * A Retry-After of 0 holds the token until the very millisecond it was
 * met, not one more: the retry right after it goes out (ten times over,
 * each retry within that millisecond or not).
 */
static void
ratelimit_zero_wait(void **state)
{
	struct scm_client *c;
	char *cause = NULL;
	int i;

	(void)state;
	c = github_client(GH_TOKEN_MODE, "");
	for (i = 0; i < 10; i++) {
		srv_reset();
		push(429, "{\"message\":\"slow down\"}", "Retry-After: 0",
		    NULL);
		push(200, "{}", NULL);
		assert_int_equal(c->ops->update_comment(c, &gh_repo, 1, 5, "x",
		    &cause), SCM_OK);
		assert_int_equal(nrecs(), 2);
	}
	scm_client_free(c);
}

/*
 * Of two limits known for one credential, the later end stands: a file
 * of kept holds naming the token held for a minute, then for ten
 * seconds, holds it for the minute.
 */
static void
ratelimit_longest_kept(void **state)
{
	char *dir = test_tmpdir("scm-holds-two"), *path, *text;
	struct scm_client *c;
	int64_t now = now_unix_ms(), reset = 0;

	(void)state;
	path = xasprintf("%s/ratelimits-github.json", dir);
	text = xasprintf("{\"api\":\"%s\",\"holds\":[{\"credential\":"
	    "\"token\",\"untilMs\":%" PRId64 "},{\"credential\":\"token\","
	    "\"untilMs\":%" PRId64 "}]}", srv.base, now + 60000, now + 10000);
	put_file(path, text);
	free(text);
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	scm_client_keep_holds(c, dir);
	assert_int_equal(sent(c, &reset), 0);
	assert_int_equal(reset, now + 60000);
	scm_client_free(c);
	free(path);
	free(dir);
}

/*
 * What an error reply becomes: 410 Gone is not found; the API's message
 * is quoted printable, cut at 200 bytes, with our token redacted; the
 * reply of a token mint (a secret) is never quoted; the path is shown
 * without its query; a reply beyond its bound (8 MiB, a GitLab raw file
 * 4 MiB) is an error of its own, not retried.
 */
static void
error_replies(void **state)
{
	struct scm_repo r9 = { "octocat/Hello-World", 0, 9 };
	struct scm_client *c;
	char *cause = NULL, *body, *want, *data = NULL, *login = NULL;
	size_t len = 0;
	int64_t id;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push(410, "{\"message\":\"Issues are disabled for this repo\"}", NULL);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 1, 5, "x",
	    &cause), SCM_ENOTFOUND);
	assert_non_null(strstr(cause, "HTTP 410 (gone: 'Issues are disabled "
	    "for this repo')"));
	free(cause);
	cause = NULL;

	/* 300 bytes: the first 200 */
	body = xasprintf("{\"message\":\"%0300d\"}", 0);
	push(422, body, NULL);
	free(body);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 1, 5, "x",
	    &cause), SCM_EINVALID);
	want = xasprintf("(unprocessable: '%0200d')", 0);
	assert_non_null(strstr(cause, want));
	free(want);
	free(cause);
	cause = NULL;

	/* no line break or escape sequence goes into a log line */
	push(422, "{\"message\":\"bad\\nX-Forged: 1\\u001b[31m\"}", NULL);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 1, 5, "x",
	    &cause), SCM_EINVALID);
	assert_non_null(strstr(cause, "'bad?X-Forged: 1?[31m'"));
	assert_null(strchr(cause, '\n'));
	assert_null(strchr(cause, '\033'));
	free(cause);
	cause = NULL;

	/* the final reply quotes our token (a proxy echoing the header) */
	push(422, "{\"message\":\"token " GH_TOKEN " is not valid here\"}",
	    NULL);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 1, 5, "x",
	    &cause), SCM_EINVALID);
	assert_null(strstr(cause, GH_TOKEN));
	assert_non_null(strstr(cause, "is not valid here"));
	free(cause);
	cause = NULL;

	/* the path, not the query */
	push(404, "{\"message\":\"Not Found\"}", NULL);
	assert_int_equal(c->ops->read_file(c, &gh_repo, "topic", "a.yaml",
	    &data, &len, &cause), SCM_ENOTFOUND);
	assert_non_null(strstr(cause, "GET /repos/octocat/Hello-World/"
	    "contents/a.yaml: HTTP 404"));
	assert_null(strstr(cause, "ref="));
	free(cause);
	cause = NULL;

	/* one byte over 8 MiB */
	srv_reset();
	body = xmalloc(SCM_MAX_BODY + 2);
	memset(body, ' ', SCM_MAX_BODY + 1);
	body[0] = '{';
	body[SCM_MAX_BODY - 1] = '}';
	body[SCM_MAX_BODY + 1] = '\0';
	push(200, body, NULL);
	push(200, body, NULL);
	free(body);
	assert_int_equal(c->ops->whoami(c, &login, &id, &cause),
	    SCM_EINTERNAL);
	assert_non_null(strstr(cause, "larger than 8388608 bytes"));
	assert_int_equal(nrecs(), 1);
	free(cause);
	cause = NULL;
	srv_reset();
	scm_client_free(c);

	/* a GitLab raw file: 4 MiB at most */
	c = gitlab_client("/api/v4");
	body = xmalloc(SCM_MAX_FILE + 2);
	memset(body, 'a', SCM_MAX_FILE + 1);
	body[SCM_MAX_FILE + 1] = '\0';
	push(200, body, NULL);
	free(body);
	assert_int_equal(c->ops->read_file(c, &gl_repo, "main", "big", &data,
	    &len, &cause), SCM_EINTERNAL);
	assert_non_null(strstr(cause, "larger than 4194304 bytes"));
	assert_int_equal(nrecs(), 1);
	free(cause);
	cause = NULL;
	scm_client_free(c);

	/* an access_tokens reply is never quoted, even a harmless one */
	srv_reset();
	c = github_client(GH_APP_MODE, "");
	push(422, "{\"message\":\"There is no installation 9 here\"}", NULL);
	assert_int_equal(c->ops->react(c, &r9, 1, 2, 0, "eyes", &cause),
	    SCM_EINVALID);
	assert_non_null(strstr(cause, "HTTP 422"));
	assert_null(strstr(cause, "no installation 9"));
	free(cause);
	scm_client_free(c);
}

/* A GitHub client with both github.token and the App. */
static struct scm_client *
github_both_client(void)
{
	return github_client_at(srv.base, 1, 1);
}

/*
 * The App's edges: an App 401 is signed again only for a Date far from
 * our clock (not for one that agrees, nor one that cannot be read); a
 * revoked installation token is minted again once, not more; a mint
 * that meets a 502 is tried again (it is idempotent); a token that would
 * break the header line, or an installation lookup without an id, is an
 * error; a minted token of any shape is redacted after; the JWT's limits
 * are the App's, not the token's; a token is kept until five minutes
 * before its expiry, an hour when the reply says none.
 */
static void
app_edges(void **state)
{
	struct scm_repo r31 = { "octocat/Hello-World", 0, 31 };
	struct scm_repo r32 = { "octocat/Hello-World", 0, 32 };
	struct scm_repo r33 = { "octocat/Hello-World", 0, 33 };
	struct scm_repo r34 = { "octocat/Hello-World", 0, 34 };
	struct scm_repo r35 = { "octocat/Hello-World", 0, 35 };
	struct scm_repo r36 = { "octocat/Hello-World", 0, 36 };
	struct scm_repo r0 = { "octocat/Hello-World", 0, 0 };
	static const char odd[] = "v1.1f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c";
	struct scm_client *c;
	char *cause = NULL, *login = NULL, *body;
	int64_t id, now = now_unix();

	(void)state;
	srv_reset();
	c = github_client(GH_APP_MODE, "");
	/* the fake's Date is our clock's */
	push(401, "{\"message\":\"A JSON web token could not be decoded\"}",
	    NULL);
	push_file(200, "github/apps.get-authenticated.json", NULL, NULL);
	assert_int_equal(c->ops->whoami(c, &login, &id, &cause),
	    SCM_EUNAUTHORIZED);
	assert_int_equal(nrecs(), 1);
	free(cause);
	cause = NULL;
	srv_reset();
	push(401, "{\"message\":\"Bad credentials\"}", "Date: not a date",
	    NULL);
	push_file(200, "github/apps.get-authenticated.json", NULL, NULL);
	assert_int_equal(c->ops->whoami(c, &login, &id, &cause),
	    SCM_EUNAUTHORIZED);
	assert_int_equal(nrecs(), 1);
	free(cause);
	cause = NULL;

	/* minted, refused, minted again, refused: given up */
	srv_reset();
	body = token_reply(now + 3600);
	push(201, body, NULL);
	push(401, "{\"message\":\"Bad credentials\"}", NULL);
	push(201, body, NULL);
	push(401, "{\"message\":\"Bad credentials\"}", NULL);
	push(201, body, NULL);
	push(200, "{}", NULL);
	assert_int_equal(c->ops->update_comment(c, &r31, 1, 3, "a", &cause),
	    SCM_EUNAUTHORIZED);
	assert_int_equal(nrecs(), 4);
	free(cause);
	cause = NULL;

	/* a mint that meets a 502: minted on the second try */
	srv_reset();
	push(502, "bad gateway", NULL);
	push(201, body, NULL);
	push(200, "{}", NULL);
	free(body);
	assert_int_equal(c->ops->update_comment(c, &r36, 1, 3, "a", &cause),
	    SCM_OK);
	assert_int_equal(nrecs(), 3);
	assert_string_equal(srv.recs[1].path,
	    "/app/installations/36/access_tokens");
	assert_string_equal(srv.recs[2].auth, "Bearer " INST_TOKEN);

	/* a token with a line break: not sent as a header */
	srv_reset();
	push(201, "{\"token\":\"ghs_abc\\r\\nX-Forged: 1\",\"expires_at\":"
	    "\"2099-01-01T00:00:00Z\"}", NULL);
	push(200, "{}", NULL);
	assert_int_equal(c->ops->update_comment(c, &r32, 1, 3, "a", &cause),
	    SCM_EINTERNAL);
	assert_int_equal(nrecs(), 1);
	assert_non_null(strstr(cause, "no usable token"));
	free(cause);
	cause = NULL;

	/* the installation lookup answers no id */
	srv_reset();
	push(200, "{\"app_id\":1,\"account\":{\"login\":\"octocat\"}}", NULL);
	push(200, "{}", NULL);
	assert_int_equal(c->ops->update_comment(c, &r0, 1, 3, "a", &cause),
	    SCM_EINTERNAL);
	assert_int_equal(nrecs(), 1);
	assert_non_null(strstr(cause, "no id"));
	free(cause);
	cause = NULL;

	/* a token of no known shape, quoted back by an error: redacted */
	srv_reset();
	body = xasprintf("{\"token\":\"%s\",\"expires_at\":\"2099-01-01T00:00:"
	    "00Z\"}", odd);
	push(201, body, NULL);
	free(body);
	body = xasprintf("{\"message\":\"token %s lacks a permission\"}", odd);
	push(422, body, NULL);
	free(body);
	assert_int_equal(c->ops->update_comment(c, &r33, 1, 3, "a", &cause),
	    SCM_EINVALID);
	assert_int_equal(nrecs(), 2);
	assert_string_equal(srv.recs[1].auth + strlen("Bearer "), odd);
	assert_non_null(strstr(cause, "lacks a permission"));
	assert_null(strstr(cause, odd));
	free(cause);
	cause = NULL;

	/*
	 * 6 min 40 s left: used again; no expires_at: an hour, used again
	 * (4 min left: minted again, in app_tokens)
	 */
	srv_reset();
	body = token_reply(now + 400);
	push(201, body, NULL);
	free(body);
	push(200, "{}", NULL);
	push(201, "{\"token\":\"" INST_TOKEN "\"}", NULL);
	push(200, "{}", NULL);
	assert_int_equal(c->ops->update_comment(c, &r34, 1, 3, "a", &cause),
	    SCM_OK);
	assert_int_equal(c->ops->update_comment(c, &r34, 1, 3, "b", &cause),
	    SCM_OK);
	assert_int_equal(nrecs(), 3);
	assert_string_equal(srv.recs[2].method, "PATCH");
	srv_reset();
	push(201, "{\"token\":\"" INST_TOKEN "\"}", NULL);
	push(200, "{}", NULL);
	push(201, "{\"token\":\"" INST_TOKEN "\"}", NULL);
	push(200, "{}", NULL);
	assert_int_equal(c->ops->update_comment(c, &r35, 1, 3, "a", &cause),
	    SCM_OK);
	assert_int_equal(c->ops->update_comment(c, &r35, 1, 3, "b", &cause),
	    SCM_OK);
	assert_int_equal(nrecs(), 3);
	assert_string_equal(srv.recs[2].method, "PATCH");
	srv_reset();
	scm_client_free(c);

	/* the App's JWT met a limit: the token's calls go on */
	c = github_both_client();
	push(429, "{\"message\":\"API rate limit exceeded\"}", "Retry-After: 60",
	    NULL);
	assert_int_equal(c->ops->react(c, &r31, 1, 2, 0, "eyes", &cause),
	    SCM_ERATELIMITED);
	assert_string_equal(srv.recs[0].path,
	    "/app/installations/31/access_tokens");
	free(cause);
	cause = NULL;
	push(200, "{}", NULL);
	assert_int_equal(c->ops->update_comment(c, &gh_repo, 1, 3, "a",
	    &cause), SCM_OK);
	assert_int_equal(nrecs(), 2);
	assert_string_equal(srv.recs[1].auth, "Bearer " GH_TOKEN);
	scm_client_free(c);
}

/* A GitHub contents reply holding n bytes of 'a'. */
static char *
content_of(size_t n)
{
	unsigned char *raw = xmalloc(n);
	char *b64, *body;

	memset(raw, 'a', n);
	b64 = base64_encode(raw, n, 0, 1);
	body = xasprintf("{\"type\":\"file\",\"encoding\":\"base64\","
	    "\"content\":\"%s\"}", b64);
	free(b64);
	free(raw);
	return body;
}

/*
 * GitHub replies the client must not take as they come: the permission
 * of a login that names another account now (renamed, and taken) is
 * none; "." and ".." are no owner or name; a pull request without its
 * clone URL is an error, one whose head repository is gone (null) a
 * fork; the headers of a redirect are not the reply's (its Link is not
 * followed); a list stops after 200 pages; a file is 4 MiB at most; a
 * reaction (idempotent) is sent again after a 502.
 */
static void
github_guards(void **state)
{
	static const struct scm_repo bad[] = {
		{ "../Hello-World", 0, 0 }, { "./Hello-World", 0, 0 },
		{ "octocat/..", 0, 0 }, { "octocat/.", 0, 0 },
	};
	struct scm_client *c;
	struct scm_comment *v = NULL;
	struct scm_pr pr;
	enum scm_permission p;
	char *cause = NULL, *loc, *body, *data = NULL;
	size_t n = 0, i, len = 0;

	(void)state;
	srv_reset();
	c = github_client(GH_TOKEN_MODE, "");
	push(200, "{\"permission\":\"admin\",\"role_name\":\"admin\",\"user\":"
	    "{\"login\":\"u\",\"id\":99}}", NULL);
	p = 99;
	assert_int_equal(c->ops->permission(c, &gh_repo, "u", 5, &p, &cause),
	    SCM_OK);
	assert_int_equal(p, SCM_PERM_NONE);
	push(200, "{\"permission\":\"admin\",\"role_name\":\"admin\",\"user\":"
	    "{\"login\":\"u\",\"id\":99}}", NULL);
	assert_int_equal(c->ops->permission(c, &gh_repo, "u", 99, &p, &cause),
	    SCM_OK);
	assert_int_equal(p, SCM_PERM_MAINTAIN);

	/* (replies queued: a path let through gets one, and succeeds) */
	srv_reset();
	for (i = 0; i < ARRAY_SIZE(bad); i++)
		push_file(200, "github/pulls.get.json", NULL, NULL);
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		assert_int_equal(c->ops->get_pr(c, &bad[i], 1, &pr, &cause),
		    SCM_EINVALID);
		free(cause);
		cause = NULL;
	}
	assert_int_equal(nrecs(), 0);

	srv_reset();
	push(200, "{\"state\":\"open\",\"head\":{\"ref\":\"t\",\"sha\":\"abc\","
	    "\"repo\":{\"id\":1}},\"base\":{\"ref\":\"main\",\"repo\":"
	    "{\"id\":1}}}", NULL);
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1, &pr, &cause),
	    SCM_EINTERNAL);
	assert_non_null(strstr(cause, "clone_url"));
	free(cause);
	cause = NULL;
	push(200, "{\"state\":\"open\",\"head\":{\"ref\":\"t\",\"sha\":\"abc\","
	    "\"repo\":null},\"base\":{\"ref\":\"main\",\"repo\":{\"clone_url\":"
	    "\"https://github.com/o/r.git\"}}}", NULL);
	assert_int_equal(c->ops->get_pr(c, &gh_repo, 1, &pr, &cause), SCM_OK);
	assert_int_equal(pr.fork, 1);
	assert_null(pr.head_clone_url);
	scm_pr_release(&pr);

	/* a 307 with a Link, then the list's one page without */
	srv_reset();
	loc = xasprintf("Location: %s/repositories/1/issues/2/comments?"
	    "per_page=100", srv.base);
	push(307, "", loc, "Link: <{base}/repositories/1/issues/2/comments?"
	    "per_page=100&page=2>; rel=\"next\"", NULL);
	free(loc);
	push(200, "[{\"id\":1,\"body\":\"c\",\"user\":{\"login\":\"bot\","
	    "\"id\":7}}]", NULL);
	push(200, "[]", NULL);
	assert_int_equal(c->ops->list_comments(c, &gh_repo, 2, &v, &n,
	    &cause), SCM_OK);
	assert_int_equal(n, 1);
	assert_int_equal(nrecs(), 2);
	scm_comments_free(v, n);
	v = NULL;

	/* page after page, each naming the next: 200 read, then an error */
	srv_reset();
	srv.pager = 1;
	assert_int_equal(c->ops->list_comments(c, &gh_repo, 2, &v, &n,
	    &cause), SCM_EINTERNAL);
	assert_non_null(strstr(cause, "more than 200 pages"));
	assert_int_equal(nrecs(), 200);
	assert_string_equal(srv.recs[199].query, "per_page=100&page=200");
	assert_null(v);
	free(cause);
	cause = NULL;

	/* 4 MiB is a file; a byte more is refused */
	srv_reset();
	body = content_of(SCM_MAX_FILE);
	push(200, body, NULL);
	free(body);
	assert_int_equal(c->ops->read_file(c, &gh_repo, "main", "big", &data,
	    &len, &cause), SCM_OK);
	assert_int_equal(len, SCM_MAX_FILE);
	free(data);
	data = NULL;
	body = content_of(SCM_MAX_FILE + 1);
	push(200, body, NULL);
	free(body);
	assert_int_equal(c->ops->read_file(c, &gh_repo, "main", "big", &data,
	    &len, &cause), SCM_EINVALID);
	assert_non_null(strstr(cause, "larger than"));
	assert_null(data);
	free(cause);
	cause = NULL;

	/* a reaction is sent again after a 502 */
	srv_reset();
	push(502, "bad gateway", NULL);
	push_file(201, "github/reactions.create-for-issue-comment.json", NULL,
	    NULL);
	assert_int_equal(c->ops->react(c, &gh_repo, 1, 11, 0, "eyes", &cause),
	    SCM_OK);
	assert_int_equal(nrecs(), 2);
	scm_client_free(c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(jwt_vector),
		cmocka_unit_test(headers_github),
		cmocka_unit_test(headers_gitlab),
		cmocka_unit_test(get_pr_github),
		cmocka_unit_test(get_mr_gitlab),
		cmocka_unit_test(gitlab_shapes),
		cmocka_unit_test(pages_github),
		cmocka_unit_test(pages_gitlab),
		cmocka_unit_test(pages_gitlab_relist),
		cmocka_unit_test(pages_gitlab_stripped),
		cmocka_unit_test(pages_github_stripped),
		cmocka_unit_test(whoami_shared),
		cmocka_unit_test(retry_after_429),
		cmocka_unit_test(redirects),
		cmocka_unit_test(tls_verified),
		cmocka_unit_test(secondary_limit),
		cmocka_unit_test(ratelimit_beyond_bound),
		cmocka_unit_test(ratelimit_held),
		cmocka_unit_test(ratelimit_kept),
		cmocka_unit_test(burst_5xx),
		cmocka_unit_test(not_found),
		cmocka_unit_test(errors_mapping),
		cmocka_unit_test(permissions),
		cmocka_unit_test(bots),
		cmocka_unit_test(app_tokens),
		cmocka_unit_test(app_tokens_threads),
		cmocka_unit_test(read_file),
		cmocka_unit_test(comments_gitlab),
		cmocka_unit_test(get_comment),
		cmocka_unit_test(config_errors),
		cmocka_unit_test(no_secrets_in_logs),
		cmocka_unit_test(transport_errors),
		cmocka_unit_test(retry_counts),
		cmocka_unit_test(retry_slow_replies),
		cmocka_unit_test(ratelimit_waits),
		cmocka_unit_test(ratelimit_zero_wait),
		cmocka_unit_test(ratelimit_longest_kept),
		cmocka_unit_test(error_replies),
		cmocka_unit_test(app_edges),
		cmocka_unit_test(github_guards),
	};

	util_json_init();
	if (getenv("TEST_FILTER") != NULL)
		cmocka_set_test_filter(getenv("TEST_FILTER"));
	return cmocka_run_group_tests_name("scm_client", tests, srv_start,
	    srv_stop);
}
