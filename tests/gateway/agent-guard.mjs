// agent-guard.mjs — one agent loop over the three APIs on the real SDKs,
// for the guards of tests/gateway/guard.sh (text loops, the cascade, named
// policies): ask the model, run the tools it asks for, until it answers
// without tool calls or the step cap is reached. The SDKs' own stream
// accumulators read the streams, so a stream that does not end the way
// its API ends one fails here.
//
//   API       chat (default), messages, responses; functions (Chat Completions'
//             older function calling)
//   BASE_URL  the API's base URL (for messages: without /v1)
//   MODEL     the fake upstream's script
//   STREAM    1: chat.completions.stream(), messages.stream(), responses.stream()
//   HEADERS   JSON object of extra request headers (X-Loopguard-*)
//   STEP_CAP  the agent's cap on model calls [12]
//   WRITE_OK  1: write_record succeeds (else it fails: the storage is read-only)
//   BASE_URLS comma-separated: the requests go to each in turn (round-robin.mjs)
//   CODING    1: a coding agent's tools, Bash and Edit, instead: Bash runs
//             the tests, which fail (an error) until its PASS_AFTER-th run [5]
// Prints one JSON object: executions per tool, steps, how it ended, the
// last answer's text, how it finished and its usage as the SDK read it,
// the X-Loopguard-* headers seen (non-stream), or the error the SDK threw;
// on a Responses stream, the last text delta's snapshot (the message's text
// as the SDK built it from the events).
import OpenAI from 'openai';
import { roundRobin } from './round-robin.mjs';
import Anthropic from '@anthropic-ai/sdk';

const api = process.env.API || 'chat';
const model = process.env.MODEL || 'loop-write';
const stream = process.env.STREAM === '1';
const cap = Number(process.env.STEP_CAP || 12);
const defaultHeaders = JSON.parse(process.env.HEADERS || '{}');
const opts = { baseURL: process.env.BASE_URL, maxRetries: 0, timeout: 20000, defaultHeaders, fetch: roundRobin() };
const openai = new OpenAI({ ...opts, apiKey: 'sk-test-client' });
const anthropic = new Anthropic({ ...opts, apiKey: 'sk-ant-test' });

const coding = process.env.CODING === '1';
const passAfter = Number(process.env.PASS_AFTER || 5);
const schemas = coding ? {
  Bash: { type: 'object', properties: { command: { type: 'string' }, description: { type: 'string' } } },
  Edit: { type: 'object', properties: { file_path: { type: 'string' }, old_string: { type: 'string' }, new_string: { type: 'string' } } },
} : {
  write_record: { type: 'object', properties: { record_id: { type: 'integer' }, value: { type: 'string' } } },
  lookup: { type: 'object', properties: { customer_id: { type: 'string' } } },
};
const executions = coding ? { Bash: 0, Edit: 0 } : { write_record: 0, lookup: 0 };
function runTool(name) {
  executions[name] = (executions[name] || 0) + 1;
  if (name === 'Bash') return executions.Bash < passAfter
    ? `Error: Exit code 1\nFAILED tests/test_parser.py::test_tok_${executions.Bash} - AssertionError` : '12 passed in 0.31s';
  if (name === 'Edit') return 'The file src/parser.py has been updated.';
  if (name === 'write_record')
    return process.env.WRITE_OK === '1' ? 'Wrote record 7.' : 'Error: the storage is read-only; the record was not written.';
  if (name === 'lookup') return JSON.stringify({ customer_id: 'c-1', name: 'Ada' });
  return 'Error: no such tool: ' + name;
}
const headersOf = (r) => ({ run: r.headers.get('x-loopguard-run'), action: r.headers.get('x-loopguard-action'), reason: r.headers.get('x-loopguard-reason') });

// One Chat Completions call, streamed (the SDK's accumulator) or not (its
// headers seen): the completion.
async function chatCompletion(req, seen) {
  if (stream) return openai.chat.completions.stream({ ...req, stream_options: { include_usage: true } }).finalChatCompletion();
  const { data, response } = await openai.chat.completions.create(req).withResponse();
  seen.push(headersOf(response));
  return data;
}

