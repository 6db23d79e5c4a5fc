/*
 * responses.c — the OpenAI Responses wire format of the gateway (POST
 * /v1/responses): the stop's final response, the reader of an upstream
 * stream (events renumbered with the client's sequence_number and
 * output_index, function_call items held until decided) and the end of
 * the client's stream (response.completed listing only the calls the
 * client may run). The conversation itself is chat.c's.
 */
#include "conv.h"

#include <stdio.h>

static void r_final_stream(chat_t *c, const char *text, json_t *resp);

void lg__gwr_final(chat_t *c, const char *text, const char *model) {
  char id[64], mid[64];
  int64_t t = now_ms(c->cx);
  lg__gwc_own_id(c, id, sizeof id);
  lg__gwc_own_response(c, id, text);
  snprintf(mid, sizeof mid, "msg_lg%lld", (long long)t);
  json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[{s:s, s:s, s:s, s:s, s:[{s:s, s:s, s:[]}]}],"
                        " s:n, s:n, s:o}",
                        "id", id, "object", "response", "created_at", (json_int_t)(t / 1000),
                        "status", "completed", "model", model, "output", "type", "message", "id", mid,
                        "status", "completed", "role", "assistant", "content", "type", "output_text",
                        "text", text, "annotations", "error", "incomplete_details", "usage",
                        /* this request's last answer's, or a cut's (cut_told) */
                        c->usage ? json_incref(c->usage) : lg__gwc_usage(c, 0, 0));
  lg__gwc_register_key(c, o);
  if (c->stream) {
    lg__gwc_begin_stream(c);
    r_final_stream(c, text, o);
    json_decref(o);
    return;
  }
  lg__gwc_answer_body(c, o);
  json_decref(o);
}

/* The lg__gwr_output_text of a Responses output (new). */
char *lg__gwr_output_text(json_t *resp) {
  lg__buf_t b = {0};
  lg__buf_puts(&b, "");
  json_t *items = json_object_get(resp, "output");
  for (size_t i = 0; i < json_array_size(items); i++) {
    json_t *ct = json_object_get(json_array_get(items, i), "content");
    for (size_t k = 0; k < json_array_size(ct); k++) {
      const char *ty = sget(json_array_get(ct, k), "type"), *tx = sget(json_array_get(ct, k), "text");
      if (ty && tx && !strcmp(ty, "output_text")) lg__buf_puts(&b, tx); /* a text not a string: none */
    }
  }
  return lg__buf_steal(&b, NULL);
}


/* Writes one Responses event with the client's own sequence number. */
void lg__gwr_event(chat_t *c, json_t *ev) {
  const char *type = sget(ev, "type");
  json_object_set_new(ev, "sequence_number", json_integer(c->r_seq++));
  char *t = lg__json_text(ev, NULL);
  lg__buf_t b = {0};
  lg__buf_printf(&b, "event: %s\ndata: %s\n\n", type ? type : "message", t ? t : "{}");
  if (b.data) lg__gw_stream_write(c->j, b.data, b.len);
  lg__buf_free(&b);
  lg__free(t);
  json_decref(ev);
}

