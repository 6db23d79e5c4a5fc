// mutate.mjs — the gateway under mutated conversations (tests/gateway/mutate.sh).
//
// Sends N requests to BASE_URL (the gateway): each a valid request of one
// of the three APIs (a conversation with tool calls and their results,
// stream false or true) mutated by a seed (mutate-lib.mjs: values of
// other types, members gone or doubled, its bytes cut or changed), to a
// model of the fake upstream (one that loops, one that finishes, or
// mutant-SEED, whose answer is mutated too). Some requests share a run
// (X-Loopguard-Run), so a run's state meets odd histories; one in ten
// hangs up after 0 to 30 ms (counted as "hangup"). Eight at once.
//
// Every answer must be one the client can read: 200 with a JSON object or
// an event stream whose events are JSON (or [DONE]), or an error status
// other than 500 with a JSON error in the route's API shape (OpenAI's
// {"error": {...}}, Anthropic's {"type": "error", "error": {...}}). A
// stream that already began may end on an error event of its API. Prints
// {"sent", "by_status", "bad": [...]} and exits 1 when any answer is bad.
// SEED (1) and N (600) choose the requests; a failure names its seed.
import { rng, mutateValue, mutateText } from './mutate-lib.mjs';

const BASE = process.env.BASE_URL;
const N = Number(process.env.N || 600);
const SEED = Number(process.env.SEED || 1);

const tools = [
  { type: 'function', function: { name: 'lookup', description: 'Look a customer up.', parameters: { type: 'object', properties: { customer_id: { type: 'string' } }, required: ['customer_id'] } } },
  { type: 'function', function: { name: 'write_record', description: 'Write a record.', parameters: { type: 'object', properties: { record_id: { type: 'integer' }, value: { type: 'string' } }, required: ['record_id', 'value'] } } },
];

function chatSeed(model, stream) {
  const messages = [{ role: 'system', content: 'You are careful.' }, { role: 'user', content: 'Write record 7.' }];
  for (let i = 0; i < 3; i++) {
    const id = `call_m${i}`;
    messages.push({ role: 'assistant', content: null, tool_calls: [{ id, type: 'function', function: { name: 'write_record', arguments: '{"record_id":7,"value":"A"}' } }] });
    messages.push({ role: 'tool', tool_call_id: id, content: '{"error":"storage read-only"}' });
  }
  const b = { model, messages, tools };
  if (stream) { b.stream = true; b.stream_options = { include_usage: true }; }
  return b;
}

function messagesSeed(model, stream) {
  const messages = [{ role: 'user', content: 'Write record 7.' }];
  for (let i = 0; i < 3; i++) {
    const id = `toolu_m${i}`;
    messages.push({ role: 'assistant', content: [{ type: 'text', text: 'Writing.' }, { type: 'tool_use', id, name: 'write_record', input: { record_id: 7, value: 'A' } }] });
    messages.push({ role: 'user', content: [{ type: 'tool_result', tool_use_id: id, content: 'storage read-only', is_error: true }] });
  }
  const b = { model, max_tokens: 256, messages, tools: tools.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters })) };
  if (stream) b.stream = true;
  return b;
}

function responsesSeed(model, stream) {
  const input = [{ role: 'user', content: 'Write record 7.' }];
  for (let i = 0; i < 3; i++) {
    const call_id = `call_r${i}`;
    input.push({ type: 'function_call', id: `fc_r${i}`, call_id, name: 'write_record', arguments: '{"record_id":7,"value":"A"}', status: 'completed' });
    input.push({ type: 'function_call_output', call_id, output: '{"error":"storage read-only"}' });
  }
  const b = { model, input, tools: tools.map((t) => ({ type: 'function', name: t.function.name, description: t.function.description, parameters: t.function.parameters })) };
  if (stream) b.stream = true;
  return b;
}

const ROUTES = [
  { path: '/v1/chat/completions', seed: chatSeed, api: 'openai' },
  { path: '/v1/messages', seed: messagesSeed, api: 'anthropic' },
  { path: '/v1/responses', seed: responsesSeed, api: 'openai' },
];

