// chat-stream.mjs — a Chat Completions stream joined as a hand-written
// client joins it (one for OpenRouter or Gemini, whose deltas the openai
// SDK's accumulator does not join): each member of the first choice's
// delta joined (strings) or kept as it last came; reasoning_details merged
// by type and index (their text, summary and data joined); a call delta
// by its index, or, without one (Gemini's), a new id a new call and no id
// the last call, its other members (extra_content) kept as they last came;
// a custom tool's call (type "custom") joined as a function's, its
// custom.input for function.arguments.
// Used by agent-openai.mjs (STREAM=raw) and fidelity.mjs.
export async function joinChatStream(stream) {
  const message = { role: 'assistant' }, calls = [];
  let finish_reason = null, usage = null;
  for await (const ch of stream) {
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices || []) {
      if (c.index !== 0) continue;
      if (c.finish_reason) finish_reason = c.finish_reason;
      for (const [k, v] of Object.entries(c.delta || {})) {
        if (k === 'tool_calls') {
          for (const { index, id, type, function: f, custom: cu, ...rest } of v) {
            const at = index ?? (!id ? Math.max(calls.length - 1, 0) : ((i) => (i < 0 ? calls.length : i))(calls.findIndex((t) => t.id === id)));
            const tc = (calls[at] ??= type === 'custom' || cu ? { id: '', type: 'custom', custom: { name: '', input: '' } } : { id: '', type: 'function', function: { name: '', arguments: '' } });
            Object.assign(tc, rest);
            if (id) tc.id = id;
            const into = tc.custom || tc.function, part = cu || f;
            if (part?.name) into.name += part.name;
            if (part?.[tc.custom ? 'input' : 'arguments']) into[tc.custom ? 'input' : 'arguments'] += part[tc.custom ? 'input' : 'arguments'];
          }
        } else if (k === 'reasoning_details') {
          message[k] ??= [];
          for (const d of v) {
            const had = message[k].find((e) => e.type === d.type && e.index === d.index);
            if (!had) message[k].push({ ...d });
            else for (const [dk, dv] of Object.entries(d)) had[dk] = ['text', 'summary', 'data'].includes(dk) && typeof had[dk] === 'string' ? had[dk] + dv : dv;
          }
        } else if (typeof v === 'string' && typeof message[k] === 'string' && k !== 'role') {
          message[k] += v;
        } else {
          message[k] = v;
        }
      }
    }
  }
  if (calls.length) message.tool_calls = calls;
  return { message, finish_reason, usage };
}
