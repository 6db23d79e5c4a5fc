// fake-upstream.mjs — a scripted OpenAI-compatible model server for the
// gateway's tests (no dependencies).
//
// It speaks the wire format of POST /v1/chat/completions (JSON, and SSE
// with the usage chunk when stream_options.include_usage), GET /v1/models,
// POST /v1/messages (Anthropic, JSON and SSE), and checks every request
// for what a real provider rejects: a tool call without its result, a
// result without its call, a message between a call and its result, a
// Responses function_call_output whose output list holds a part that is
// not input_text, input_image or input_file, a call answered by the other
// kind of output (a custom_tool_call by a function_call_output, or the
// reverse). Such a request is answered
// 400 as OpenAI answers it and counted in GET /stats, so a test can fail
// on it. GET /stats also lists the last request bodies of the three APIs
// as they came (raw), and the last 50 parsed (bodies).
//
// A tool the request offers as a custom tool (type "custom": free-text
// input) is called with a custom_tool_call item (Responses) or a tool call
// of type "custom" (Chat Completions; streamed as a function's call is,
// custom.input for function.arguments); a custom write_record
// asks for the same patch text every time (PATCH).
//
// The model is scripted by the request's `model`:
//   loop-write  always asks to write the same record (the tool fails), in
//               variants: key order, 7 vs 7.0, white space, case; with tools
//               hidden or tool_choice "none" it gives up in text
//   stubborn    the same, and it never gives up (not even without tools)
//   loop-builtin  (Responses) the same write by a built-in tool the client
//               runs: an apply_patch_call when `apply_patch` is offered,
//               else a shell_call when `shell` is, else a computer_call
//               (the same click on the form's Save button) when
//               `computer_use_preview` is, else a local_shell_call (the
//               older local shell: an exec action) when `local_shell` is,
//               the same each time; with none it gives up in text. Their
//               outputs must have the API's shapes (a shell's chunks, a
//               patch's status, a computer call's screenshot, its safety
//               checks acknowledged, a local shell's id and text).
//               loop-builtin-checks: each computer_call has a pending
//               safety check, which its output must acknowledge;
//               loop-builtin-pair: with each write, a lookup of another
//               customer in the same answer
//   loop-click  (Messages) the same left_click of the computer-use tool (a
//               tool of type computer_*: the request must name its beta in
//               anthropic-beta, as Anthropic wants), each time; without it,
//               gives up in text
//   pingpong    calls its first tool named transfer_to_* (an Agents SDK
//               handoff) every time: two agents handing the task back and forth
//   pair        asks for two calls an answer, the failing write and a lookup
//               of another customer each time (the guard keeps one, refuses
//               the other); with the write hidden it gives up in text
//   picky       as stubborn, but a conversation with three tool results or
//               more is refused: 400 invalid_request_error, in the API's shape
//               (picky-html, Chat Completions: 400 with an HTML page, a byte
//               in it not UTF-8, as a proxy in front of a provider answers)
//   flail       a coding agent on Codex's shell tool (a function named
//               shell): a different command every time (make test's output
//               cut at another length), whatever the results say; with shell
//               hidden or tools off, gives up in text
//   poll        a coding agent's build in the background: Codex's
//               exec_command starts it, then the same write_stdin poll
//               until a result says the process exited (Claude Code's Bash
//               with run_in_background, then BashOutput until a result says
//               <status>completed</status>, when Bash is offered; OpenHands'
//               execute_bash, polled with an empty command, when it is), then
//               "Done: the build finished."
//   finish      looks a customer up once, then answers "Done: ..."
//   edit-test   a coding agent: Bash (the same test command every time), then
//               an Edit (a different one each time), in turn, until a result
//               says " passed": then "Done: the tests pass."; with Bash hidden
//               or tools off, gives up in text
//   detour      asks to write the record (with a word of text) until the write is hidden, then
//               looks customer c-1 up instead, then answers "Done: ..." (any
//               name that holds it: o3-detour, which the AI SDK takes for a
//               reasoning model)
//   twin        asks for the same write twice in one answer (two calls, two
//               ids, as models making parallel calls do), then answers
//               "Done: " and the results it got (twin3: three times, with
//               a word of text)
//   drip        streams its text a word every 250 ms (drip-long: 40 words)
//   slow        answers after 3 s
//   busy        429 with Retry-After: 7 and the API's rate-limit error
//   garbage     answers 200 with a body that is not JSON
//   garbage-stream  answers 200 text/event-stream with events that are not JSON
//   cutoff      streams a few words of text, then drops the connection; not
//               streamed (Chat Completions): a 200 and half its body, then
//               drops the connection (cutoff-slow: the rest after 3 s)
//   queued      (Chat Completions, stream) three SSE comments 300 ms apart, as
//               OpenRouter keeps a queued request alive, then "Done."
//   slow-call   (Chat Completions, stream) a write whose arguments come in 8
//               pieces 250 ms apart; with a tool result, "Done."
//   overload    streams a few words of text, then the API's own error event
//               (Anthropic's overloaded_error, OpenAI's server_error) and ends
//   chant       "Waiting for the payment." over and over, 200 times (a text
//               loop), a word every 5 ms when streamed
//   chant-call  the same text with a lookup (a call); with a tool result,
//               "Done."
//   call-chant  a lookup (a call); with a tool result, the text loop of
//               chant
//   ask         asks to write the record until it is offered ask_human, then
//               asks the person (finalize: the same with finalize_partial)
//   yielding    the same as stubborn while it may call tools; with tool use
//               turned off (tool_choice "none", no tools) it gives up in text
//   odd-answer  Responses: a completed answer whose output_text's text is
//               a number; Chat Completions: a JSON array; its stream: an event of two data
//               lines (not JSON once joined, as SSE joins them), a tool
//               call delta at index 2^53, then text
//   big-write   asks to write a file of 120 KB (quotes, backslashes, é, 日本,
//               new lines) whose arguments stream in 7-character deltas, all
//               sent at once: some 18,000 of them (Chat Completions and
//               Messages)
//   truncated   asks to write the record, its answer cut off by max_tokens
//               in the middle of the call's arguments: Messages' stop_reason
//               max_tokens (not streamed, the tool_use's input {}), Chat
//               Completions' finish_reason length
//   flood       answers 200 with 2 MiB: a JSON answer, or a stream whose
//               second event never ends (Chat Completions); flood-text and
//               flood-args stream 2 MiB of valid text or call-argument deltas
//   (POST /v1/completions, the legacy API the gateway passes through
//   unguarded: its text is the prompt echoed; "drip" streams it a word every
//   250 ms, as Chat Completions does)
//   mutant-SEED asks to write the record, in an answer mutated by SEED
//               (mutate-lib.mjs): a value of another type, a member gone or
//               doubled, bytes cut or changed, in the JSON body or in the
//               stream's events (tests/gateway/mutate.sh)
// An input item {type: "item_reference", id} stands for the output item of
// that id (404 when no answer made one), as the AI SDK's openai provider
// sends its earlier answers with `store` on.
// POST /v1/conversations makes a conversation; a response with
// `conversation` continues it and adds its input and output to it, once
// delivered whole (not a stream its client left).
// Chat Completions with `thinking: {type: "enabled"}` give each answer a
// reasoning_content (a stream: in one delta), and refuse an assistant
// message with tool calls that does not carry its own back.
// A model named *-gemini* answers as Gemini's OpenAI-compatible API: an
// answer's first call carries extra_content.google.thought_signature (a
// stream: on the delta with the call's id), and a request is refused when a
// step of the current turn (an assistant message with tool calls after the
// last user message) has none on its first call, or one the fake did not
// sign (Google's value for calls made elsewhere,
// skip_thought_signature_validator, passes).
// *-gemini-indexless* streams as Gemini's API may: each call whole in one
// delta without an `index`, the first call's signature in a delta of its
// own after it (no index, no id), and finish_reason "stop".
// *-groq* answers with `reasoning` (its reasoning models' field, in
// pieces when streamed) and refuses an assistant message that carries a
// reasoning_content (a member it does not know).
// *-mistral* answers as Mistral's API: a request with stream_options is
// refused (422, "Extra inputs are not permitted"; counted in GET /stats
// as stream_options_refused), a stream's last chunk carries the usage.
// *-nousage* never sends a stream's usage, asked or not.
// *-o3* answers as OpenAI's reasoning models: a request with max_tokens is
// refused ("Use 'max_completion_tokens' instead"; counted in GET /stats as
// max_tokens_refused).
// *-azure* streams Azure OpenAI's first chunk: no choice, its
// prompt_filter_results; so does every answer on Azure's own paths
// (/openai/deployments/NAME/chat/completions), which also carry Azure's
// content_filter_results in each choice and, whole, its
// prompt_filter_results.
// A model named *-openrouter* answers as OpenRouter does with a thinking
// model: `reasoning` and `reasoning_details` (a signed reasoning.text; a
// stream: in three pieces, the last in the chunk of the first call's
// delta), and refuses an assistant message with tool calls that does not
// carry them back whole (the provider behind it refuses a tool use turn
// without its signed thinking).
// Responses with `reasoning` start each answer with a reasoning item, and
// refuse a function_call of that answer without the item before it, or the
// item without one of its answer's after it (OpenAI's 400s).
// Messages with `thinking: {type: "enabled"}` start each answer with a
// signed thinking block (streamed as thinking_delta and signature_delta).
// POST /v1/files takes an upload as OpenAI does (multipart/form-data with a
// `purpose` and a `file` part; anything else is its 400) and answers the
// file object, with the sha256 of the bytes it got beside it; GET /v1/files
// lists the uploads a page at a time (limit, after: a cursor as OpenAI's),
// GET /v1/files/file-up-N/content gives an upload's bytes back.
// GET (HEAD) /v1/files/file-big-N/content answers N bytes (a 16-byte line
// counted in hex, over and over), written as fast as the client takes
// them; file-cut-N drops the connection half-way. GET /stats counts the
// answers whose client left before their end (aborted).
// POST /v1/embeddings answers OpenAI's list with `usage` last, a token
// every four bytes of text (counted in GET /stats as embedding_tokens);
// model embed-broken is its 500, embed-nousage an answer without usage,
// costly-* one whose usage has a cost (USD: 5 micro-dollars, -over 777),
// embed-slow the usual answer after 3 s.
// A request whose members have the wrong types (a mutated one) is answered
// 400 in its API's error shape, as a provider answers it, and counted in
// GET /stats as malformed (not as a violation: the client sent it so).
// A model name may carry a suffix after the script's name ("stubborn-strong"):
// the script is the same, and GET /stats lists the models asked for.
// Usage: node fake-upstream.mjs PORTFILE   (writes the port it took)
// With FAKE_TLS_CERT and FAKE_TLS_KEY (PEM files) it serves HTTPS instead,
// HTTP/2 or HTTP/1.1 as the client's ALPN asks (as api.openai.com and
// api.anthropic.com do); GET /stats counts the requests of each version
// (`http_versions`) and the TLS connections (`tls_connections`).
import http from 'node:http';
import http2 from 'node:http2';
import fs from 'node:fs';
import crypto from 'node:crypto';
import { rng, mutateValue, mutateText } from './mutate-lib.mjs';

const stats = { requests: 0, azure: 0, compat: 0, chat: 0, violations: [], bodies: [], raw: [], models: [], aborted: 0, auths: [], malformed: 0, stream_options_refused: 0, max_tokens_refused: 0, thinking_repeated: 0, embedding_tokens: 0, http_versions: {}, tls_connections: 0, connections: 0 };
const CHANT = 'Waiting for the payment. '.repeat(200).trim();
const BIG = Array.from({ length: 4000 }, (_, i) => `line ${i}: caf\u00e9 "q" \\ \u65e5\u672c\n`).join('');
let callSeq = 0, requestSeq = 0;
// A stream's pace: one event every TICK_MS ms (FAKE_CHUNK_MS, 1 by default:
// each event its own write, apart from the next; the drip models keep
// their own, slower pace for the tests that watch a stream as it comes).
// Until session 41 it was 5 ms, and the suite's streams took a fifth of
// gateway_e2e's time.
const TICK_MS = Number(process.env.FAKE_CHUNK_MS || 1);