int lg__gwr_on_event(chat_t *c, const char *data, size_t n) {
  json_t *ev = lg__gwc_event_json(c, data, n);
  if (!ev) return 0; /* not JSON: dropped */
  const char *type = sget(ev, "type");
  json_int_t oi = json_integer_value(json_object_get(ev, "output_index"));
  char k[32];
  snprintf(k, sizeof k, "%lld", (long long)oi);
  if (!type) {
    json_decref(ev);
  } else if (!strcmp(type, "response.created") || !strcmp(type, "response.in_progress")) {
    if (c->r_started > 1 || (c->r_started && !strcmp(type, "response.created"))) json_decref(ev);
    else {
      c->r_started++;
      lg__gwr_event(c, ev);
    }
  } else if (!strcmp(type, "response.completed") || !strcmp(type, "response.incomplete")) {
    json_decref(c->r_done);
    c->r_done = json_incref(json_object_get(ev, "response"));
    json_decref(c->usage);
    c->usage = json_incref(json_object_get(c->r_done, "usage"));
    c->saw_done = 1;
    json_decref(ev);
  } else if (!strcmp(type, "response.output_item.added")) {
    json_t *it = json_object_get(ev, "item");
    const char *ity = sget(it, "type");
    if (lg__gwr_is_call(ity)) { /* held until decided */
      json_object_set_new(c->a_map, k, json_integer(-1));
      json_decref(ev);
    } else {
      int ci = c->r_index++;
      json_object_set_new(c->a_map, k, json_integer(ci));
      json_object_set_new(ev, "output_index", json_integer(ci));
      if (ity && !strcmp(ity, "message")) { /* open until its output_item.done */
        c->r_open = ci;
        json_decref(c->r_open_item);
        c->r_open_item = json_deep_copy(it);
      }
      lg__gwr_event(c, ev);
    }
  } else if (json_object_get(ev, "output_index")) {
    int m = lg__gwc_map_get(c, oi);
    if (m < 0) {
      json_decref(ev); /* a held call's deltas, or an item never announced */
    } else {
      const char *d = !strcmp(type, "response.output_text.delta") ? sget(ev, "delta") : NULL;
      if (d) lg__buf_puts(&c->text, d);
      if (d && (c->cut = lg__gwc_feed_text(c, 0))) { /* a text loop: cut here */
        json_decref(ev);
        return 1;
      }
      if (d) c->r_sent = c->text.len;
      if (!strcmp(type, "response.output_item.done") && m == c->r_open) c->r_open = -1;
      json_object_set_new(ev, "output_index", json_integer(m));
      lg__gwr_event(c, ev);
    }
  } else { /* errors and the rest: as they came */
    if (!strcmp(type, "error") || !strcmp(type, "response.failed")) c->saw_error = 1;
    lg__gwr_event(c, ev);
  }
  return 0;
}

/* The message item the client has open (a stream cut in the middle),
 * completed with the text it got (its deltas: not the one that made the
 * cut, which the run read and the client never got); that item (new), or
 * NULL. */
static json_t *r_close_open(chat_t *c) {
  if (c->r_open < 0 || !c->r_open_item) return NULL;
  const char *id = sget(c->r_open_item, "id");
  json_t *text = json_stringn(c->text.data ? c->text.data : "", c->text.data ? c->r_sent : 0);
  int oi = c->r_open;
  c->r_open = -1;
  lg__gwr_event(c, json_pack("{s:s, s:s?, s:i, s:i, s:O}", "type", "response.output_text.done", "item_id", id,
                       "output_index", oi, "content_index", 0, "text", text));
  json_t *part = json_pack("{s:s, s:o, s:[]}", "type", "output_text", "text", text, "annotations");
  lg__gwr_event(c, json_pack("{s:s, s:s?, s:i, s:i, s:O}", "type", "response.content_part.done", "item_id", id,
                       "output_index", oi, "content_index", 0, "part", part));
  json_t *item = json_deep_copy(c->r_open_item);
  json_object_set_new(item, "status", json_string("completed"));
  json_object_set_new(item, "content", json_pack("[O]", part));
  lg__gwr_event(c, json_pack("{s:s, s:i, s:O}", "type", "response.output_item.done", "output_index", oi, "item", item));
  json_decref(part);
  return item;
}

/* Responses: the kept call items, each whole (a function_call's
 * arguments, a custom_tool_call's input, done in one event; a shell or
 * apply_patch call in its added and done events); the completed response
 * lists only them. */
