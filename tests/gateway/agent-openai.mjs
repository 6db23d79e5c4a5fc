// agent-openai.mjs — a plain agent loop on the real `openai` package:
// ask the model, run the tools it asks for, give back the results, until
// it answers without tool calls or the agent's own step cap is reached.
//
//   BASE_URL  the API's base URL (the gateway's or the fake upstream's)
//   MODEL     the fake upstream's script ("loop-write", "finish")
//   STREAM    1: chat.completions.stream() (the SDK's own accumulator);
//             raw: create({stream: true}), the chunks joined as a
//             hand-written client for OpenRouter and Gemini joins them
//             (chat-stream.mjs)
//   STEP_CAP  the agent's cap on model calls [12]
//   CUSTOM    1: write_record is a custom tool (type "custom", free-text
//             input): its calls are of type "custom" (with STREAM=raw:
//             the SDK's own accumulator takes only functions' calls)
//   THINKING  1: `thinking: {type: "enabled"}` (DeepSeek's, Moonshot's): each
//             answer's reasoning_content goes back with its tool calls
//   LEGACY    1: the older function calling, as agents written for it still
//             send it: `functions` for tools, one `function_call` an answer,
//             its result a message of role "function" (STREAM 1 or unset)
//   SHELL_TOOLS  a coding agent's shell tools instead of the write
//             (coding-tools.mjs): shell, Codex's own shell tool (Codex with
//             wire_api "chat": a function named shell, each call answered
//             with Codex's text of a command that exited 2); exec, its
//             exec_command and write_stdin, a build polled until it ends;
//             openhands, OpenHands' execute_bash, polled with an empty
//             command
//   AZURE     1: the package's AzureOpenAI client, its endpoint BASE_URL
//             without /v1, the model a deployment's name: its requests go to
//             /openai/deployments/MODEL/chat/completions?api-version=...,
//             the key in api-key
// What the model binds to its calls goes back with them, as a client of
// that provider keeps it: reasoning_content, reasoning and
// reasoning_details, a call's extra_content (Gemini's thought signature).
// Prints one JSON object: executions per tool, steps, how it ended, the
// last answer text, the X-Loopguard-* headers seen (non-stream).
import OpenAI, { AzureOpenAI } from 'openai';
import { joinChatStream } from './chat-stream.mjs';
import { SHELL_PARAMETERS, SHELL_DESCRIPTION, shellOutput, EXEC_TOOLS, execOutput, OPENHANDS_TOOLS, openhandsOutput } from './coding-tools.mjs';

const client = process.env.AZURE === '1'
  ? new AzureOpenAI({ endpoint: process.env.BASE_URL.replace(/\/v1$/, ''), apiKey: 'azure-test-key', apiVersion: '2024-10-21', maxRetries: 0, timeout: 20000 })
  : new OpenAI({ baseURL: process.env.BASE_URL, apiKey: 'sk-test-client', maxRetries: 0, timeout: 20000 });
const model = process.env.MODEL || 'loop-write';
const stream = process.env.STREAM === '1', raw = process.env.STREAM === 'raw';
const cap = Number(process.env.STEP_CAP || 12);
const thinking = process.env.THINKING === '1' ? { thinking: { type: 'enabled' } } : {};

