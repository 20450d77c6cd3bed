/* kvr_grow: resizing the heap arrays actors and the client keep (one way, not one per file). */
#ifndef KVR_GROW_H
#define KVR_GROW_H

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Resize the array *(void **)arrp to n elements of elem bytes. 0, or -ENOMEM with the
 * array untouched (still valid, still its old size). */
static inline int kvr_realloc_n(void *arrp, size_t n, size_t elem)
{
	void *p;
	memcpy(&p, arrp, sizeof(p));
	if (elem && n > (size_t)-1 / elem)
		return -ENOMEM;
	size_t bytes = n * elem;
	p = realloc(p, bytes ? bytes : 1);
	if (!p)
		return -ENOMEM;
	memcpy(arrp, &p, sizeof(p));
	return 0;
}

/* Make room for `need` elements in array `arr` of capacity `cap` (lvalues of any pointer
 * and integer type): the capacity doubles from `first` until it holds need. 0, or -ENOMEM
 * with both untouched. */
#define KVR_GROW(arr, cap, need, first)                                                    \
	({                                                                                 \
		int kvr_grow_rc_ = 0;                                                      \
		if ((size_t)(need) > (size_t)(cap)) {                                      \
			size_t kvr_grow_n_ = (cap) ? (size_t)(cap) : (size_t)(first);      \
			while (kvr_grow_n_ < (size_t)(need))                               \
				kvr_grow_n_ *= 2;                                          \
			kvr_grow_rc_ = kvr_realloc_n(&(arr), kvr_grow_n_, sizeof(*(arr))); \
			if (!kvr_grow_rc_)                                                 \
				(cap) = kvr_grow_n_;                                       \
		}                                                                          \
		kvr_grow_rc_;                                                              \
	})

#endif