function check(messages) {
  const open = new Map(); // call id -> answered
  let pending = 0;
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i];
    if (pending > 0 && m.role !== 'tool')
      return `messages[${i}]: an assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'`;
    if (m.role === 'assistant' && Array.isArray(m.tool_calls) && m.tool_calls.length) {
      for (const tc of m.tool_calls) {
        if (open.has(tc.id)) return `messages[${i}]: duplicate tool call id ${tc.id}`;
        open.set(tc.id, false);
      }
      pending = m.tool_calls.length;
    } else if (m.role === 'tool') {
      if (!open.has(m.tool_call_id) || open.get(m.tool_call_id) || pending === 0)
        return `messages[${i}]: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'`;
      open.set(m.tool_call_id, true);
      pending--;
    }
  }
  if (pending > 0) return `the last assistant message has tool calls without results`;
  return null;
}

// Legacy function calling (`functions`): one call an answer, an assistant
// message's function_call, answered by a message of role function that
// names it. OpenAI requires the name; that each call is answered before
// the next message, and each answer follows its call, is this fake's own
// check (what the gateway sends in a client's name must be a conversation
// the client could have sent). A request in the newer dialect's words is
// refused too: the gateway speaks the client's.
function checkLegacy(req) {
  if (req.tools) return "'functions' and 'tools' in one request";
  const msgs = req.messages || [];
  let open = null;
  for (let i = 0; i < msgs.length; i++) {
    const m = msgs[i];
    if (m.role === 'tool' || (m.role === 'assistant' && m.tool_calls)) return `messages[${i}]: a tool call or tool message in a request with 'functions'`;
    if (m.role === 'function') {
      if (typeof m.name !== 'string' || !m.name) return `messages[${i}].name: a message with role 'function' must have a name`;
      if (open !== m.name) return `messages[${i}]: a 'function' message must answer the function_call of the assistant message before it`;
      open = null;
    } else if (open) {
      return `messages[${i}]: the function_call of messages[${i - 1}] has no 'function' message answering it`;
    }
    if (m.role === 'assistant' && m.function_call) open = m.function_call.name;
  }
  return open ? 'the last assistant message has a function_call without its result' : null;
}
// The legacy request in the newer dialect's words, for script().
function fromLegacy(req) {
  const fc = req.function_call;
  const toolChoice = fc && typeof fc === 'object' ? { type: 'function', function: { name: fc.name } } : fc;
  let n = 0;
  const messages = (req.messages || []).map((m) => (m.role === 'function' ? { role: 'tool', tool_call_id: `fc_${n}`, content: m.content }
    : m.role === 'assistant' && m.function_call ? { role: 'assistant', content: m.content, tool_calls: [{ id: `fc_${++n}`, type: 'function', function: m.function_call }] } : m));
  return { ...req, functions: undefined, function_call: undefined, tools: req.functions.map((f) => ({ type: 'function', function: f })), tool_choice: toolChoice, messages };
}

// A custom tool's call (a tool of type "custom": Responses' custom_tool_call,
// Chat Completions' tool call of type "custom") carries free text, not
// JSON: a custom write_record asks for this patch, the same every time.
const PATCH = '*** Begin Patch\n*** Update File: records/7\n@@\n-value: \n+value: A\n*** End Patch\n';
const customInput = (c) => (c.name === 'write_record' ? PATCH : c.args);

const variants = [
  '{"record_id":7,"value":"A"}',
  '{"value":"A","record_id":7.0}',
  '{ "record_id" : 7 , "value" : "A" }',
  '{"record_id":7e0,"value":"A"}',
  '{"record_id":7,"value":" a "}', // the same to a policy that says value: lower, trim
];

// Chat Completions with thinking on: every assistant message with tool
// calls must carry its reasoning_content back (Moonshot's and DeepSeek's 400).
function checkReasoningContent(req) {
  if (!req.thinking || req.thinking.type !== 'enabled') return null;
  const msgs = req.messages || [];
  for (let i = 0; i < msgs.length; i++)
    if (msgs[i].role === 'assistant' && Array.isArray(msgs[i].tool_calls) && msgs[i].tool_calls.length && typeof msgs[i].reasoning_content !== 'string')
      return `thinking is enabled but reasoning_content is missing in assistant tool call message at index ${i}`;
  return null;
}

const signOf = (what) => 'sig-' + crypto.createHash('sha256').update(what).digest('base64url').slice(0, 24);
const SKIP_SIGNATURE = 'skip_thought_signature_validator';

// (A mutant's history is the mutation test's, not checked: its answer is.)
function checkThoughtSignatures(req) {
  if (!/-gemini/.test(req.model || '') || req.model.startsWith('mutant')) return null;
  const msgs = req.messages || [];
  let i = msgs.length;
  while (i > 0 && msgs[i - 1].role !== 'user') i--;
  for (; i < msgs.length; i++) {
    const tc = msgs[i].role === 'assistant' && Array.isArray(msgs[i].tool_calls) ? msgs[i].tool_calls[0] : null;
    if (!tc) continue;
    const sig = tc.extra_content?.google?.thought_signature;
    if (sig === undefined)
      return `Function call is missing a thought_signature in functionCall parts. This is required for tools to work correctly. Additional data, function call \`default_api:${tc.function?.name}\`, position ${i + 1}.`;
    if (sig !== SKIP_SIGNATURE && sig !== signOf('gemini:' + tc.id)) return `Corrupted thought signature (messages[${i}]).`;
  }
  return null;
}

function checkReasoningDetails(req) {
  if (!/-openrouter/.test(req.model || '') || req.model.startsWith('mutant')) return null;
  const msgs = req.messages || [];
  for (let i = 0; i < msgs.length; i++) {
    const m = msgs[i];
    if (m.role !== 'assistant' || !Array.isArray(m.tool_calls) || !m.tool_calls.length) continue;
    const d = Array.isArray(m.reasoning_details) ? m.reasoning_details.find((x) => x && x.type === 'reasoning.text') : null;
    if (!d || typeof d.text !== 'string' || d.signature !== signOf('thinking:' + d.text))
      return `messages.${i}.content.0.type: Expected \`thinking\` or \`redacted_thinking\`, but found \`tool_use\`. When \`thinking\` is enabled, a final \`assistant\` message must start with a thinking block`;
  }
  return null;
}

// Groq: its reasoning models answer with `reasoning`, and a member it
// does not know in a message is refused (reasoning_content, which it never sends).
function checkGroq(req) {
  if (!/-groq/.test(req.model || '') || req.model.startsWith('mutant')) return null;
  const msgs = req.messages || [];
  for (let i = 0; i < msgs.length; i++)
    if (msgs[i].role === 'assistant' && 'reasoning_content' in msgs[i])
      return `'messages.${i}' : for 'role:assistant' the following must be satisfied[('messages.${i}' : property 'reasoning_content' is unsupported)]`;
  return null;
}

