/*
 * The GitHub REST client (api.github.com or GitHub Enterprise Server at
 * https://HOST/api/v3). Authentication is by a GitHub App (an RS256 JWT
 * minted with OpenSSL, exchanged per installation for an installation
 * token cached until five minutes before it expires) or by a token
 * (github.token), both sent as "Authorization: Bearer". With both, the
 * App is used for repositories with an installation id and the token for
 * the others; an App without a token looks the installation up.
 */
#include "config.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "config/config.h"
#include "scm/client.h"
#include "scm/scm.h"
#include "util/util.h"

#define JWT_BACKDATE_S		30	/* iat = now - 30 (octokit) */
#define JWT_LIFETIME_S		600	/* exp = iat + 600 */
#define TOKEN_MARGIN_S		300	/* refresh 5 minutes before expiry */
#define MAX_TOKENS		1024	/* installations cached */

/* A cached installation token. */
struct inst_token {
	struct inst_token *next;
	int64_t installation;
	char *token;
	int64_t expires;	/* unix seconds */
};

struct github {
	struct scm_client c;	/* first: the ops */
	struct scm_http *http;
	/*
	 * token and key are replaced on SIGHUP, under cred: read them only
	 * under it. Whether each is there never changes: has_token and
	 * has_key say so, set before the client is shared and read without
	 * the lock.
	 */
	pthread_rwlock_t cred;
	char *token;		/* github.token, or NULL */
	char *app_id;		/* NULL: no App */
	EVP_PKEY *key;		/* the App's private key */
	int has_token;		/* token != NULL, for ever */
	int has_key;		/* key != NULL, for ever */
	char *slug;		/* configured slug, or NULL */

	pthread_mutex_t skew_lock;
	int64_t skew;		/* GitHub's clock minus ours, seconds */

	pthread_mutex_t lock;	/* the token cache */
	struct inst_token *tokens;
	size_t ntokens;
};

static const struct scm_ops github_ops;

static struct github *
gh_of(struct scm_client *c)
{
	return (struct github *)c;
}

/* ---- the App JWT ---- */

static EVP_PKEY *
load_key(const char *pem, size_t len)
{
	BIO *bio;
	EVP_PKEY *k;

	if (len > INT32_MAX)
		return NULL;
	bio = BIO_new_mem_buf(pem, (int)len);
	if (bio == NULL)
		return NULL;
	k = PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL);
	BIO_free(bio);
	if (k != NULL && EVP_PKEY_base_id(k) != EVP_PKEY_RSA) {
		EVP_PKEY_free(k);
		k = NULL;
	}
	return k;
}

/* Whether s is a non-empty run of digits. */
static int
all_digits(const char *s)
{
	if (*s == '\0')
		return 0;
	for (; *s != '\0'; s++)
		if (*s < '0' || *s > '9')
			return 0;
	return 1;
}

static int
jwt_sign(EVP_PKEY *key, const char *iss, int64_t now, char **out,
    char **cause)
{
	static const char header[] = "{\"alg\":\"RS256\",\"typ\":\"JWT\"}";
	EVP_MD_CTX *md = NULL;
	unsigned char *sig = NULL;
	char *h64 = NULL, *p64 = NULL, *s64 = NULL, *payload = NULL;
	char *input = NULL, *issj = NULL;
	json_t *js = NULL;
	size_t siglen = 0;
	int64_t iat = now - JWT_BACKDATE_S;
	int ret = -1;

	/* key order and spacing as octokit's, so its test vector holds */
	if (all_digits(iss))
		issj = xstrdup(iss);
	else {
		js = json_string(iss);
		issj = js != NULL ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
		if (issj == NULL) {
			*cause = xstrdup("github: 'github.app.id' is not "
			    "valid UTF-8");
			goto out;
		}
	}
	payload = xasprintf("{\"iat\":%" PRId64 ",\"exp\":%" PRId64
	    ",\"iss\":%s}", iat, iat + JWT_LIFETIME_S, issj);
	h64 = base64_encode((const unsigned char *)header,
	    sizeof(header) - 1, 1, 0);
	p64 = base64_encode((const unsigned char *)payload, strlen(payload),
	    1, 0);
	input = xasprintf("%s.%s", h64, p64);
	md = EVP_MD_CTX_new();
	if (md == NULL || EVP_DigestSignInit(md, NULL, EVP_sha256(), NULL,
	    key) != 1 || EVP_DigestSign(md, NULL, &siglen,
	    (const unsigned char *)input, strlen(input)) != 1) {
		*cause = xstrdup("github: cannot sign the app JWT");
		goto out;
	}
	sig = xmalloc(siglen);
	if (EVP_DigestSign(md, sig, &siglen, (const unsigned char *)input,
	    strlen(input)) != 1) {
		*cause = xstrdup("github: cannot sign the app JWT");
		goto out;
	}
	s64 = base64_encode(sig, siglen, 1, 0);
	*out = xasprintf("%s.%s", input, s64);
	ret = 0;
out:
	EVP_MD_CTX_free(md);
	free(sig);
	free(h64);
	free(p64);
	free(s64);
	free(payload);
	free(input);
	free(issj);
	json_decref(js);
	return ret;
}

