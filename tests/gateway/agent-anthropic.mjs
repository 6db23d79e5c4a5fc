// agent-anthropic.mjs — the same agent loop as agent-openai.mjs on the real
// `@anthropic-ai/sdk` package (Messages API, tool_use / tool_result).
//   BASE_URL (without /v1), MODEL, STREAM=1 (messages.stream().finalMessage()), STEP_CAP,
//   THINKING=1 (extended thinking: each answer's thinking block goes back with its tool_use),
//   BETA=1 (client.beta.messages: POST /v1/messages?beta=true, as Claude Code sends),
//   REMINDER=1 (a text after each turn's tool_result blocks, as Claude Code adds its
//   <system-reminder>s: not the person's new message, so no new episode),
//   IMAGE=1 (the write answers with an image alone: a screenshot of the form,
//   unchanged, as Claude Code's Read of an image file or a computer-use
//   screenshot answers),
//   CLAUDE_CODE=1 (MODEL=poll: Claude Code's Bash and BashOutput, a build
//   started in the background and polled until it ends: coding-tools.mjs),
//   COMPUTER=1 (MODEL=loop-click: the write is a click of Anthropic's
//   computer-use tool, type computer_20250124 on the beta API with its
//   beta header; each click answered with the screen as SCREENS says:
//   screens.mjs), counted as write_record's executions
// Prints executions, steps, how it ended, the final text, the headers seen,
// and `shapes`: each tool_use block as the SDK got it, but its id and input.
import Anthropic from '@anthropic-ai/sdk';
import { SCREEN_B64, nextScreenB64 } from './screens.mjs';
import { CLAUDE_TOOLS, bashOutput } from './coding-tools.mjs';

const client = new Anthropic({ baseURL: process.env.BASE_URL, apiKey: 'sk-ant-test', maxRetries: 0, timeout: 20000 });
const model = process.env.MODEL || 'loop-write';
const stream = process.env.STREAM === '1';
const cap = Number(process.env.STEP_CAP || 12);
const thinking = process.env.THINKING === '1' ? { type: 'enabled', budget_tokens: 1024 } : undefined;
const computer = process.env.COMPUTER === '1';
const api = process.env.BETA === '1' || computer ? client.beta.messages : client.messages;
const reminder = process.env.REMINDER === '1';
const tools = process.env.CLAUDE_CODE === '1' ? CLAUDE_TOOLS : computer ? [
  { type: 'computer_20250124', name: 'computer', display_width_px: 1024, display_height_px: 768 },
  { name: 'lookup', description: 'Look a customer up.', input_schema: { type: 'object', properties: { customer_id: { type: 'string' } } } },
] : [
  { name: 'write_record', description: 'Write a record.', input_schema: { type: 'object', properties: { record_id: { type: 'integer' }, value: { type: 'string' } } } },
  { name: 'lookup', description: 'Look a customer up.', input_schema: { type: 'object', properties: { customer_id: { type: 'string' } } } },
];
const executions = { write_record: 0, lookup: 0 };
function runTool(name) {
  if (name === 'computer') name = 'write_record'; // the click on Save
  executions[name] = (executions[name] || 0) + 1;
  if (name === 'Bash' || name === 'BashOutput') return { content: bashOutput((executions.Bash || 0) + (executions.BashOutput || 0)) };
  if (computer && name === 'write_record') return { content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: nextScreenB64() } }] };
  if (name === 'write_record' && process.env.IMAGE === '1')
    return { content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: SCREEN_B64 } }] };
  if (name === 'write_record') return { content: 'Error: the storage is read-only; the record was not written.', is_error: true };
  return { content: JSON.stringify({ customer_id: 'c-1', name: 'Ada' }) };
}
const messages = [{ role: 'user', content: 'Write record 7 with value A.' }];
const seen = [], shapes = []; // shapes: each tool_use block's members but its id and input
let steps = 0, ended = 'step_cap', final = null;
while (steps < cap) {
  steps++;
  let msg;
  const req = { model, max_tokens: thinking ? 2048 : 1024, system: 'You are a careful agent.', messages, tools, ...(thinking && { thinking }), ...(computer && { betas: ['computer-use-2025-01-24'] }) };
  if (stream) {
    msg = await api.stream(req).finalMessage();
  } else {
    const { data, response } = await api.create(req).withResponse();
    seen.push({ run: response.headers.get('x-loopguard-run'), action: response.headers.get('x-loopguard-action') });
    msg = data;
  }
  if (!msg.stop_reason) throw new Error('no stop_reason');
  messages.push({ role: 'assistant', content: msg.content });
  const uses = msg.content.filter((b) => b.type === 'tool_use');
  for (const { id, input, ...rest } of uses) shapes.push(JSON.stringify(rest, Object.keys(rest).sort()));
  if (!uses.length) { ended = 'final'; final = msg.content.filter((b) => b.type === 'text').map((b) => b.text).join(''); break; }
  const results = uses.map((u) => ({ type: 'tool_result', tool_use_id: u.id, ...runTool(u.name, u.input) }));
  if (reminder) results.push({ type: 'text', text: `<system-reminder>Turn ${steps}: keep the todo list current.</system-reminder>` });
  messages.push({ role: 'user', content: results });
}
console.log(JSON.stringify({ executions, steps, ended, final, seen, shapes }));
