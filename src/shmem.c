/* shmem.c: one request hook and one startup hook for every shared block. */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"

#include "pg_compat.h"
#include "shmem.h"

#define MAX_BLOCKS 4

typedef struct ShmemBlock
{
	const char *name;
	Size		size;
	void	  **pointer;
	ShmemBlockInit init;
} ShmemBlock;

static ShmemBlock blocks[MAX_BLOCKS];
static int	block_count = 0;

static shmem_request_hook_type previous_request_hook = NULL;
static shmem_startup_hook_type previous_startup_hook = NULL;

static void
request_blocks(void)
{
	if (previous_request_hook)
		previous_request_hook();
	for (int i = 0; i < block_count; i++)
		RequestAddinShmemSpace(MAXALIGN(blocks[i].size));
}

static void
attach_blocks(void)
{
	bool		found;

	if (previous_startup_hook)
		previous_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	for (int i = 0; i < block_count; i++)
	{
		*blocks[i].pointer = ShmemInitStruct(blocks[i].name, blocks[i].size, &found);
		if (!found)
			blocks[i].init(*blocks[i].pointer);
	}
	LWLockRelease(AddinShmemInitLock);
}

void
shmem_request_block(const char *name, Size size, void **pointer, ShmemBlockInit init)
{
	if (block_count == MAX_BLOCKS)
		elog(ERROR, "idempotency: too many shared memory blocks");
	blocks[block_count++] = (ShmemBlock) {name, size, pointer, init};
	if (block_count > 1)
		return;
	previous_request_hook = shmem_request_hook;
	shmem_request_hook = request_blocks;
	previous_startup_hook = shmem_startup_hook;
	shmem_startup_hook = attach_blocks;
}