function script(req) {
  const model = req.model || '';
  const msgs = req.messages || [];
  const toolsOff = !Array.isArray(req.tools) || !req.tools.length || req.tool_choice === 'none';
  const names = (req.tools || []).map((t) => (t.function || t.custom || {}).name);
  if (model.startsWith('loop-write')) {
    if (toolsOff || !names.includes('write_record'))
      return { text: 'I could not write the record; the storage keeps failing.' };
    const n = msgs.filter((m) => m.role === 'tool').length;
    return { calls: [{ name: 'write_record', args: variants[n % variants.length] }], text: n === 0 ? 'Let me write it.' : null };
  }
  if (model.startsWith('loop-click')) // Messages' computer-use tool: the same click on Save, each time
    return !toolsOff && names.includes('computer') ? { calls: [{ name: 'computer', args: '{"action":"left_click","coordinate":[312,208]}' }] }
      : { text: 'I could not write the record; the storage keeps failing.' };
  if (model.startsWith('loop-builtin')) { // the write by a built-in tool the client runs: apply_patch, else shell
    const way = ['apply_patch', 'shell', 'computer_use_preview', 'local_shell'].find((n) => !toolsOff && names.includes(n));
    if (!way) return { text: 'I could not write the record; the storage keeps failing.' };
    const also = model.startsWith('loop-builtin-pair') && names.includes('lookup') ? [{ name: 'lookup', args: '{"customer_id":"c-' + (msgs.length + 1) + '"}' }] : [];
    return { calls: [{ name: way, args: '{}' }, ...also] };
  }
  const writeVariant = () => variants[msgs.filter((m) => m.role === 'tool').length % variants.length];
  if (model.startsWith('call-chant'))
    return msgs.some((m) => m.role === 'tool') ? { text: CHANT } : { calls: [{ name: 'lookup', args: '{"customer_id":"c-1"}' }] };
  if (model.startsWith('chant-call'))
    return msgs.some((m) => m.role === 'tool') ? { text: 'Done.' } : { text: CHANT, calls: [{ name: 'lookup', args: '{"customer_id":"c-1"}' }] };
  if (model.startsWith('chant')) return { text: CHANT };
  if (model.startsWith('truncated')) return { calls: [{ name: 'write_record', args: '{"record_id":7,"val' }], cut: true };
  if (model.startsWith('big-write')) return { calls: [{ name: 'write_file', args: JSON.stringify({ path: 'notes.txt', content: BIG }) }], pieces: 7 };
  if (model.startsWith('mutant')) return { calls: [{ name: 'write_record', args: writeVariant() }], text: 'Let me write it.' };
  if (model.startsWith('drip-long')) return { text: Array.from({ length: 40 }, (_, i) => `word${i}`).join(' ') };
  if (model.startsWith('ask') || model.startsWith('finalize')) {
    const way = model.startsWith('ask') ? 'ask_human' : 'finalize_partial';
    if (names.includes(way))
      return { calls: [{ name: way, args: way === 'ask_human' ? '{"question":"The storage is read-only: may I write somewhere else?"}' : '{"answer":"Record 7 is not written: the storage is read-only."}' }] };
    return { calls: [{ name: 'write_record', args: writeVariant() }] };
  }
  if (model.startsWith('yielding')) {
    if (toolsOff) return { text: 'I give up: the storage is read-only, so record 7 cannot be written.' };
    return { calls: [{ name: 'write_record', args: writeVariant() }] };
  }
  if (model.startsWith('pingpong')) { // hands the task to the other agent, forever (a handoff tool, as the Agents SDK names them)
    const handoff = names.find((n) => n && n.startsWith('transfer_to_'));
    return handoff && !toolsOff ? { calls: [{ name: handoff, args: '{}' }] } : { text: 'Neither of us can finish this.' };
  }
  if (model.startsWith('pair')) { // two calls an answer: the failing write, and a lookup never the same
    if (toolsOff || !names.includes('write_record')) return { text: 'I could not write the record; the storage keeps failing.' };
    const n = msgs.filter((m) => m.role === 'tool').length;
    return { calls: [{ name: 'write_record', args: writeVariant() }, { name: 'lookup', args: JSON.stringify({ customer_id: `c-${n}` }) }] };
  }
  if (/detour/.test(model)) { // writes until the write is hidden, then looks the customer up instead, then answers
    const last = msgs.filter((m) => m.role === 'tool').pop();
    if (toolsOff || (last && String(last.content).includes('"Ada"'))) return { text: 'Done: the storage keeps failing, and customer c-1 is Ada.' };
    if (names.includes('write_record')) return { calls: [{ name: 'write_record', args: writeVariant() }], text: 'Writing the record.' };
    return { calls: [{ name: 'lookup', args: '{"customer_id":"c-1"}' }] };
  }
  if (model.startsWith('twin')) { // the same write twice in one answer (parallel calls), then done
    const res = msgs.filter((m) => m.role === 'tool');
    const write = { name: 'write_record', args: '{"record_id":7,"value":"A"}' };
    if (model.startsWith('twin3') && !res.length) return { calls: [write, write, write], text: 'Writing it three times.' };
    if (!res.length) return { calls: [write, write] };
    return { text: 'Done: ' + res.map((m) => m.content).join(' | ') };
  }
  if (model.startsWith('picky-html') && msgs.filter((m) => m.role === 'tool').length >= 3)
    return { refuse_raw: Buffer.from('<html>\n<h1>400 \xff\xfe Bad Request</h1> caf\u00e9</html>', 'latin1') };
  if (model.startsWith('picky') && msgs.filter((m) => m.role === 'tool').length >= 3)
    return { refuse: 'picky: this conversation holds three tool results, more than this model takes' };
  if (model.startsWith('stubborn') || model.startsWith('picky')) // never gives up, whatever it is told
    return { calls: [{ name: 'write_record', args: variants[msgs.filter((m) => m.role === 'tool').length % variants.length] }] };
  if (model.startsWith('edit-test')) { // a coding agent: the same test command after each edit, until the tests pass
    const res = msgs.filter((m) => m.role === 'tool'), n = res.length;
    if (n && / passed/.test(String(res[n - 1].content))) return { text: 'Done: the tests pass.' };
    if (toolsOff || !names.includes('Bash')) return { text: 'I could not make the tests pass.' };
    if (n % 2 === 0) return { calls: [{ name: 'Bash', args: '{"command":"pytest -x tests/test_parser.py","description":"Run the parser tests"}' }] };
    return { calls: [{ name: 'Edit', args: JSON.stringify({ file_path: 'src/parser.py', old_string: `tok = ${n}`, new_string: `tok = ${n + 1}` }) }] };
  }
  if (model.startsWith('flail')) { // a coding agent trying one command after another (Codex's shell tool), never the same
    const n = msgs.filter((m) => m.role === 'tool').length;
    if (toolsOff || !names.includes('shell')) return { text: 'I could not get the tests to pass.' };
    return { calls: [{ name: 'shell', args: JSON.stringify({ command: ['bash', '-lc', `make test 2>&1 | tail -n ${20 + 10 * n}`], workdir: '/repo', timeout_ms: 120000 }) }] };
  }
  if (model.startsWith('poll')) { // a build started, then polled (the same call) until it ends: Codex's unified exec, or Claude Code's background Bash
    const res = msgs.filter((m) => m.role === 'tool'), last = res.length ? String(res[res.length - 1].content) : '';
    if (/^Process exited with code |^<status>(completed|failed)<\/status>|^\[The command completed with exit code /m.test(last)) return { text: 'Done: the build finished.' };
    const way = names.includes('Bash') ? 'claude' : names.includes('execute_bash') ? 'openhands' : 'codex';
    const [start, poll] = { claude: ['Bash', 'BashOutput'], openhands: ['execute_bash', 'execute_bash'], codex: ['exec_command', 'write_stdin'] }[way];
    if (toolsOff || !names.includes(start) || (res.length && !names.includes(poll))) return { text: 'I stopped waiting for the build.' };
    if (!res.length) return { calls: [{ name: start, args: { claude: '{"command":"make -j2","description":"Build","run_in_background":true}', openhands: '{"command":"make -j2"}', codex: '{"cmd":"make -j2","yield_time_ms":10000}' }[way] }] };
    return { calls: [{ name: poll, args: { claude: '{"bash_id":"b2f8b9"}', openhands: '{"command":"","is_input":"false"}', codex: '{"session_id":7,"chars":"","yield_time_ms":30000}' }[way] }] };
  }
  if (model.startsWith('finish')) {
    const res = msgs.filter((m) => m.role === 'tool');
    if (!res.length) return { calls: [{ name: 'lookup', args: '{"customer_id":"c-1"}' }] };
    return { text: 'Done: ' + res[res.length - 1].content };
  }
  return { text: 'Hello from the fake upstream.' };
}

function usageOf(req, out) {
  const p = JSON.stringify(req.messages || []).length >> 2;
  const c = Math.min(10, req.max_completion_tokens ?? req.max_tokens ?? 10); // as a provider, never past max_tokens
  const u = { prompt_tokens: p, completion_tokens: c, total_tokens: p + c };
  if ((req.model || '').startsWith('costly')) u.cost = 0.000777; // an upstream that reports the cost (USD)
  return u;
}

// A call's arguments as its deltas: in two halves, or in pieces of n
// UTF-16 units (never a character cut: BIG has no surrogate pairs).
function pieces(a, n) {
  if (!n) return [a.slice(0, a.length >> 1), a.slice(a.length >> 1)];
  const out = [];
  for (let i = 0; i < a.length; i += n) out.push(a.slice(i, i + n));
  return out;
}

// Azure OpenAI's filter results: of the prompt (an answer's top, a stream's
// first chunk) and of a choice's content
const AZ_FILTER = { hate: { filtered: false, severity: 'safe' }, self_harm: { filtered: false, severity: 'safe' },
  sexual: { filtered: false, severity: 'safe' }, violence: { filtered: false, severity: 'safe' } };
const AZ_PROMPT = [{ prompt_index: 0, content_filter_results: AZ_FILTER }];

function reply(res, req, legacy = false, azure = false) {
  if (/^flood-(text|args)/.test(req.model || '') && req.stream) { // valid deltas, 2 MiB of them
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    const args = req.model.startsWith('flood-args');
    const chunk = (delta) => 'data: ' + JSON.stringify({ id: 'chatcmpl-flood', object: 'chat.completion.chunk', created: 1,
      model: req.model, choices: [{ index: 0, delta, logprobs: null, finish_reason: null }] }) + '\n\n';
    if (args) res.write(chunk({ role: 'assistant', tool_calls: [{ index: 0, id: 'call_flood', type: 'function', function: { name: 'write_file', arguments: '' } }] }));
    let sent = 0;
    const more = () => { // numbers, none repeated: no text loop for the guard to cut
      while (sent < (2 << 20) && !res.destroyed) {
        const part = Array.from({ length: 400 }, (_, i) => (sent + i).toString(36)).join(' ') + ' ';
        sent += part.length;
        if (!res.write(chunk(args ? { tool_calls: [{ index: 0, function: { arguments: part } }] } : { content: part }))) return res.once('drain', more);
      }
      if (!res.destroyed) res.end(chunk({}) + 'data: [DONE]\n\n');
    };
    return more();
  }
  if ((req.model || '').startsWith('cutoff') && !req.stream) { // a 200, half its body, a dropped connection
    const full = JSON.stringify({ id: 'chatcmpl-cut', object: 'chat.completion', created: 1, model: req.model,
      choices: [{ index: 0, message: { role: 'assistant', content: 'Partial answer then more' }, logprobs: null, finish_reason: 'stop' }],
      usage: { prompt_tokens: 5, completion_tokens: 5, total_tokens: 10 } });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(full) });
    res.write(full.slice(0, full.length >> 1));
    if (req.model.startsWith('cutoff-slow')) // the rest after 3 s
      return setTimeout(() => { if (!res.destroyed) res.end(full.slice(full.length >> 1)); }, 3000);
    setTimeout(() => res.destroy(), 50);
    return;
  }
  if ((req.model || '').startsWith('flood')) { // past the gateway's bound (guard.sh sets 1 MiB)
    const pad = 'x'.repeat(2 << 20);
    if (!req.stream) {
      res.writeHead(200, { 'content-type': 'application/json' });
      return res.end(JSON.stringify({ id: 'chatcmpl-flood', object: 'chat.completion', created: 1, model: req.model, choices: [], pad }));
    }
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    res.write('data: ' + JSON.stringify({ id: 'chatcmpl-flood', object: 'chat.completion.chunk', created: 1, model: req.model,
      choices: [{ index: 0, delta: { role: 'assistant', content: 'Hi' }, logprobs: null, finish_reason: null }] }) + '\n\n');
    res.write('data: {"pad":"');
    return res.end(pad); // no end to the event: a broken upstream
  }
  const plan = script(req);
  if (plan.refuse) return openaiError(res, 400, plan.refuse, 'messages');
  if (plan.refuse_raw) { res.writeHead(400, { 'content-type': 'text/html' }); return res.end(plan.refuse_raw); }
  const id = 'chatcmpl-fake' + (++stats.chat);
  const created = Math.floor(Date.now() / 1000);
  const customs = (req.tools || []).filter((t) => t.type === 'custom').map((t) => t.custom && t.custom.name);
  const calls = (plan.calls || []).slice(0, legacy ? 1 : undefined).map((c) => (customs.includes(c.name)
    ? { id: 'call_' + (++callSeq), type: 'custom', custom: { name: c.name, input: customInput(c) } }
    : { id: 'call_' + (++callSeq), type: 'function', function: { name: c.name, arguments: c.args } }));
  const finish = plan.cut ? 'length' : calls.length ? (legacy ? 'function_call' : 'tool_calls') : 'stop';
  const usage = usageOf(req);
  // thinking on (DeepSeek's and Moonshot's `thinking`): the answer's reasoning_content
  // Chat Completions' n (up to 4): the other choices the same answer, their call ids their own
  const others = (c) => Array.from({ length: Math.max(0, Math.min(4, Number(req.n) || 1) - 1) }, (_, k) => {
    const o = JSON.parse(JSON.stringify(c));
    o.index = k + 1;
    for (const t of (o.message || o.delta || {}).tool_calls || []) if (t.id) t.id += `_c${k + 1}`;
    return o;
  });
  const thought = req.thinking && req.thinking.type === 'enabled' ? `Thinking about ${id}: ${calls.map((c) => c.function.name).join(', ') || 'an answer'}.` : null;
  if (calls.length && /-gemini/.test(req.model)) calls[0].extra_content = { google: { thought_signature: signOf('gemini:' + calls[0].id) } };
  const routed = /-(openrouter|groq)/.test(req.model) ? `The record keeps failing; this answer (${id}) asks for ${calls.map((c) => c.function.name).join(', ') || 'nothing'}.` : null;
  const groq = /-groq/.test(req.model);
  const detail = (text, last) => ({ type: 'reasoning.text', text, ...(last && { signature: signOf('thinking:' + routed) }), format: 'anthropic-claude-v1', index: 0 });
  if (!req.stream) {
    const message = { role: 'assistant', content: plan.text ?? null, refusal: null };
    if (thought) message.reasoning_content = thought;
    if (routed) Object.assign(message, { reasoning: routed, ...(!groq && { reasoning_details: [detail(routed, true)] }) });
    if (calls.length && legacy) message.function_call = calls[0].function;
    else if (calls.length) message.tool_calls = calls;
    const first = { index: 0, message, logprobs: null, finish_reason: finish, ...(azure && { content_filter_results: AZ_FILTER }) };
    const body = { id, object: 'chat.completion', created, model: req.model, choices: [first, ...others(first)], usage, system_fingerprint: 'fp_fake',
      ...(azure && { prompt_filter_results: AZ_PROMPT }) };
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
    return;
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const base = { id, object: 'chat.completion.chunk', created, model: req.model, system_fingerprint: 'fp_fake' };
  // n of 2 and more: each choice's delta in a chunk of its own, as OpenAI streams them
  const send = (choices, extra) => {
    // on Azure's paths each choice with its content's filter results (none yet on the role's chunk)
    if (azure) choices = choices.map((c) => ({ content_filter_results: c.delta.role ? {} : AZ_FILTER, ...c }));
    for (const cs of [choices, ...(choices.length === 1 ? others(choices[0]).map((o) => [o]) : [])])
      res.write('data: ' + JSON.stringify({ ...base, choices: cs, ...extra }) + '\n\n');
  };
  if (azure || /-azure/.test(req.model)) // Azure OpenAI's first chunk: no choice, the prompt's filter results
    res.write('data: ' + JSON.stringify({ choices: [], created: 0, id: '', model: '', object: '', prompt_filter_results: AZ_PROMPT }) + '\n\n');
  send([{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }]);
  const steps = [];
  if (thought) steps.push(() => send([{ index: 0, delta: { reasoning_content: thought }, logprobs: null, finish_reason: null }]));
  // the reasoning in three pieces: two chunks of their own, the last (signed) with the first call
  const cut = routed ? [0, routed.length / 3 | 0, (2 * routed.length) / 3 | 0, routed.length] : [];
  const piece = (p) => routed.slice(cut[p], cut[p + 1]);
  const lastPiece = routed ? { reasoning: piece(2), ...(!groq && { reasoning_details: [detail(piece(2), true)] }) } : {};
  if (routed) for (const p of [0, 1]) steps.push(() => send([{ index: 0, delta: { reasoning: piece(p), ...(!groq && { reasoning_details: [detail(piece(p), false)] }) }, logprobs: null, finish_reason: null }]));
  if (routed && !calls.length) steps.push(() => send([{ index: 0, delta: lastPiece, logprobs: null, finish_reason: null }]));
  if (plan.text) for (const w of plan.text.match(/\S+\s*/g)) steps.push(() => send([{ index: 0, delta: { content: w }, logprobs: null, finish_reason: null }]));
  const indexless = /-indexless/.test(req.model);
  // a custom tool's call streams as a function's does, custom.input for
  // function.arguments (the SDKs' types do not say how it streams)
  if (indexless) calls.forEach((c, i) => {
    steps.push(() => send([{ index: 0, delta: { tool_calls: [c.type === 'custom' ? { id: c.id, type: 'custom', custom: c.custom } : { id: c.id, type: 'function', function: c.function }] }, logprobs: null, finish_reason: null }]));
    if (c.extra_content) steps.push(() => send([{ index: 0, delta: { tool_calls: [{ extra_content: c.extra_content }] }, logprobs: null, finish_reason: null }]));
  });
  else if (legacy) calls.forEach((c) => { // its one call: the name, then the arguments
    steps.push(() => send([{ index: 0, delta: { function_call: { name: c.function.name, arguments: '' } }, logprobs: null, finish_reason: null }]));
    for (const part of pieces(c.function.arguments, plan.pieces))
      steps.push(() => send([{ index: 0, delta: { function_call: { arguments: part } }, logprobs: null, finish_reason: null }]));
  });
  else calls.forEach((c, i) => {
    const extra = c.extra_content ? { extra_content: c.extra_content } : {};
    if (c.type === 'custom') {
      steps.push(() => send([{ index: 0, delta: { ...(i === 0 && lastPiece), tool_calls: [{ index: i, id: c.id, type: 'custom', custom: { name: c.custom.name, input: '' } }] }, logprobs: null, finish_reason: null }]));
      for (const part of pieces(c.custom.input, plan.pieces))
        steps.push(() => send([{ index: 0, delta: { tool_calls: [{ index: i, custom: { input: part } }] }, logprobs: null, finish_reason: null }]));
      return;
    }
    steps.push(() => send([{ index: 0, delta: { ...(i === 0 && lastPiece), tool_calls: [{ index: i, id: c.id, type: 'function', function: { name: c.function.name, arguments: '' }, ...extra }] }, logprobs: null, finish_reason: null }]));
    for (const part of pieces(c.function.arguments, plan.pieces))
      steps.push(() => send([{ index: 0, delta: { tool_calls: [{ index: i, function: { arguments: part } }] }, logprobs: null, finish_reason: null }]));
  });
  const mistral = /-mistral/.test(req.model); // its usage in the last chunk, unasked
  steps.push(() => send([{ index: 0, delta: {}, logprobs: null, finish_reason: indexless ? 'stop' : finish }], mistral ? { usage } : undefined));
  if (req.stream_options && req.stream_options.include_usage && !/-nousage/.test(req.model)) steps.push(() => send([], { usage }));
  steps.push(() => res.end('data: [DONE]\n\n'));
  if (plan.pieces) { for (const step of steps) step(); return; } // all at once
  const delay = (req.model || '').startsWith('drip') ? 250 : TICK_MS;
  let k = 0;
  const tick = () => { if (k < steps.length && !res.destroyed) { steps[k++](); setTimeout(tick, delay); } };
  tick();
}