void lg__gwr_emit_kept(chat_t *c, json_t *kept, int refused) {
  for (size_t i = 0; i < json_array_size(kept); i++) {
    json_t *it = json_array_get(kept, i);
    const lg__gwr_kind_t *k = lg__gwr_kind(sget(it, "type"));
    int ci = c->r_index++;
    lg__gwr_event(c, json_pack("{s:s, s:i, s:O}", "type", "response.output_item.added", "output_index", ci, "item", it));
    if (k && k->form != LG__ARGS_OBJECT) /* a built-in's item is whole in its added and done events */
      lg__gwr_event(c, json_pack("{s:s, s:s?, s:i, s:s?}", "type",
                                 k->form == LG__ARGS_FREE_TEXT ? "response.custom_tool_call_input.done"
                                                               : "response.function_call_arguments.done",
                                 "item_id", sget(it, "id"), "output_index", ci, k->args, sget(it, k->args)));
    lg__gwr_event(c, json_pack("{s:s, s:i, s:O}", "type", "response.output_item.done", "output_index", ci, "item", it));
  }
  if (refused) lg__gwr_keep_items(c->r_done, kept);
  lg__gwc_register_key(c, c->r_done);
}

/* Ends a Responses stream: response.completed with what the upstream
 * completed, or response.incomplete with what it left incomplete (cut
 * off by max_output_tokens: the SDKs tell the two apart by the event, as
 * the API sends them), or an empty incomplete response. */
void lg__gwr_end_stream(chat_t *c) {
  json_t *item = r_close_open(c);
  char id[64];
  if (!c->r_done) { /* an answer of the gateway's own: the client may continue from it */
    lg__gwc_own_id(c, id, sizeof id);
    lg__gwc_own_response(c, id, sget(json_array_get(json_object_get(item, "content"), 0), "text")); /* r_close_open's */
  }
  json_t *resp = c->r_done ? json_incref(c->r_done)
                 : item    ? json_pack("{s:s, s:s, s:s, s:s?, s:[O]}", "id", id, "object", "response",
                            "status", "completed", "model", c->model, "output", item)
                           : json_pack("{s:s, s:s, s:s, s:[]}", "id", id, "object",
                                       "response", "status", "incomplete", "output");
  if (!c->r_done && resp && c->usage) json_object_set(resp, "usage", c->usage); /* a cut's: cut_told */
  if (!c->r_done && resp) lg__gwc_register_key(c, resp);
  json_decref(item);
  const char *st = resp ? sget(resp, "status") : NULL;
  lg__gwr_event(c, json_pack("{s:s, s:o}", "type",
                             st && !strcmp(st, "incomplete") ? "response.incomplete" : "response.completed",
                             "response", resp));
}

/* A final message as Responses events (a stop), as the API streams a
 * message: its item added empty (in progress, no content), its text part
 * added empty, the text as a delta, then each of them done. The SDKs build
 * the message from these events: a text in the added item as well as in
 * the delta was shown twice (earlier builds). */
static void r_final_stream(chat_t *c, const char *text, json_t *resp) {
  json_decref(r_close_open(c));
  char mid[64];
  snprintf(mid, sizeof mid, "msg_lg%lld", (long long)now_ms(c->cx));
  if (!c->r_started) {
    c->r_started = 2;
    json_t *r0 = json_deep_copy(resp);
    json_object_set_new(r0, "status", json_string("in_progress"));
    json_object_set_new(r0, "output", json_array());
    lg__gwr_event(c, json_pack("{s:s, s:o}", "type", "response.created", "response", r0));
  }
  int ci = c->r_index++;
  json_t *part = json_pack("{s:s, s:s, s:[]}", "type", "output_text", "text", text, "annotations");
  json_t *item = json_pack("{s:s, s:s, s:s, s:s, s:[O]}", "type", "message", "id", mid, "status", "completed",
                           "role", "assistant", "content", part);
  lg__gwr_event(c, json_pack("{s:s, s:i, s:{s:s, s:s, s:s, s:s, s:[]}}", "type", "response.output_item.added",
                             "output_index", ci, "item", "type", "message", "id", mid, "status", "in_progress",
                             "role", "assistant", "content"));
  lg__gwr_event(c, json_pack("{s:s, s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "type", "response.content_part.added",
                             "item_id", mid, "output_index", ci, "content_index", 0, "part", "type",
                             "output_text", "text", "", "annotations"));
  lg__gwr_event(c, json_pack("{s:s, s:s, s:i, s:i, s:s}", "type", "response.output_text.delta", "item_id", mid,
                       "output_index", ci, "content_index", 0, "delta", text));
  lg__gwr_event(c, json_pack("{s:s, s:s, s:i, s:i, s:s}", "type", "response.output_text.done", "item_id", mid,
                       "output_index", ci, "content_index", 0, "text", text));
  lg__gwr_event(c, json_pack("{s:s, s:s, s:i, s:i, s:O}", "type", "response.content_part.done", "item_id", mid,
                             "output_index", ci, "content_index", 0, "part", part));
  lg__gwr_event(c, json_pack("{s:s, s:i, s:O}", "type", "response.output_item.done", "output_index", ci, "item", item));
  json_decref(part);
  json_decref(item);
  lg__gwr_event(c, json_pack("{s:s, s:O}", "type", "response.completed", "response", resp));
}
/* The Responses items of a call the client runs, each with its answer's
 * type, the tool's name when the item has none (a built-in tool's, which
 * the tools list names by its type: {"type": "shell"}) and the member
 * that holds its arguments. */