/* Sign an App JWT with a PEM key (see client.h). */
int
scm_github_jwt(const char *pem, size_t pem_len, const char *iss,
    int64_t now, char **out, char **cause)
{
	EVP_PKEY *key = load_key(pem, pem_len);
	int ret;

	if (key == NULL) {
		*cause = xstrdup("github: the app private key is not an RSA "
		    "PEM key");
		return -1;
	}
	ret = jwt_sign(key, iss, now, out, cause);
	EVP_PKEY_free(key);
	return ret;
}

/*
 * Run rq with a fresh App JWT. A 401 whose Date header is further from
 * our clock than the JWT's backdating means that our clock is off (GitHub
 * then refuses iat or exp): sign again on GitHub's time, once, and keep
 * the difference for the next JWTs (octokit does the same).
 */
static int
jwt_call(struct github *g, struct scm_req *rq, struct scm_resp *rp,
    char **cause)
{
	char *jwt = NULL, *auth = NULL, skew_s[32];
	int64_t skew, now;
	int ret, again = 0;

	for (;;) {
		pthread_mutex_lock(&g->skew_lock);
		skew = g->skew;
		pthread_mutex_unlock(&g->skew_lock);
		now = now_unix() + skew;
		pthread_rwlock_rdlock(&g->cred);
		ret = jwt_sign(g->key, g->app_id, now, &jwt, cause);
		pthread_rwlock_unlock(&g->cred);
		if (ret < 0)
			return SCM_EINTERNAL;
		auth = xasprintf("Authorization: Bearer %s", jwt);
		scm_secret_free(jwt);
		jwt = NULL;
		rq->auth = auth;
		rq->cred = "app";	/* the App's own limits */
		ret = scm_http_call(g->http, rq, rp, cause);
		rq->auth = NULL;
		scm_secret_free(auth);
		auth = NULL;
		if (ret != SCM_EUNAUTHORIZED || again || rp->date <= 0 ||
		    llabs((long long)(rp->date - now)) <= JWT_BACKDATE_S)
			return ret;
		again = 1;
		skew = rp->date - now_unix();
		pthread_mutex_lock(&g->skew_lock);
		g->skew = skew;
		pthread_mutex_unlock(&g->skew_lock);
		snprintf(skew_s, sizeof(skew_s), "%" PRId64, skew);
		log_kv(LOG_WARN, "github: the clock differs from github's: "
		    "signing the app JWT on its time", "skew_s", skew_s, NULL);
		free(*cause);
		*cause = NULL;
	}
}

/* ---- installation tokens ---- */

static void
tokens_free(struct inst_token *t)
{
	struct inst_token *next;

	for (; t != NULL; t = next) {
		next = t->next;
		scm_secret_free(t->token);
		free(t);
	}
}

/* Drop the cached token of an installation (lock held). */
static void
token_forget_locked(struct github *g, int64_t installation)
{
	struct inst_token **pp, *t;

	for (pp = &g->tokens; (t = *pp) != NULL; pp = &t->next) {
		if (t->installation != installation)
			continue;
		*pp = t->next;
		t->next = NULL;
		tokens_free(t);
		g->ntokens--;
		return;
	}
}

/*
 * POST /app/installations/{id}/access_tokens: the reply holds the token,
 * so it is never quoted and its buffer is wiped.
 */
static int
token_mint(struct github *g, int64_t installation, char **tok,
    int64_t *expires, char **cause)
{
	struct scm_req rq = { 0 };
	struct scm_resp rp;
	char *url = NULL;
	const char *t, *exp;
	json_t *j = NULL;
	int ret;

	scm_resp_init(&rp);
	url = xasprintf("/app/installations/%" PRId64 "/access_tokens",
	    installation);
	rq.op = "access_token";
	rq.method = "POST";
	rq.url = url;
	rq.idempotent = 1;
	rq.secret_reply = 1;
	ret = jwt_call(g, &rq, &rp, cause);
	if (ret != SCM_OK)
		goto out;
	ret = scm_json_reply(&rp, 1, "github: installation token", &j,
	    cause);
	if (ret != SCM_OK)
		goto out;
	t = json_string_value(json_object_get(j, "token"));
	exp = json_string_value(json_object_get(j, "expires_at"));
	if (t == NULL || *t == '\0' || strpbrk(t, "\r\n") != NULL) {
		*cause = xstrdup("github: installation token: the reply has "
		    "no usable token");
		ret = SCM_EINTERNAL;
		goto out;
	}
	/* minted every hour: older ones are kept too (util/redact.c) */
	redact_secret_add(t, strlen(t));
	*tok = xstrdup(t);
	*expires = scm_parse_time(exp);
	if (*expires < 0)	/* GitHub says one hour */
		*expires = now_unix() + 3600;
	ret = SCM_OK;
out:
	if (j != NULL) {
		/* wipe the token inside jansson's copy too */
		t = json_string_value(json_object_get(j, "token"));
		if (t != NULL)
			secure_wipe((char *)(uintptr_t)t, strlen(t));
		json_decref(j);
	}
	if (rp.body.data != NULL)
		secure_wipe(rp.body.data, rp.body.len);
	scm_resp_release(&rp);
	free(url);
	return ret;
}

