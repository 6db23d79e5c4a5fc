// passthrough-stream.mjs — the legacy Completions API (a path the gateway
// passes through unguarded) on the real `openai` package: a stream's events
// reach the client as the upstream sends them (the fake upstream's "drip"
// sends a word every 250 ms), not all at once at its end; and a whole
// answer as the upstream sent it. Prints {first_ms, total_ms, text, whole}.
import OpenAI from 'openai';
const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: 'sk-test', maxRetries: 0 });
const prompt = 'one two three four five six';
const t0 = Date.now();
let first = -1, text = '';
const s = await client.completions.create({ model: 'drip', prompt, stream: true });
for await (const ch of s) {
  const d = ch.choices[0] && ch.choices[0].text;
  if (d && first < 0) first = Date.now() - t0;
  text += d || '';
}
const total = Date.now() - t0;
const whole = await client.completions.create({ model: 'finish', prompt });
console.log(JSON.stringify({ first_ms: first, total_ms: total, text, whole: whole.choices[0].text }));