// ---- the legacy Completions API, and a download (passthrough) ----

function replyLegacy(res, req) {
  const text = ` ${String(req.prompt || '')}`;
  const base = { id: 'cmpl-fake', object: 'text_completion', created: 1, model: req.model };
  if (!req.stream) {
    res.writeHead(200, { 'content-type': 'application/json' });
    return res.end(JSON.stringify({ ...base, choices: [{ text, index: 0, logprobs: null, finish_reason: 'stop' }],
      usage: { prompt_tokens: 3, completion_tokens: 3, total_tokens: 6 } }));
  }
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  const words = text.match(/\s*\S+/g) || [];
  const delay = (req.model || '').startsWith('drip') ? 250 : 5;
  let k = 0;
  const tick = () => {
    if (res.destroyed) return;
    if (k < words.length) {
      res.write('data: ' + JSON.stringify({ ...base, choices: [{ text: words[k++], index: 0, logprobs: null, finish_reason: null }] }) + '\n\n');
      return setTimeout(tick, delay);
    }
    res.write('data: ' + JSON.stringify({ ...base, choices: [{ text: '', index: 0, logprobs: null, finish_reason: 'stop' }] }) + '\n\n');
    res.end('data: [DONE]\n\n');
  };
  tick();
}

function download(res, n, cut) { // cut: the connection dropped half-way
  res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(n) });
  if (res.req.method === 'HEAD') return res.end();
  let sent = 0;
  const more = () => {
    while (sent < n && !res.destroyed) {
      const len = Math.min(1 << 16, n - sent);
      const block = Buffer.alloc(len); // its own: a written buffer is held until sent
      for (let o = 0; o < len; o += 16) block.write((sent + o).toString(16).padStart(15, '0') + '\n', o, 'latin1');
      sent += len;
      if (cut && sent > n / 2) return res.destroy();
      if (!res.write(block)) return res.once('drain', more);
    }
    if (sent >= n) res.end();
  };
  more();
}

// The members a provider requires before it looks at a conversation: a
// model, a non-empty list of messages and, on Anthropic's Messages API, a
// max_tokens of at least 1 (OpenAI's and Anthropic's words; Responses: a
// model, in replyResponses).
function checkRequired(j, api) {
  if (!j || typeof j !== 'object' || Array.isArray(j)) return 'the body must be a JSON object';
  if (api === 'messages') {
    if (typeof j.model !== 'string' || !j.model) return 'model: Field required';
    if (!Number.isInteger(j.max_tokens)) return 'max_tokens: Field required';
    if (j.max_tokens < 1) return 'max_tokens: Input should be greater than or equal to 1';
    if (!Array.isArray(j.messages)) return 'messages: Field required';
    if (!j.messages.length) return 'messages: at least one message is required';
    return null;
  }
  if (typeof j.model !== 'string' || !j.model) return 'you must provide a model parameter';
  if (!Array.isArray(j.messages)) return "Missing required parameter: 'messages'.";
  if (!j.messages.length) return "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.";
  return null;
}

// ---- Anthropic Messages ----

// What the Messages API rejects: roles must alternate starting with user;
// every tool_use must be answered by a tool_result in the next user
// message, those results first in it, and a tool_result must answer a
// tool_use of the message before.
function checkAnthropic(messages) {
  let prevUses = new Set();
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i];
    const want = i % 2 === 0 ? 'user' : 'assistant';
    if (m.role !== want) return `messages: roles must alternate between "user" and "assistant", starting with "user" (messages.${i})`;
    const blocks = Array.isArray(m.content) ? m.content : [];
    if (m.role === 'user') {
      const answered = new Set(blocks.filter((b) => b.type === 'tool_result').map((b) => b.tool_use_id));
      for (const id of answered) if (!prevUses.has(id)) return `messages.${i}.content: unexpected \`tool_use_id\` found in \`tool_result\` blocks: ${id}. Each \`tool_result\` block must have a corresponding \`tool_use\` block in the previous message.`;
      for (const id of prevUses) if (!answered.has(id)) return `messages.${i}: \`tool_use\` ids were found without \`tool_result\` blocks immediately after: ${id}`;
      const lead = blocks.findIndex((b) => b.type !== 'tool_result');
      if (prevUses.size && lead >= 0 && lead < prevUses.size)
        return `messages.${i}: Did not find ${prevUses.size} \`tool_result\` block(s) at the beginning of this message. Messages following \`tool_use\` blocks must begin with a matching number of \`tool_result\` blocks.`;
      prevUses = new Set();
    } else {
      prevUses = new Set(blocks.filter((b) => b.type === 'tool_use').map((b) => b.id));
    }
  }
  if (prevUses.size) return 'the last assistant message has tool_use blocks without results';
  return null;
}

// Extended thinking (`thinking: {type: "enabled"}`): the answer starts with
// a thinking block whose signature only this server makes, and a request is
// refused as Anthropic refuses it when a thinking block comes back changed,
// when tool use is forced, or when the assistant message of the last
// tool_use / tool_result exchange does not start with its thinking block.
const SIGNING = crypto.randomBytes(16);
const signThinking = (text) => crypto.createHmac('sha256', SIGNING).update(text).digest('base64');
function checkThinking(req) {
  const msgs = req.messages || [];
  for (let i = 0; i < msgs.length; i++) {
    if (msgs[i].role !== 'assistant' || !Array.isArray(msgs[i].content)) continue;
    for (let k = 0; k < msgs[i].content.length; k++) {
      const b = msgs[i].content[k];
      if (b.type === 'thinking' && (typeof b.signature !== 'string' || b.signature !== signThinking(String(b.thinking))))
        return `messages.${i}.content.${k}: Invalid \`signature\` in \`thinking\` block`;
    }
  }
  if (!req.thinking || req.thinking.type !== 'enabled') return null;
  const choice = req.tool_choice && req.tool_choice.type;
  if (choice === 'any' || choice === 'tool') return 'Thinking may not be enabled when tool_choice forces tool use.';
  const last = msgs[msgs.length - 1];
  const answers = last && last.role === 'user' && Array.isArray(last.content) && last.content.some((b) => b.type === 'tool_result');
  const asked = msgs[msgs.length - 2];
  if (answers && asked && asked.role === 'assistant') {
    const first = Array.isArray(asked.content) ? asked.content[0] : { type: 'text' };
    if (!first || (first.type !== 'thinking' && first.type !== 'redacted_thinking'))
      return `messages.${msgs.length - 2}.content.0.type: Expected \`thinking\` or \`redacted_thinking\`, but found \`${first ? first.type : 'nothing'}\`. When \`thinking\` is enabled, a final \`assistant\` message must start with a thinking block (preceeding the lastmost set of \`tool_use\` and \`tool_result\` blocks).`;
  }
  return null;
}

// A thinking block (by its signature, or a redacted one's data) that the
// conversation holds more than once.
function thinkingRepeated(msgs) {
  const seen = new Set();
  for (const m of msgs) {
    if (m.role !== 'assistant' || !Array.isArray(m.content)) continue;
    for (const b of m.content) {
      const key = b.type === 'thinking' ? 's:' + b.signature : b.type === 'redacted_thinking' ? 'd:' + b.data : null;
      if (!key) continue;
      if (seen.has(key)) return true;
      seen.add(key);
    }
  }
  return false;
}

