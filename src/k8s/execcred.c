/*
 * Exec credential plugins (client.authentication.k8s.io): what the
 * kubeconfigs of EKS (aws eks get-token), GKE (gke-gcloud-auth-plugin)
 * and AKS (kubelogin) use instead of a token. The plugin runs with the
 * kubeconfig's arguments and environment, plus KUBERNETES_EXEC_INFO (an
 * ExecCredential saying it is not interactive, with the cluster when
 * provideClusterInfo asks for it), stdin from /dev/null, and must print an
 * ExecCredential whose status holds a token and, usually, when it
 * expires. Its stderr is kept (cut) for the error; the token never
 * appears in one. A plugin that runs too long is killed. It gets none of
 * the daemon's descriptors but those three, close-on-exec or not.
 */
#include "config.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "k8s/k8s.h"
#include "util/util.h"

extern char **environ;
/*
 * glibc declares these only for _GNU_SOURCE, which the build's forced
 * include (util/banned.h) comes before.
 */
int pipe2(int fd[2], int flags);
#ifdef HAVE_POSIX_SPAWN_FILE_ACTIONS_ADDCLOSEFROM_NP
int posix_spawn_file_actions_addclosefrom_np(posix_spawn_file_actions_t *fa,
    int from);
#endif

#define MAX_OUT		(1024 * 1024)	/* the ExecCredential */
#define MAX_ERR		512		/* what an error shows of stderr */
/* descriptors closed one by one at most (the kernel's default nr_open) */
#define MAX_FDS		(1024 * 1024)

int k8s_exec_test_fork;

/*
 * A pipe whose ends no other spawned process keeps open (their copies
 * would hold the plugin's stdout open after it exits): close-on-exec
 * from its creation, with no moment a spawn in another thread could
 * catch them without.
 */
static int
cloexec_pipe(int fd[2])
{
	return pipe2(fd, O_CLOEXEC);
}

/*
 * The signals a plugin starts with at their default action: the daemon
 * ignores SIGPIPE, and its threads block SIGTERM, SIGINT and SIGHUP,
 * which a child would inherit (and pass to what it runs) through exec.
 */
static void
default_signals(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGPIPE);
	sigaddset(set, SIGTERM);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGHUP);
}

#ifdef HAVE_POSIX_SPAWN_FILE_ACTIONS_ADDCLOSEFROM_NP
/* Start the plugin with posix_spawnp; 0 or an errno value. */
static int
spawn_posix(const char *cmd, char *const argv[], char *const envp[],
    int out1, int err1, pid_t *pid)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t sa;
	sigset_t none, dfl;
	int rc;

	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_adddup2(&fa, out1, 1);
	posix_spawn_file_actions_adddup2(&fa, err1, 2);
	/* not the daemon's sockets and files, close-on-exec or not */
	posix_spawn_file_actions_addclosefrom_np(&fa, 3);
	posix_spawnattr_init(&sa);
	sigemptyset(&none);
	default_signals(&dfl);
	posix_spawnattr_setsigmask(&sa, &none);
	posix_spawnattr_setsigdefault(&sa, &dfl);
	posix_spawnattr_setflags(&sa, POSIX_SPAWN_SETSIGMASK |
	    POSIX_SPAWN_SETSIGDEF);
	rc = posix_spawnp(pid, cmd, &fa, &sa, argv, envp);
	posix_spawnattr_destroy(&sa);
	posix_spawn_file_actions_destroy(&fa);
	return rc;
}
#endif

/*
 * The files the plugin's command may be, in the order posix_spawnp tries
 * them: the command itself when it holds a '/', else the command in each
 * directory of PATH (an empty one: the current directory). Made before
 * the fork: the child may not allocate.
 */
