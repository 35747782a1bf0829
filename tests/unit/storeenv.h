/*
 * The three ways tests reach a resource store (STORE_MODE): 1 the embedded
 * backend in process; 2 the REST client against the embedded store served
 * over HTTP; 3 the REST client against the independent fake kube-apiserver
 * of tests/fakes (TLS with a test CA, bearer token).
 */
#ifndef DIVERGE_STOREENV_H
#define DIVERGE_STOREENV_H

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <curl/curl.h>

#include "k8s/k8s.h"
#include "util/util.h"
#include "testutil.h"

struct storeenv {
	struct k8s_api *api;		/* what the test uses */
	struct k8s_api *backing;	/* mode 2: the served store */
	struct k8s_apiserver *server;	/* mode 2 */
	pid_t fake_pid;			/* mode 3 */
	FILE *fake_in;
	char *fake_server;		/* mode 3: its URL and CA */
	char *fake_ca;
	char *dir;
};

static inline char *
storeenv_tmpdir(void)
{
	return test_tmpdir("store");
}

/* Start tests/fakes/kube_apiserver.py and read its one JSON line. */
static inline int
storeenv_start_fake(struct storeenv *env, size_t history,
    struct k8s_cluster *c)
{
	const char *top = getenv("top_srcdir");
	int in[2], outp[2];
	char line[4096], hist[32];
	FILE *f;
	json_t *j;
	char *script = xasprintf("%s/tests/fakes/kube_apiserver.py",
	    top ? top : ".");

	if (access(script, R_OK) != 0 || pipe(in) < 0 || pipe(outp) < 0) {
		free(script);
		return -1;
	}
	snprintf(hist, sizeof(hist), "%zu", history);
	env->fake_pid = fork();
	if (env->fake_pid == 0) {
		int logfd = open("/tmp/diverge-fake-apiserver.log",
		    O_WRONLY | O_CREAT | O_APPEND, 0600);

		dup2(in[0], 0);
		dup2(outp[1], 1);
		if (logfd >= 0)
			dup2(logfd, 2);
		close(in[1]);
		close(outp[0]);
		execlp("python3", "python3", script, "--port", "0", "--token",
		    "contract-token", "--history", hist, (char *)NULL);
		_exit(127);
	}
	free(script);
	close(in[0]);
	close(outp[1]);
	env->fake_in = fdopen(in[1], "w");	/* closed: the fake ends */
	f = fdopen(outp[0], "r");
	if (f == NULL || fgets(line, sizeof(line), f) == NULL) {
		if (f != NULL)
			fclose(f);
		return -1;
	}
	fclose(f);
	j = json_loads(line, 0, NULL);
	if (j == NULL)
		return -1;
	memset(c, 0, sizeof(*c));
	c->server = xstrdup(json_string_value(json_object_get(j, "server")));
	c->ca_file = xstrdup(json_string_value(json_object_get(j,
	    "ca_file")));
	c->token = xstrdup("contract-token");
	c->namespace = xstrdup("default");
	env->fake_server = xstrdup(c->server);
	env->fake_ca = xstrdup(c->ca_file);
	json_decref(j);
	return 0;
}

static inline size_t
storeenv_fake_write(char *data, size_t size, size_t nmemb, void *arg)
{
	return buf_add(arg, data, size * nmemb) < 0 ? 0 : size * nmemb;
}

/*
 * Mode 3: one call to the fake's /_fake control endpoints (faults,
 * delays, the request log) with body (a JSON text or NULL); the parsed
 * answer (to json_decref) or NULL.
 */
static inline json_t *
storeenv_fake(struct storeenv *env, const char *method, const char *path,
    const char *body)
{
	CURL *h = curl_easy_init();
	struct curl_slist *hdrs = NULL;
	struct buf b;
	char *url = xasprintf("%s%s", env->fake_server, path);
	json_t *j = NULL;

	buf_init(&b, 64 * 1024 * 1024);
	hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_CAINFO, env->fake_ca);
	curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(h, CURLOPT_TIMEOUT, 20L);
	if (body != NULL)
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, storeenv_fake_write);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
	if (curl_easy_perform(h) == CURLE_OK && b.len > 0)
		j = json_loadb(b.data, b.len, 0, NULL);
	curl_slist_free_all(hdrs);
	curl_easy_cleanup(h);
	buf_release(&b);
	free(url);
	return j;
}

/*
 * Mode 3: how many requests of method whose path ends with suffix the
 * fake has seen since its request log was last cleared.
 */
static inline int
storeenv_fake_count(struct storeenv *env, const char *method,
    const char *suffix)
{
	json_t *reqs = storeenv_fake(env, "GET", "/_fake/requests", NULL);
	json_t *r;
	size_t i, sl = strlen(suffix), pl;
	const char *m, *p;
	int n = 0;

	json_array_foreach(reqs, i, r) {
		m = json_string_value(json_object_get(r, "method"));
		p = json_string_value(json_object_get(r, "path"));
		if (m == NULL || p == NULL || strcmp(m, method) != 0)
			continue;
		pl = strlen(p);
		if (pl >= sl && strcmp(p + pl - sl, suffix) == 0)
			n++;
	}
	json_decref(reqs);
	return n;
}

/* Open the store of mode; history bounds every backend's watch window. */
static inline int
storeenv_open(struct storeenv *env, int mode, size_t history)
{
	struct k8s_embedded_config ec = { history, 3600, 0 };
	struct k8s_cluster c;
	char *cause = NULL, *path = NULL;
	int rc = -1;

	memset(env, 0, sizeof(*env));
	signal(SIGPIPE, SIG_IGN);
	if (mode != 3) {
		env->dir = storeenv_tmpdir();
		if (env->dir == NULL)
			return -1;
		path = xasprintf("%s/diverge.db", env->dir);
	}
	if (mode == 1) {
		rc = k8s_embedded_open(&env->api, path, &ec, &cause);
	} else if (mode == 2) {
		struct k8s_apiserver_config sc;

		if (k8s_embedded_open(&env->backing, path, &ec, &cause) < 0)
			goto out;
		memset(&sc, 0, sizeof(sc));
		sc.listen = "127.0.0.1:0";
		sc.max_connections = 256;
		if (k8s_apiserver_start(&env->server, env->backing, &sc,
		    &cause) < 0)
			goto out;
		memset(&c, 0, sizeof(c));
		c.server = xasprintf("http://127.0.0.1:%d",
		    k8s_apiserver_port(env->server));
		c.namespace = xstrdup("default");
		rc = k8s_rest_open(&env->api, &c, NULL, &cause);
		k8s_cluster_release(&c);
	} else {
		if (storeenv_start_fake(env, history, &c) < 0) {
			cause = xstrdup("cannot start the fake apiserver");
			goto out;
		}
		rc = k8s_rest_open(&env->api, &c, NULL, &cause);
		k8s_cluster_release(&c);
	}
out:
	if (rc < 0)
		fprintf(stderr, "# store: %s\n", cause ? cause : "?");
	free(cause);
	free(path);
	return rc;
}

static inline void
storeenv_close(struct storeenv *env)
{
	k8s_api_free(env->api);
	if (env->server != NULL)
		k8s_apiserver_stop(env->server);
	k8s_api_free(env->backing);
	if (env->fake_in != NULL)
		fclose(env->fake_in);
	if (env->fake_pid > 0) {
		kill(env->fake_pid, SIGTERM);
		waitpid(env->fake_pid, NULL, 0);
	}
	free(env->fake_server);
	free(env->fake_ca);
	free(env->dir);
	memset(env, 0, sizeof(*env));
}

#endif