const custom = process.env.CUSTOM === '1';
const shellTools = process.env.SHELL_TOOLS;
const tools = shellTools === 'exec' ? EXEC_TOOLS.map((f) => ({ type: 'function', function: f }))
  : shellTools === 'openhands' ? OPENHANDS_TOOLS.map((f) => ({ type: 'function', function: f }))
  : shellTools === 'shell' ? [{ type: 'function', function: { name: 'shell', description: SHELL_DESCRIPTION, parameters: SHELL_PARAMETERS } }] : [
  custom ? { type: 'custom', custom: { name: 'write_record', description: 'Apply a patch to the records.' } } :
  { type: 'function', function: { name: 'write_record', description: 'Write a record.', parameters: { type: 'object', properties: { record_id: { type: 'integer' }, value: { type: 'string' } }, required: ['record_id', 'value'] } } },
  { type: 'function', function: { name: 'lookup', description: 'Look a customer up.', parameters: { type: 'object', properties: { customer_id: { type: 'string' } } } } },
];
const legacy = process.env.LEGACY === '1';
if (legacy && (custom || raw)) throw new Error('LEGACY takes neither CUSTOM nor STREAM=raw');
// the tools as the request offers them: `functions` (LEGACY), else `tools`
const offer = legacy ? { functions: tools.map((t) => t.function) } : { tools };
const executions = { write_record: 0, lookup: 0 };
function runTool(name, args) {
  executions[name] = (executions[name] || 0) + 1;
  if (!custom || name !== 'write_record') JSON.parse(args); // the agent parses what it is given
  if (name === 'write_record') return 'Error: the storage is read-only; the record was not written.';
  if (name === 'lookup') return JSON.stringify({ customer_id: 'c-1', name: 'Ada' });
  if (name === 'shell') return shellOutput(executions.shell);
  if (name === 'execute_bash') return openhandsOutput(executions.execute_bash);
  if (name === 'exec_command' || name === 'write_stdin') return execOutput((executions.exec_command || 0) + (executions.write_stdin || 0));
  return 'unknown tool';
}


const messages = [
  { role: 'system', content: 'You are a careful agent.' },
  { role: 'user', content: 'Write record 7 with value A.' },
];
const seen = [];
let steps = 0, ended = 'step_cap', final = null;
while (steps < cap) {
  steps++;
  let msg, fin;
  if (raw) {
    const r = await joinChatStream(await client.chat.completions.create({ model, messages, ...offer, ...thinking, stream: true }));
    if (r.finish_reason === null) throw new Error('no finish_reason');
    msg = r.message;
    fin = r.finish_reason;
  } else if (stream) {
    const s = client.chat.completions.stream({ model, messages, ...offer, stream_options: { include_usage: true }, ...thinking });
    const done = await s.finalChatCompletion();
    msg = done.choices[0].message;
    fin = done.choices[0].finish_reason;
    if (fin === null) throw new Error('no finish_reason');
  } else {
    const { data, response } = await client.chat.completions.create({ model, messages, ...offer, ...thinking }).withResponse();
    seen.push({ run: response.headers.get('x-loopguard-run'), action: response.headers.get('x-loopguard-action'), reason: response.headers.get('x-loopguard-reason') });
    msg = data.choices[0].message;
    fin = data.choices[0].finish_reason;
  }
  if (legacy && msg.tool_calls?.length) throw new Error('tool_calls in an answer to functions: ' + JSON.stringify(msg.tool_calls));
  if (legacy && msg.function_call) { // its one call, answered by a function message
    if (fin !== 'function_call') throw new Error(`a function_call answer finished on ${fin}`);
    messages.push({ role: 'assistant', content: msg.content ?? null, function_call: { name: msg.function_call.name, arguments: msg.function_call.arguments } });
    messages.push({ role: 'function', name: msg.function_call.name, content: runTool(msg.function_call.name, msg.function_call.arguments) });
    continue;
  }
  const calls = msg.tool_calls || [];
  const back = { role: 'assistant', content: msg.content ?? null };
  for (const k of ['reasoning_content', 'reasoning', 'reasoning_details']) if (msg[k] != null) back[k] = msg[k];
  if (calls.length) back.tool_calls = calls.map((c) => (c.type === 'custom' ? { id: c.id, type: 'custom', custom: { name: c.custom.name, input: c.custom.input } }
    : { id: c.id, type: 'function', function: { name: c.function.name, arguments: c.function.arguments }, ...(c.extra_content && { extra_content: c.extra_content }) }));
  messages.push(back);
  if (!calls.length) { ended = 'final'; final = msg.content; break; }
  for (const c of calls) {
    const fn = c.type === 'custom' ? c.custom : c.function;
    messages.push({ role: 'tool', tool_call_id: c.id, content: runTool(fn.name, c.type === 'custom' ? fn.input : fn.arguments) });
  }
}
console.log(JSON.stringify({ executions, steps, ended, final, seen }));
