// agent-responses.mjs — the agent loop on the real `openai` package's
// Responses API: each turn continues the last with previous_response_id
// and sends only the function_call_output items.
//   BASE_URL, MODEL, STREAM=1 (responses.stream().finalResponse()), STEP_CAP
//   FOLLOW_UP  after the final answer, the person writes this, continuing
//              from it (previous_response_id), to MODEL2 (default MODEL)
//   BASE_URLS  comma-separated: the requests go to each in turn (round-robin.mjs)
import OpenAI from 'openai';
import { roundRobin } from './round-robin.mjs';

const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: 'sk-test-client', maxRetries: 0, timeout: 20000, fetch: roundRobin() });
const model = process.env.MODEL || 'loop-write';
const cap = Number(process.env.STEP_CAP || 12);
const stream = process.env.STREAM === '1';
const tools = [
  { type: 'function', name: 'write_record', description: 'Write a record.', parameters: { type: 'object', properties: { record_id: { type: 'integer' }, value: { type: 'string' } } } },
  { type: 'function', name: 'lookup', description: 'Look a customer up.', parameters: { type: 'object', properties: { customer_id: { type: 'string' } } } },
];
const executions = { write_record: 0, lookup: 0 };
function runTool(name) {
  executions[name] = (executions[name] || 0) + 1;
  if (name === 'write_record') return 'Error: the storage is read-only; the record was not written.';
  return JSON.stringify({ customer_id: 'c-1', name: 'Ada' });
}
let input = 'Write record 7 with value A.', prev;
const seen = [];
let steps = 0, ended = 'step_cap', final = null;
while (steps < cap) {
  steps++;
  const req = { model, input, tools, ...(prev ? { previous_response_id: prev } : {}) };
  let data;
  if (stream) {
    data = await client.responses.stream(req).finalResponse();
  } else {
    const r = await client.responses.create(req).withResponse();
    data = r.data;
    seen.push({ run: r.response.headers.get('x-loopguard-run'), action: r.response.headers.get('x-loopguard-action') });
  }
  prev = data.id;
  const calls = data.output.filter((it) => it.type === 'function_call');
  if (!calls.length) { ended = 'final'; final = data.output_text ?? data.output.filter((m) => m.type === 'message').flatMap((m) => m.content).map((c) => c.text).join(''); break; }
  input = calls.map((c) => ({ type: 'function_call_output', call_id: c.call_id, output: runTool(c.name) }));
}
let follow = null;
if (process.env.FOLLOW_UP && ended === 'final') {
  try {
    const r = await client.responses.create({ model: process.env.MODEL2 || model, input: process.env.FOLLOW_UP, tools, previous_response_id: prev }).withResponse();
    follow = { run: r.response.headers.get('x-loopguard-run'), action: r.response.headers.get('x-loopguard-action'), text: r.data.output_text };
  } catch (e) {
    follow = { error: String(e && e.message || e) };
  }
}
console.log(JSON.stringify({ executions, steps, ended, final, seen, follow }));
