// keys-load.mjs — AGENTS concurrent agents on one loopguard key, through
// the gateway with the real `openai` client, for DURATION_MS: each sends
// chat completions (no max_tokens: the gateway sets the most the key
// affords) one after the other, whatever the answer. Prints JSON: the
// answers by status, the limit_source of the refusals, and the cost of
// every answered request from its usage at the test's prices
// (IN_MICRO / OUT_MICRO micro-dollars a token), summed.
import OpenAI from 'openai';

const env = process.env;
const agents = Number(env.AGENTS || 32), until = Date.now() + Number(env.DURATION_MS || 4000);
const IN = Number(env.IN_MICRO), OUT = Number(env.OUT_MICRO);
const client = new OpenAI({ baseURL: env.BASE_URL, apiKey: env.KEY, maxRetries: 0, timeout: 60000 });
const out = { status: {}, limit_source: {}, cost_micro: 0, ok: 0 };

async function agent(a) {
  for (let i = 0; Date.now() < until; i++) {
    try {
      const r = await client.chat.completions.create({ model: env.MODEL, messages: [{ role: 'user', content: `agent ${a} task ${i}` }] });
      out.status[200] = (out.status[200] || 0) + 1;
      out.ok++;
      out.cost_micro += r.usage.prompt_tokens * IN + r.usage.completion_tokens * OUT;
    } catch (e) {
      const st = e.status || 'none';
      out.status[st] = (out.status[st] || 0) + 1;
      const src = e.error && e.error.metadata ? e.error.metadata.limit_source : (e.error && e.error.code) || String(e.message).slice(0, 80);
      out.limit_source[src] = (out.limit_source[src] || 0) + 1;
      await new Promise((r) => setTimeout(r, 10));
    }
  }
}
await Promise.all(Array.from({ length: agents }, (_, a) => agent(a)));
console.log(JSON.stringify(out));
