/* key_lock.c: locks on key identities: tried by claims, waited for by a lease holder or a claim with a wait. */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/lock.h"

#include "key_lock.h"

static void
key_lock_tag(LOCKTAG *tag, const uint8 identity[IDEM_SHA256_BYTES])
{
	uint64		bits = idem_core_lock_tag(identity);

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (bits >> 32), (uint32) bits,
						 IDEM_LOCK_OBJSUBID);
}

KeyLockResult
key_lock_try(const uint8 identity[IDEM_SHA256_BYTES])
{
	LOCKTAG		tag;

	key_lock_tag(&tag, identity);
	switch (LockAcquire(&tag, ExclusiveLock, false, true))
	{
		case LOCKACQUIRE_NOT_AVAIL:
			return KEY_LOCK_BUSY;
		case LOCKACQUIRE_ALREADY_HELD:
		case LOCKACQUIRE_ALREADY_CLEAR:
			return KEY_LOCK_ALREADY_OURS;
		case LOCKACQUIRE_OK:
			break;
	}
	return KEY_LOCK_TAKEN;
}

void
key_lock_release(const uint8 identity[IDEM_SHA256_BYTES])
{
	LOCKTAG		tag;

	key_lock_tag(&tag, identity);
	LockRelease(&tag, ExclusiveLock, false);
}

void
key_lock_wait(const uint8 identity[IDEM_SHA256_BYTES])
{
	LOCKTAG		tag;

	key_lock_tag(&tag, identity);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
}