function scriptAnthropic(req) {
  const msgs = (req.messages || []).map((m) => {
    if (m.role !== 'user' || !Array.isArray(m.content)) return [m];
    return m.content.filter((b) => b.type === 'tool_result').map((b) => ({ role: 'tool', content: typeof b.content === 'string' ? b.content : (b.content || []).map((x) => x.text).join('') }));
  }).flat();
  const tools = (req.tools || []).map((t) => ({ type: 'function', function: { name: t.name } }));
  const off = req.tool_choice && req.tool_choice.type === 'none';
  return script({ model: req.model, messages: msgs, tools: off ? [] : tools });
}

function replyAnthropic(res, req) {
  const plan = scriptAnthropic(req);
  if (plan.refuse) {
    res.writeHead(400, { 'content-type': 'application/json' });
    return res.end(JSON.stringify({ type: 'error', error: { type: 'invalid_request_error', message: plan.refuse } }));
  }
  const id = 'msg_fake' + (++stats.chat);
  const content = [];
  if (req.thinking && req.thinking.type === 'enabled') {
    const thought = `Thinking about request ${id}: ${(plan.calls || []).map((c) => c.name).join(', ') || 'an answer'}.`;
    content.push({ type: 'thinking', thinking: thought, signature: signThinking(thought) });
  }
  // stop_sequences: a text answer ends before the first of them it holds
  const seq = (req.stop_sequences || []).find((s) => typeof s === 'string' && s && plan.text && plan.text.includes(s));
  if (seq) plan.text = plan.text.slice(0, plan.text.indexOf(seq));
  if (plan.text) content.push({ type: 'text', text: plan.text });
  // caller: who made the call, as the API says since its programmatic tool calling (direct: the model)
  for (const c of plan.calls || []) content.push({ type: 'tool_use', id: 'toolu_' + (++callSeq), name: c.name, input: plan.cut ? {} : JSON.parse(c.args), caller: { type: 'direct' }, _raw: c.args });
  const stop = plan.cut ? 'max_tokens' : (plan.calls || []).length ? 'tool_use' : seq ? 'stop_sequence' : 'end_turn';
  // as the API counts a request: its cache's part apart
  const usage = { input_tokens: JSON.stringify(req.messages || []).length >> 2, cache_creation_input_tokens: 100, cache_read_input_tokens: 5000, output_tokens: 10 };
  if (!req.stream) {
    res.writeHead(200, { 'content-type': 'application/json' });
    return res.end(JSON.stringify({ id, type: 'message', role: 'assistant', model: req.model, content: content.map(({ _raw, ...b }) => b), stop_reason: stop, stop_sequence: seq || null, usage }));
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const ev = (type, data) => res.write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
  const steps = [];
  steps.push(() => ev('message_start', { message: { id, type: 'message', role: 'assistant', model: req.model, content: [], stop_reason: null, stop_sequence: null, usage: { ...usage, output_tokens: 1 } } }));
  steps.push(() => ev('ping', {}));
  content.forEach((b, i) => {
    if (b.type === 'thinking') {
      steps.push(() => ev('content_block_start', { index: i, content_block: { type: 'thinking', thinking: '', signature: '' } }));
      for (const w of b.thinking.match(/\S+\s*/g)) steps.push(() => ev('content_block_delta', { index: i, delta: { type: 'thinking_delta', thinking: w } }));
      steps.push(() => ev('content_block_delta', { index: i, delta: { type: 'signature_delta', signature: b.signature } }));
    } else if (b.type === 'text') {
      steps.push(() => ev('content_block_start', { index: i, content_block: { type: 'text', text: '' } }));
      for (const w of b.text.match(/\S+\s*/g)) steps.push(() => ev('content_block_delta', { index: i, delta: { type: 'text_delta', text: w } }));
    } else {
      steps.push(() => ev('content_block_start', { index: i, content_block: { type: 'tool_use', id: b.id, name: b.name, input: {}, caller: b.caller } }));
      for (const part of pieces(b._raw, plan.pieces))
        steps.push(() => ev('content_block_delta', { index: i, delta: { type: 'input_json_delta', partial_json: part } }));
    }
    steps.push(() => ev('content_block_stop', { index: i }));
  });
  // the message's usage so far, whole, as the API's last message_delta has it
  steps.push(() => ev('message_delta', { delta: { stop_reason: stop, stop_sequence: seq || null }, usage }));
  steps.push(() => { ev('message_stop', {}); res.end(); });
  if (plan.pieces) { for (const step of steps) step(); return; } // all at once
  let k = 0;
  const tick = () => { if (k < steps.length && !res.destroyed) { steps[k++](); setTimeout(tick, TICK_MS); } };
  tick();
}

// ---- OpenAI Responses (stored responses, previous_response_id) ----

const stored = new Map(); // response id -> the conversation items up to and with its output
let respSeq = 0;

// A call item's type (the items the client runs), and its output's: a
// function's call is answered by a function_call_output, a custom tool's by
// a custom_tool_call_output, a built-in shell's or apply_patch's by its own.
const OUTPUT_OF = { function_call: 'function_call_output', custom_tool_call: 'custom_tool_call_output', shell_call: 'shell_call_output', apply_patch_call: 'apply_patch_call_output', computer_call: 'computer_call_output', local_shell_call: 'local_shell_call_output' };
const OUTPUTS = Object.values(OUTPUT_OF);
const PNG = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
// what a built-in tool's output item must hold, as the API checks it (a
// computer call's: `call` its call item)
function checkBuiltinOutput(it, call, i) {
  if (it.type === 'computer_call_output') {
    const extra = Object.keys(it).find((k) => !['type', 'id', 'call_id', 'output', 'acknowledged_safety_checks', 'status'].includes(k));
    if (extra) return `Unknown parameter: 'input[${i}].${extra}'.`;
    const o = it.output;
    if (!o || typeof o !== 'object' || o.type !== 'computer_screenshot') return `Invalid value for 'input[${i}].output': expected an object of type 'computer_screenshot'.`;
    if (typeof o.image_url === 'string') {
      const m = /^data:image\/png;base64,(.*)$/.exec(o.image_url);
      if (!m || !Buffer.from(m[1], 'base64').subarray(0, 8).equals(PNG)) return `Invalid 'input[${i}].output.image_url': not a PNG image.`;
    } else if (typeof o.file_id !== 'string') return `Missing required parameter: 'input[${i}].output.image_url'.`;
    const acked = new Set((it.acknowledged_safety_checks || []).map((c) => c && c.id));
    const missing = ((call && call.pending_safety_checks) || []).find((c) => !acked.has(c.id));
    if (missing) return `Safety check ${missing.id} of computer call ${it.call_id} was not acknowledged.`;
  }
  if (it.type === 'shell_call_output') {
    if (!Array.isArray(it.output)) return `Invalid type for 'output': expected an array of shell call output content.`;
    const bad = it.output.find((o) => !o || typeof o.stdout !== 'string' || typeof o.stderr !== 'string' || !o.outcome || !['exit', 'timeout'].includes(o.outcome.type));
    if (bad) return `Invalid value for 'output': each chunk needs stdout, stderr and an outcome of type 'exit' or 'timeout'.`;
  }
  if (it.type === 'local_shell_call_output') { // id, call_id and output all required (openai-python #3923)
    for (const k of ['id', 'call_id', 'output']) if (typeof it[k] !== 'string' || !it[k]) return `Missing required parameter: 'input[${i}].${k}'.`;
    const extra = Object.keys(it).find((k) => !['type', 'id', 'call_id', 'output', 'status'].includes(k));
    if (extra) return `Unknown parameter: 'input[${i}].${extra}'.`;
  }
  if (it.type === 'apply_patch_call_output' && !['completed', 'failed'].includes(it.status))
    return `Invalid value: '${it.status}'. Supported values are: 'completed' and 'failed'.`;
  return null;
}
// a call's output as a tool message's text, for the script
const outputText = (it) => (it.type === 'shell_call_output' ? it.output.map((o) => o.stdout + o.stderr).join('')
  : it.type === 'apply_patch_call_output' ? it.output || it.status
  : it.type === 'computer_call_output' ? 'a screenshot' : it.output);
function checkResponses(items) {
  const calls = new Map(), kinds = new Map(), callItems = new Map();
  for (let i = 0; i < items.length; i++) {
    const it = items[i];
    if (OUTPUT_OF[it.type]) { calls.set(it.call_id, false); kinds.set(it.call_id, it.type); callItems.set(it.call_id, it); }
    if (OUTPUTS.includes(it.type)) {
      const what = it.type.replace(/_/g, ' '); // 'function call output', as OpenAI words it
      const shape = checkBuiltinOutput(it, callItems.get(it.call_id), i);
      if (shape) return shape;
      // (a local shell's call may be answered by a function_call_output: Codex's answer, which the API takes)
      const codex = kinds.get(it.call_id) === 'local_shell_call' && it.type === 'function_call_output';
      if (!calls.has(it.call_id) || (OUTPUT_OF[kinds.get(it.call_id)] !== it.type && !codex)) return `No tool call found for ${what} with call_id ${it.call_id}.`;
      calls.set(it.call_id, true);
      // an output given as a list: each part an input_* part, as OpenAI takes it
      const bad = it.type !== 'shell_call_output' && Array.isArray(it.output) && it.output.find((p) => !['input_text', 'input_image', 'input_file'].includes(p && p.type));
      if (bad) return `Invalid value: '${bad && bad.type}'. Supported values are: 'input_text', 'input_image', and 'input_file'.`;
    }
    if ((it.role === 'user' || it.type === 'message' && it.role === 'user') && [...calls.values()].includes(false))
      return `No tool output found for function call ${[...calls.entries()].find(([, v]) => !v)[0]}.`;
  }
  for (const [id, done] of calls) if (!done) return `No tool output found for function call ${id}.`;
  return null;
}

// Reasoning items (a request with `reasoning`): each answer starts with
// one, and the items it made are bound to it as OpenAI binds them. A
// function_call the server made after a reasoning item may come back only
// after that item, and a reasoning item only followed by an item of its
// own answer; no item may come twice (by its id); else the request is
// refused with OpenAI's words.
const reasoningOf = new Map(); // a call item's id -> its reasoning item's id
const followersOf = new Map(); // reasoning item id -> the ids of the items after it
function checkReasoning(items) {
  const seen = new Set();
  for (let i = 0; i < items.length; i++) {
    const it = items[i];
    if (it.id && seen.has(it.id)) // one item twice (an input item and a stored one, two copies), as OpenAI refuses it
      return `Duplicate item found with id ${it.id}. Remove duplicate items from your input and try again.`;
    if (OUTPUT_OF[it.type] && it.id && reasoningOf.has(it.id) && !seen.has(reasoningOf.get(it.id)))
      return `Item '${it.id}' of type '${it.type}' was provided without its required 'reasoning' item: '${reasoningOf.get(it.id)}'.`;
    if (it.type === 'reasoning' && it.id && followersOf.has(it.id)) {
      const next = items[i + 1];
      if (!next || !next.id || !followersOf.get(it.id).includes(next.id))
        return `Item '${it.id}' of type 'reasoning' was provided without its required following item.`;
    }
    if (it.id) seen.add(it.id);
  }
  return null;
}

// Conversations (POST /v1/conversations): a response created with
// `conversation` reads its items and appends its input and output to them,
// as OpenAI's Conversations API does; with previous_response_id too it is
// refused, as OpenAI refuses it.
const conversations = new Map(); // id -> items
const itemsById = new Map(); // an output item's id -> the item (what an item_reference names)
let convSeq = 0;
function createConversation(res, j) {
  const id = 'conv_fake' + (++convSeq);
  conversations.set(id, Array.isArray(j && j.items) ? j.items.slice() : []);
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ id, object: 'conversation', created_at: Math.floor(Date.now() / 1000), metadata: {} }));
}

