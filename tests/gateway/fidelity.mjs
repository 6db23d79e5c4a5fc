// fidelity.mjs — an answer that needs no guard reaches the client as the
// upstream gave it: the first answer of a conversation (one that asks for
// a tool call, or says a text), asked directly of the fake upstream and
// through the gateway, each API stream false and true, as the real SDKs
// hand it to an agent (openai's chat.completions and responses,
// @anthropic-ai/sdk's messages; a stream joined by the SDK's own
// accumulator, and Chat Completions' by a hand-written loop too, as a
// client of OpenRouter or Gemini joins it). The two are compared member
// by member, but for what differs between any two answers of the fake
// (ids, times); with each API's reasoning on, and off.
//   DIRECT, GATEWAY   the base URLs (without /v1)
//   MODELS            the fake's models to ask (comma-separated)
// Prints {"compared": N, "differences": [...]}; exits 1 (throws) on a difference.
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { joinChatStream } from './chat-stream.mjs';

const models = (process.env.MODELS || 'finish').split(',');
const oa = (base) => new OpenAI({ baseURL: base + '/v1', apiKey: 'sk-test-client', maxRetries: 0, timeout: 20000 });
const an = (base) => new Anthropic({ baseURL: base, apiKey: 'sk-ant-test', maxRetries: 0, timeout: 20000 });
const fn = { type: 'object', properties: { customer_id: { type: 'string' } } };
const chatTools = [{ type: 'function', function: { name: 'lookup', description: 'Look a customer up.', parameters: fn } }];
const flatTools = [{ type: 'function', name: 'lookup', description: 'Look a customer up.', parameters: fn }];
const anTools = flatTools.map(({ name, description, parameters }) => ({ name, description, input_schema: parameters }));
const ask = 'Who is customer c-1?';
// each API's reasoning turned on, as the fake knows it (DeepSeek's thinking, Claude's, OpenAI's)
const THINKING = { chat: { thinking: { type: 'enabled' } }, messages: { thinking: { type: 'enabled', budget_tokens: 1024 } }, responses: { reasoning: { effort: 'low' } } };


const ways = {
  'chat': async (base, model, think) => {
    const r = await oa(base).chat.completions.create({ model, messages: [{ role: 'user', content: ask }], tools: chatTools, ...think.chat });
    return { message: r.choices[0].message, finish_reason: r.choices[0].finish_reason, usage: r.usage };
  },
  'chat stream': async (base, model, think) => {
    const r = await oa(base).chat.completions.stream({ model, messages: [{ role: 'user', content: ask }], tools: chatTools, stream_options: { include_usage: true }, ...think.chat }).finalChatCompletion();
    return { message: r.choices[0].message, finish_reason: r.choices[0].finish_reason, usage: r.usage };
  },
  'chat raw stream': async (base, model, think) => joinChatStream(await oa(base).chat.completions.create({ model, messages: [{ role: 'user', content: ask }], tools: chatTools, ...think.chat, stream: true, stream_options: { include_usage: true } })),
  'messages': async (base, model, think) => {
    const r = await an(base).messages.create({ model, max_tokens: 2048, messages: [{ role: 'user', content: ask }], tools: anTools, ...think.messages });
    return { content: r.content, stop_reason: r.stop_reason, stop_sequence: r.stop_sequence, usage: r.usage };
  },
  'messages stream': async (base, model, think) => {
    const r = await an(base).messages.stream({ model, max_tokens: 2048, messages: [{ role: 'user', content: ask }], tools: anTools, ...think.messages }).finalMessage();
    return { content: r.content, stop_reason: r.stop_reason, stop_sequence: r.stop_sequence, usage: r.usage };
  },
  'responses': async (base, model, think) => {
    const r = await oa(base).responses.create({ model, input: ask, tools: flatTools, ...think.responses });
    return { output: r.output, status: r.status, usage: r.usage };
  },
  'responses stream': async (base, model, think) => {
    const r = await oa(base).responses.stream({ model, input: ask, tools: flatTools, ...think.responses }).finalResponse();
    return { output: r.output, status: r.status, usage: r.usage };
  },
};

// What differs between any two answers of the fake: ids, times, the
// signatures made of them, the usage's count of the request (the gateway
// asks for the usage in a stream), the text naming the answer.
const VARYING = /^(id|call_id|created|created_at|signature|thought_signature)$/;
function norm(v, key) {
  if (Array.isArray(v)) return v.map((x) => norm(x));
  if (v && typeof v === 'object') return Object.fromEntries(Object.keys(v).sort().map((k) => [k, norm(v[k], k)]));
  if (typeof v === 'string' && key && VARYING.test(key)) return '<varies>';
  if (typeof v === 'string') return v.replace(/(fake|call_|toolu_|fc_|rs_)\d\w*/g, '$1N');
  return v;
}
function diff(a, b, path, out) {
  if (JSON.stringify(a) === JSON.stringify(b)) return;
  if (a && b && typeof a === 'object' && typeof b === 'object' && Array.isArray(a) === Array.isArray(b)) {
    for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) diff(a[k], b[k], `${path}.${k}`, out);
    return;
  }
  out.push(`${path}: directly ${JSON.stringify(a)}, through the gateway ${JSON.stringify(b)}`);
}

const differences = [];
let compared = 0;
for (const model of models) {
  for (const [way, get] of Object.entries(ways)) {
    for (const think of [{ chat: {}, messages: {}, responses: {} }, THINKING]) {
      if (/-(gemini|openrouter|groq|azure)/.test(model) && (!way.startsWith('chat') || think === THINKING)) continue; // Chat Completions' providers
      const name = `${model} ${way}${think === THINKING ? ' thinking' : ''}`;
      let a, b;
      try {
        a = norm(await get(process.env.DIRECT, model, think));
        b = norm(await get(process.env.GATEWAY, model, think));
      } catch (e) {
        differences.push(`${name}: ${e && e.message}`);
        continue;
      }
      compared++;
      const out = [];
      diff(a, b, '', out);
      for (const d of out) differences.push(`${name}${d}`);
    }
  }
}
console.log(JSON.stringify({ compared, differences }, null, 1));
if (differences.length) throw new Error(`${differences.length} differences`); // exit status 1 (run alone or in host.mjs)
