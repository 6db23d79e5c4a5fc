// agent-ai-sdk.mjs — the Vercel AI SDK's own agent loop (`ai` generateText
// with tools and a step cap) on @ai-sdk/openai-compatible: the SDK runs
// the tools and asks again until the model answers without a tool call.
//   BASE_URL, MODEL, STREAM=1 (streamText), STEP_CAP,
//   PROVIDER=openai (@ai-sdk/openai on the Responses API, `store` on as by
//   default: its earlier answers go back as item_reference items), REASONING=1
//   (reasoningEffort low: `reasoning` sent for a reasoning model's name, o3-...)
//   PROVIDER=azure, azure-chat (@ai-sdk/azure, its baseURL BASE_URL's
//   server and /openai/v1, as a proxy in front of Azure is named: the
//   resource's v1 API, Responses or chat completions, the key in api-key)
import { generateText, streamText, tool, stepCountIs } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { createOpenAI } from '@ai-sdk/openai';
import { createAzure } from '@ai-sdk/azure';
import { z } from 'zod';

const azure = () => createAzure({ baseURL: process.env.BASE_URL.replace(/\/v1$/, '') + '/openai/v1', apiKey: 'azure-test-key' });
const provider = process.env.PROVIDER === 'openai' ? createOpenAI({ baseURL: process.env.BASE_URL, apiKey: 'sk-test' }).responses
  : process.env.PROVIDER === 'azure' ? azure().responses
  : process.env.PROVIDER === 'azure-chat' ? azure().chat
  : createOpenAICompatible({ name: 'fake', baseURL: process.env.BASE_URL, apiKey: 'sk-test', includeUsage: true });
const cap = Number(process.env.STEP_CAP || 12);
const executions = { write_record: 0, lookup: 0 };
const tools = {
  write_record: tool({
    description: 'Write a record.',
    inputSchema: z.object({ record_id: z.number(), value: z.string() }),
    execute: async () => { executions.write_record++; return 'Error: the storage is read-only; the record was not written.'; },
  }),
  lookup: tool({
    description: 'Look a customer up.',
    inputSchema: z.object({ customer_id: z.string() }),
    execute: async () => { executions.lookup++; return { customer_id: 'c-1', name: 'Ada' }; },
  }),
};
const args = { model: provider(process.env.MODEL || 'loop-write'), system: 'You are a careful agent.', prompt: 'Write record 7 with value A.', tools, stopWhen: stepCountIs(cap), maxRetries: 0,
  ...(process.env.REASONING === '1' && { providerOptions: { openai: { reasoningEffort: 'low' } } }) };
let text, steps, finishReason;
if (process.env.STREAM === '1') {
  const r = streamText(args);
  text = await r.text; steps = (await r.steps).length; finishReason = await r.finishReason;
} else {
  const r = await generateText(args);
  text = r.text; steps = r.steps.length; finishReason = r.finishReason;
}
console.log(JSON.stringify({ executions, steps, ended: finishReason === 'stop' ? 'final' : finishReason, final: text }));
