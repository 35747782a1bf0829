/* SQLite connections and cached statements, shared by the inbox and the
 * embedded store. */
#include "config.h"

#include <string.h>

#include <sqlite3.h>

#include "util/util.h"

/* Run SQL. */
int
db_exec(sqlite3 *db, const char *sql, char **cause)
{
	char *err = NULL;

	if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) {
		if (cause != NULL)
			*cause = xasprintf("sqlite: %s", err ? err :
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
	if (db_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;",
	    cause) < 0 || (manual_checkpoints &&
	    db_exec(db, "PRAGMA wal_autocheckpoint=0;", cause) < 0)) {
		sqlite3_close(db);
		return -1;
	}
	*out = db;
	return 0;
}