function replyResponses(res, req) {
  if (!req || typeof req !== 'object' || Array.isArray(req) || typeof req.model !== 'string' || !req.model) {
    const v = "Missing required parameter: 'model'.";
    stats.violations.push(v);
    return openaiError(res, 400, v, 'model');
  }
  let conv = [];
  const convId = typeof req.conversation === 'string' ? req.conversation : req.conversation && req.conversation.id;
  if (req.conversation !== undefined && req.conversation !== null) {
    if (req.previous_response_id) return openaiError(res, 400, "Mutually exclusive parameters: Ensure you are only providing one of: 'previous_response_id' or 'conversation'.", 'conversation');
    if (!conversations.has(convId)) return openaiError(res, 404, `Conversation with id '${convId}' not found.`, 'conversation');
    conv = conversations.get(convId).slice();
  }
  if (req.previous_response_id) {
    if (!stored.has(req.previous_response_id)) {
      res.writeHead(400, { 'content-type': 'application/json' });
      return res.end(JSON.stringify({ error: { message: `Previous response with id '${req.previous_response_id}' not found.`, type: 'invalid_request_error', param: 'previous_response_id', code: 'previous_response_not_found' } }));
    }
    conv = stored.get(req.previous_response_id).slice();
  }
  let input = typeof req.input === 'string' ? [{ role: 'user', content: req.input }] : req.input || [];
  const missing = input.find((it) => it && it.type === 'item_reference' && !itemsById.has(it.id));
  if (missing) return openaiError(res, 404, `Item with id '${missing.id}' not found.`, 'input');
  input = input.map((it) => (it && it.type === 'item_reference' ? itemsById.get(it.id) : it));
  conv.push(...input);
  const v = checkResponses(conv) || checkReasoning(conv);
  if (v) {
    stats.violations.push(v);
    res.writeHead(400, { 'content-type': 'application/json' });
    return res.end(JSON.stringify({ error: { message: v, type: 'invalid_request_error', param: 'input', code: null } }));
  }
  const msgs = conv.filter((it) => OUTPUTS.includes(it.type)).map((it) => ({ role: 'tool', content: outputText(it) }));
  const tools = (req.tools || []).map((t) => ({ type: 'function', function: { name: t.name || t.type } }));
  const builtins = (req.tools || []).filter((t) => ['shell', 'apply_patch', 'computer_use_preview', 'local_shell'].includes(t.type)).map((t) => t.type);
  const customs = (req.tools || []).filter((t) => t.type === 'custom').map((t) => t.name);
  const plan = script({ model: req.model, messages: msgs, tools: req.tool_choice === 'none' ? [] : tools });
  if (plan.refuse) return openaiError(res, 400, plan.refuse, 'input');
  const id = 'resp_fake' + (++respSeq);
  const output = [];
  if (req.reasoning) output.push({ type: 'reasoning', id: 'rs_f' + respSeq, summary: [] });
  if (plan.text) output.push({ type: 'message', id: 'msg_f' + respSeq, status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: plan.text, annotations: [] }] });
  for (const c of plan.calls || []) {
    if (builtins.includes(c.name) && c.name === 'apply_patch') output.push({ type: 'apply_patch_call', id: 'apc_' + (++callSeq), call_id: 'call_' + callSeq, status: 'completed', operation: { type: 'update_file', path: 'records/7', diff: '@@\n-value: \n+value: A\n' } });
    else if (builtins.includes(c.name) && c.name === 'computer_use_preview')
      output.push({ type: 'computer_call', id: 'cu_' + (++callSeq), call_id: 'call_' + callSeq, status: 'completed', action: { type: 'click', button: 'left', x: 312, y: 208 },
        pending_safety_checks: req.model === 'loop-builtin-checks' ? [{ id: 'cu_sc_' + callSeq, code: 'malicious_instructions', message: 'The page may hold instructions that are not the person\'s.' }] : [] });
    else if (builtins.includes(c.name) && c.name === 'local_shell')
      output.push({ type: 'local_shell_call', id: 'lsh_' + (++callSeq), call_id: 'call_' + callSeq, status: 'completed', action: { type: 'exec', command: ['write-record', '7', 'A'], env: {}, timeout_ms: 10000, user: null, working_directory: null } });
    else if (builtins.includes(c.name)) output.push({ type: 'shell_call', id: 'sh_' + (++callSeq), call_id: 'call_' + callSeq, status: 'completed', action: { commands: ['write-record 7 A'], timeout_ms: 10000, max_output_length: 4096 } });
    else if (customs.includes(c.name)) output.push({ type: 'custom_tool_call', id: 'ctc_' + (++callSeq), call_id: 'call_' + callSeq, name: c.name, input: customInput(c), status: 'completed' });
    else output.push({ type: 'function_call', id: 'fc_' + (++callSeq), call_id: 'call_' + callSeq, name: c.name, arguments: c.args, status: plan.cut ? 'incomplete' : 'completed' });
  }
  if (req.reasoning) {
    followersOf.set(output[0].id, output.slice(1).map((it) => it.id));
    for (const it of output) if (OUTPUT_OF[it.type]) reasoningOf.set(it.id, output[0].id);
  }
  stored.set(id, conv.concat(output));
  for (const it of output) itemsById.set(it.id, it);
  // the conversation takes the request's input and output when its answer
  // was delivered whole: a stream its client left before its end adds
  // nothing (as OpenAI's Conversations API does: openai-node#2571)
  const keep = () => { if (convId && conversations.has(convId)) conversations.set(convId, conv.concat(output)); };
  // cut off by max_output_tokens: status incomplete, and a stream ends on response.incomplete
  const full = { id, object: 'response', created_at: Math.floor(Date.now() / 1000), status: plan.cut ? 'incomplete' : 'completed', model: req.model, output, parallel_tool_calls: true, previous_response_id: req.previous_response_id || null, usage: { input_tokens: 20, output_tokens: 10, total_tokens: 30 }, error: null, incomplete_details: plan.cut ? { reason: 'max_output_tokens' } : null };
  if (req.stream) {
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    let seq = 0;
    const ev = (type, data) => res.write(`event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq++, ...data })}\n\n`);
    const steps = [];
    steps.push(() => ev('response.created', { response: { ...full, status: 'in_progress', output: [], usage: null } }));
    steps.push(() => ev('response.in_progress', { response: { ...full, status: 'in_progress', output: [], usage: null } }));
    output.forEach((it, i) => {
      if (it.type === 'message') {
        const text = it.content[0].text;
        steps.push(() => ev('response.output_item.added', { output_index: i, item: { ...it, status: 'in_progress', content: [] } }));
        steps.push(() => ev('response.content_part.added', { item_id: it.id, output_index: i, content_index: 0, part: { type: 'output_text', text: '', annotations: [] } }));
        for (const w of text.match(/\S+\s*/g)) steps.push(() => ev('response.output_text.delta', { item_id: it.id, output_index: i, content_index: 0, delta: w }));
        steps.push(() => ev('response.output_text.done', { item_id: it.id, output_index: i, content_index: 0, text }));
        steps.push(() => ev('response.content_part.done', { item_id: it.id, output_index: i, content_index: 0, part: { type: 'output_text', text, annotations: [] } }));
      } else if (it.type === 'reasoning') {
        steps.push(() => ev('response.output_item.added', { output_index: i, item: it }));
      } else if (['shell_call', 'apply_patch_call', 'computer_call', 'local_shell_call'].includes(it.type)) { // whole in its added and done events
        steps.push(() => ev('response.output_item.added', { output_index: i, item: { ...it, status: 'in_progress' } }));
      } else if (it.type === 'custom_tool_call') { // its input in two deltas
        const half = it.input.length >> 1;
        steps.push(() => ev('response.output_item.added', { output_index: i, item: { ...it, input: '', status: 'in_progress' } }));
        for (const d of [it.input.slice(0, half), it.input.slice(half)]) steps.push(() => ev('response.custom_tool_call_input.delta', { item_id: it.id, output_index: i, delta: d }));
        steps.push(() => ev('response.custom_tool_call_input.done', { item_id: it.id, output_index: i, input: it.input }));
      } else {
        steps.push(() => ev('response.output_item.added', { output_index: i, item: { ...it, arguments: '', status: 'in_progress' } }));
        steps.push(() => ev('response.function_call_arguments.delta', { item_id: it.id, output_index: i, delta: it.arguments }));
        steps.push(() => ev('response.function_call_arguments.done', { item_id: it.id, output_index: i, arguments: it.arguments }));
      }
      steps.push(() => ev('response.output_item.done', { output_index: i, item: it }));
    });
    steps.push(() => { keep(); ev(plan.cut ? 'response.incomplete' : 'response.completed', { response: full }); res.end(); });
    let k = 0;
    const tick = () => { if (k < steps.length && !res.destroyed) { steps[k++](); setTimeout(tick, TICK_MS); } };
    return tick();
  }
  keep();
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(JSON.stringify(full));
}

// A Chat Completions stream's chunk of one choice, as an SSE event.
const chatChunk = (id, model, delta, finish = null) =>
  'data: ' + JSON.stringify({ id, object: 'chat.completion.chunk', created: 0, model, choices: [{ index: 0, delta, finish_reason: finish }] }) + '\n\n';
// A Chat Completions stream's end: its usage chunk when the request asked for one, then [DONE].
function chatEnd(res, j, id, usage) {
  if (j.stream_options && j.stream_options.include_usage)
    res.write('data: ' + JSON.stringify({ id, object: 'chat.completion.chunk', created: 0, model: j.model, choices: [], usage }) + '\n\n');
  res.end('data: [DONE]\n\n');
}