/* The Authorization line for an installation, minting when needed. */
static int
token_header(struct github *g, int64_t installation, char **hdr,
    char **cause)
{
	struct inst_token *t;
	char *tok = NULL;
	int64_t expires = 0;
	int ret = SCM_OK;

	/*
	 * The lock is held while minting so that concurrent workers do not
	 * all mint a token for the same installation.
	 */
	pthread_mutex_lock(&g->lock);
	for (t = g->tokens; t != NULL; t = t->next)
		if (t->installation == installation)
			break;
	if (t != NULL && now_unix() < t->expires - TOKEN_MARGIN_S) {
		*hdr = xasprintf("Authorization: Bearer %s", t->token);
		goto out;
	}
	if (t != NULL)
		token_forget_locked(g, installation);
	ret = token_mint(g, installation, &tok, &expires, cause);
	if (ret != SCM_OK)
		goto out;
	if (g->ntokens >= MAX_TOKENS) {
		tokens_free(g->tokens);
		g->tokens = NULL;
		g->ntokens = 0;
	}
	t = xcalloc(1, sizeof(*t));
	t->installation = installation;
	t->token = tok;
	tok = NULL;	/* now the cache's */
	t->expires = expires;
	t->next = g->tokens;
	g->tokens = t;
	g->ntokens++;
	*hdr = xasprintf("Authorization: Bearer %s", t->token);
out:
	pthread_mutex_unlock(&g->lock);
	scm_secret_free(tok);
	return ret;
}

static void
token_forget(struct github *g, int64_t installation)
{
	pthread_mutex_lock(&g->lock);
	token_forget_locked(g, installation);
	pthread_mutex_unlock(&g->lock);
}

/* ---- calls ---- */

/* "/repos/OWNER/NAME" for a full name, refusing odd ones. */
static int
repo_path(const struct scm_repo *repo, char **out, char **cause)
{
	const char *fn = repo != NULL ? repo->full_name : NULL;
	const char *slash;
	char *owner = NULL, *name = NULL, *eo, *en;

	slash = fn != NULL ? strchr(fn, '/') : NULL;
	if (slash == NULL || slash == fn || slash[1] == '\0' ||
	    strchr(slash + 1, '/') != NULL) {
		*cause = xstrdup("github: the repository is not 'owner/name'");
		return SCM_EINVALID;
	}
	owner = xstrndup(fn, (size_t)(slash - fn));
	name = xstrdup(slash + 1);
	if (strcmp(owner, ".") == 0 || strcmp(owner, "..") == 0 ||
	    strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
		free(owner);
		free(name);
		*cause = xstrdup("github: the repository is not 'owner/name'");
		return SCM_EINVALID;
	}
	eo = scm_escape(owner);
	en = scm_escape(name);
	*out = xasprintf("/repos/%s/%s", eo, en);
	free(eo);
	free(en);
	free(owner);
	free(name);
	return SCM_OK;
}

/* GET /repos/{o}/{r}/installation with the JWT: the installation id. */
static int
find_installation(struct github *g, const char *rpath, int64_t *out,
    char **cause)
{
	struct scm_req rq = { 0 };
	struct scm_resp rp;
	char *url = NULL;
	json_t *j = NULL;
	int ret;

	scm_resp_init(&rp);
	url = xasprintf("%s/installation", rpath);
	rq.op = "installation";
	rq.method = "GET";
	rq.url = url;
	rq.idempotent = 1;
	ret = jwt_call(g, &rq, &rp, cause);
	if (ret != SCM_OK)
		goto out;
	ret = scm_json_reply(&rp, 1, "github: installation", &j, cause);
	if (ret != SCM_OK)
		goto out;
	*out = scm_json_int(j, "id");
	if (*out <= 0) {
		*cause = xstrdup("github: installation: the reply has no id");
		ret = SCM_EINTERNAL;
	}
out:
	json_decref(j);
	scm_resp_release(&rp);
	free(url);
	return ret;
}

/*
 * Run rq for repo with the right credential: an installation token
 * (re-minted once on a 401: it may have been revoked) or the token.
 */
static int
gh_call(struct github *g, const struct scm_repo *repo, const char *rpath,
    struct scm_req *rq, struct scm_resp *rp, char **cause)
{
	char *auth = NULL, cred[48];
	int64_t inst = repo != NULL ? repo->installation_id : 0;
	int ret, again = 0;

