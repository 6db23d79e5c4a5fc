// conversation.mjs — conversations that outlive one agent loop, on plain
// fetch (Chat Completions, not streamed), for tests/gateway/guard.sh:
//
//   MODE=episode  loop with MODEL until a final answer, then the person
//                 writes again and the loop goes on with MODEL2: a new
//                 user message after a stop starts a new episode
//   MODE=evict    conversation A asks for a tool call, then OTHERS other
//                 conversations start, then A goes on with its result
//                 (A's run was evicted from the gateway's memory meanwhile;
//                 A_RUN: A's requests name their run by X-Loopguard-Run)
//   MODE=resume   loop with MODEL until a final answer, then an operator
//                 resumes the run (POST /v1/runs/{id}/resume) and the
//                 conversation goes on as it is with MODEL2 (no new message)
//   AFTER=N       (episode) then N more requests with MODEL2, the
//                 conversation going on without a new user message
//   BASE_URL, HEADERS (JSON: extra request headers)
//   BASE_URLS     comma-separated: the requests go to each in turn
//                 (round-robin.mjs), BASE_URL's path kept
// Prints one JSON object: the run (X-Loopguard-Run) and answer of each step.
import { roundRobin } from './round-robin.mjs';

const base = process.env.BASE_URL;
const send = roundRobin();
const headers = { 'content-type': 'application/json', authorization: 'Bearer sk-test', ...JSON.parse(process.env.HEADERS || '{}') };
const tools = [
  { type: 'function', function: { name: 'write_record', parameters: { type: 'object' } } },
  { type: 'function', function: { name: 'lookup', parameters: { type: 'object' } } },
];

async function ask(model, messages, run) {
  const h = run ? { ...headers, 'x-loopguard-run': run } : headers;
  const r = await send(base + '/chat/completions', { method: 'POST', headers: h, body: JSON.stringify({ model, messages, tools }) });
  const body = await r.json();
  if (r.status !== 200) throw new Error(`HTTP ${r.status}: ${JSON.stringify(body)}`);
  const msg = body.choices[0].message;
  messages.push({ role: 'assistant', content: msg.content ?? null, ...(msg.tool_calls ? { tool_calls: msg.tool_calls } : {}) });
  for (const c of msg.tool_calls || [])
    messages.push({ role: 'tool', tool_call_id: c.id, content: c.function.name === 'lookup' ? '{"customer_id":"c-1","name":"Ada"}' : 'Error: the storage is read-only.' });
  return { run: r.headers.get('x-loopguard-run'), action: r.headers.get('x-loopguard-action'), calls: (msg.tool_calls || []).length, text: msg.content };
}

const start = () => [{ role: 'system', content: 'You are a careful agent.' }, { role: 'user', content: 'Write record 7 with value A.' }];
const out = {};
if (process.env.MODE === 'episode') {
  const conv = start();
  let a;
  for (let i = 0; i < 8; i++) if (!(a = await ask(process.env.MODEL, conv)).calls) break;
  out.first = a;
  conv.push({ role: 'user', content: 'The storage is writable now; please look customer c-1 up instead.' });
  out.second = await ask(process.env.MODEL2, conv);
  out.after = [];
  for (let i = 0; i < Number(process.env.AFTER || 0); i++) out.after.push(await ask(process.env.MODEL2, conv));
} else if (process.env.MODE === 'resume') {
  const conv = start();
  let a;
  for (let i = 0; i < 8; i++) if (!(a = await ask(process.env.MODEL, conv)).calls) break;
  out.first = a;
  const r = await fetch(`${base}/runs/${a.run}/resume`, { method: 'POST', headers, body: JSON.stringify({ note: 'the storage is fixed' }) });
  out.resumed = r.status;
  out.second = await ask(process.env.MODEL2, conv);
} else {
  const a = start();
  out.a1 = await ask('finish', a, process.env.A_RUN);
  out.others = [];
  for (let i = 0; i < Number(process.env.OTHERS || 3); i++) out.others.push((await ask('finish', start())).run);
  out.a2 = await ask('finish', a, process.env.A_RUN);
}
console.log(JSON.stringify(out));
