/*
 * in_flight.c: per-backend slots of the keys claimed and not yet completed.
 * in_flight_list.c lists them for idem_keys_in_flight_claims().
 *
 * Writing (the claiming backend, in txn_claims.c's step) takes no lock: the
 * owner bumps its slot's change counter, copies the entry, bumps it again.
 * A reader copies a slot and retries until the counter was even and the same
 * before and after, as PgBackendStatus is read for pg_stat_activity.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "idem_core.h"
#include "in_flight.h"
#include "pg_compat.h"
#include "shmem.h"

typedef struct InFlightKey
{
	TimestampTz since;
	uint16		scope_len;
	uint16		key_len;
	char		scope[IDEM_MAX_SCOPE_BYTES];
	char		key[IDEM_MAX_KEY_BYTES];
} InFlightKey;

typedef struct InFlightSlot
{
	int			changecount;	/* odd while the owner writes */
	int			pid;			/* 0: no backend uses the slot */
	Oid			database;
	int			listed;			/* keys[0 .. listed) */
	int			unlisted;		/* held claims beyond the listed ones */
	TimestampTz unlisted_since; /* when the first of them was claimed */
	InFlightKey keys[IN_FLIGHT_KEYS_PER_BACKEND];
} InFlightSlot;

typedef struct InFlightShared
{
	int			slot_count;
	InFlightSlot slots[FLEXIBLE_ARRAY_MEMBER];
} InFlightShared;

static InFlightShared *shared = NULL;

/* This backend's slot, taken at its first claim, and the identities of its listed keys. */
static InFlightSlot *my_slot = NULL;
static uint8 listed_identity[IN_FLIGHT_KEYS_PER_BACKEND][IDEM_SHA256_BYTES];

/* The owner's write bracket: no error can happen inside (a critical section, as for pgstat). */
#define BEGIN_SLOT_WRITE(slot) \
	do { \
		START_CRIT_SECTION(); \
		(slot)->changecount++; \
		pg_write_barrier(); \
	} while (0)
#define END_SLOT_WRITE(slot) \
	do { \
		pg_write_barrier(); \
		(slot)->changecount++; \
		END_CRIT_SECTION(); \
	} while (0)

static Size
in_flight_size(void)
{
	return add_size(offsetof(InFlightShared, slots), mul_size(MaxBackends, sizeof(InFlightSlot)));
}

static void
init_in_flight(void *block)
{
	InFlightShared *in_flight = block;

	memset(in_flight, 0, in_flight_size());
	in_flight->slot_count = MaxBackends;
}

void
in_flight_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	shmem_request_block_sized("idempotency keys in flight", in_flight_size, (void **) &shared,
							  init_in_flight);
}

static void
release_slot(int code, Datum arg)
{
	InFlightSlot *slot = my_slot;

	if (slot == NULL)
		return;
	BEGIN_SLOT_WRITE(slot);
	slot->pid = 0;
	slot->listed = 0;
	slot->unlisted = 0;
	END_SLOT_WRITE(slot);
	my_slot = NULL;
}

/* This backend's slot; NULL without shared memory or for a process without a backend number. */
static InFlightSlot *
own_slot(void)
{
	int			index;
	InFlightSlot *slot;

	if (my_slot != NULL || shared == NULL)
		return my_slot;
	index = idem_my_backend_index();
	if (index < 0 || index >= shared->slot_count)
		return NULL;
	slot = &shared->slots[index];
	BEGIN_SLOT_WRITE(slot);
	slot->pid = MyProcPid;
	slot->database = MyDatabaseId;
	slot->listed = 0;
	slot->unlisted = 0;
	END_SLOT_WRITE(slot);
	my_slot = slot;
	before_shmem_exit(release_slot, (Datum) 0);
	return slot;
}

void
in_flight_publish(const uint8 identity[IDEM_SHA256_BYTES], const char *scope, int scope_len,
				  const char *key, int key_len, TimestampTz since)
{
	InFlightSlot *slot = own_slot();
	int			position;

	if (slot == NULL)
		return;
	position = slot->listed;
	BEGIN_SLOT_WRITE(slot);
	if (position < IN_FLIGHT_KEYS_PER_BACKEND)
	{
		InFlightKey *entry = &slot->keys[position];

		entry->since = since;
		entry->scope_len = Min(scope_len, IDEM_MAX_SCOPE_BYTES);
		entry->key_len = Min(key_len, IDEM_MAX_KEY_BYTES);
		memcpy(entry->scope, scope, entry->scope_len);
		memcpy(entry->key, key, entry->key_len);
		slot->listed = position + 1;
	}
	else if (slot->unlisted++ == 0)
		slot->unlisted_since = since;
	END_SLOT_WRITE(slot);
	if (position < IN_FLIGHT_KEYS_PER_BACKEND)
		memcpy(listed_identity[position], identity, IDEM_SHA256_BYTES);
}