	if (g->has_key && inst == 0 && !g->has_token &&
	    rpath != NULL) {
		ret = find_installation(g, rpath, &inst, cause);
		if (ret != SCM_OK)
			return ret;
	}
	for (;;) {
		/* GitHub limits each installation apart from the token */
		snprintf(cred, sizeof(cred), "installation:%" PRId64, inst);
		if (g->has_key && inst > 0)
			ret = token_header(g, inst, &auth, cause);
		else if (g->has_token) {
			snprintf(cred, sizeof(cred), "token");
			pthread_rwlock_rdlock(&g->cred);
			auth = xasprintf("Authorization: Bearer %s", g->token);
			pthread_rwlock_unlock(&g->cred);
			ret = SCM_OK;
		} else {
			*cause = xstrdup("github: no credential for this "
			    "call (no installation id and no github.token)");
			ret = SCM_EUNAUTHORIZED;
		}
		if (ret != SCM_OK)
			break;
		rq->auth = auth;
		rq->cred = cred;
		ret = scm_http_call(g->http, rq, rp, cause);
		rq->auth = NULL;
		rq->cred = NULL;
		scm_secret_free(auth);
		auth = NULL;
		if (ret != SCM_EUNAUTHORIZED || !g->has_key || inst <= 0 ||
		    again)
			break;
		/* a revoked or early-expired token: mint a new one once */
		again = 1;
		token_forget(g, inst);
		free(*cause);
		*cause = NULL;
	}
	return ret;
}

/* A JSON body {"key": value}; SCM_EINVALID when value is not UTF-8. */
static int
body1(const char *key, const char *value, char **out, char **cause)
{
	json_t *j = json_pack("{s:s}", key, value != NULL ? value : "");

	*out = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (*out == NULL) {
		*cause = xasprintf("github: the %s is not valid UTF-8", key);
		return SCM_EINVALID;
	}
	return SCM_OK;
}

/* ---- ops ---- */

static int
gh_get_pr(struct scm_client *c, const struct scm_repo *repo, int64_t number,
    struct scm_pr *out, char **cause)
{
	struct github *g = gh_of(c);
	struct scm_req rq = { 0 };
	struct scm_resp rp;
	struct scm_pr pr;
	char *rpath = NULL, *url = NULL;
	json_t *j = NULL, *head, *base, *hrepo, *brepo;
	int ret;

	memset(&pr, 0, sizeof(pr));
	scm_resp_init(&rp);
	ret = repo_path(repo, &rpath, cause);
	if (ret != SCM_OK)
		goto out;
	url = xasprintf("%s/pulls/%" PRId64, rpath, number);
	rq.op = "get_pr";
	rq.method = "GET";
	rq.url = url;
	rq.idempotent = 1;
	rq.retry_404 = 2;	/* a PR just commented on exists: lag */
	ret = gh_call(g, repo, rpath, &rq, &rp, cause);
	if (ret != SCM_OK)
		goto out;
	ret = scm_json_reply(&rp, 1, "github: get pull request", &j, cause);
	if (ret != SCM_OK)
		goto out;
	head = json_object_get(j, "head");
	base = json_object_get(j, "base");
	hrepo = json_object_get(head, "repo");
	brepo = json_object_get(base, "repo");
	pr.state = scm_json_strdup(j, "state");
	pr.merged = json_is_true(json_object_get(j, "merged"));
	pr.head_ref = scm_json_strdup(head, "ref");
	pr.base_ref = scm_json_strdup(base, "ref");
	pr.head_sha = scm_json_strdup(head, "sha");
	pr.clone_url = scm_json_strdup(brepo, "clone_url");
	/* head.repo is null when the fork was deleted */
	pr.head_clone_url = scm_json_strdup(hrepo, "clone_url");
	pr.fork = !json_is_object(hrepo) ||
	    scm_json_int(hrepo, "id") != scm_json_int(brepo, "id");
	pr.author = scm_json_strdup(json_object_get(j, "user"), "login");
	pr.html_url = scm_json_strdup(j, "html_url");
	if (pr.state == NULL || pr.head_ref == NULL || pr.base_ref == NULL ||
	    pr.head_sha == NULL || pr.clone_url == NULL) {
		*cause = xstrdup("github: get pull request: the reply lacks "
		    "state, head, base or clone_url");
		ret = SCM_EINTERNAL;
		goto out;
	}
	*out = pr;
	memset(&pr, 0, sizeof(pr));	/* now the caller's */
out:
	scm_pr_release(&pr);
	json_decref(j);
	scm_resp_release(&rp);
	free(rpath);
	free(url);
	return ret;
}

/* An issue comment as the API shows it (a list's item, or one comment). */
static void
comment_from(const json_t *e, struct scm_comment *cm)
{
	scm_comment_from(e, "user", "login", cm);
}