static char **
exec_paths(const char *cmd)
{
	const char *path = getenv("PATH"), *p, *e;
	size_t n = 1;
	char **v;

	if (strchr(cmd, '/') != NULL) {
		v = xcalloc(2, sizeof(*v));
		v[0] = xstrdup(cmd);
		return v;
	}
	if (path == NULL)
		path = "/bin:/usr/bin";
	for (p = path; *p != '\0'; p++)
		n += *p == ':';
	v = xcalloc(n + 1, sizeof(*v));
	for (n = 0, p = path;; p = e + 1) {
		e = p + strcspn(p, ":");
		v[n++] = xasprintf("%.*s%s%s", (int)(e - p), p,
		    e > p ? "/" : "", cmd);
		if (*e == '\0')
			break;
	}
	return v;
}

/*
 * Close every descriptor from 4 up: close_range when the kernel has it
 * (Linux 5.9), else one by one up to the limit the parent read.
 */
static void
close_from_4(long maxfd)
{
	long fd;

#ifdef SYS_close_range
	if (k8s_exec_test_fork != 2 &&
	    syscall(SYS_close_range, 4U, ~0U, 0U) == 0)
		return;
#endif
	for (fd = 4; fd < maxfd; fd++)
		close((int)fd);
}

/* Whether a failed exec means "not in this directory": try the next. */
static int
not_there(int e)
{
	return e == ENOENT || e == ENOTDIR || e == ESTALE || e == ENODEV ||
	    e == ETIMEDOUT;
}

/*
 * The child of spawn_fork, which never returns: between the fork and the
 * exec only async-signal-safe calls (another thread of the daemon may
 * have held any lock, malloc's included, at the fork; syscall() is a bare
 * system call). It sets up what spawn_posix asks of posix_spawnp, then
 * execs each of paths in turn as execvp does; on failure it writes errno
 * to report (close-on-exec: it closes when the exec succeeds).
 */
static void
child_exec(char *const *paths, char *const argv[], char *const envp[],
    int out1, int err1, int report, long maxfd)
{
	struct sigaction sa;
	sigset_t dfl, none;
	int sig, fd, e = ENOENT, eacces = 0;
	size_t i;

	/* no handler of the daemon's may run here, nor SIGPIPE stay ignored */
	default_signals(&dfl);
	for (sig = 1; sig < NSIG; sig++) {
		if (sigaction(sig, NULL, &sa) < 0 || sa.sa_handler == SIG_DFL ||
		    (sa.sa_handler == SIG_IGN && !sigismember(&dfl, sig)))
			continue;
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = SIG_DFL;
		sigemptyset(&sa.sa_mask);
		sigaction(sig, &sa, NULL);
	}
	fd = open("/dev/null", O_RDONLY);
	if (fd < 0 || (fd != 0 && (dup2(fd, 0) < 0 || close(fd) < 0)) ||
	    dup2(out1, 1) < 0 || dup2(err1, 2) < 0)
		goto fail;
	/* the report pipe to 3, then none of the daemon's descriptors */
	if (report != 3 && (dup2(report, 3) < 0 ||
	    fcntl(3, F_SETFD, FD_CLOEXEC) < 0))
		goto fail;
	report = 3;
	close_from_4(maxfd);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	for (i = 0; paths[i] != NULL; i++) {
		execve(paths[i], argv, envp);
		e = errno;
		if (e == EACCES)
			eacces = 1;
		else if (!not_there(e))
			break;
	}
	if (eacces && not_there(e))
		e = EACCES;
	(void)!write(report, &e, sizeof(e));
	_exit(127);
fail:
	e = errno;
	(void)!write(report, &e, sizeof(e));
	_exit(127);
}

/*
 * Start the plugin without posix_spawn_file_actions_addclosefrom_np
 * (glibc before 2.34): fork, close every descriptor above 2, exec. The
 * answer is posix_spawnp's: 0, or the errno of a failed exec (the child
 * then reaped).
 */
