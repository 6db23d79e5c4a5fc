// agent-langgraph.mjs — LangGraph's own ReAct loop (`createReactAgent` from
// @langchain/langgraph/prebuilt: a model node and a ToolNode in a graph) on
// ChatOpenAI from @langchain/openai. The graph runs the tools and asks
// again until the model answers without a tool call, or until its
// recursionLimit (the agent's own step cap) is reached. The write tool
// throws, as a failing LangChain tool does; the ToolNode turns the error
// into the tool message the model sees.
//   BASE_URL, MODEL, STEP_CAP: the model calls the graph allows [12]
//   RESPONSES=1: ChatOpenAI on the Responses API (useResponsesApi), the
//   whole conversation sent as items each time
//   STREAM=1: ChatOpenAI streaming: true, the graph run with
//   agent.stream(streamMode ["messages", "values"]): the model's tokens
//   arrive as the upstream streams them, usage from the usage chunk.
//   AZURE=1: AzureChatOpenAI, its azureOpenAIEndpoint BASE_URL without /v1
//   and the model its deployment: Azure's classic API
//   (/openai/deployments/MODEL/chat/completions?api-version=, api-key)
//   (agent.invoke with streaming: true would stream too, but then
//   ChatOpenAI estimates the usage with tiktoken, fetched from the
//   Internet; the test must not leave the machine.)
// Prints one JSON object: executions per tool, model steps, how it ended
// ("final", or "step_cap" on LangGraph's GraphRecursionError), the last
// answer text, the streamed message chunks, and every host other than
// the loopback one that something tried to fetch (must be none).
import { AzureChatOpenAI, ChatOpenAI } from '@langchain/openai';
import { createReactAgent } from '@langchain/langgraph/prebuilt';
import { tool } from '@langchain/core/tools';
import { z } from 'zod';

const outside = [];
const realFetch = globalThis.fetch;
globalThis.fetch = (input, init) => {
  const url = new URL(typeof input === 'string' || input instanceof URL ? input : input.url);
  if (url.hostname !== '127.0.0.1' && url.hostname !== 'localhost') {
    outside.push(url.hostname);
    return Promise.reject(new Error(`agent-langgraph: no fetch leaves the machine (${url.hostname})`));
  }
  return realFetch(input, init);
};

const stream = process.env.STREAM === '1';
const cap = Number(process.env.STEP_CAP || 12);
const executions = { write_record: 0, lookup: 0 };
const writeRecord = tool(async () => {
  executions.write_record++;
  throw new Error('the storage is read-only; the record was not written.');
}, { name: 'write_record', description: 'Write a record.', schema: z.object({ record_id: z.number().int(), value: z.string() }) });
const lookup = tool(async () => {
  executions.lookup++;
  return JSON.stringify({ customer_id: 'c-1', name: 'Ada' });
}, { name: 'lookup', description: 'Look a customer up.', schema: z.object({ customer_id: z.string() }) });

const model = process.env.MODEL || 'loop-write';
const llm = new (process.env.AZURE === '1' ? AzureChatOpenAI : ChatOpenAI)({
  model,
  ...(process.env.AZURE === '1'
    ? { azureOpenAIEndpoint: process.env.BASE_URL.replace(/\/v1$/, ''), azureOpenAIApiKey: 'azure-test-key', azureOpenAIApiVersion: '2024-10-21', azureOpenAIApiDeploymentName: model }
    : { apiKey: 'sk-test-client', configuration: { baseURL: process.env.BASE_URL } }),
  streaming: stream,
  streamUsage: true,
  ...(process.env.RESPONSES === '1' && { useResponsesApi: true }),
  maxRetries: 0,
  timeout: 20000,
});
const agent = createReactAgent({ llm, tools: [writeRecord, lookup], prompt: 'You are a careful agent.' });

// One graph step per model call and one per tool round: cap model calls
// and cap tool rounds fit in 2 * cap steps.
const recursionLimit = 2 * cap;
const input = { messages: [{ role: 'user', content: 'Write record 7 with value A.' }] };
let messages = [], ended = 'final', chunks = 0;
try {
  if (stream) {
    for await (const [mode, data] of await agent.stream(input, { recursionLimit, streamMode: ['messages', 'values'] })) {
      if (mode === 'values') messages = data.messages;
      else if (data[1] && data[1].langgraph_node === 'agent') chunks++;
    }
  } else {
    messages = (await agent.invoke(input, { recursionLimit })).messages;
  }
} catch (e) {
  if (e.name !== 'GraphRecursionError' && !/recursion limit/i.test(String(e.message))) throw e;
  ended = 'step_cap';
}
const ai = messages.filter((m) => m.getType && m.getType() === 'ai');
const last = ai[ai.length - 1];
if (ended === 'final' && last && last.tool_calls && last.tool_calls.length) ended = 'tool_calls';
const final = ended === 'final' && last ? (typeof last.content === 'string' ? last.content : JSON.stringify(last.content)) : null;
console.log(JSON.stringify({ executions, steps: ai.length, ended, final, chunks, outside }));