static int
gh_list_comments(struct scm_client *c, const struct scm_repo *repo,
    int64_t number, struct scm_comment **out, size_t *n, char **cause)
{
	struct github *g = gh_of(c);
	struct scm_req rq = { 0 };
	struct scm_resp rp;
	struct scm_comment *v = NULL;
	size_t nv = 0, cap = 0, i, pages = 0, got;
	int64_t page = 1, next;
	char *rpath = NULL, *url = NULL, **seen = NULL;
	size_t nseen = 0;
	json_t *j = NULL, *e;
	int ret;

	scm_resp_init(&rp);
	ret = repo_path(repo, &rpath, cause);
	if (ret != SCM_OK)
		goto out;
	url = xasprintf("%s/issues/%" PRId64 "/comments?per_page=%d", rpath,
	    number, SCM_PER_PAGE);
	rq.op = "list_comments";
	rq.method = "GET";
	rq.idempotent = 1;
	while (url != NULL) {
		if (++pages > SCM_MAX_PAGES) {
			*cause = xasprintf("github: list comments: more than "
			    "%d pages", SCM_MAX_PAGES);
			ret = SCM_EINTERNAL;
			goto out;
		}
		rq.url = url;
		ret = gh_call(g, repo, rpath, &rq, &rp, cause);
		if (ret != SCM_OK)
			goto out;
		ret = scm_json_page(&rp, "github: list comments", &j, cause);
		if (ret != SCM_OK)
			goto out;
		got = json_array_size(j);
		json_array_foreach(j, i, e) {
			if (!json_is_object(e))
				continue;
			if (nv == cap) {
				cap = cap ? cap * 2 : 32;
				v = xrealloc(v, cap * sizeof(*v));
			}
			comment_from(e, &v[nv++]);
		}
		json_decref(j);
		j = NULL;
		seen = xrealloc(seen, (nseen + 1) * sizeof(*seen));
		seen[nseen++] = url;
		url = NULL;	/* now in seen */
		if (scm_next_page_stale(&rp, page, seen, nseen,
		    "github: list comments")) {
			*cause = xstrdup("github: list comments: the Link "
			    "rel=\"next\" goes back to a page read already");
			ret = SCM_EINTERNAL;
			goto out;
		}
		next = scm_next_page(&rp, page, got);
		if (rp.link_next != NULL) {
			/* as written: client.c keeps it on our host */
			url = rp.link_next;
			rp.link_next = NULL;	/* now ours */
			page = next > 0 ? next : page + 1;
		} else if (next > 0) {
			/*
			 * A proxy stripped the Link: a full page may have a
			 * next one; a short or empty one is the last
			 */
			url = xasprintf("%s/issues/%" PRId64 "/comments?"
			    "per_page=%d&page=%" PRId64, rpath, number,
			    SCM_PER_PAGE, next);
			page = next;
		}
	}
	*out = v;
	*n = nv;
	v = NULL;	/* now the caller's */
	ret = SCM_OK;
out:
	scm_comments_free(v, nv);
	json_decref(j);
	scm_resp_release(&rp);
	free(rpath);
	free(url);
	for (i = 0; i < nseen; i++)
		free(seen[i]);
	free(seen);
	return ret;
}

/* A call without a useful reply body, for the comment ops. */
static int
simple(struct github *g, const struct scm_repo *repo, const char *op,
    const char *method, const char *suffix, const char *body_key,
    const char *body, int idempotent, struct scm_resp *rp, char **cause)
{
	struct scm_req rq = { 0 };
	char *rpath = NULL, *url = NULL, *json = NULL;
	int ret;

	ret = repo_path(repo, &rpath, cause);
	if (ret != SCM_OK)
		goto out;
	if (body_key != NULL) {
		ret = body1(body_key, body, &json, cause);
		if (ret != SCM_OK)
			goto out;
	}
	url = xasprintf("%s%s", rpath, suffix);
	rq.op = op;
	rq.method = method;
	rq.url = url;
	rq.body = json;
	rq.body_len = json != NULL ? strlen(json) : 0;
	rq.idempotent = idempotent;
	ret = gh_call(g, repo, rpath, &rq, rp, cause);
out:
	free(rpath);
	free(url);
	free(json);
	return ret;
}

static int
gh_create_comment(struct scm_client *c, const struct scm_repo *repo,
    int64_t number, const char *body, int64_t *id_out, char **cause)
{
	struct scm_resp rp;
	char suffix[64];
	json_t *j = NULL;
	int64_t id;
	int ret;

	scm_resp_init(&rp);
	snprintf(suffix, sizeof(suffix), "/issues/%" PRId64 "/comments",
	    number);
	ret = simple(gh_of(c), repo, "create_comment", "POST", suffix, "body",
	    body, 0, &rp, cause);
	if (ret != SCM_OK)
		goto out;
	ret = scm_json_reply(&rp, 1, "github: create comment", &j, cause);
	if (ret != SCM_OK)
		goto out;
	id = scm_json_int(j, "id");
	if (id <= 0) {
		*cause = xstrdup("github: create comment: the reply has no "
		    "id");
		ret = SCM_EINTERNAL;
		goto out;
	}
	if (id_out != NULL)
		*id_out = id;
out:
	json_decref(j);
	scm_resp_release(&rp);
	return ret;
}

/* A call on issue comment id; body: a {"body": ...} to send. */
static int
comment_call(struct scm_client *c, const struct scm_repo *repo, int64_t id,
    const char *op, const char *method, const char *body,
    struct scm_resp *rp, char **cause)
{
	char suffix[64];

	snprintf(suffix, sizeof(suffix), "/issues/comments/%" PRId64, id);
	return simple(gh_of(c), repo, op, method, suffix, body != NULL ?
	    "body" : NULL, body, 1, rp, cause);
}

