// reuse.mjs — AGENTS agents at once through the gateway (BASE_URL), each
// sending EACH requests one after another on its own kept-alive
// connection (Node's fetch), each request a run of its own (the `finish`
// model of fake-upstream.mjs answers a lookup). Prints what was sent;
// exits 1 on an answer other than 200.
const base = process.env.BASE_URL;
const agents = Number(process.env.AGENTS || 64), each = Number(process.env.EACH || 32);

async function agent(i) {
  for (let k = 0; k < each; k++) {
    const r = await fetch(`${base}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-loopguard-run': `reuse-${i}-${k}` },
      body: JSON.stringify({ model: 'finish', messages: [{ role: 'user', content: `look customer c-${i} up` }] }),
    });
    const text = await r.text();
    if (r.status !== 200) throw new Error(`agent ${i}, request ${k}: ${r.status} ${text}`);
  }
}

try {
  await Promise.all(Array.from({ length: agents }, (_, i) => agent(i)));
  console.log(JSON.stringify({ agents, requests: agents * each }));
} catch (e) {
  console.log(String(e.message || e));
  process.exit(1);
}