// What is wrong with an answer, or null.
function judge(route, status, ctype, text) {
  if (status === 500) return `500: ${text.slice(0, 300)}`;
  if (status === 200 && /text\/event-stream/.test(ctype)) {
    for (const block of text.split(/\r?\n\r?\n/)) {
      for (const line of block.split(/\r?\n/)) {
        if (!line.startsWith('data:')) continue;
        const d = line.slice(5).trim();
        if (d === '[DONE]') continue;
        try { const v = JSON.parse(d); if (!v || typeof v !== 'object') return `a stream event that is not an object: ${d.slice(0, 200)}`; }
        catch { return `a stream event that is not JSON: ${JSON.stringify(d.slice(0, 1200))}`; }
      }
    }
    return null;
  }
  let v;
  try { v = JSON.parse(text); } catch { return `${status} ${ctype}: not JSON: ${text.slice(0, 300)}`; }
  if (!v || typeof v !== 'object' || Array.isArray(v)) return `${status}: not a JSON object: ${text.slice(0, 300)}`;
  if (status === 200) return null;
  const shaped = route.api === 'anthropic'
    ? v.type === 'error' && v.error && typeof v.error.message === 'string'
    : v.error && typeof v.error === 'object' && typeof v.error.message === 'string';
  return shaped ? null : `${status}: an error not in the ${route.api} shape: ${text.slice(0, 300)}`;
}

async function one(i) {
  const r = rng(SEED * 1000003 + i);
  const route = ROUTES[i % ROUTES.length];
  const stream = r() < 0.5;
  const kind = r();
  // a mutant answers as Gemini (signed calls) or OpenRouter (reasoning_details) one time in three each
  const flavour = ['', '-gemini', '-openrouter'][Math.floor(i / 3) % 3];
  const model = kind < 0.4 ? `mutant-${SEED * 7919 + i}${flavour}` : kind < 0.7 ? 'loop-write' : 'finish';
  const seed = route.seed(model, stream);
  let body;
  const how = r();
  if (how < 0.1) body = mutateText(JSON.stringify(seed), r); // bytes
  else if (how < 0.25) body = JSON.stringify(seed); // whole: the model's answer (mutant) is what is odd
  else body = JSON.stringify(mutateValue(seed, r));
  const headers = { 'content-type': 'application/json', authorization: 'Bearer sk-test' };
  if (route.api === 'anthropic') headers['anthropic-version'] = '2023-06-01';
  if (r() < 0.5) headers['x-loopguard-run'] = `mut-${SEED}-${Math.floor(r() * 12)}`; // shared runs
  // One request in ten hangs up after 0 to 30 ms: before its answer, or
  // in the middle of its stream.
  const hangup = r() < 0.1 ? Math.floor(r() * 30) : -1;
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(new Error('no answer in 20 s')), 20000);
  if (hangup >= 0) setTimeout(() => ac.abort(new Error('hang-up')), hangup);
  const t0 = Date.now();
  let res, text;
  try {
    res = await fetch(BASE + route.path, { method: 'POST', headers, body, signal: ac.signal });
    text = await res.text();
  } catch (e) {
    if (hangup >= 0 && ac.signal.reason && ac.signal.reason.message === 'hang-up') return { i, status: 'hangup' };
    return { i, status: 0, bad: `request ${i} (seed ${SEED}): ${e && e.message}` };
  } finally {
    clearTimeout(timer);
  }
  const why = judge(route, res.status, res.headers.get('content-type') || '', text);
  return { i, status: res.status, ms: Date.now() - t0, bad: why && `request ${i} (seed ${SEED}, ${route.path}, stream ${stream}, model ${model}): ${why}\n  body: ${Buffer.from(body).toString().slice(0, 400)}` };
}

const out = { sent: 0, by_status: {}, bad: [], slowest_ms: 0 };
let next = 0;
async function lane() {
  while (next < N) {
    const r = await one(next++);
    out.sent++;
    out.by_status[r.status] = (out.by_status[r.status] || 0) + 1;
    out.slowest_ms = Math.max(out.slowest_ms, r.ms || 0);
    if (r.bad) out.bad.push(r.bad);
  }
}
await Promise.all(Array.from({ length: 8 }, lane));
console.log(JSON.stringify(out));
process.exit(out.bad.length ? 1 : 0);
