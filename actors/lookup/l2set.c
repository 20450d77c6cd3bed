/* l2set: the (key, lane) set's table — growing it, adding and removing pairs (lookups are inline in l2set.h). */
#include "l2set.h"

#include <errno.h>
#include <stdlib.h>

static int set_grow(struct l2set *s)
{
	uint32_t cap = s->cap ? s->cap * 2 : 1024;
	struct l2ent *old = s->e, *n = calloc(cap, sizeof(*n));
	if (!n)
		return -ENOMEM;
	uint32_t old_cap = s->cap;
	s->e = n;
	s->cap = cap;
	s->n = s->dead = 0;
	for (uint32_t i = 0; i < old_cap; i++)
		if (old[i].used && !old[i].dead) {
			struct l2ent *e = l2set_find(s, (kvr_key){old[i].lo, old[i].hi}, old[i].lane, true);
			*e = old[i];
			s->n++;
		}
	free(old);
	return 0;
}

int l2set_open(struct l2set *s)
{
	*s = (struct l2set){0};
	return set_grow(s);
}

void l2set_close(struct l2set *s)
{
	free(s->e);
	*s = (struct l2set){0};
}

void l2set_add(struct l2set *s, kvr_key k, unsigned lane, uint8_t model)
{
	if ((s->n + s->dead + 1) * 2 > s->cap && set_grow(s))
		return; /* out of memory: the block is simply not known to be on disk */
	struct l2ent *e = l2set_find(s, k, lane, true);
	if (e && e->used && !e->dead && e->model == L2SET_UNKNOWN && model != L2SET_UNKNOWN) {
		s->by_model[e->model]--;
		s->by_model[model]++;
		e->model = model; /* now we know whose it is */
	}
	if (!e || (e->used && !e->dead))
		return;
	if (e->dead)
		s->dead--;
	*e = (struct l2ent){.lo = k.lo, .hi = k.hi, .lane = (uint16_t)lane, .used = 1, .model = model};
	s->n++;
	s->by_model[model]++;
}

void l2set_del(struct l2set *s, kvr_key k, unsigned lane)
{
	struct l2ent *e = l2set_find(s, k, lane, false);
	if (!e)
		return;
	e->dead = 1;
	s->n--;
	s->dead++;
	s->by_model[e->model]--;
}