static int
spawn_fork(const char *cmd, char *const argv[], char *const envp[],
    int out1, int err1, pid_t *pid)
{
	char **paths = exec_paths(cmd);
	int rep[2] = { -1, -1 }, rc = 0, e = 0;
	long maxfd = sysconf(_SC_OPEN_MAX);
	struct rlimit rl;
	sigset_t all, old;
	ssize_t r;

	/*
	 * The hard limit, not the soft one: a descriptor opened before the
	 * soft limit was lowered is still open above it.
	 */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		maxfd = rl.rlim_max == RLIM_INFINITY ? MAX_FDS :
		    (long)rl.rlim_max;
	if (maxfd < 0 || maxfd > MAX_FDS)
		maxfd = MAX_FDS;
	if (cloexec_pipe(rep) < 0) {
		rc = errno;
		goto out;
	}
	/* no signal handler runs in the child before it resets them */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	*pid = fork();
	if (*pid == 0)
		child_exec(paths, argv, envp, out1, err1, rep[1], maxfd);
	if (*pid < 0)
		rc = errno;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	close(rep[1]);
	if (*pid > 0) {
		while ((r = read(rep[0], &e, sizeof(e))) < 0 && errno == EINTR)
			;
		if (r == (ssize_t)sizeof(e)) {
			rc = e;
			while (waitpid(*pid, NULL, 0) < 0 && errno == EINTR)
				;
		}
	}
out:
	if (rep[0] >= 0)
		close(rep[0]);
	k8s_strv_free(paths);
	return rc;
}

/* KUBERNETES_EXEC_INFO for c. */
static char *
exec_info(const struct k8s_cluster *c)
{
	json_t *spec = json_pack("{s:b}", "interactive", 0), *cl, *info;
	char *s, *env, *b64 = NULL;

	if (c->exec_cluster_info) {
		cl = json_pack("{s:s,s:b}", "server", c->server != NULL ?
		    c->server : "", "insecure-skip-tls-verify", c->insecure);
		if (c->ca_data != NULL) {
			b64 = base64_encode((const unsigned char *)c->ca_data,
			    strlen(c->ca_data), 0, 1);
			json_object_set_new(cl, "certificate-authority-data",
			    json_string(b64));
		}
		if (c->tls_server_name != NULL)
			json_object_set_new(cl, "tls-server-name",
			    json_string(c->tls_server_name));
		/* as client-go's ConfigToExecCluster: as written */
		if (c->proxy_url != NULL)
			json_object_set_new(cl, "proxy-url",
			    json_string(c->proxy_url));
		json_object_set_new(spec, "cluster", cl);
	}
	info = json_pack("{s:s,s:s,s:o}", "apiVersion", c->exec_api_version,
	    "kind", "ExecCredential", "spec", spec);
	s = json_dumps(info, JSON_COMPACT);
	json_decref(info);
	free(b64);
	env = xasprintf("KUBERNETES_EXEC_INFO=%s", s);
	free(s);
	return env;
}

/* Whether the "NAME=value" entry e sets a variable of the list "NAME=...". */
static int
env_named(const char *e, char *const *list)
{
	size_t n = strcspn(e, "=");

	for (; list != NULL && *list != NULL; list++)
		if (strncmp(*list, e, n) == 0 && (*list)[n] == '=')
			return 1;
	return 0;
}

/*
 * The process environment with c's additions and info, which replace the
 * process's variables of their names (as kubectl's exec.Cmd gives them:
 * with two entries of a name, Go and Python programs take the first).
 */
static char **
exec_envp(const struct k8s_cluster *c, char *info)
{
	size_t n = 0, m = 0, i, j;
	char **envp;

	while (environ[n] != NULL)
		n++;
	while (c->exec_env != NULL && c->exec_env[m] != NULL)
		m++;
	envp = xcalloc(n + m + 2, sizeof(*envp));
	for (i = j = 0; i < n; i++)
		if (strncmp(environ[i], "KUBERNETES_EXEC_INFO=", 21) != 0 &&
		    !env_named(environ[i], c->exec_env))
			envp[j++] = environ[i];
	for (i = 0; i < m; i++)
		envp[j++] = c->exec_env[i];
	envp[j] = info;
	return envp;
}

