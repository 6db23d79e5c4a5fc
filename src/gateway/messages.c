/*
 * messages.c — the Anthropic Messages wire format of the gateway (POST
 * /v1/messages): the stop's final message, the reader of an upstream
 * stream (text blocks forwarded with the client's indices, tool_use blocks
 * held until decided) and the end of the client's stream (message_delta,
 * message_stop). The conversation itself is chat.c's.
 */
#include "conv.h"

#include <stdio.h>

/* Writes one Anthropic SSE event. */
static void a_event(chat_t *c, const char *type, json_t *data) {
  char *t = data ? lg__json_text(data, NULL) : NULL;
  lg__buf_t b = {0};
  lg__buf_printf(&b, "event: %s\ndata: %s\n\n", type, t ? t : "{}");
  if (b.data) lg__gw_stream_write(c->j, b.data, b.len);
  lg__buf_free(&b);
  lg__free(t);
  json_decref(data);
}

static void a_message_start(chat_t *c, const char *model) {
  if (c->a_started) return;
  c->a_started = 1;
  char id[64];
  snprintf(id, sizeof id, "msg_lg%lld", (long long)now_ms(c->cx));
  json_t *m = c->a_msg ? json_incref(c->a_msg)
                       : json_pack("{s:s, s:s, s:s, s:[], s:s, s:n, s:n, s:o}", "id", id, "type",
                                   "message", "role", "assistant", "content", "model", model,
                                   "stop_reason", "stop_sequence", "usage", lg__gwc_usage(c, 0, 0));
  a_event(c, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message", m));
}

/* The text block the client has open (a stream cut in the middle), closed. */
static void a_close_open(chat_t *c) {
  if (c->a_open < 0) return;
  a_event(c, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", c->a_open));
  c->a_open = -1;
}

/* The message's end: the upstream's last message_delta as it came (its
 * stop_sequence, its usage's cache tokens, a code execution's container),
 * with our stop_reason (its stop_sequence only when it is the upstream's)
 * and the output tokens of every answer read. */
static void a_message_end(chat_t *c, const char *stop_reason) {
  a_close_open(c);
  json_t *d = json_object(), *u = json_object();
  json_object_update(d, json_object_get(c->a_delta, "delta"));
  json_object_update(u, json_object_get(c->a_delta, "usage"));
  const char *had = sget(d, "stop_reason");
  int same = had && !strcmp(had, stop_reason);
  json_object_set_new(d, "stop_reason", json_string(stop_reason));
  if (!same || !json_object_get(d, "stop_sequence")) json_object_set_new(d, "stop_sequence", json_null());
  json_object_set_new(u, "output_tokens", json_integer((json_int_t)c->a_out_tokens));
  a_event(c, "message_delta", json_pack("{s:s, s:o, s:o}", "type", "message_delta", "delta", d, "usage", u));
  a_event(c, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}

void lg__gwm_final(chat_t *c, const char *text, const char *model) {
  if (c->stream) {
    lg__gwc_begin_stream(c);
    a_message_start(c, model);
    a_close_open(c);
    int i = c->a_index++;
    a_event(c, "content_block_start",
            json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start", "index", i,
                      "content_block", "type", "text", "text", ""));
    a_event(c, "content_block_delta",
            json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", i, "delta",
                      "type", "text_delta", "text", text));
    a_event(c, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", i));
    a_message_end(c, "end_turn");
    return;
  }
  char id[64];
  snprintf(id, sizeof id, "msg_lg%lld", (long long)now_ms(c->cx));
  json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s}], s:s, s:n, s:o}", "id", id, "type",
                        "message", "role", "assistant", "model", model, "content", "type", "text",
                        "text", text, "stop_reason", "end_turn", "stop_sequence", "usage",
                        lg__gwc_usage(c, 0, 0));
  lg__gwc_answer_body(c, o);
  json_decref(o);
}



/* A thinking block of the upstream's stream begins (forwarded as it
 * comes, and kept: restored_items may need it). */
static void think_start(chat_t *c, json_t *cb, json_int_t idx) {
  if (!c->reasoning) c->reasoning = json_array();
  json_array_append_new(c->reasoning, json_deep_copy(cb));
  c->think_at = idx;
  c->think[0].len = c->think[1].len = 0;
}

