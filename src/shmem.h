/*
 * shmem.h: the module's shared memory, requested while preloading.
 *
 * Each user asks once, from _PG_init, for a named block; one pair of hooks
 * reserves them all and initialises each the first time the server starts.
 */
#ifndef IDEM_SHMEM_H
#define IDEM_SHMEM_H

typedef void (*ShmemBlockInit) (void *block);
typedef Size (*ShmemBlockSize) (void);

/* *pointer is set when shared memory is attached; it stays NULL without preloading. */
void		shmem_request_block(const char *name, Size size, void **pointer, ShmemBlockInit init);

/*
 * The same for a block whose size depends on settings known only when shared
 * memory is requested (MaxBackends): size() is called then, once.
 */
void		shmem_request_block_sized(const char *name, ShmemBlockSize size, void **pointer,
									  ShmemBlockInit init);

#endif