/*
 * Read the plugin's stdout and stderr until both close or the deadline;
 * 0, or with *why what went wrong: -2 it ran too long, -1 it printed too
 * much or poll failed.
 */
static int
drain(int out, int err, struct buf *ob, struct buf *eb, int64_t deadline,
    const char **why)
{
	struct pollfd p[2] = { { out, POLLIN, 0 }, { err, POLLIN, 0 } };
	char chunk[4096];
	ssize_t r;
	int open = 2, i;
	int64_t left;

	while (open > 0) {
		left = deadline - now_mono_ms();
		if (left <= 0) {
			*why = "did not finish in time";
			return -2;
		}
		if (poll(p, 2, (int)left) < 0) {
			if (errno == EINTR)
				continue;
			*why = "could not be read (poll failed)";
			return -1;
		}
		for (i = 0; i < 2; i++) {
			if (p[i].fd < 0 || p[i].revents == 0)
				continue;
			r = read(p[i].fd, chunk, sizeof(chunk));
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				p[i].fd = -1;
				open--;
				continue;
			}
			if (i == 0 && buf_add(ob, chunk, (size_t)r) < 0) {
				*why = "printed too much";
				return -1;
			}
			if (i == 1 && eb->len < MAX_ERR)
				(void)buf_add(eb, chunk, (size_t)r <
				    MAX_ERR - eb->len ? (size_t)r :
				    MAX_ERR - eb->len);
		}
	}
	return 0;
}

/* The first line of the plugin's stderr, for a message. */
static char *
err_line(const struct buf *eb)
{
	size_t n = 0;
	char *line, *r;

	while (eb->data != NULL && n < eb->len && eb->data[n] != '\n')
		n++;
	if (n == 0)
		return xstrdup("");
	/* a plugin may print the token, or the one it was refused */
	line = xasprintf(": %.*s", (int)n, eb->data);
	r = redact(line);
	if (r == NULL)
		return line;
	free(line);
	return r;
}

/* Parse the ExecCredential the plugin printed. */
static int
parse_credential(const struct k8s_cluster *c, const char *cmd,
    const struct buf *ob, char **token, int64_t *expiry, char **cause)
{
	json_t *j = ob->data != NULL ? json_loadb(ob->data, ob->len, 0,
	    NULL) : NULL;
	json_t *st = json_object_get(j, "status");
	const char *tok = json_string_value(json_object_get(st, "token"));
	const char *exp = json_string_value(json_object_get(st,
	    "expirationTimestamp"));
	int ret = -1;

	*expiry = 0;
	if (!json_is_object(j) || !streq(json_string_value(json_object_get(j,
	    "kind")), "ExecCredential") || !streq(json_string_value(
	    json_object_get(j, "apiVersion")), c->exec_api_version)) {
		*cause = xasprintf("k8s: exec plugin '%s' did not print an "
		    "ExecCredential of %s", cmd, c->exec_api_version);
	} else if (json_object_get(st, "clientCertificateData") != NULL) {
		*cause = xasprintf("k8s: exec plugin '%s' gave a client "
		    "certificate; only tokens are supported", cmd);
	} else if (tok == NULL || *tok == '\0' || strpbrk(tok, "\r\n")) {
		*cause = xasprintf("k8s: exec plugin '%s' gave no token", cmd);
	} else if (exp != NULL && time_parse_rfc3339(exp, expiry) < 0) {
		*cause = xasprintf("k8s: exec plugin '%s': expirationTimestamp "
		    "'%.64s' is not a time", cmd, exp);
	} else {
		/* each new token joins the old ones (util/redact.c) */
		redact_secret_add(tok, strlen(tok));
		*token = xstrdup(tok);
		ret = 0;
	}
	if (j != NULL && tok != NULL)
		secure_wipe((char *)tok, strlen(tok));
	json_decref(j);
	return ret;
}