static int
gh_get_comment(struct scm_client *c, const struct scm_repo *repo,
    int64_t number, int64_t id, struct scm_comment *out, char **cause)
{
	struct scm_resp rp;
	int ret;

	(void)number;
	memset(out, 0, sizeof(*out));
	scm_resp_init(&rp);
	ret = comment_call(c, repo, id, "get_comment", "GET", NULL, &rp,
	    cause);
	if (ret == SCM_OK)
		ret = scm_comment_reply(&rp, "github: get comment", id,
		    comment_from, out, cause);
	scm_resp_release(&rp);
	return ret;
}

static int
gh_update_comment(struct scm_client *c, const struct scm_repo *repo,
    int64_t number, int64_t id, const char *body, char **cause)
{
	struct scm_resp rp;
	int ret;

	(void)number;
	scm_resp_init(&rp);
	ret = comment_call(c, repo, id, "update_comment", "PATCH", body, &rp,
	    cause);
	scm_resp_release(&rp);
	return ret;
}

static int
gh_delete_comment(struct scm_client *c, const struct scm_repo *repo,
    int64_t number, int64_t id, char **cause)
{
	struct scm_resp rp;
	int ret;

	(void)number;
	scm_resp_init(&rp);
	ret = comment_call(c, repo, id, "delete_comment", "DELETE", NULL, &rp,
	    cause);
	scm_resp_release(&rp);
	return ret;
}

static int
gh_react(struct scm_client *c, const struct scm_repo *repo, int64_t number,
    int64_t comment_id, int review, const char *reaction, char **cause)
{
	struct scm_resp rp;
	char suffix[80];
	int ret;

	(void)number;
	scm_resp_init(&rp);
	snprintf(suffix, sizeof(suffix), "/%s/comments/%" PRId64 "/reactions",
	    review ? "pulls" : "issues", comment_id);
	/* 201 created, 200 already there: both fine */
	ret = simple(gh_of(c), repo, "react", "POST", suffix, "content",
	    reaction, 1, &rp, cause);
	scm_resp_release(&rp);
	return ret;
}

static int
gh_permission(struct scm_client *c, const struct scm_repo *repo,
    const char *login, int64_t user_id, enum scm_permission *out,
    char **cause)
{
	struct scm_resp rp;
	char *suffix = NULL, *elogin = NULL;
	const char *perm, *role;
	json_t *j = NULL;
	enum scm_permission p;
	json_int_t uid;
	int ret;

	scm_resp_init(&rp);
	if (login == NULL || *login == '\0') {
		*cause = xstrdup("github: permission: no login");
		ret = SCM_EINVALID;
		goto out;
	}
	elogin = scm_escape(login);
	suffix = xasprintf("/collaborators/%s/permission", elogin);
	ret = simple(gh_of(c), repo, "permission", "GET", suffix, NULL, NULL,
	    1, &rp, cause);
	if (ret == SCM_ENOTFOUND) {
		/* not a collaborator, or no such user: no access */
		free(*cause);
		*cause = NULL;
		*out = SCM_PERM_NONE;
		ret = SCM_OK;
		goto out;
	}
	if (ret != SCM_OK)
		goto out;
	ret = scm_json_reply(&rp, 1, "github: permission", &j, cause);
	if (ret != SCM_OK)
		goto out;
	perm = json_string_value(json_object_get(j, "permission"));
	role = json_string_value(json_object_get(j, "role_name"));
	uid = json_integer_value(json_object_get(json_object_get(j, "user"),
	    "id"));
	if (user_id > 0 && uid > 0 && uid != user_id) {
		/*
		 * The permission is looked up by login, and the login now
		 * names another account (renamed since the comment, and
		 * taken): not the author's access, so none.
		 */
		log_kv(LOG_WARN, "github: permission: the login names another "
		    "account now: no access", "login", login, NULL);
		*out = SCM_PERM_NONE;
		goto out;
	}
	if (perm == NULL) {
		*cause = xstrdup("github: permission: the reply has no "
		    "permission");
		ret = SCM_EINTERNAL;
		goto out;
	}
	/* "permission" folds maintain into write and triage into read */
	if (strcmp(perm, "admin") == 0 || (role != NULL &&
	    (strcmp(role, "maintain") == 0 || strcmp(role, "admin") == 0)))
		p = SCM_PERM_MAINTAIN;
	else if (strcmp(perm, "write") == 0 || strcmp(perm, "maintain") == 0)
		p = SCM_PERM_WRITE;
	else if (strcmp(perm, "read") == 0 || strcmp(perm, "triage") == 0)
		p = SCM_PERM_READ;
	else
		p = SCM_PERM_NONE;
	*out = p;
out:
	json_decref(j);
	scm_resp_release(&rp);
	free(suffix);
	free(elogin);
	return ret;
}

