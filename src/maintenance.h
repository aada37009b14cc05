/*
 * maintenance.h: what the worker and idem_cleanup() run on behalf of a database runs as the table's owner, in a
 * security-restricted operation, with every setting that could change its meaning pinned (maintenance.c).
 */
#ifndef IDEM_MAINTENANCE_H
#define IDEM_MAINTENANCE_H

/*
 * The version of the SQL objects this library is built for: the Makefile's EXTVERSION, which it passes as
 * IDEM_EXTVERSION, so the two cannot disagree (a build without it stops here).
 */
#ifndef IDEM_EXTVERSION
#error "IDEM_EXTVERSION is not defined: build with the extension's Makefile, which passes -DIDEM_EXTVERSION"
#endif
#define IDEM_LIBRARY_VERSION IDEM_EXTVERSION

typedef struct Maintenance
{
	Oid			saved_user;
	int			saved_security_context;
	int			guc_nest_level;
} Maintenance;

/* Becomes relid's owner with the maintenance settings, in a GUC nest level of its own. */
void		maintenance_begin(Oid relid, Maintenance *maintenance);

/* Restores the user and the settings; an ERROR in between restores them with the (sub)transaction's abort. */
void		maintenance_end(const Maintenance *maintenance);

/* The lock timeout every maintenance step runs under (a net under the shorter ones the steps set). */
#define MAINTENANCE_LOCK_TIMEOUT "1s"

/* How long a sweep step waits for its table's lock before it passes the table by, in milliseconds. */
#define MAINTENANCE_TABLE_LOCK_WAIT_MS 200

/*
 * Takes a lock on a relation, waiting at most MAINTENANCE_TABLE_LOCK_WAIT_MS (polling a conditional lock on the
 * latch, so no lock queue forms behind it either). False when another session holds a conflicting lock all that time.
 */
bool		maintenance_lock_relation(Oid relid, LOCKMODE mode);

/* The extension's SQL version in this database (palloc'd), or NULL when it is not installed; needs SPI. */
char	   *maintenance_sql_version(void);

/*
 * A relation or function of the extension, found by name in the extension's schema and accepted only if the
 * extension owns it (its membership in pg_depend): InvalidOid otherwise. A function is matched by its exact
 * argument types, so an overload never stands in for it.
 */
Oid			maintenance_member_relation(Oid schema, const char *name);
Oid			maintenance_member_function(Oid schema, const char *name, int nargs, const Oid *argtypes);

#endif