int
k8s_exec_credential(const struct k8s_cluster *c, int64_t timeout_ms,
    char **token, int64_t *expiry, char **cause)
{
	const char *cmd = c->exec_argv[0];
	int out[2] = { -1, -1 }, err[2] = { -1, -1 }, rc, status = 0, ret = -1;
	struct buf ob, eb;
	char **envp, *info, *line;
	const char *why = NULL, *result = "result=\"error\"";
	pid_t pid = -1;
	int late;
	int64_t deadline = now_mono_ms() + timeout_ms;

	*token = NULL;
	buf_init(&ob, MAX_OUT);
	buf_init(&eb, MAX_ERR + 1);
	/* said before spawning: a child's exec failure is only a status */
	if (strchr(cmd, '/') != NULL && access(cmd, X_OK) < 0) {
		*cause = xasprintf("k8s: exec plugin '%s': %s%s%s", cmd,
		    strerror(errno), c->exec_hint != NULL ? "; " : "",
		    c->exec_hint != NULL ? c->exec_hint : "");
		goto out;
	}
	if (cloexec_pipe(out) < 0 || cloexec_pipe(err) < 0) {
		*cause = xasprintf("k8s: exec plugin '%s': %s", cmd,
		    strerror(errno));
		goto out;
	}
	info = exec_info(c);
	envp = exec_envp(c, info);
#ifdef HAVE_POSIX_SPAWN_FILE_ACTIONS_ADDCLOSEFROM_NP
	if (!k8s_exec_test_fork)
		rc = spawn_posix(cmd, c->exec_argv, envp, out[1], err[1],
		    &pid);
	else
#endif
		rc = spawn_fork(cmd, c->exec_argv, envp, out[1], err[1], &pid);
	free(envp);
	free(info);
	close(out[1]);
	close(err[1]);
	out[1] = err[1] = -1;
	if (rc != 0) {
		*cause = xasprintf("k8s: exec plugin '%s': %s%s%s", cmd,
		    strerror(rc), c->exec_hint != NULL ? "; " : "",
		    c->exec_hint != NULL ? c->exec_hint : "");
		goto out;
	}
	late = drain(out[0], err[0], &ob, &eb, deadline, &why);
	if (late == -2)
		result = "result=\"timeout\"";
	if (late)
		kill(pid, SIGKILL);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (late) {
		*cause = xasprintf("k8s: exec plugin '%s' %s", cmd, why);
		goto out;
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		line = err_line(&eb);
		*cause = WIFEXITED(status) ? xasprintf("k8s: exec plugin '%s' "
		    "exited with status %d%s%s%s", cmd, WEXITSTATUS(status),
		    line, WEXITSTATUS(status) == 127 && c->exec_hint != NULL ?
		    " (not found?); " : "", WEXITSTATUS(status) == 127 &&
		    c->exec_hint != NULL ? c->exec_hint : "") :
		    xasprintf("k8s: exec plugin '%s' was killed by signal %d%s",
		    cmd, WTERMSIG(status), line);
		free(line);
		goto out;
	}
	ret = parse_credential(c, cmd, &ob, token, expiry, cause);
out:
	metrics_inc("diverge_kube_exec_plugin_runs_total", ret == 0 ?
	    "result=\"ok\"" : result, 1);
	if (ob.data != NULL)
		secure_wipe(ob.data, ob.len);
	buf_release(&ob);
	buf_release(&eb);
	if (out[0] >= 0)
		close(out[0]);
	if (err[0] >= 0)
		close(err[0]);
	if (out[1] >= 0)
		close(out[1]);
	if (err[1] >= 0)
		close(err[1]);
	return ret;
}