static const lg__gwr_kind_t kinds[] = {
    {"function_call", "function_call_output", NULL, "arguments", LG__ARGS_JSON_TEXT, LG__OUT_TEXT},
    {"custom_tool_call", "custom_tool_call_output", NULL, "input", LG__ARGS_FREE_TEXT, LG__OUT_TEXT},
    {"shell_call", "shell_call_output", "shell", "action", LG__ARGS_OBJECT, LG__OUT_CHUNKS},
    {"apply_patch_call", "apply_patch_call_output", "apply_patch", "operation", LG__ARGS_OBJECT, LG__OUT_STATUS},
    {"computer_call", "computer_call_output", "computer_use_preview", "action", LG__ARGS_OBJECT,
     LG__OUT_SCREENSHOT},
    {"local_shell_call", "local_shell_call_output", "local_shell", "action", LG__ARGS_OBJECT, LG__OUT_LOCAL_SHELL},
};

const lg__gwr_kind_t *lg__gwr_kind(const char *ty) {
  for (size_t i = 0; ty && i < LG__ARRAY_LEN(kinds); i++)
    if (!strcmp(ty, kinds[i].call) || !strcmp(ty, kinds[i].output)) return &kinds[i];
  return NULL;
}

int lg__gwr_is_call(const char *ty) {
  const lg__gwr_kind_t *k = lg__gwr_kind(ty);
  return k && !strcmp(ty, k->call);
}

int lg__gwr_is_output(const char *ty) {
  const lg__gwr_kind_t *k = lg__gwr_kind(ty);
  return k && !strcmp(ty, k->output);
}

const char *lg__gwr_builtin_tool(const char *ty) {
  for (size_t i = 0; ty && i < LG__ARRAY_LEN(kinds); i++)
    if (kinds[i].tool && !strcmp(ty, kinds[i].tool)) return kinds[i].tool;
  return NULL;
}

/* A screenshot of one transparent pixel: the output of a refused computer
 * call when the conversation holds no screenshot yet (the API takes no
 * output without an image; the note says the action did not run). */
static const char blank_png[] = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lE"
                                "QVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII=";

