/*
 * store_trace.c — a run's trace-v1 file, from its rows in the store.
 *
 * Every decision appends its event's trace line in its own transaction,
 * written by the one trace writer (src/trace/write.c); a cancel from the
 * CLI, a stop by another replica and a budget's refusal are decisions like
 * the others. So the file is the lines as they are, after a comment naming
 * the run. A run created before the store kept traces (schema 5) has no
 * run line: it is rebuilt from the run's row, after an "# incomplete"
 * comment. GET /v1/runs/{id}/trace and `loopguard runs trace` both answer
 * with it.
 */
#include "../trace/trace.h"
#include "store.h"

int lg_store_run_trace(lg_store_t *s, const char *run_id, char **text, size_t *len,
                       lg_error_t *err) {
  *text = NULL;
  if (len) *len = 0;
  lg_run_record_t rec = {0};
  int rc = lg_store_run_get(s, run_id, &rec, err);
  if (rc) return rc;
  lg__buf_t raw = {0}, out = {0};
  if ((rc = lg__store_events_read(s, run_id, &raw, err))) goto done;
  int has_run = raw.len > 13 && !memcmp(raw.data, "{\"type\":\"run\"", 13);
  lg__buf_puts(&out, "# loopguard trace-v1 of run ");
  for (const char *p = run_id; *p; p++) lg__buf_putc(&out, *p == '\n' ? ' ' : *p);
  lg__buf_putc(&out, '\n');
  if (!has_run) { /* the run line, from the store */
    lg__buf_puts(&out, "# incomplete: this run was created before its store kept traces (schema "
                       "version 5), so the events decided before the upgrade are missing; "
                       "replaying this file may not reproduce every decision\n");
    lg__trace_write_run(&out, rec.run_id, rec.group, NULL, rec.policy_json ? rec.policy_json : "{}");
  }
  lg__buf_append(&out, raw.data, raw.len);
  if (out.oom) {
    rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
    goto done;
  }
  if (len) *len = out.len;
  *text = lg__buf_steal(&out, NULL);
  if (!*text) rc = lg__err(err, LG_ENOMEM, NULL, -1, "out of memory");
done:
  lg__buf_free(&raw);
  lg__buf_free(&out);
  lg_run_record_clear(&rec);
  return rc;
}
