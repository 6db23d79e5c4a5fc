// passthrough-files.mjs — what an agent does besides asking the model, on
// the real `openai` package through the gateway: uploads files (multipart,
// one over the server's own 1 MiB --max-body), lists them a page at a time
// (the SDK's own pagination, which sends the cursor in the query: a
// gateway that dropped the query would give the first page forever), reads
// one back, and sends a model request with a 3 MB image, all of it on
// paths the gateway passes through or guards. Prints {uploads, listed,
// list_ok (every upload listed, none twice), download_ok, chat_status,
// image_chars}; exits 1 on a wrong byte.
import OpenAI, { toFile } from 'openai';
import crypto from 'node:crypto';
const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: 'sk-test', maxRetries: 0 });
const sha = (b) => crypto.createHash('sha256').update(b).digest('hex');
const fail = (m) => { console.error(m); process.exit(1); };

const bodies = [crypto.randomBytes(3 << 20), Buffer.from('{"a": 1}\n'), crypto.randomBytes(70000)];
const ids = [];
for (const [i, b] of bodies.entries()) {
  const f = await client.files.create({ file: await toFile(b, `part-${i}.bin`), purpose: 'assistants' });
  if (f.bytes !== b.length || f.sha256 !== sha(b) || f.filename !== `part-${i}.bin` || f.purpose !== 'assistants')
    fail(`upload ${i}: the upstream got ${JSON.stringify(f)}, sent ${b.length} bytes ${sha(b)}`);
  ids.push(f.id);
}

// a page of one file a request: the SDK asks for the next with ?after=ID
const listed = [];
for await (const f of client.files.list({ limit: 1 })) {
  listed.push(f.id);
  if (listed.length > 3 * ids.length) fail(`the list never ends (the cursor lost?): ${listed.join(' ')}`);
}

const got = Buffer.from(await (await client.files.content(ids[0])).arrayBuffer());
const image = 'data:image/png;base64,' + crypto.randomBytes(2250000).toString('base64'); // 3 MB
const chat = await client.chat.completions.create({
  model: 'finish',
  messages: [{ role: 'user', content: [{ type: 'text', text: 'What is in this picture?' },
    { type: 'image_url', image_url: { url: image } }] }],
}).withResponse();
const list_ok = new Set(listed).size === listed.length && ids.every((id) => listed.includes(id));
console.log(JSON.stringify({ uploads: ids, listed, list_ok, download_ok: sha(got) === sha(bodies[0]),
  chat_status: chat.response.status, image_chars: image.length }));
