// stream-timing.mjs — a text delta reaches the client as soon as the
// upstream sends it: the first delta must come long before the stream's
// end (the fake upstream's "drip" model sends a word every 250 ms), and each
// delta as soon as it comes: max_gap_ms, the longest wait between two
// deltas, stays near 250 ms (a parked stream that is resumed without waking
// its event loop waits for the loop's timeout, a second).
import OpenAI from 'openai';
const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: 'sk-test', maxRetries: 0 });
const t0 = Date.now();
let first = -1, last = -1, maxGap = 0, text = '';
const s = await client.chat.completions.create({ model: 'drip', messages: [{ role: 'user', content: 'hi' }], stream: true });
for await (const ch of s) {
  const d = ch.choices[0] && ch.choices[0].delta && ch.choices[0].delta.content;
  if (d) {
    const now = Date.now() - t0;
    if (first < 0) first = now;
    else maxGap = Math.max(maxGap, now - last);
    last = now;
    text += d;
  }
}
console.log(JSON.stringify({ first_ms: first, total_ms: Date.now() - t0, max_gap_ms: maxGap, text }));
