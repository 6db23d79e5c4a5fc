// agent-handoffs.mjs — two agents of the OpenAI Agents SDK that hand a task
// back and forth (each has a handoff to the other; the fake upstream's
// `pingpong` model always takes it): the loop the SDK's own maxTurns ends
// only at its cap. Counts the handoffs by the agent that answered each turn.
//   BASE_URL, STEP_CAP (maxTurns) [20]
// The client is this run's own (a Runner with its own provider; see
// agent-openai-agents.mjs).
import OpenAI from 'openai';
import { Agent, Runner, OpenAIProvider, setTracingDisabled, MaxTurnsExceededError } from '@openai/agents';

setTracingDisabled(true); // no export to the internet (a setting of the whole process, the same each run)
const openAIClient = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: 'sk-test', maxRetries: 0 });
const runner = new Runner({ modelProvider: new OpenAIProvider({ openAIClient, useResponses: true }), tracingDisabled: true });
const triage = new Agent({ name: 'triage', instructions: 'Route the task to the right team.', model: 'pingpong' });
const billing = new Agent({ name: 'billing', instructions: 'Handle billing questions.', model: 'pingpong' });
triage.handoffs = [billing];
billing.handoffs = [triage];
let ended = 'final', final = null, handoffs = 0;
try {
  const r = await runner.run(triage, 'Refund order 7.', { maxTurns: Number(process.env.STEP_CAP || 20) });
  handoffs = r.newItems.filter((it) => it.type === 'handoff_output_item').length;
  final = r.finalOutput;
} catch (e) {
  if (!(e instanceof MaxTurnsExceededError)) throw e;
  ended = 'step_cap';
  handoffs = (e.state && e.state._generatedItems || []).filter((it) => it.type === 'handoff_output_item').length;
}
console.log(JSON.stringify({ ended, final, handoffs }));
