// embed.mjs — the openai package's embeddings.create through the gateway
// (gateway_keys, run in host.mjs): KEY the loopguard key, URL the base URL
// (AZURE=1: an AzureOpenAI client, URL its endpoint), INPUT the input as
// JSON, the model embed-small. The SDK asks for base64 and decodes it.
// Prints [the embeddings, the first's values x100 rounded, usage.prompt_tokens].
import OpenAI, { AzureOpenAI } from 'openai';

const { KEY, URL, AZURE, INPUT } = process.env;
const client = AZURE
  ? new AzureOpenAI({ apiKey: KEY, endpoint: URL, apiVersion: '2024-10-21', maxRetries: 0 })
  : new OpenAI({ apiKey: KEY, baseURL: URL, maxRetries: 0 });
const r = await client.embeddings.create({ model: 'embed-small', input: JSON.parse(INPUT) });
console.log(JSON.stringify([r.data.length, r.data[0].embedding.map((x) => Math.round(x * 100)), r.usage.prompt_tokens]));