json_t *lg__gwr_output_for(json_t *call, const char *call_id, const char *text, json_t *screen) {
  const lg__gwr_kind_t *k = lg__gwr_kind(sget(call, "type"));
  const char *ty = k ? k->output : "function_call_output", *id = call_id ? call_id : "";
  if (k && k->out == LG__OUT_SCREENSHOT) {
    json_t *blank = screen ? NULL : json_pack("{s:s, s:s}", "type", "computer_screenshot", "image_url",
                                              blank_png);
    json_t *o = json_pack("{s:s, s:s, s:O?, s:s}", "type", ty, "call_id", id, "output",
                          screen ? screen : blank, LG__GWR_NOTE, text);
    /* its safety checks acknowledged, as the API asks of an answer: the
     * action they were about did not run */
    json_t *checks = json_object_get(call, "pending_safety_checks");
    if (o && json_array_size(checks)) json_object_set(o, "acknowledged_safety_checks", checks);
    json_decref(blank);
    return o;
  }
  if (k && k->out == LG__OUT_CHUNKS) /* as a command that failed, the text its stderr */
    return json_pack("{s:s, s:s, s:[{s:s, s:s, s:{s:s, s:i}}]}", "type", ty, "call_id", id, "output",
                     "stdout", "", "stderr", text, "outcome", "type", "exit", "exit_code", 1);
  if (k && k->out == LG__OUT_STATUS)
    return json_pack("{s:s, s:s, s:s, s:s}", "type", ty, "call_id", id, "status", "failed", "output", text);
  if (k && k->out == LG__OUT_LOCAL_SHELL) { /* as a command that exited 1, the text its output */
    json_t *o = json_pack("{s:s, s:{s:i, s:f}}", "output", text, "metadata", "exit_code", 1, "duration_seconds", 0.0);
    char *t = o ? lg__json_text(o, NULL) : NULL;
    json_decref(o);
    /* its own id (the API requires one): the call's call_id, unique */
    o = t ? json_pack("{s:s, s:s, s:s, s:s}", "type", ty, "id", id, "call_id", id, "output", t) : NULL;
    lg__free(t);
    return o;
  }
  return json_pack("{s:s, s:s, s:s}", "type", ty, "call_id", id, "output", text);
}

json_t *lg__gwr_output_content(json_t *item, int *is_error) {
  const lg__gwr_kind_t *k = lg__gwr_kind(sget(item, "type"));
  json_t *out = json_object_get(item, "output");
  *is_error = 0;
  if (k && k->out == LG__OUT_STATUS) {
    const char *st = sget(item, "status");
    *is_error = st && !strcmp(st, "failed");
    /* a patch applied without a word: its status (a blank value would be
     * a tool that answered nothing, which stops the run) */
    if (json_is_string(out) && !blank(json_string_value(out))) return json_incref(out);
    return json_string(st ? st : "");
  }
  if (k && k->out == LG__OUT_SCREENSHOT) /* a part: read as any image (chat.c, result_text) */
    return json_is_object(out) ? json_pack("[O]", out) : json_incref(out);
  if (!k || k->out != LG__OUT_CHUNKS) return json_incref(out);
  /* a shell's chunks: their stdout and stderr, in order; an error when a
   * command exited non-zero or timed out; commands that printed nothing,
   * their outcomes ("[exit 0]": a silent success is an answer, not a
   * blank value, which would stop the run) */
  lg__buf_t b = {0};
  lg__buf_puts(&b, "");
  for (size_t i = 0; i < json_array_size(out); i++) {
    json_t *ch = json_array_get(out, i), *oc = json_object_get(ch, "outcome");
    const char *so = sget(ch, "stdout"), *se = sget(ch, "stderr"), *ot = sget(oc, "type");
    if (so) lg__buf_puts(&b, so);
    if (se) lg__buf_puts(&b, se);
    int failed = ot && !strcmp(ot, "exit") && json_integer_value(json_object_get(oc, "exit_code"));
    if (failed || (ot && !strcmp(ot, "timeout"))) *is_error = 1;
  }
  int silent = b.data && blank(b.data);
  for (size_t i = 0; silent && i < json_array_size(out); i++) {
    json_t *oc = json_object_get(json_array_get(out, i), "outcome");
    const char *ot = sget(oc, "type");
    if (ot && !strcmp(ot, "exit"))
      lg__buf_printf(&b, "[exit %lld]", (long long)json_integer_value(json_object_get(oc, "exit_code")));
    else if (ot)
      lg__buf_printf(&b, "[%.32s]", ot);
  }
  json_t *t = b.data ? json_stringn(b.data, b.len) : NULL;
  lg__buf_free(&b);
  return t;
}

json_t *lg__gwr_function_calls(json_t *resp) { return lg__gwc_items_of_type(resp, "output", lg__gwr_is_call); }
void lg__gwr_keep_items(json_t *resp, json_t *kept) { lg__gwc_keep_only(resp, "output", lg__gwr_is_call, kept); }