// The scripts that fail the same way on every API: true when answered.
function failing(res, j) {
  const model = j.model || '';
  if (model.startsWith('odd-answer')) { // answers no provider should send; each must reach the client readable
    if (res.req.url.endsWith('/responses')) { // a text that is not a string
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ id: 'resp_odd', object: 'response', created_at: 0, status: 'completed', model, output: [{ type: 'message', id: 'msg_odd', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: 7, annotations: [] }] }], usage: { input_tokens: 1, output_tokens: 1, total_tokens: 2 } }));
      return true;
    }
    if (res.req.url.endsWith('/chat/completions') && !j.stream) { // JSON, not an object
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('[{"id":"chatcmpl-odd","choices":[]}]');
      return true;
    }
    if (res.req.url.endsWith('/chat/completions') && j.stream) {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const ch = (delta, fin = null) => JSON.stringify({ id: 'chatcmpl-odd', object: 'chat.completion.chunk', created: 0, model, choices: [{ index: 0, delta, finish_reason: fin }] });
      res.write('data: ' + ch({ role: 'assistant', content: '' }) + '\n\n');
      res.write('data: <not json>\ndata: ' + ch({ content: 'hidden ' }) + '\n\n'); // one event of two data lines: not JSON
      res.write('data: ' + ch({ tool_calls: [{ index: 2 ** 53, id: 'call_far', type: 'function', function: { name: 'lookup', arguments: '{}' } }] }) + '\n\n');
      res.write('data: ' + ch({ content: 'Hi there.' }) + '\n\n');
      res.end('data: ' + ch({}, 'stop') + '\n\ndata: [DONE]\n\n');
      return true;
    }
  }
  if (model.startsWith('busy')) { // rate limited, as OpenAI and Anthropic answer it
    res.writeHead(429, { 'content-type': 'application/json', 'retry-after': '7' });
    res.end(JSON.stringify(res.req.url.endsWith('/messages')
      ? { type: 'error', error: { type: 'rate_limit_error', message: 'Number of requests has exceeded your rate limit.' } }
      : { error: { message: 'Rate limit reached for requests', type: 'requests', param: null, code: 'rate_limit_exceeded' } }));
    return true;
  }
  if (model.startsWith('line-ends') && j.stream && res.req.url.endsWith('/chat/completions')) {
    // the three line ends SSE allows (LF, CRLF, CR), mixed: "Hi there." in two deltas
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const ch = (delta, fin = null) => JSON.stringify({ id: 'chatcmpl-ends', object: 'chat.completion.chunk', created: 0, model, choices: [{ index: 0, delta, finish_reason: fin }] });
    res.write('data: ' + ch({ role: 'assistant', content: '' }) + '\r\r');
    res.write('data: ' + ch({ content: 'Hi ' }) + '\n\r\n');
    res.write('event: message\rdata: ' + ch({ content: 'there.' }) + '\r\n\n');
    res.end('data: ' + ch({}, 'stop') + '\r\n\r\ndata: [DONE]\r\r');
    return true;
  }
  if (model.startsWith('garbage-stream')) {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.end('data: <html>oops</html>\n\ndata: not json either\n\n');
    return true;
  }
  if (model.startsWith('queued') && j.stream && res.req.url.endsWith('/chat/completions')) {
    // OpenRouter's way while the model is queued: SSE comments, then the answer
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    let k = 0;
    const tick = () => {
      if (res.destroyed) return;
      if (k++ < 3) { res.write(': OPENROUTER PROCESSING\n\n'); return setTimeout(tick, 300); }
      res.write(chatChunk('chatcmpl-queued', model, { role: 'assistant', content: 'Done.' }));
      res.write(chatChunk('chatcmpl-queued', model, {}, 'stop'));
      chatEnd(res, j, 'chatcmpl-queued', { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 });
    };
    tick();
    return true;
  }
  if (model.startsWith('slow-call') && j.stream && res.req.url.endsWith('/chat/completions')) {
    // a call whose arguments come slowly, 250 ms a piece (a model writing a
    // long file); once the conversation holds a result, "Done."
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    const ch = (delta, finish) => chatChunk('chatcmpl-slowcall', model, delta, finish);
    const end = () => chatEnd(res, j, 'chatcmpl-slowcall', { prompt_tokens: 5, completion_tokens: 9, total_tokens: 14 });
    if ((j.messages || []).some((m) => m.role === 'tool')) {
      res.write(ch({ role: 'assistant', content: 'Done.' }));
      res.write(ch({}, 'stop'));
      return end(), true;
    }
    res.write(ch({ role: 'assistant', content: null, tool_calls: [{ index: 0, id: 'call_slow', type: 'function', function: { name: 'write_record', arguments: '' } }] }));
    const parts = ['{"record', '_id"', ': 7', ', "val', 'ue": "', 'slow', 'ly"', '}'];
    let k = 0;
    const tick = () => {
      if (res.destroyed) return;
      if (k < parts.length) {
        res.write(ch({ tool_calls: [{ index: 0, function: { arguments: parts[k++] } }] }, null));
        return setTimeout(tick, 250);
      }
      res.write(ch({}, 'tool_calls'));
      end();
    };
    setTimeout(tick, 250);
    return true;
  }
  if (model.startsWith('overload') && j.stream) { // a few words, then the provider's own error event, as each sends it
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    const words = ['Partial ', 'answer '];
    const url = res.req.url;
    if (url.endsWith('/messages')) {
      res.write(`event: message_start\ndata: ${JSON.stringify({ type: 'message_start', message: { id: 'msg_over', type: 'message', role: 'assistant', model, content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 3, output_tokens: 1 } } })}\n\n`);
      res.write(`event: content_block_start\ndata: ${JSON.stringify({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } })}\n\n`);
      for (const w of words) res.write(`event: content_block_delta\ndata: ${JSON.stringify({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: w } })}\n\n`);
      res.end(`event: error\ndata: ${JSON.stringify({ type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } })}\n\n`);
    } else if (url.endsWith('/responses')) {
      let seq = 0;
      const ev = (type, data) => res.write(`event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq++, ...data })}\n\n`);
      const resp = { id: 'resp_over', object: 'response', created_at: 0, status: 'in_progress', model, output: [], usage: null };
      ev('response.created', { response: resp });
      ev('response.output_item.added', { output_index: 0, item: { id: 'msg_over', type: 'message', status: 'in_progress', role: 'assistant', content: [] } });
      ev('response.content_part.added', { item_id: 'msg_over', output_index: 0, content_index: 0, part: { type: 'output_text', text: '', annotations: [] } });
      for (const w of words) ev('response.output_text.delta', { item_id: 'msg_over', output_index: 0, content_index: 0, delta: w });
      ev('error', { code: 'server_error', message: 'The server had an error while processing your request.', param: null });
      res.end();
    } else {
      for (const w of words) res.write(chatChunk('chatcmpl-over', model, { content: w }));
      res.end('data: ' + JSON.stringify({ error: { message: 'The server had an error while processing your request. Sorry about that!', type: 'server_error', param: null, code: null } }) + '\n\n');
    }
    return true;
  }
  if (model.startsWith('cutoff') && j.stream) {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const words = ['Partial ', 'answer ', 'then '];
    if (res.req.url.endsWith('/messages')) {
      res.write(`event: message_start\ndata: ${JSON.stringify({ type: 'message_start', message: { id: 'msg_cut', type: 'message', role: 'assistant', model, content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 1, output_tokens: 1 } } })}\n\n`);
      res.write(`event: content_block_start\ndata: ${JSON.stringify({ type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } })}\n\n`);
      for (const w of words) res.write(`event: content_block_delta\ndata: ${JSON.stringify({ type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: w } })}\n\n`);
    } else {
      for (const w of words) res.write(chatChunk('chatcmpl-cut', model, { content: w }));
    }
    setTimeout(() => res.destroy(), 50);
    return true;
  }
  return false;
}

// The answer of a mutant-SEED model mutated as it is written: a JSON body
// whole, a stream's events one by one (some of them), at times its bytes.
// Its errors (400) are a provider's, as they are.
function mutating(res, seed) {
  const r = rng(seed);
  const write = res.write.bind(res), end = res.end.bind(res);
  const mut = (chunk) => {
    if (typeof chunk !== 'string' || !chunk || res.statusCode !== 200) return chunk; /* its errors as a provider's */
    if (r() < 0.08) return mutateText(chunk, r);
    if (/^(data|event): /.test(chunk))
      return chunk.replace(/^data: (.*)$/m, (line, d) => {
        if (d === '[DONE]' || r() > 0.3) return line;
        try { return 'data: ' + JSON.stringify(mutateValue(JSON.parse(d), r)); } catch { return line; }
      });
    try { return JSON.stringify(mutateValue(JSON.parse(chunk), r)); } catch { return chunk; }
  };
  res.write = (c, ...a) => write(mut(c), ...a);
  res.end = (c, ...a) => end(mut(c), ...a);
}

function malformed(res, url, err) {
  stats.malformed++;
  if (res.headersSent) return res.destroy();
  const msg = `Invalid request: ${String(err && err.message || err).slice(0, 200)}`;
  res.writeHead(400, { 'content-type': 'application/json' });
  res.end(JSON.stringify(url.endsWith('/messages') ? { type: 'error', error: { type: 'invalid_request_error', message: msg } }
    : { error: { message: msg, type: 'invalid_request_error', param: null, code: null } }));
}

const uploads = []; // POST /v1/files: {id, bytes, filename, purpose, created_at, sha256, data}

function openaiError(res, status, message, param = null) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ error: { message, type: 'invalid_request_error', param, code: null } }));
  return true;
}

// The parts of a multipart/form-data body (RFC 7578): [{name, filename, data}], or a string: what is wrong.
function multipart(type, buf) {
  const m = /^multipart\/form-data\s*;.*boundary=(?:"([^"]+)"|([^;\s]+))/i.exec(type || '');
  if (!m) return `Invalid Content-Type header (${type || 'none'}), expected multipart/form-data`;
  const delim = Buffer.from(`--${m[1] || m[2]}`);
  const parts = [];
  let at = buf.indexOf(delim);
  if (at < 0) return 'the multipart body has no boundary line';
  for (;;) {
    at += delim.length;
    if (buf.slice(at, at + 2).toString() === '--') return parts; // the closing delimiter
    const headEnd = buf.indexOf('\r\n\r\n', at);
    const next = buf.indexOf(Buffer.concat([Buffer.from('\r\n'), delim]), headEnd);
    if (headEnd < 0 || next < 0) return 'the multipart body ends inside a part';
    const head = buf.slice(at, headEnd).toString();
    const disp = /content-disposition:\s*form-data;([^\r\n]*)/i.exec(head);
    if (!disp) return 'a part without Content-Disposition: form-data';
    const name = /\bname="([^"]*)"/.exec(disp[1]), file = /\bfilename="([^"]*)"/.exec(disp[1]);
    parts.push({ name: name && name[1], filename: file && file[1], data: buf.slice(headEnd + 4, next) });
    at = next + 2;
  }
}

function files(req, res, buf) {
  const u = new URL(req.url, 'http://x');
  if (req.method === 'POST' && u.pathname === '/v1/files') {
    stats.upload_requests = (stats.upload_requests || 0) + 1;
    const parts = multipart(req.headers['content-type'], buf);
    if (typeof parts === 'string') return openaiError(res, 400, parts);
    const purpose = parts.find((p) => p.name === 'purpose'), file = parts.find((p) => p.name === 'file');
    if (!purpose) return openaiError(res, 400, "Missing required parameter: 'purpose'.", 'purpose');
    if (!file || file.filename == null) return openaiError(res, 400, "Missing required parameter: 'file'.", 'file');
    const f = { id: `file-up-${uploads.length + 1}`, object: 'file', bytes: file.data.length,
      created_at: 1700000000 + uploads.length, filename: file.filename, purpose: purpose.data.toString(),
      sha256: crypto.createHash('sha256').update(file.data).digest('hex') };
    uploads.push({ ...f, data: file.data });
    res.writeHead(200, { 'content-type': 'application/json' });
    return res.end(JSON.stringify(f)), true;
  }
  if (req.method === 'GET' && u.pathname === '/v1/files') {
    const limit = Number(u.searchParams.get('limit') || 10000), after = u.searchParams.get('after');
    const from = after ? uploads.findIndex((f) => f.id === after) + 1 : 0;
    if (after && from === 0) return openaiError(res, 400, `No such file: '${after}'`, 'after');
    const page = uploads.slice(from, from + limit).map(({ data, ...f }) => f);
    res.writeHead(200, { 'content-type': 'application/json' });
    return res.end(JSON.stringify({ object: 'list', data: page, first_id: page.length ? page[0].id : null,
      last_id: page.length ? page[page.length - 1].id : null, has_more: from + limit < uploads.length })), true;
  }
  const got = req.method === 'GET' && /^\/v1\/files\/(file-up-\d+)\/content$/.exec(u.pathname);
  const f = got && uploads.find((x) => x.id === got[1]);
  if (f) {
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(f.data.length) });
    return res.end(f.data), true;
  }
  return false;
}

function serve(req, res) {
  stats.http_versions[req.httpVersion] = (stats.http_versions[req.httpVersion] || 0) + 1;
  // HTTP/2's compatibility response has no `destroyed`: its stream's
  if (!('destroyed' in res)) Object.defineProperty(res, 'destroyed', { get: () => res.stream.destroyed });
  let body = '';
  const chunks = [];
  req.on('data', (d) => chunks.push(d));
  res.on('close', () => { if (!res.writableEnded) stats.aborted++; });
  // what a provider sends with every answer: a client reads its request id
  // and its rate limits (the gateway passes them on); the server and its
  // cookie are the provider's own (the gateway does not)
  res.setHeader('x-request-id', `req_fake_${++requestSeq}`);
  res.setHeader('x-ratelimit-remaining-requests', '4999');
  res.setHeader('server', 'fake-upstream');
  res.setHeader('set-cookie', 'provider_session=abc; Path=/; HttpOnly');
  res.setHeader('x-loopguard-action', 'forged'); // the gateway's own header is its own
  req.on('end', () => {
    const buf = Buffer.concat(chunks);
    body = buf.toString();
    try { if (!files(req, res, buf)) route(req, res, body); } catch (e) { malformed(res, req.url, e); }
  });
}
const tls = process.env.FAKE_TLS_CERT && process.env.FAKE_TLS_KEY;
const server = tls
  ? http2.createSecureServer({ cert: fs.readFileSync(process.env.FAKE_TLS_CERT), key: fs.readFileSync(process.env.FAKE_TLS_KEY), allowHTTP1: true }, serve)
  : http.createServer(serve);
