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
	ShmemBlockSize size_at_request;	/* or NULL: size is fixed */
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
	{
		if (blocks[i].size_at_request)
			blocks[i].size = blocks[i].size_at_request();
		RequestAddinShmemSpace(MAXALIGN(blocks[i].size));
	}
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
		/* A backend started by exec (not fork) did not run the request hook. */
		if (blocks[i].size_at_request && blocks[i].size == 0)
			blocks[i].size = blocks[i].size_at_request();
		*blocks[i].pointer = ShmemInitStruct(blocks[i].name, blocks[i].size, &found);
		if (!found)
			blocks[i].init(*blocks[i].pointer);
	}
	LWLockRelease(AddinShmemInitLock);
}

static void
request_block(const char *name, Size size, ShmemBlockSize size_at_request, void **pointer,
			  ShmemBlockInit init)
{
	if (block_count == MAX_BLOCKS)
		elog(ERROR, "idempotency: too many shared memory blocks");
	blocks[block_count++] = (ShmemBlock) {name, size, size_at_request, pointer, init};
	if (block_count > 1)
		return;
	previous_request_hook = shmem_request_hook;
	shmem_request_hook = request_blocks;
	previous_startup_hook = shmem_startup_hook;
	shmem_startup_hook = attach_blocks;
}

void
shmem_request_block(const char *name, Size size, void **pointer, ShmemBlockInit init)
{
	request_block(name, size, NULL, pointer, init);
}

void
shmem_request_block_sized(const char *name, ShmemBlockSize size, void **pointer, ShmemBlockInit init)
{
	request_block(name, 0, size, pointer, init);
}
