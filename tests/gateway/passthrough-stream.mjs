// passthrough-stream.mjs — the legacy Completions API (a path the gateway
// passes through unguarded) on the real `openai` package: a stream's events
// reach the client as the upstream sends them (the fake upstream's "drip"
// sends a word every 250 ms), not all at once at its end; and a whole
// answer as the upstream sent it, its request id read by the SDK. Prints
// {first_ms, total_ms, text, whole, whole_request_id, chat_request_id}.
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
// the upstream's request id, as the SDK reads it (x-request-id), on a
// passed-through answer and on a guarded one
const chat = await client.chat.completions.create({ model: 'finish', messages: [{ role: 'user', content: 'hi' }] });
console.log(JSON.stringify({ first_ms: first, total_ms: total, text, whole: whole.choices[0].text,
  whole_request_id: whole._request_id || null, chat_request_id: chat._request_id || null }));