if (tls) server.on('secureConnection', () => stats.tls_connections++);
server.on('connection', () => stats.connections++); // TCP connections accepted (reuse.sh)

// Azure OpenAI, its paths under the resource's /openai: the classic API
// (an AzureOpenAI client's) without an api-version a 404, and either API
// without its key a 401 (the classic one takes it in api-key only, the v1
// API in Authorization too), as Azure answers them; a deployment's chat
// completions are the model it names (the body's model is not read); then
// as OpenAI's.
function azure(req, res, body) {
  const u = new URL(req.url, 'http://x'), json = { 'content-type': 'application/json' };
  const v1 = u.pathname.startsWith('/openai/v1/');
  if (!v1 && !u.searchParams.get('api-version')) { res.writeHead(404, json); res.end(JSON.stringify({ error: { code: '404', message: 'Resource not found' } })); return null; }
  if (!req.headers['api-key'] && !(v1 && req.headers.authorization)) {
    res.writeHead(401, json);
    res.end(JSON.stringify({ error: { code: '401', message: 'Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.' } }));
    return null;
  }
  stats.azure++;
  if (v1) { req.url = u.pathname.slice(7); req.azureWire = true; return body; }
  const dep = /^\/openai\/deployments\/([^/]+)\/chat\/completions$/.exec(u.pathname);
  if (dep) {
    req.url = '/v1/chat/completions';
    req.azureWire = true; // answered in Azure's own shape (reply)
    try { const j = JSON.parse(body); if (j && typeof j === 'object') { j.model = decodeURIComponent(dep[1]); return JSON.stringify(j); } } catch { /* its 400 below */ }
    return body;
  }
  if (req.method === 'POST' && u.pathname === '/openai/responses') { req.url = '/v1/responses'; return body; }
  const emb = /^\/openai\/deployments\/([^/]+)\/embeddings$/.exec(u.pathname);
  if (emb) { // the deployment's model, whatever the body says
    req.url = '/v1/embeddings';
    try { const j = JSON.parse(body); if (j && typeof j === 'object') { j.model = decodeURIComponent(emb[1]); return JSON.stringify(j); } } catch { /* its 400 */ }
    return body;
  }
  res.writeHead(404, json); res.end(JSON.stringify({ error: { code: '404', message: 'Resource not found' } }));
  return null;
}

// Gemini's OpenAI compatibility (generativelanguage.googleapis.com/v1beta/openai):
// OpenAI's paths under a base URL that ends in /openai without being Azure's,
// the key in Authorization only (an Azure-style api-key alone is refused).
function compat(req, res) {
  if (!req.headers.authorization) {
    res.writeHead(401, { 'content-type': 'application/json' });
    res.end(JSON.stringify([{ error: { code: 401, message: 'Missing or invalid Authorization header.', status: 'UNAUTHENTICATED' } }]));
    return false;
  }
  stats.compat++;
  req.url = '/v1' + req.url.slice('/v1beta/openai'.length);
  return true;
}

function route(req, res, body) {
    stats.requests++;
    if (req.url.startsWith('/openai/') && (body = azure(req, res, body)) === null) return;
    if (req.url.startsWith('/v1beta/openai/') && !compat(req, res)) return;
    // the headers of the last request (a passed-through one's type and encoding, for a test)
    if (!/^\/(stats|reset)$/.test(req.url)) [stats.last_headers, stats.last_url] = [req.headers, req.url];
    if (req.method === 'POST' && /^\/v1\/(chat\/completions|messages|responses)$/.test(req.url)) {
      stats.raw.push(body); // the bytes as they came, for the tests of an unchanged body
      if (stats.raw.length > 20) stats.raw.shift();
    }
    if (req.method === 'POST') {
      // the credential each model request came with (a test checks which key went upstream)
      stats.auths.push(req.headers.authorization || req.headers['x-api-key'] || req.headers['api-key'] || null);
      if (stats.auths.length > 50) stats.auths.shift();
      let j = null;
      try { j = JSON.parse(body); } catch { /* each route answers its own 400 */ }
      if (j && typeof j === 'object') {
        if (j.model) stats.models.push(j.model);
        if (stats.models.length > 200) stats.models.shift();
        if (typeof j.model !== 'string' && j.model !== undefined) throw new Error('model: expected a string');
        if ((j.model || '').startsWith('mutant-')) mutating(res, parseInt(j.model.slice(7), 10) || 1);
        if (failing(res, j)) return;
      }
    }
    if (req.method === 'GET' && req.url === '/stats') {
      res.writeHead(200, { 'content-type': 'application/json' });
      return res.end(JSON.stringify(stats));
    }
    if (req.method === 'POST' && req.url === '/reset') {
      stats.violations = []; stats.chat = 0; stats.bodies = []; stats.raw = []; stats.models = []; stats.aborted = 0; stats.auths = [];
      res.writeHead(200); return res.end('{}');
    }
    if (req.method === 'POST' && req.url === '/v1/conversations') {
      let j = {};
      try { j = body ? JSON.parse(body) : {}; } catch { return openaiError(res, 400, 'We could not parse the JSON body of your request.'); }
      return createConversation(res, j);
    }
    if (req.method === 'POST' && req.url === '/v1/completions') {
      let j;
      try { j = JSON.parse(body); } catch { res.writeHead(400); return res.end('{}'); }
      if ((j.model || '').startsWith('slow')) return setTimeout(() => replyLegacy(res, j), 3000); // a passed-through request that thinks
      return replyLegacy(res, j);
    }
    const file = (req.method === 'GET' || req.method === 'HEAD') && /^\/v1\/files\/file-(big|cut)-(\d+)\/content$/.exec(req.url);
    if (file) return download(res, Number(file[2]), file[1] === 'cut');
    if (req.method === 'POST' && req.url === '/v1/embeddings') { // OpenAI's shape; usage last, as OpenAI sends it
      let j;
      try { j = JSON.parse(body); } catch { j = null; }
      const inputs = j && (typeof j.input === 'string' || (Array.isArray(j.input) && typeof j.input[0] === 'number') ? [j.input] : j.input);
      if (!j || typeof j.model !== 'string' || !Array.isArray(inputs) || !inputs.length) {
        res.writeHead(400, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ error: { message: "'input' is a required property", type: 'invalid_request_error', param: null, code: null } }));
      }
      if (j.model === 'embed-broken') {
        res.writeHead(500, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ error: { message: 'The server had an error while processing your request.', type: 'server_error', param: null, code: null } }));
      }
      // a token every four bytes of text, as a tokenizer makes them about
      const tokens = inputs.reduce((n, x) => n + (typeof x === 'string' ? Math.ceil(Buffer.byteLength(x) / 4) : x.length), 0);
      stats.embedding_tokens += tokens;
      const vec = [0.1, -0.2, 0.3, 0.05]; // base64: the float32s' bytes, as the openai SDK asks by default
      const embedding = j.encoding_format === 'base64' ? Buffer.from(new Float32Array(vec).buffer).toString('base64') : vec;
      const out = { object: 'list', data: inputs.map((_, index) => ({ object: 'embedding', index, embedding })), model: j.model };
      if (j.model !== 'embed-nousage') out.usage = { prompt_tokens: tokens, total_tokens: tokens };
      // an upstream that reports the cost (USD), under the tokens' price or over the worst case
      if (out.usage && j.model.startsWith('costly')) out.usage.cost = j.model.endsWith('-over') ? 0.000777 : 0.000005;
      const answer = () => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify(out));
      };
      return j.model === 'embed-slow' ? setTimeout(answer, 3000) : answer();
    }
    if (req.method === 'GET' && req.url === '/v1/models') {
      res.writeHead(200, { 'content-type': 'application/json', 'x-fake': 'models' });
      return res.end(JSON.stringify({ object: 'list', data: [{ id: 'finish', object: 'model', created: 0, owned_by: 'fake' }] }));
    }
    if (req.method === 'POST' && req.url === '/v1/chat/completions') {
      let j;
      try { j = JSON.parse(body); } catch {
        res.writeHead(400, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ error: { message: 'We could not parse the JSON body of your request.', type: 'invalid_request_error', param: null, code: null } }));
      }
      stats.bodies.push(j);
      if (stats.bodies.length > 50) stats.bodies.shift();
      const legacy = Array.isArray(j.functions);
      const v = checkRequired(j, 'chat') || (legacy ? checkLegacy(j) : check(j.messages || []) || checkReasoningContent(j) || checkThoughtSignatures(j) || checkReasoningDetails(j) || checkGroq(j));
      if (v) {
        stats.violations.push(v);
        res.writeHead(400, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ error: { message: "Invalid parameter: " + v, type: 'invalid_request_error', param: 'messages', code: null } }));
      }
      if (/-mistral/.test(j.model || '') && 'stream_options' in j) { // Mistral's API: no such member
        stats.stream_options_refused++;
        res.writeHead(422, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ object: 'error', message: { detail: [{ type: 'extra_forbidden', loc: ['body', 'stream_options'], msg: 'Extra inputs are not permitted', input: j.stream_options }] }, type: 'invalid_request_error', param: null, code: null }));
      }
      if (/-o3/.test(j.model || '') && 'max_tokens' in j) { // OpenAI's reasoning models
        stats.max_tokens_refused++;
        res.writeHead(400, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ error: { message: "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.", type: 'invalid_request_error', param: 'max_tokens', code: 'unsupported_parameter' } }));
      }
      if ((j.model || '').startsWith('slow')) return setTimeout(() => reply(res, j, false, req.azureWire), 3000);
      if ((j.model || '').startsWith('garbage')) { res.writeHead(200, { 'content-type': 'application/json' }); return res.end('<html>oops'); }
      return legacy ? reply(res, fromLegacy(j), true) : reply(res, j, false, req.azureWire);
    }
    if (req.method === 'POST' && req.url === '/v1/responses') {
      let j;
      try { j = JSON.parse(body); } catch { res.writeHead(400); return res.end('{}'); }
      stats.bodies.push(j);
      if (stats.bodies.length > 50) stats.bodies.shift();
      return replyResponses(res, j);
    }
    if (req.method === 'POST' && (req.url === '/v1/messages' || req.url === '/v1/messages?beta=true')) { // the SDKs' beta path too
      let j;
      try { j = JSON.parse(body); } catch {
        res.writeHead(400, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ type: 'error', error: { type: 'invalid_request_error', message: 'invalid JSON' } }));
      }
      stats.bodies.push(j);
      if (stats.bodies.length > 50) stats.bodies.shift();
      // not a refusal (none is documented), but never a conversation the
      // model made: one answer's thinking block in two turns
      if (thinkingRepeated(j.messages || [])) stats.thinking_repeated++;
      // a computer-use tool is a beta tool: refused without its beta named
      const beta = String(req.headers['anthropic-beta'] || '');
      const cu = (j.tools || []).find((t) => t && typeof t.type === 'string' && t.type.startsWith('computer_'));
      const v = checkRequired(j, 'messages') || checkAnthropic(j.messages || []) || checkThinking(j) ||
        (cu && !/computer-use-/.test(beta) ? `tools.0: Input tag '${cu.type}' found using 'type' does not match any of the expected tags without the beta header computer-use` : null);
      if (v) {
        stats.violations.push(v);
        res.writeHead(400, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ type: 'error', error: { type: 'invalid_request_error', message: v } }));
      }
      return replyAnthropic(res, j);
    }
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { message: `Unknown request URL: ${req.method} ${req.url}`, type: 'invalid_request_error', param: null, code: 'unknown_url' } }));
}
server.listen(0, '127.0.0.1', () => {
  fs.writeFileSync(process.argv[2], String(server.address().port));
});