void
in_flight_unpublish(const uint8 identity[IDEM_SHA256_BYTES])
{
	InFlightSlot *slot = my_slot;
	int			last;
	int			position;

	if (slot == NULL)
		return;
	last = slot->listed - 1;
	for (position = last; position >= 0; position--)
		if (memcmp(listed_identity[position], identity, IDEM_SHA256_BYTES) == 0)
			break;
	if (position < 0 && slot->unlisted == 0)
		return;
	BEGIN_SLOT_WRITE(slot);
	if (position < 0)
		slot->unlisted--;
	else
	{
		/* The last entry fills the gap. */
		if (position != last)
			memcpy(&slot->keys[position], &slot->keys[last], sizeof(InFlightKey));
		slot->listed = last;
	}
	END_SLOT_WRITE(slot);
	if (position >= 0 && position != last)
		memcpy(listed_identity[position], listed_identity[last], IDEM_SHA256_BYTES);
}

void
in_flight_clear(void)
{
	InFlightSlot *slot = my_slot;

	if (slot == NULL || (slot->listed == 0 && slot->unlisted == 0))
		return;
	BEGIN_SLOT_WRITE(slot);
	slot->listed = 0;
	slot->unlisted = 0;
	END_SLOT_WRITE(slot);
}

/* ---------- reading ---------- */

/* A consistent copy of a slot: its header, and its keys if it is a backend of this database. */
static void
read_slot(InFlightSlot *slot, InFlightSlot *copy)
{
	for (;;)
	{
		int			before;
		int			after;

		before = slot->changecount;
		pg_read_barrier();
		copy->pid = slot->pid;
		copy->database = slot->database;
		copy->listed = Max(0, Min(slot->listed, IN_FLIGHT_KEYS_PER_BACKEND));
		copy->unlisted = slot->unlisted;
		copy->unlisted_since = slot->unlisted_since;
		if (copy->pid != 0 && copy->database == MyDatabaseId)
			memcpy(copy->keys, slot->keys, copy->listed * sizeof(InFlightKey));
		pg_read_barrier();
		after = slot->changecount;
		if (before == after && (before & 1) == 0)
			return;
		CHECK_FOR_INTERRUPTS();
	}
}

bool
in_flight_read_claims(InFlightClaim **claims, int *count)
{
	InFlightSlot *copy;
	InFlightClaim *rows = NULL;
	int			capacity = 0;

	*claims = NULL;
	*count = 0;
	if (shared == NULL)
		return false;
	copy = palloc(sizeof(InFlightSlot));
	for (int i = 0; i < shared->slot_count; i++)
	{
		read_slot(&shared->slots[i], copy);
		if (copy->pid == 0 || copy->database != MyDatabaseId)
			continue;
		if (*count + copy->listed + copy->unlisted > capacity)
		{
			capacity = Max(2 * capacity, *count + copy->listed + copy->unlisted + 16);
			rows = rows ? repalloc(rows, sizeof(InFlightClaim) * capacity)
				: palloc(sizeof(InFlightClaim) * capacity);
		}
		for (int k = 0; k < copy->listed; k++)
		{
			InFlightClaim *row = &rows[(*count)++];

			row->scope = cstring_to_text_with_len(copy->keys[k].scope, copy->keys[k].scope_len);
			row->key = cstring_to_text_with_len(copy->keys[k].key, copy->keys[k].key_len);
			row->pid = copy->pid;
			row->since = copy->keys[k].since;
		}
		for (int k = 0; k < copy->unlisted; k++)
		{
			InFlightClaim *row = &rows[(*count)++];

			row->scope = NULL;
			row->key = NULL;
			row->pid = copy->pid;
			row->since = copy->unlisted_since;
		}
	}
	pfree(copy);
	*claims = rows;
	return true;
}
