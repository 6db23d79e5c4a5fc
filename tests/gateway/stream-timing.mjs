// stream-timing.mjs — a text delta reaches the client as soon as the
// upstream sends it: the first delta must come long before the stream's
// end (the fake upstream's "drip" model sends a word every 250 ms).
import OpenAI from 'openai';
const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: 'sk-test', maxRetries: 0 });
const t0 = Date.now();
let first = -1, text = '';
const s = await client.chat.completions.create({ model: 'drip', messages: [{ role: 'user', content: 'hi' }], stream: true });
for await (const ch of s) {
  const d = ch.choices[0] && ch.choices[0].delta && ch.choices[0].delta.content;
  if (d) { if (first < 0) first = Date.now() - t0; text += d; }
}
console.log(JSON.stringify({ first_ms: first, total_ms: Date.now() - t0, text }));