/* A delta of the open thinking block; its stop fills the kept block in. */
static void think_delta(chat_t *c, const char *type, json_t *d) {
  static const char *const keys[2] = {"thinking", "signature"};
  json_t *bl = json_array_get(c->reasoning, json_array_size(c->reasoning) - 1);
  if (!strcmp(type, "content_block_stop")) {
    for (int i = 0; i < 2; i++)
      if (c->think[i].len && !c->think[i].oom)
        json_object_set_new(bl, keys[i], json_stringn(c->think[i].data, c->think[i].len));
    c->think_at = -1;
    return;
  }
  const char *dt = sget(d, "type");
  int i = !dt ? -1 : !strcmp(dt, "thinking_delta") ? 0 : !strcmp(dt, "signature_delta") ? 1 : -1;
  const char *part = i < 0 ? NULL : sget(d, keys[i]);
  if (!part) return;
  size_t n = strlen(part);
  c->held_bytes += n; /* within the answer's bound, as held calls are */
  lg__buf_append(&c->think[i], part, n);
}

static void a_forward(chat_t *c, const char *type, json_t *ch, int index) {
  json_t *cp = json_copy(ch);
  if (index >= 0) json_object_set_new(cp, "index", json_integer(index));
  a_event(c, type, cp);
}

int lg__gwm_on_event(chat_t *c, const char *data, size_t n, const char *raw, size_t rawn) {
  (void)raw, (void)rawn;
  json_t *ch = lg__gwc_event_json(c, data, n);
  if (!ch) return 0; /* not JSON: dropped */
  const char *type = sget(ch, "type");
  json_int_t idx = json_integer_value(json_object_get(ch, "index"));
  if (!type) {
  } else if (!strcmp(type, "message_start")) {
    json_t *m = json_object_get(ch, "message");
    if (!c->a_msg && json_is_object(m)) c->a_msg = json_incref(m);
    json_decref(c->usage); /* the answer's usage: input (and cache) tokens here, output to come */
    json_t *mu = json_object_get(m, "usage");
    c->usage = json_is_object(mu) ? json_copy(mu) : json_object();
    json_object_del(c->usage, "output_tokens");
    a_message_start(c, c->model ? c->model : "");
  } else if (!strcmp(type, "content_block_start")) {
    json_t *cb = json_object_get(ch, "content_block");
    const char *ty = sget(cb, "type");
    char k[32];
    snprintf(k, sizeof k, "%lld", (long long)idx);
    if (ty && !strcmp(ty, "tool_use")) { /* held until decided: its members as they came (its
                                             caller too), its input from the deltas (_args) */
      int t = (int)json_array_size(c->tcalls);
      json_t *tu = json_copy(cb);
      json_object_del(tu, "input");
      if (!sget(tu, "id")) json_object_set_new(tu, "id", json_string(""));
      if (!sget(tu, "name")) json_object_set_new(tu, "name", json_string(""));
      json_object_set_new(tu, "_args", json_string(""));
      json_array_append_new(c->tcalls, tu);
      json_object_set_new(c->a_map, k, json_integer(-1 - t));
    } else {
      if (ty && (!strcmp(ty, "thinking") || !strcmp(ty, "redacted_thinking")))
        think_start(c, cb, idx);
      int ci = c->a_index++;
      json_object_set_new(c->a_map, k, json_integer(ci));
      a_forward(c, type, ch, ci);
      c->a_open = ci;
    }
  } else if (!strcmp(type, "content_block_delta") || !strcmp(type, "content_block_stop")) {
    int m = lg__gwc_map_get(c, idx);
    json_t *d = json_object_get(ch, "delta");
    if (m <= -1 && m > -1000000) {
      json_t *tu = json_array_get(c->tcalls, (size_t)(-1 - m));
      const char *pj = sget(d, "partial_json");
      if (tu && pj) lg__gwc_held(c, (size_t)(-1 - m), LG__HELD_ARGS, pj, strlen(pj));
    } else if (m >= 0) {
      if (c->think_at == idx) think_delta(c, type, d);
      const char *tx = sget(d, "text");
      if (tx) lg__buf_puts(&c->text, tx);
      if (tx && (c->cut = lg__gwc_feed_text(c, 0))) { /* a text loop: cut here */
        json_decref(ch);
        return 1;
      }
      a_forward(c, type, ch, m);
      if (!strcmp(type, "content_block_stop") && m == c->a_open) c->a_open = -1;
    }
  } else if (!strcmp(type, "message_delta")) {
    json_decref(c->a_delta);
    c->a_delta = json_incref(ch);
    const char *sr = sget(json_object_get(ch, "delta"), "stop_reason");
    if (sr) {
      lg__free(c->finish);
      c->finish = lg__strdup(sr);
    }
    /* the message's usage so far (the API's newer ones restate its input
     * and cache tokens here too) */
    json_t *du = json_object_get(ch, "usage"), *ot = json_object_get(du, "output_tokens");
    if (json_is_integer(ot)) c->a_out_tokens = lg__add_sat(c->a_out_tokens, json_integer_value(ot));
    if (c->usage && json_is_object(du)) json_object_update(c->usage, du);
  } else if (!strcmp(type, "message_stop")) {
    c->saw_done = 1;
  } else { /* ping, error: as they came */
    if (!strcmp(type, "error")) c->saw_error = 1;
    a_event(c, type, json_incref(ch));
  }
  json_decref(ch);
  return 0;
}