// Each API: one model call -> { text, calls: [{id, name, args}], finish }, and
// how the conversation grows.
const apis = {
  chat: {
    conv: [{ role: 'system', content: 'You are a careful agent.' }, { role: 'user', content: 'Write record 7 with value A.' }],
    tools: Object.entries(schemas).map(([name, parameters]) => ({ type: 'function', function: { name, description: name, parameters } })),
    async call(seen) {
      const done = await chatCompletion({ model, messages: this.conv, tools: this.tools }, seen);
      const msg = done.choices[0].message;
      const calls = (msg.tool_calls || []).map((c) => ({ id: c.id, name: c.function.name, args: c.function.arguments }));
      this.conv.push({ role: 'assistant', content: msg.content ?? null, ...(calls.length ? { tool_calls: msg.tool_calls } : {}) });
      return { text: msg.content, calls, finish: done.choices[0].finish_reason, usage: done.usage };
    },
    answer(c, out) { this.conv.push({ role: 'tool', tool_call_id: c.id, content: out }); },
  },
  // Chat Completions' older function calling: `functions`, one
  // function_call an answer, answered by a message of role function
  functions: {
    conv: [{ role: 'system', content: 'You are a careful agent.' }, { role: 'user', content: 'Write record 7 with value A.' }],
    functions: Object.entries(schemas).map(([name, parameters]) => ({ name, description: name, parameters })),
    async call(seen) {
      const done = await chatCompletion({ model, messages: this.conv, functions: this.functions }, seen);
      const msg = done.choices[0].message, fc = msg.function_call;
      if (msg.tool_calls?.length) throw new Error('tool_calls in an answer to functions');
      this.conv.push({ role: 'assistant', content: msg.content ?? null, ...(fc ? { function_call: { name: fc.name, arguments: fc.arguments } } : {}) });
      return { text: msg.content, calls: fc ? [{ name: fc.name, args: fc.arguments }] : [], finish: done.choices[0].finish_reason, usage: done.usage };
    },
    answer(c, out) { this.conv.push({ role: 'function', name: c.name, content: out }); },
  },
  messages: {
    conv: [{ role: 'user', content: 'Write record 7 with value A.' }],
    tools: Object.entries(schemas).map(([name, input_schema]) => ({ name, description: name, input_schema })),
    pending: [],
    async call(seen) {
      if (this.pending.length) { this.conv.push({ role: 'user', content: this.pending }); this.pending = []; }
      const req = { model, max_tokens: 1024, messages: this.conv, tools: this.tools };
      let msg;
      if (stream) msg = await anthropic.messages.stream(req).finalMessage();
      else {
        const { data, response } = await anthropic.messages.create(req).withResponse();
        seen.push(headersOf(response));
        msg = data;
      }
      this.conv.push({ role: 'assistant', content: msg.content });
      const calls = msg.content.filter((b) => b.type === 'tool_use').map((b) => ({ id: b.id, name: b.name, args: JSON.stringify(b.input) }));
      return { text: msg.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), calls, finish: msg.stop_reason, usage: msg.usage };
    },
    answer(c, out) { this.pending.push({ type: 'tool_result', tool_use_id: c.id, content: out, is_error: out.startsWith('Error') }); },
  },
  responses: {
    conv: [{ role: 'user', content: 'Write record 7 with value A.' }],
    tools: Object.entries(schemas).map(([name, parameters]) => ({ type: 'function', name, description: name, parameters })),
    async call(seen) {
      const req = { model, input: this.conv, tools: this.tools };
      let resp;
      if (stream) {
        const s = openai.responses.stream(req);
        s.on('response.output_text.delta', (e) => { snapshot = e.snapshot; });
        resp = await s.finalResponse();
      } else {
        const { data, response } = await openai.responses.create(req).withResponse();
        seen.push(headersOf(response));
        resp = data;
      }
      this.conv.push(...resp.output);
      const calls = resp.output.filter((it) => it.type === 'function_call').map((it) => ({ id: it.call_id, name: it.name, args: it.arguments }));
      const text = resp.output.filter((it) => it.type === 'message').flatMap((it) => it.content).filter((p) => p.type === 'output_text').map((p) => p.text).join('');
      return { text, calls, finish: resp.status, usage: resp.usage };
    },
    answer(c, out) { this.conv.push({ type: 'function_call_output', call_id: c.id, output: out }); },
  },
};

const a = apis[api];
const seen = [];
let steps = 0, ended = 'step_cap', final = null, finish = null, usage = null, error = null;
let snapshot = null; // Responses stream: the text of the last delta's message as the SDK built it
try {
  while (steps < cap) {
    steps++;
    const r = await a.call(seen);
    finish = r.finish;
    usage = r.usage ?? null;
    if (!r.calls.length) { ended = 'final'; final = r.text; break; }
    for (const c of r.calls) { JSON.parse(c.args); a.answer(c, runTool(c.name)); }
  }
} catch (e) {
  ended = 'error';
  error = String(e && e.message || e);
}
console.log(JSON.stringify({ executions, steps, ended, final, finish, usage, seen, error, snapshot }));
