/* SQLite connections and cached statements, shared by the inbox and the
 * embedded store. */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "util/util.h"

/*
 * "sqlite: 'FILE': what", naming the database (a state directory holds
 * several), with what to do when the file itself is damaged.
 */
char *
db_error(sqlite3 *db, int rc, const char *what)
{
	const char *path = sqlite3_db_filename(db, "main");

	rc &= 0xff;
	return xasprintf("sqlite: '%s': %s%s", path != NULL && *path != '\0' ?
	    path : ":memory:", what, rc == SQLITE_CORRUPT ||
	    rc == SQLITE_NOTADB ? " (the file is damaged: stop diverged, "
	    "then restore it from a backup, or salvage what it holds with "
	    "sqlite3 FILE .recover)" : "");
}

/* Run SQL. */
int
db_exec(sqlite3 *db, const char *sql, char **cause)
{
	char *err = NULL;
	int rc = sqlite3_exec(db, sql, NULL, NULL, &err);

	if (rc != SQLITE_OK) {
		if (cause != NULL)
			*cause = db_error(db, rc, err ? err :
			    sqlite3_errmsg(db));
		sqlite3_free(err);
		return -1;
	}
	return 0;
}

/* A cached prepared statement. */
sqlite3_stmt *
db_stmt(sqlite3 *db, const char *sql)
{
	sqlite3_stmt *st = NULL;

	while ((st = sqlite3_next_stmt(db, st)) != NULL)
		if (strcmp(sqlite3_sql(st), sql) == 0)
			break;
	if (st == NULL && sqlite3_prepare_v3(db, sql, -1,
	    SQLITE_PREPARE_PERSISTENT, &st, NULL) != SQLITE_OK)
		return NULL;
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
	return st;
}

/* Close with the cached statements. */
void
db_close(sqlite3 *db)
{
	sqlite3_stmt *st;

	if (db == NULL)
		return;
	while ((st = sqlite3_next_stmt(db, NULL)) != NULL)
		sqlite3_finalize(st);
	sqlite3_close(db);
}

int
db_step(sqlite3 *db, const char *sql)
{
	sqlite3_stmt *st = db_stmt(db, sql);
	int rc;

	if (st == NULL)
		return -1;
	rc = sqlite3_step(st);
	sqlite3_reset(st);
	return rc == SQLITE_DONE ? 0 : -1;
}

/* The integer a one-row PRAGMA answers into *v: 0, or -1 on error. */
static int
pragma_int(sqlite3 *db, const char *pragma, int64_t *v)
{
	sqlite3_stmt *st = NULL;
	int rc = -1;

	if (sqlite3_prepare_v2(db, pragma, -1, &st, NULL) == SQLITE_OK &&
	    sqlite3_step(st) == SQLITE_ROW) {
		*v = sqlite3_column_int64(st, 0);
		rc = 0;
	}
	sqlite3_finalize(st);
	return rc;
}

/*
 * Every database diverged writes says so (PRAGMA application_id "DIVG")
 * and carries the schema version of the diverged that last opened it
 * (PRAGMA user_version). One newer than this build's (an upgrade rolled
 * back) is refused: an older diverged does not know what the newer one
 * added, and would misread or break it. One stamped by another program
 * is refused too. A file from before the stamps (0, 0) or of an older
 * schema is stamped with this one's at open; the modules then migrate
 * their tables (idempotent: ALTER TABLE when a column is missing).
 * Whoever changes a table's layout raises DB_SCHEMA_VERSION and writes
 * its migration.
 */
static int
db_check_version(sqlite3 *db, const char *path, char **cause)
{
	int64_t app = 0, ver = 0;
	char *sql;
	int rc;

	if (pragma_int(db, "PRAGMA application_id", &app) < 0 ||
	    pragma_int(db, "PRAGMA user_version", &ver) < 0) {
		*cause = xasprintf("cannot read database '%s': %s", path,
		    sqlite3_errmsg(db));
		return -1;
	}
	if (app != 0 && app != DB_APPLICATION_ID) {
		*cause = xasprintf("database '%s' belongs to another program "
		    "(application_id 0x%08llx, not diverged's 0x%08x)", path,
		    (unsigned long long)(uint32_t)app, DB_APPLICATION_ID);
		return -1;
	}
	/* every diverged that set a user_version set its application_id */
	if (app == 0 && ver != 0) {
		*cause = xasprintf("database '%s' belongs to another program "
		    "(user_version %lld and no application_id; diverged's "
		    "is 0x%08x)", path, (long long)ver, DB_APPLICATION_ID);
		return -1;
	}
	if (ver > DB_SCHEMA_VERSION || ver < 0) {
		*cause = xasprintf("database '%s' was written by a newer "
		    "diverged (schema %lld; this one knows up to %d): run that "
		    "version again, or restore the backup made before the "
		    "upgrade", path, (long long)ver, DB_SCHEMA_VERSION);
		return -1;
	}
	if (app == DB_APPLICATION_ID && ver == DB_SCHEMA_VERSION)
		return 0;
	sql = xasprintf("PRAGMA application_id = %d; PRAGMA user_version = "
	    "%d;", DB_APPLICATION_ID, DB_SCHEMA_VERSION);
	rc = db_exec(db, sql, cause);
	free(sql);
	return rc;
}

/* Open in WAL mode with synchronous=FULL. */
int
db_open(const char *path, int manual_checkpoints, sqlite3 **out,
    char **cause)
{
	sqlite3 *db = NULL;

	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE |
	    SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
		*cause = xasprintf("cannot open database '%s': %s", path,
		    db ? sqlite3_errmsg(db) : "out of memory");
		sqlite3_close(db);
		return -1;
	}
	sqlite3_busy_timeout(db, 10000);
	/* first: a file refused is left as it was (WAL mode is persistent) */
	if (db_check_version(db, path, cause) < 0 ||
	    db_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;",
	    cause) < 0 || (manual_checkpoints &&
	    db_exec(db, "PRAGMA wal_autocheckpoint=0;", cause) < 0)) {
		sqlite3_close(db);
		return -1;
	}
	*out = db;
	return 0;
}