static int
gh_whoami(struct scm_client *c, char **login_out, int64_t *id_out,
    char **cause)
{
	struct github *g = gh_of(c);
	struct scm_req rq = { 0 };
	struct scm_resp rp;
	const char *name;
	json_t *j = NULL;
	int ret, app = !g->has_token;

	scm_resp_init(&rp);
	rq.method = "GET";
	rq.idempotent = 1;
	rq.op = "whoami";
	/*
	 * Who posts where no installation id is known (the notifier's
	 * comments): the token's user when there is a token, else the App.
	 */
	if (app) {
		rq.url = "/app";
		ret = jwt_call(g, &rq, &rp, cause);
	} else {
		rq.url = "/user";
		ret = gh_call(g, NULL, NULL, &rq, &rp, cause);
	}
	if (ret != SCM_OK)
		goto out;
	ret = scm_json_reply(&rp, 1, "github: whoami", &j, cause);
	if (ret != SCM_OK)
		goto out;
	name = json_string_value(json_object_get(j, app ? "slug" : "login"));
	if (name == NULL || *name == '\0') {
		*cause = xstrdup("github: whoami: the reply has no name");
		ret = SCM_EINTERNAL;
		goto out;
	}
	if (app) {
		if (g->slug != NULL && strcmp(g->slug, name) != 0)
			log_kv(LOG_WARN, "github: 'github.app.slug' differs "
			    "from the app's", "configured", g->slug, "app",
			    name, NULL);
		*login_out = xasprintf("%s[bot]", name);
		/* the bot user's id is not the app's: unknown here */
		if (id_out != NULL)
			*id_out = 0;
	} else {
		*login_out = xstrdup(name);
		if (id_out != NULL)
			*id_out = scm_json_int(j, "id");
	}
out:
	json_decref(j);
	scm_resp_release(&rp);
	return ret;
}

/* Drop the whitespace GitHub puts between base64 lines. */
static char *
strip_space(const char *s, size_t *len)
{
	size_t n = strlen(s), i, k = 0;
	char *o = xmalloc(n + 1);

	for (i = 0; i < n; i++)
		if (s[i] != '\n' && s[i] != '\r' && s[i] != ' ' &&
		    s[i] != '\t')
			o[k++] = s[i];
	o[k] = '\0';
	*len = k;
	return o;
}

static int
gh_read_file(struct scm_client *c, const struct scm_repo *repo,
    const char *ref, const char *path, char **data, size_t *len,
    char **cause)
{
	struct github *g = gh_of(c);
	struct scm_req rq = { 0 };
	struct scm_resp rp;
	char *rpath = NULL, *url = NULL, *epath = NULL, *eref = NULL;
	char *b64 = NULL;
	unsigned char *dec = NULL;
	const char *type, *enc, *content;
	size_t b64len = 0, declen = 0;
	json_t *j = NULL;
	int ret;

	scm_resp_init(&rp);
	ret = repo_path(repo, &rpath, cause);
	if (ret != SCM_OK)
		goto out;
	if (!scm_path_ok(path)) {
		*cause = xasprintf("github: read file: '%s' is not a relative "
		    "path without . or .. parts", path != NULL ? path : "");
		ret = SCM_EINVALID;
		goto out;
	}
	epath = scm_escape_path(path);
	if (ref != NULL && *ref != '\0') {
		eref = scm_escape(ref);
		url = xasprintf("%s/contents/%s?ref=%s", rpath, epath, eref);
	} else
		url = xasprintf("%s/contents/%s", rpath, epath);
	rq.op = "read_file";
	rq.method = "GET";
	rq.url = url;
	rq.idempotent = 1;
	rq.max = SCM_MAX_FILE * 2;	/* base64 in JSON */
	ret = gh_call(g, repo, rpath, &rq, &rp, cause);
	if (ret != SCM_OK)
		goto out;
	if (rp.body.len > 0 && rp.body.data[0] == '[') {
		*cause = xasprintf("github: read file '%s': is a directory",
		    path);
		ret = SCM_EINVALID;
		goto out;
	}
	ret = scm_json_reply(&rp, 1, "github: read file", &j, cause);
	if (ret != SCM_OK)
		goto out;
	type = json_string_value(json_object_get(j, "type"));
	enc = json_string_value(json_object_get(j, "encoding"));
	content = json_string_value(json_object_get(j, "content"));
	if (type == NULL || strcmp(type, "file") != 0) {
		*cause = xasprintf("github: read file '%s': is a %s, not a "
		    "file", path, type != NULL ? type : "thing");
		ret = SCM_EINVALID;
		goto out;
	}
	if (enc == NULL || strcmp(enc, "base64") != 0 || content == NULL) {
		/* "none": larger than 1 MB */
		*cause = xasprintf("github: read file '%s': no base64 content "
		    "(too large?)", path);
		ret = SCM_EINVALID;
		goto out;
	}
	b64 = strip_space(content, &b64len);
	if (base64_decode(b64, b64len, &dec, &declen) < 0) {
		*cause = xasprintf("github: read file '%s': bad base64", path);
		ret = SCM_EINTERNAL;
		goto out;
	}
	if (declen > SCM_MAX_FILE) {
		*cause = xasprintf("github: read file '%s': larger than %zu "
		    "bytes", path, SCM_MAX_FILE);
		ret = SCM_EINVALID;
		goto out;
	}
	*data = (char *)dec;
	*len = declen;
	dec = NULL;	/* now the caller's */
out:
	free(dec);
	free(b64);
	json_decref(j);
	scm_resp_release(&rp);
	free(rpath);
	free(url);
	free(epath);
	free(eref);
	return ret;
}

