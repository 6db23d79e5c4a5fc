// agent-openai-agents.mjs — the OpenAI Agents SDK's own loop (Runner with
// maxTurns) on the Responses API, through an OpenAI client whose base URL
// is the gateway's or the fake upstream's. Tracing is off: no
// export to the internet. The client is this run's own (a Runner with its
// own provider, not setDefaultOpenAIClient: the SDK's default provider
// keeps the models it made from the first default client, and host.mjs
// runs many of these in one node).
//   BASE_URL, MODEL, STREAM=1 (run(..., {stream: true})), STEP_CAP,
//   REASONING=1 (modelSettings.reasoning: each answer starts with a reasoning item),
//   CONVERSATION=1 (a conversation made first, POST /v1/conversations, and the
//   run given its conversationId: the server keeps the conversation),
//   AGAIN=1 (with CONVERSATION: after the run, the person asks again in the
//   same conversation; `again` is that run's final output)
//   BASE_URLS (comma-separated: the requests go to each in turn, round-robin.mjs)
//   BUILTIN=apply_patch|shell|computer (MODEL=loop-builtin): the write is
//   the SDK's applyPatchTool (an editor whose update fails), shellTool (a
//   shell whose command exits 1) or computerTool (a browser whose Save
//   button does nothing: a click, and the same screenshot), counted as
//   write_record's executions
import OpenAI from 'openai';
import { roundRobin } from './round-robin.mjs';
import { nextScreenB64 } from './screens.mjs';
import { Agent, Runner, OpenAIProvider, tool, applyPatchTool, shellTool, computerTool, setTracingDisabled, MaxTurnsExceededError } from '@openai/agents';
import { z } from 'zod';

setTracingDisabled(true); // no export to the internet (a setting of the whole process, the same each run)
const openai = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: 'sk-test', maxRetries: 0, fetch: roundRobin() });
const runner = new Runner({ modelProvider: new OpenAIProvider({ openAIClient: openai, useResponses: true }), tracingDisabled: true });
const conversationId = process.env.CONVERSATION === '1' ? (await openai.conversations.create({})).id : undefined;
const executions = { write_record: 0, lookup: 0 };
const failed = async () => { executions.write_record++; return { status: 'failed', output: 'Error: records/7: read-only file system' }; };
const builtin = {
  apply_patch: () => applyPatchTool({ editor: { createFile: failed, updateFile: failed, deleteFile: failed } }),
  computer: () => computerTool({ computer: { // its screenshots: screens.mjs (the same after every action)
    environment: 'browser', dimensions: [1024, 768], screenshot: async () => nextScreenB64(),
    click: async () => { executions.write_record++; }, doubleClick: async () => {}, scroll: async () => {}, type: async () => {},
    wait: async () => {}, move: async () => {}, keypress: async () => {}, drag: async () => {} } }),
  shell: () => shellTool({ shell: { run: async () => { executions.write_record++; return { output: [{ stdout: '', stderr: 'write-record: read-only file system\n', outcome: { type: 'exit', exitCode: 1 } }] }; } } }),
}[process.env.BUILTIN || ''];
const agent = new Agent({
  name: 'writer',
  instructions: 'You are a careful agent.',
  model: process.env.MODEL || 'loop-write',
  ...(process.env.REASONING === '1' && { modelSettings: { reasoning: { effort: 'low' } } }),
  tools: [
    ...(builtin ? [builtin()] : []),
    ...(builtin ? [] : [tool({ name: 'write_record', description: 'Write a record.', parameters: z.object({ record_id: z.number(), value: z.string() }),
           execute: async () => { executions.write_record++; return 'Error: the storage is read-only; the record was not written.'; } })]),
    tool({ name: 'lookup', description: 'Look a customer up.', parameters: z.object({ customer_id: z.string() }),
           execute: async () => { executions.lookup++; return JSON.stringify({ customer_id: 'c-1', name: 'Ada' }); } }),
  ],
});
let ended = 'final', final = null;
try {
  const stream = process.env.STREAM === '1';
  const r = await runner.run(agent, 'Write record 7 with value A.', { maxTurns: Number(process.env.STEP_CAP || 12), ...(stream ? { stream: true } : {}), ...(conversationId && { conversationId }) });
  if (stream) await r.completed;
  final = r.finalOutput;
} catch (e) {
  if (e instanceof MaxTurnsExceededError) ended = 'step_cap';
  else throw e;
}
let again;
if (process.env.AGAIN === '1' && conversationId) {
  const r = await runner.run(agent, 'Then look customer c-1 up instead.', { maxTurns: 4, conversationId });
  again = r.finalOutput;
}
console.log(JSON.stringify({ executions, ended, final, ...(again !== undefined && { again }) }));