/* Messages: the kept tool_use blocks, each whole, with the client's indices. */
void lg__gwm_emit_kept(chat_t *c, json_t *kept) {
  a_close_open(c);
  json_t *blocks = json_array();
  for (size_t i = 0; i < json_array_size(kept); i++) {
    json_t *tu = json_array_get(kept, i);
    int ci = c->a_index++;
    json_t *cb = json_copy(tu); /* as it came, its input to come as a delta */
    json_object_del(cb, "_args");
    json_object_set_new(cb, "input", json_object());
    a_event(c, "content_block_start",
            json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", ci, "content_block", cb));
    a_event(c, "content_block_delta",
            json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index", ci,
                      "delta", "type", "input_json_delta", "partial_json", sget(tu, "_args")));
    a_event(c, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", ci));
    json_array_append_new(blocks, json_pack("{s:s, s:s}", "type", "tool_use", "id", sget(tu, "id")));
  }
  json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", blocks);
  lg__gwc_register_key(c, m);
  json_decref(m);
  /* tool_use, unless the upstream said max_tokens: its last call was cut
   * off (its input is not whole), and the client is told so, as an answer
   * not streamed tells it (earlier builds said tool_use: a cut call
   * presented as complete) */
  if (c->finish && !strcmp(c->finish, "max_tokens")) return;
  lg__free(c->finish);
  c->finish = lg__strdup("tool_use");
}

void lg__gwm_end_stream(chat_t *c) {
  a_message_start(c, c->model ? c->model : "");
  const char *fin = c->finish && strcmp(c->finish, "tool_use") ? c->finish : "end_turn";
  if (c->finish && !strcmp(c->finish, "tool_use")) {
    /* tool_use only when calls were emitted: finish_stream says so */
    fin = "tool_use";
  }
  a_message_end(c, fin);
}
static int is_tool_use(const char *ty) { return ty && !strcmp(ty, "tool_use"); }
json_t *lg__gwm_tool_uses(json_t *msg) { return lg__gwc_items_of_type(msg, "content", is_tool_use); }
void lg__gwm_keep_blocks(json_t *msg, json_t *kept) { lg__gwc_keep_only(msg, "content", is_tool_use, kept); }
json_t *lg__gwm_thinking(json_t *msg) {
  json_t *out = json_array(), *blocks = json_object_get(msg, "content");
  for (size_t i = 0; i < json_array_size(blocks); i++) {
    const char *ty = sget(json_array_get(blocks, i), "type");
    if (ty && (!strcmp(ty, "thinking") || !strcmp(ty, "redacted_thinking")))
      json_array_append(out, json_array_get(blocks, i));
  }
  return out;
}