static void
gh_free(struct scm_client *c)
{
	struct github *g = gh_of(c);

	if (g == NULL)
		return;
	scm_http_free(g->http);
	scm_secret_free(g->token);
	free(g->app_id);
	free(g->slug);
	EVP_PKEY_free(g->key);
	tokens_free(g->tokens);
	pthread_rwlock_destroy(&g->cred);
	pthread_mutex_destroy(&g->lock);
	pthread_mutex_destroy(&g->skew_lock);
	free(g);
}

/* The token and the App key of cfg (each NULL when not configured). */
static int
gh_load_creds(const struct config *cfg, char **token, EVP_PKEY **key,
    char **cause)
{
	char *pem = NULL;

	*token = NULL;
	*key = NULL;
	if (cfg->github.token != NULL && scm_secret_load("github",
	    "github.token", cfg->github.token, token, cause) < 0)
		return -1;
	if (*token != NULL && strpbrk(*token, "\r\n") != NULL) {
		*cause = xstrdup("github: 'github.token' holds a line break");
		goto fail;
	}
	if (cfg->github.app.id != NULL && *cfg->github.app.id != '\0') {
		if (cfg->github.app.private_key == NULL) {
			*cause = xstrdup("github: 'github.app.private_key' is "
			    "required with 'github.app.id'");
			goto fail;
		}
		if (scm_secret_load("github", "github.app.private_key",
		    cfg->github.app.private_key, &pem, cause) < 0)
			goto fail;
		*key = load_key(pem, strlen(pem));
		scm_secret_free(pem);
		if (*key == NULL) {
			*cause = xstrdup("github: 'github.app.private_key': "
			    "not an RSA private key in PEM");
			goto fail;
		}
	}
	return 0;
fail:
	scm_secret_free(*token);
	*token = NULL;
	return -1;
}

/*
 * SIGHUP: the token and the App key again. Installation tokens already
 * minted stay until they expire (a new key does not revoke them).
 */
static int
gh_reload(struct scm_client *c, const struct config *cfg, char **cause)
{
	struct github *g = gh_of(c);
	EVP_PKEY *key, *oldkey;
	char *token, *old;

	if (gh_load_creds(cfg, &token, &key, cause) < 0)
		return -1;
	if ((token != NULL) != g->has_token || (key != NULL) != g->has_key) {
		*cause = xstrdup("github: adding or removing 'github.token' or "
		    "'github.app' needs a restart");
		scm_secret_free(token);
		EVP_PKEY_free(key);
		return -1;
	}
	pthread_rwlock_wrlock(&g->cred);
	old = g->token;
	oldkey = g->key;
	g->token = token;
	g->key = key;
	pthread_rwlock_unlock(&g->cred);
	scm_secret_free(old);
	EVP_PKEY_free(oldkey);
	return 0;
}

static void
gh_keep_holds(struct scm_client *c, const char *path)
{
	scm_http_keep_holds(gh_of(c)->http, path);
}

static const struct scm_ops github_ops = {
	.name = "github",
	.get_pr = gh_get_pr,
	.list_comments = gh_list_comments,
	.create_comment = gh_create_comment,
	.get_comment = gh_get_comment,
	.update_comment = gh_update_comment,
	.delete_comment = gh_delete_comment,
	.react = gh_react,
	.permission = gh_permission,
	.is_bot = NULL,		/* the webhook says: user.type "Bot" */
	.whoami = gh_whoami,
	.read_file = gh_read_file,
	.reload = gh_reload,
	.keep_holds = gh_keep_holds,
	.free = gh_free,
};

/* The GitHub client of cfg, NULL when GitHub is disabled. */
int
scm_github_new(struct scm_client **out, const struct config *cfg,
    char **cause)
{
	struct scm_http_config hc = { 0 };
	struct github *g = NULL;
	int ret = -1;

	if (!cfg->github.enabled) {
		*out = NULL;
		return 0;
	}
	g = xcalloc(1, sizeof(*g));
	g->c.ops = &github_ops;
	pthread_rwlock_init(&g->cred, NULL);
	pthread_mutex_init(&g->lock, NULL);
	pthread_mutex_init(&g->skew_lock, NULL);
	hc.provider = SCM_GITHUB;
	hc.api_url = cfg->github.api_url != NULL ? cfg->github.api_url :
	    "https://api.github.com";
	hc.ca_file = cfg->github.ca_file;
	if (scm_http_new(&g->http, &hc, cause) < 0)
		goto out;
	if (gh_load_creds(cfg, &g->token, &g->key, cause) < 0)
		goto out;
	g->has_token = g->token != NULL;
	g->has_key = g->key != NULL;
	if (g->key != NULL) {
		g->app_id = xstrdup(cfg->github.app.id);
		if (cfg->github.app.slug != NULL)
			g->slug = xstrdup(cfg->github.app.slug);
	}
	if (g->token == NULL && g->key == NULL) {
		*cause = xstrdup("github: neither 'github.token' nor "
		    "'github.app' is configured");
		goto out;
	}
	g->c.who = scm_who_new();
	*out = &g->c;
	g = NULL;	/* now the caller's */
	ret = 0;
out:
	if (g != NULL)
		gh_free(&g->c);
	return ret;
}
