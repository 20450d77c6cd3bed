/* kvringd's status page: the instance as one JSON document (GET /status) and as HTML (GET /). */
#ifndef KVR_STATUS_H
#define KVR_STATUS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cJSON.h>

#include "sup.h"

/*
 * Contract
 * --------
 * sup_status_collect() reads what v points at — the segments, counters and helpers /metrics
 * renders from (metrics_read.h), and the engine table kvringd copied into the view — into a
 * cJSON document of schema SUP_STATUS_SCHEMA (docs/status-page.md, field by field). The
 * caller holds the /metrics lock while it runs (the main thread maps a client area over its
 * place under it: sup_metrics_pause()); the document is private memory, so it may be printed
 * or rendered after the lock is released. now_real_ns is CLOCK_REALTIME (the uptime).
 * Nothing read from the segment is trusted: names are cut at their field size and bytes
 * outside printable ASCII become '?'. Returns the document (the caller cJSON_Delete()s it),
 * or NULL: out of memory.
 *
 * sup_status_html() renders such a document as one self-contained HTML page: inline CSS, no
 * script, no external resource; the data is in the markup, so a browser without JavaScript
 * (or `chromium --dump-dom`) shows all of it. Every string of the document goes through
 * sup_html_escape(). Returns a NUL-terminated buffer the caller frees, with its length in
 * *ret_len, or NULL: out of memory.
 *
 * sup_html_escape() writes s to f with & < > " ' as character references, so it is safe in
 * element content and in quoted attribute values.
 */

#define SUP_STATUS_SCHEMA 1

cJSON *sup_status_collect(const struct sup_metrics_view *v, uint64_t now_real_ns);
char *sup_status_html(const cJSON *doc, size_t *ret_len);
void sup_html_escape(FILE *f, const char *s);

#endif
